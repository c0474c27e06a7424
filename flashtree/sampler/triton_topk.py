"""The k most probable tokens of each row and their log-probabilities, `logits.float().log_softmax(-1).topk(k)`, in
Triton: what best-first's growth asks of each round (its frontier node's children), without the full-vocabulary
log-softmax and sort.

`select="threshold"` (the default), four launches:
* stats, grid (rows, tiles): each program reads one tile of BV logits, keeps its maximum, its sum of exp against it
  and the maxima of its sub-blocks of SUB logits;
* row, grid (rows,): the row's log-sum-exp from the tiles' (max, sum), and t0, the k-th largest of its sub-block
  maxima: k distinct sub-blocks each hold a logit >= t0, so every one of the row's k largest logits is >= t0 (t0 is
  -inf when the row has fewer than k finite sub-blocks);
* select, grid (rows, tiles): each program reads its tile again and appends its finite logits >= t0 (typically about
  k in the whole row: 0 to a few a tile), at most k of them, its largest, by one round of (max, lowest id among the
  maxima) each, to the row's candidates at an offset it takes from the row's atomic counter;
* merge, grid (rows,): the row's k largest candidates, by k rounds of max per chunk of CH candidates.
`select="rounds"`, two launches: each tile picks its k largest by k rounds of (max, lowest id among the maxima, mask),
and one program per row merges the tiles' picks by the same rounds.

The threshold merge packs (value, token) into one int64 key, the float's order-preserving bits above 2^31 - 1 - token:
one max per round picks the largest value, ties to the lower token, and the key of (-inf, token 0) fills the slots
past a row's finite logits. Values are exact float32 logits minus the row's log-sum-exp (summed in another order than
torch's: equal to ~1e-6); a row with fewer than k finite logits fills the rest with -inf at token 0.
All shapes are fixed on the host: graph-capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

TOPK_MAX = 128  # the rounds' merge holds ~64 tiles x k picks per row
SUB = 256  # the threshold's sub-block: ~600 maxima a row at a 152K vocabulary put t0 near the k-th largest logit
CH = 128  # the merge's candidates per chunk: one chunk holds a random row's ~k + a few at k <= 63
_SENT = tl.constexpr(-9187343241983295489)  # _pack(-inf, token 0), below every finite logit's key


@triton.jit
def _pack(x, ids):
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)  # -0.0 ties +0.0, as the sort has it
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: flip the magnitude so ints order as the floats do
    return (key.to(tl.int64) << 32) | (0x7FFFFFFF - ids).to(tl.int64)


@triton.jit
def _unpack(keys):
    key = (keys >> 32).to(tl.int32)
    bits = key ^ ((key >> 31) & 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True), 0x7FFFFFFF - (keys & 0x7FFFFFFF)


@triton.jit
def _pick_keys(a, top, K: tl.constexpr, KP: tl.constexpr):
    """The K largest keys of a and top together, largest first, in KP slots (the rest _SENT)."""
    slot = tl.arange(0, KP)
    out = tl.full([KP], _SENT, tl.int64)
    for j in range(K):
        best = tl.maximum(tl.max(a, axis=0), tl.max(top, axis=0))
        out = tl.where(slot == j, best, out)
        a = tl.where(a == best, _SENT, a)
        top = tl.where(top == best, _SENT, top)
    return out


@triton.jit
def _pick_rounds(x, ids, K: tl.constexpr, KP: tl.constexpr):
    """The K largest of x (ties: the lowest id) as (values, ids) of length KP, the unused slots -inf / 0."""
    slot = tl.arange(0, KP)
    vals = tl.full([KP], float("-inf"), tl.float32)
    toks = tl.zeros([KP], tl.int32)
    for j in tl.static_range(K):
        best = tl.max(x, axis=0)
        tok = tl.min(tl.where(x == best, ids, 2147483647), axis=0)
        vals = tl.where(slot == j, best, vals)
        toks = tl.where(slot == j, tok, toks)
        x = tl.where(ids == tok, float("-inf"), x)
    return vals, toks


@triton.jit
def _row_lse(pm_ptr, ps_ptr, r, T, TP: tl.constexpr):
    t = tl.arange(0, TP)
    pm = tl.load(pm_ptr + r * T + t, mask=t < T, other=float("-inf"))
    ps = tl.load(ps_ptr + r * T + t, mask=t < T, other=0.0)
    top = tl.max(pm, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)
    return top + tl.log(tl.sum(ps * tl.exp(pm - top), axis=0))


@triton.jit
def _stats_kernel(x_ptr, stride_x, V, pm_ptr, ps_ptr, pb_ptr, T, BV: tl.constexpr, SUB: tl.constexpr):
    r = tl.program_id(0)
    t = tl.program_id(1)
    S: tl.constexpr = BV // SUB
    cols = t * BV + tl.arange(0, S)[:, None] * SUB + tl.arange(0, SUB)[None, :]
    x = tl.load(x_ptr + r.to(tl.int64) * stride_x + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
    sub = tl.max(x, axis=1)
    m = tl.max(sub, axis=0)
    s = tl.sum(tl.sum(tl.exp(x - tl.where(m == float("-inf"), 0.0, m)), axis=1), axis=0)
    part = r.to(tl.int64) * T + t
    tl.store(pm_ptr + part, m)
    tl.store(ps_ptr + part, s)
    tl.store(pb_ptr + part * S + tl.arange(0, S), sub)


@triton.jit
def _row_kernel(pm_ptr, ps_ptr, pb_ptr, lse_ptr, t0_ptr, cnt_ptr, T, NB,
                K: tl.constexpr, KP: tl.constexpr, TP: tl.constexpr, NBP: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    b = tl.arange(0, NBP)
    top = tl.topk(tl.load(pb_ptr + r * NB + b, mask=b < NB, other=float("-inf")), KP)
    tl.store(t0_ptr + r, tl.max(tl.where(tl.arange(0, KP) == K - 1, top, float("-inf")), axis=0))
    tl.store(lse_ptr + r, _row_lse(pm_ptr, ps_ptr, r, T, TP))
    tl.store(cnt_ptr + r, 0)


@triton.jit
def _select_kernel(x_ptr, stride_x, V, t0_ptr, cnt_ptr, cv_ptr, ci_ptr, C, K: tl.constexpr, BV: tl.constexpr):
    r = tl.program_id(0)
    t = tl.program_id(1)
    cols = t * BV + tl.arange(0, BV)
    x = tl.load(x_ptr + r.to(tl.int64) * stride_x + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
    x = tl.where(x >= tl.load(t0_ptr + r), x, float("-inf"))
    # only the tile's K largest can be among the row's; loops, not unrolled rounds: few registers, many tiles in flight
    c = tl.minimum(tl.sum((x > float("-inf")).to(tl.int32), axis=0), K)
    if c > 0:
        base = r.to(tl.int64) * C + tl.atomic_add(cnt_ptr + r, c)
        for j in range(c):
            best = tl.max(x, axis=0)
            tok = tl.min(tl.where(x == best, cols, 2147483647), axis=0)
            tl.store(cv_ptr + base + j, best)
            tl.store(ci_ptr + base + j, tok)
            x = tl.where(cols == tok, float("-inf"), x)


@triton.jit
def _merge_keys_kernel(cv_ptr, ci_ptr, cnt_ptr, lse_ptr, out_v_ptr, out_i_ptr, C,
                       K: tl.constexpr, KP: tl.constexpr, CH: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    n = tl.load(cnt_ptr + r)
    top = tl.full([KP], _SENT, tl.int64)
    for start in range(0, n, CH):
        i = start + tl.arange(0, CH)
        keys = _pack(tl.load(cv_ptr + r * C + i, mask=i < n), tl.load(ci_ptr + r * C + i, mask=i < n))
        top = _pick_keys(tl.where(i < n, keys, _SENT), top, K, KP)
    vals, toks = _unpack(top)
    slot = tl.arange(0, KP)
    tl.store(out_v_ptr + r * K + slot, vals - tl.load(lse_ptr + r), mask=slot < K)
    tl.store(out_i_ptr + r * K + slot, toks, mask=slot < K)


@triton.jit
def _tile_topk_kernel(x_ptr, stride_x, V, pv_ptr, pi_ptr, pm_ptr, ps_ptr, T,
                      K: tl.constexpr, KP: tl.constexpr, BV: tl.constexpr):
    r = tl.program_id(0)
    t = tl.program_id(1)
    cols = t * BV + tl.arange(0, BV)
    x = tl.load(x_ptr + r.to(tl.int64) * stride_x + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    s = tl.sum(tl.exp(x - tl.where(m == float("-inf"), 0.0, m)), axis=0)
    vals, toks = _pick_rounds(x, cols, K, KP)
    part = r.to(tl.int64) * T + t
    slot = tl.arange(0, KP)
    tl.store(pv_ptr + part * KP + slot, vals)
    tl.store(pi_ptr + part * KP + slot, toks)
    tl.store(pm_ptr + part, m)
    tl.store(ps_ptr + part, s)


@triton.jit
def _merge_topk_kernel(pv_ptr, pi_ptr, pm_ptr, ps_ptr, out_v_ptr, out_i_ptr, T,
                       K: tl.constexpr, KP: tl.constexpr, TP: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    lse = _row_lse(pm_ptr, ps_ptr, r, T, TP)
    c = tl.arange(0, TP * KP)
    cm = (c // KP) < T
    vals = tl.load(pv_ptr + r * T * KP + c, mask=cm, other=float("-inf"))
    ids = tl.load(pi_ptr + r * T * KP + c, mask=cm, other=2147483647)
    # a tile's unused slots hold -inf at id 0: give them ids no real token has, so a pick never masks a real one
    ids = tl.where(vals == float("-inf"), 2147483647 - c, ids)
    best, toks = _pick_rounds(vals, ids, K, KP)
    toks = tl.where(best == float("-inf"), 0, toks)  # fewer than k finite logits: the rest -inf at token 0
    slot = tl.arange(0, KP)
    tl.store(out_v_ptr + r * K + slot, best - lse, mask=slot < K)
    tl.store(out_i_ptr + r * K + slot, toks.to(tl.int64), mask=slot < K)


def row_topk_logprobs(logits: torch.Tensor, k: int, *, block_v: int | None = None,
                      select: str = "threshold") -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probabilities (R, k) float32, token ids (R, k) int64) of the k most probable tokens of each row of
    `logits` (R, V), largest first (ties: the lower id): `logits.float().log_softmax(-1).topk(k)`. `select`:
    "threshold" or "rounds" (the module docstring); `block_v`: the tile."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be (rows, vocab), got shape {tuple(logits.shape)}")
    if select not in ("threshold", "rounds"):
        raise ValueError(f"select={select!r}: use 'threshold' or 'rounds'")
    rows, v = logits.shape
    if not 1 <= k <= min(v, TOPK_MAX):
        raise ValueError(f"k={k}: use 1 <= k <= min(vocab, {TOPK_MAX}) (vocab {v})")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    dev = logits.device
    kp = max(2, triton.next_power_of_2(k))
    out_v = torch.empty((rows, k), dtype=torch.float32, device=dev)
    out_i = torch.empty((rows, k), dtype=torch.int64, device=dev)
    if select == "rounds":
        # at most ~64 tiles a row, so the merge holds them all (64 x 64 picks at k = 64)
        bv = max(block_v or max(1024, triton.next_power_of_2(triton.cdiv(v, 64))), kp)
    else:
        bv = max(block_v or min(4096, triton.next_power_of_2(v)), 32)
    tiles = triton.cdiv(v, bv)
    tp = max(2, triton.next_power_of_2(tiles))
    pm = torch.empty((rows, tiles), dtype=torch.float32, device=dev)
    ps = torch.empty((rows, tiles), dtype=torch.float32, device=dev)
    if rows == 0:
        return out_v, out_i
    if select == "rounds":
        pv = torch.empty((rows, tiles, kp), dtype=torch.float32, device=dev)
        pi = torch.empty((rows, tiles, kp), dtype=torch.int32, device=dev)
        _tile_topk_kernel[(rows, tiles)](logits, logits.stride(0), v, pv, pi, pm, ps, tiles, K=k, KP=kp, BV=bv,
                                         num_warps=4)
        _merge_topk_kernel[(rows,)](pv, pi, pm, ps, out_v, out_i, tiles, K=k, KP=kp, TP=tp,
                                    num_warps=8 if tp * kp > 2048 else 4)
        return out_v, out_i
    sub = min(SUB, bv // 2)
    while sub > 16 and v < 2 * kp * sub:  # at least 2k sub-blocks where the vocabulary allows: a tighter t0
        sub //= 2
    nb = tiles * (bv // sub)
    pb = torch.empty((rows, nb), dtype=torch.float32, device=dev)
    lse = torch.empty(rows, dtype=torch.float32, device=dev)
    t0 = torch.empty(rows, dtype=torch.float32, device=dev)
    cnt = torch.empty(rows, dtype=torch.int32, device=dev)
    cap = tiles * k  # each tile appends at most k candidates
    cv = torch.empty((rows, cap), dtype=torch.float32, device=dev)
    ci = torch.empty((rows, cap), dtype=torch.int32, device=dev)
    _stats_kernel[(rows, tiles)](logits, logits.stride(0), v, pm, ps, pb, tiles, BV=bv, SUB=sub, num_warps=4)
    _row_kernel[(rows,)](pm, ps, pb, lse, t0, cnt, tiles, nb, K=k, KP=kp, TP=tp,
                         NBP=max(kp, triton.next_power_of_2(nb)), num_warps=4)
    _select_kernel[(rows, tiles)](logits, logits.stride(0), v, t0, cnt, cv, ci, cap, K=k, BV=bv, num_warps=4)
    _merge_keys_kernel[(rows,)](cv, ci, cnt, lse, out_v, out_i, cap, K=k, KP=kp, CH=CH, num_warps=1)
    return out_v, out_i
