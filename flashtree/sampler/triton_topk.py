"""The k most probable tokens of each row and their log-probabilities, `logits.float().log_softmax(-1).topk(k)`, in
Triton: what best-first's growth asks of each round (its frontier node's children), without the full-vocabulary
log-softmax and sort.

Two launches, graph-capturable (shapes only on the host):
* grid (rows, tiles): each program reads one tile of BV logits once, keeps its maximum and its sum of exp against
  it, and picks its k largest by k rounds of argmax (ties to the lowest token id), masking each pick;
* grid (rows,): one program per row merges the tiles' (max, sum) into the row's log-sum-exp and their k x tiles picks
  into the row's k largest by the same rounds, in order of value, then token id.
Values are exact float32 logits minus the row's log-sum-exp (summed in another order than torch's: equal to ~1e-6); a
row with fewer than k finite logits fills the rest with -inf at token 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

TOPK_MAX = 128  # the merge holds ~64 tiles x k picks per row


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
    t = tl.arange(0, TP)
    tm = t < T
    pm = tl.load(pm_ptr + r * T + t, mask=tm, other=float("-inf"))
    ps = tl.load(ps_ptr + r * T + t, mask=tm, other=0.0)
    top = tl.max(pm, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)
    lse = top + tl.log(tl.sum(ps * tl.exp(pm - top), axis=0))
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


def row_topk_logprobs(logits: torch.Tensor, k: int, *, block_v: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probabilities (R, k) float32, token ids (R, k) int64) of the k most probable tokens of each row of
    `logits` (R, V), largest first (ties: the lower id): `logits.float().log_softmax(-1).topk(k)`."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be (rows, vocab), got shape {tuple(logits.shape)}")
    rows, v = logits.shape
    if not 1 <= k <= min(v, TOPK_MAX):
        raise ValueError(f"k={k}: use 1 <= k <= min(vocab, {TOPK_MAX}) (vocab {v})")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    dev = logits.device
    kp = max(2, triton.next_power_of_2(k))
    # at most ~64 tiles a row, so the merge holds them all (64 x 64 picks at k = 64)
    bv = max(block_v or max(1024, triton.next_power_of_2(triton.cdiv(v, 64))), kp)
    tiles = triton.cdiv(v, bv)
    pv = torch.empty((rows, tiles, kp), dtype=torch.float32, device=dev)
    pi = torch.empty((rows, tiles, kp), dtype=torch.int32, device=dev)
    pm = torch.empty((rows, tiles), dtype=torch.float32, device=dev)
    ps = torch.empty((rows, tiles), dtype=torch.float32, device=dev)
    out_v = torch.empty((rows, k), dtype=torch.float32, device=dev)
    out_i = torch.empty((rows, k), dtype=torch.int64, device=dev)
    if rows == 0:
        return out_v, out_i
    _tile_topk_kernel[(rows, tiles)](logits, logits.stride(0), v, pv, pi, pm, ps, tiles, K=k, KP=kp, BV=bv,
                                     num_warps=4)
    tp = max(2, triton.next_power_of_2(tiles))
    _merge_topk_kernel[(rows,)](pv, pi, pm, ps, out_v, out_i, tiles, K=k, KP=kp, TP=tp,
                                num_warps=8 if tp * kp > 2048 else 4)
    return out_v, out_i
