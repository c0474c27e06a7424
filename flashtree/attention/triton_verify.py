"""Split-KV tree-verify attention in Triton.

One program per (request, KV head, row block, part). Its rows are the G query heads that share the KV head times
the L verify tokens (row r = token r // G, head h * G + r % G: GQA packing), so each prefix key and value is read once
per KV head for all of them, and the rows are the M dimension of each dot. When the batch alone cannot fill the GPU
the prefix is cut into S splits (`num_splits`, by default `choose_splits`) and the L fresh verify tokens, attended
under the tree mask (read only on each request's L x L block), get a part of their own, so no program walks a split
and the tree one after the other; a merge kernel combines the S + 1 parts by their log-sum-exp. With S = 1 one part
does both and writes the output itself. Only shapes are read on the host: graph-capturable.

`tune` overrides the launch for small batches (see `launch_choice`): the key tile, the rows a program packs
(`block_m`), warps and stages; the split outputs' dtype (`partials`: by default the queries' own 16-bit dtype, fp32
for fp32 queries; the log-sum-exp stays fp32); the tree
folded into the last split instead of a part of its own; `prefetch` (on by default), each key tile's KV slots loaded
one tile ahead and its V gathered before the QK dot (on the H200 it took 4-15% off at every shape of kernel run 10,
1.09x the floor to 1.04x at bs 64 / 8K; gathering the next tile's K and V into registers as well was slower at bs 1,
kernel run 12); `pdl`, programmatic dependent launch (on by default from Hopper on: each launch is set up while the
kernel before it runs, and waits for it before reading anything it may have written: with `prefix_ready` the
prefix's lengths and first key tiles' slots, and with `early` 2 its first key tile, are read before that wait); and a
fused merge, with no second launch: each part, its partial written, takes a ticket from a per-(request, KV head, row
block) counter, and the last to arrive merges the row block's parts and writes the output. The counters live in a
persistent zeroed buffer per device that the merging program zeroes again, so fused calls must not overlap on two
streams.

Layouts: sglang's (`k_buffer`/`v_buffer (slots, Hkv, D)`, `kv_indptr`, `kv_indices`) and paged (`k_cache`/`v_cache
(pages, page_size, Hkv, D)`, `page_table (bs, max_pages)`, `prefix_lens (bs,)`). Masks: QLEN (each request's L x L
block) or sglang's FULL layout (`mask_indptr` given; prefix columns skipped); or none, for a chain (`causal`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

try:  # griddepcontrol for programmatic dependent launch: Triton 3.3 and newer
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:
    gdc_launch_dependents = gdc_wait = None

from ..gpu import has_pdl, sm_count, zeroed_counters
from .reference import check_mask_args


@triton.jit
def gqa_program(RB: tl.constexpr, BM: tl.constexpr, G: tl.constexpr, L: tl.constexpr):
    """This program's (request b, KV head h, row block rb, part s) and its BM rows: row r = token r // G, query head
    h * G + r % G (GQA packing; row_ok marks the rows of the G * L that exist)."""
    b = tl.program_id(0)
    h = tl.program_id(1) // RB
    rb = tl.program_id(1) % RB
    rows = rb * BM + tl.arange(0, BM)
    return b, h, rb, tl.program_id(2), rows, rows < G * L, rows // G, h * G + rows % G


@triton.jit
def _tile_slots(page_table, kv_indices, b, pt_stride, kv_start, n, nm, PAGED: tl.constexpr, PAGE: tl.constexpr):
    """The KV slots of keys n (masked by nm) of request b: through its page table, or sglang's kv_indices."""
    if PAGED:
        page = tl.load(page_table + b.to(tl.int64) * pt_stride + n // PAGE, mask=nm, other=0)
        return page.to(tl.int64) * PAGE + n % PAGE
    return tl.load(kv_indices + kv_start + n, mask=nm, other=0).to(tl.int64)


@triton.jit
def _merge_parts(po_ptr, plse_ptr, grp, S, BM: tl.constexpr, BDV: tl.constexpr, MU: tl.constexpr):
    """Row block `grp`'s S parts merged by their log-sum-exp (an online merge, MU parts' loads in flight at once),
    every part from its partial in part order, the merging program's own included: the result does not depend on
    which part finished last. Loaded past L1 (.cg) since other programs wrote them during this launch. An empty
    split's partial was never written: its weight is 0, and a `where` keeps whatever it holds (NaN, say) out of the
    sum."""
    r = tl.arange(0, BM)
    dv = tl.arange(0, BDV)
    m = tl.full([BM], float("-inf"), tl.float32)
    den = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BDV], tl.float32)
    for s0 in range(0, S, MU):
        for u in tl.static_range(MU):
            p = s0 + u
            ok = p < S
            part = (grp * S + p).to(tl.int64)
            ls = tl.load(plse_ptr + part * BM + r, mask=ok, other=float("-inf"), cache_modifier=".cg")
            po = tl.load(po_ptr + part * (BM * BDV) + r[:, None] * BDV + dv[None, :], mask=ok, other=0.0,
                         cache_modifier=".cg").to(tl.float32)
            m_new = tl.maximum(m, ls)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m - m_safe)
            w = tl.exp2(ls - m_safe)
            acc = acc * alpha[:, None] + w[:, None] * tl.where(w[:, None] > 0, po, 0.0)
            den = den * alpha + w
            m = m_new
    return acc / tl.where(den > 0, den, 1.0)[:, None]


@triton.jit
def _scores(q, kk, allowed, m_i, l_i, qk_scale, DOT_F32: tl.constexpr):
    """One key tile's step of the online softmax: the tile's probabilities p (rows x keys, unnormalised, 0 where not
    `allowed`), the rescale alpha of what came before, and the running max and sum after it."""
    if DOT_F32:
        kk = kk.to(tl.float32)
    sc = tl.dot(q, tl.trans(kk)) * qk_scale
    sc = tl.where(allowed, sc, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(sc, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(sc - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def _accumulate(acc, alpha, p, vt, DOT_F32: tl.constexpr):
    if DOT_F32:
        return acc * alpha[:, None] + tl.dot(p, vt.to(tl.float32))
    return acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)


@triton.jit
def _verify_kernel(
    q_ptr, k_ptr, v_ptr, kb_ptr, vb_ptr,
    kv_indptr, kv_indices, page_table, prefix_lens, pt_stride,
    mask_ptr, mask_indptr,
    o_ptr, po_ptr, plse_ptr, cnt_ptr,
    qk_scale, n_splits,
    s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_kbt, s_kbh, s_vbt, s_vbh, s_ot, s_oh,
    HKV: tl.constexpr, G: tl.constexpr, L: tl.constexpr, LP: tl.constexpr,
    D: tl.constexpr, BD: tl.constexpr, DV: tl.constexpr, BDV: tl.constexpr,
    BM: tl.constexpr, RB: tl.constexpr, BN: tl.constexpr,
    PAGED: tl.constexpr, PAGE: tl.constexpr, MASK_FULL: tl.constexpr, CAUSAL: tl.constexpr, DIRECT: tl.constexpr,
    FUSED: tl.constexpr, MU: tl.constexpr, PREFETCH: tl.constexpr, DOT_F32: tl.constexpr, PDL: tl.constexpr,
    EARLY: tl.constexpr,
):
    if PDL and not EARLY:  # launched early (programmatic dependent launch): what is read below may come from the
        gdc_wait()  # kernel just before
        gdc_launch_dependents()  # the merge launch may start now (it waits for this grid before reading)
    # S parts (programs along axis 2): n_splits prefix splits, the last of which also takes the tree (S = n_splits),
    # or a part of the tree's own after them (S = n_splits + 1: its prefix range is empty)
    S = tl.num_programs(2)
    b, h, rb, s, rows, row_ok, t, hq = gqa_program(RB, BM, G, L)
    d = tl.arange(0, BD)
    dv = tl.arange(0, BDV)
    if PAGED:
        prefix = tl.load(prefix_lens + b).to(tl.int32)
        kv_start = 0
    else:
        kv_start = tl.load(kv_indptr + b)
        prefix = (tl.load(kv_indptr + b + 1) - kv_start).to(tl.int32)
    # splits of whole key tiles: a prefix of fewer tiles than splits leaves the last ones empty
    chunk = tl.cdiv(tl.cdiv(prefix, n_splits), BN) * BN
    lo = s * chunk
    hi = tl.minimum(lo + chunk, prefix)
    live = (lo < hi) | (s == S - 1)  # an empty split reads nothing, not even q
    kb_h = kb_ptr + h * s_kbh
    vb_h = vb_ptr + h * s_vbh
    first = lo  # the loop's first key; EARLY 2 walks the first tile before it
    if EARLY == 2:  # the first tile's K and V gathered before the wait as well: in flight while the kernel before ends
        n0 = lo + tl.arange(0, BN)
        nm0 = n0 < hi
        slot0 = _tile_slots(page_table, kv_indices, b, pt_stride, kv_start, n0, nm0, PAGED, PAGE)
        kk0 = tl.load(kb_h + slot0[:, None] * s_kbt + d[None, :], mask=nm0[:, None] & (d[None, :] < D), other=0.0)
        vt0 = tl.load(vb_h + slot0[:, None] * s_vbt + dv[None, :], mask=nm0[:, None] & (dv[None, :] < DV), other=0.0)
        first = lo + BN
    if PREFETCH:  # the first tile's slots; each iteration then loads the next tile's while its own K / V arrive
        n1 = first + tl.arange(0, BN)
        slot_next = _tile_slots(page_table, kv_indices, b, pt_stride, kv_start, n1, n1 < hi, PAGED, PAGE)
    if PDL and EARLY > 0:  # the prefix's reads above ran while the kernel before still ran; q needs it done
        gdc_wait()
        gdc_launch_dependents()
    q = tl.load(q_ptr + (b * L + t).to(tl.int64)[:, None] * s_qt + hq[:, None] * s_qh + d[None, :],
                mask=live & row_ok[:, None] & (d[None, :] < D), other=0.0)
    if DOT_F32:  # the CPU interpreter (triton 3.7) mis-multiplies bf16 dots; compute them in fp32 there
        q = q.to(tl.float32)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BDV], tl.float32)
    if EARLY == 2:
        p, alpha, m_i, l_i = _scores(q, kk0, nm0[None, :], m_i, l_i, qk_scale, DOT_F32)
        acc = _accumulate(acc, alpha, p, vt0, DOT_F32)
    for start in range(first, hi, BN):
        n = start + tl.arange(0, BN)
        nm = n < hi
        if PREFETCH:
            slot = slot_next
            n1 = n + BN
            slot_next = _tile_slots(page_table, kv_indices, b, pt_stride, kv_start, n1, n1 < hi, PAGED, PAGE)
        else:
            slot = _tile_slots(page_table, kv_indices, b, pt_stride, kv_start, n, nm, PAGED, PAGE)
        kk = tl.load(kb_h + slot[:, None] * s_kbt + d[None, :], mask=nm[:, None] & (d[None, :] < D), other=0.0)
        if PREFETCH:  # V's gather issued before the QK dot, not after it
            vt = tl.load(vb_h + slot[:, None] * s_vbt + dv[None, :], mask=nm[:, None] & (dv[None, :] < DV),
                         other=0.0)
        p, alpha, m_i, l_i = _scores(q, kk, nm[None, :], m_i, l_i, qk_scale, DOT_F32)
        if not PREFETCH:
            vt = tl.load(vb_h + slot[:, None] * s_vbt + dv[None, :], mask=nm[:, None] & (dv[None, :] < DV),
                         other=0.0)
        acc = _accumulate(acc, alpha, p, vt, DOT_F32)
    if s == S - 1:
        j = tl.arange(0, LP)
        jm = j < L
        tok = (b * L + j).to(tl.int64)
        kk = tl.load(k_ptr + tok[:, None] * s_kt + h * s_kh + d[None, :], mask=jm[:, None] & (d[None, :] < D),
                     other=0.0)
        mm = row_ok[:, None] & jm[None, :]
        if CAUSAL:  # a chain: token t sees tokens 0..t, no mask to read
            allowed = mm & (j[None, :] <= t[:, None])
        else:
            if MASK_FULL:
                moff = tl.load(mask_indptr + b) + t[:, None].to(tl.int64) * (prefix + L) + prefix + j[None, :]
            else:
                moff = b.to(tl.int64) * (L * L) + t[:, None] * L + j[None, :]
            allowed = tl.load(mask_ptr + moff, mask=mm, other=0) != 0
        p, alpha, m_i, l_i = _scores(q, kk, allowed, m_i, l_i, qk_scale, DOT_F32)
        vt = tl.load(v_ptr + tok[:, None] * s_vt + h * s_vh + dv[None, :], mask=jm[:, None] & (dv[None, :] < DV),
                     other=0.0)
        acc = _accumulate(acc, alpha, p, vt, DOT_F32)
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_safe[:, None]
    o_rows = o_ptr + (b * L + t).to(tl.int64)[:, None] * s_ot + hq[:, None] * s_oh + dv[None, :]
    o_ok = row_ok[:, None] & (dv[None, :] < DV)
    if DIRECT:
        tl.store(o_rows, out.to(o_ptr.dtype.element_ty), mask=o_ok)
    else:
        grp = (b * HKV + h) * RB + rb
        part = grp * S + s
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        r = tl.arange(0, BM)
        tl.store(plse_ptr + part.to(tl.int64) * BM + r, lse)
        # an empty split (a prefix shorter than the splits) writes its -inf log-sum-exp only; the merge skips it
        tl.store(po_ptr + part.to(tl.int64) * (BM * BDV) + r[:, None] * BDV + dv[None, :],
                 out.to(po_ptr.dtype.element_ty), mask=(l_i > 0)[:, None])
        if FUSED:
            tl.debug_barrier()  # every thread's partial stores happen-before this program's release below
            if tl.atomic_add(cnt_ptr + grp, 1, sem="acq_rel") == S - 1:  # the row block's last part to finish
                tl.store(cnt_ptr + grp, 0)  # zero again for the next call (and the next graph replay)
                out = _merge_parts(po_ptr, plse_ptr, grp, S, BM, BDV, MU)
                tl.store(o_rows, out.to(o_ptr.dtype.element_ty), mask=o_ok)


@triton.jit
def _merge_kernel(
    po_ptr, plse_ptr, o_ptr, s_ot, s_oh,
    HKV: tl.constexpr, G: tl.constexpr, L: tl.constexpr, DV: tl.constexpr, BDV: tl.constexpr,
    BM: tl.constexpr, RB: tl.constexpr, S: tl.constexpr, SP: tl.constexpr, MR: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()  # the partials of the split kernel before it
    # program (b, h * RB + rb, c): rows c * MR .. + MR of that row block
    b = tl.program_id(0)
    h = tl.program_id(1) // RB
    rb = tl.program_id(1) % RB
    r = tl.program_id(2) * MR + tl.arange(0, MR)
    rows = rb * BM + r
    row_ok = (rows < G * L) & (r < BM)
    t = rows // G
    hq = h * G + rows % G
    dv = tl.arange(0, BDV)
    sp = tl.arange(0, SP)
    base = ((b * HKV + h) * RB + rb) * S
    lse = tl.load(plse_ptr + (base + sp[None, :]).to(tl.int64) * BM + r[:, None],
                  mask=(sp[None, :] < S) & (r[:, None] < BM), other=float("-inf"))  # [MR, SP]
    mx = tl.max(lse, axis=1)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    w = tl.exp2(lse - mx[:, None])
    den = tl.sum(w, axis=1)
    acc = tl.zeros([MR, BDV], tl.float32)
    for s in tl.static_range(S):  # unrolled: every part's load in flight at once
        ws = tl.sum(tl.where(sp[None, :] == s, w, 0.0), axis=1)
        # not masked by the weight, so the loads need not wait for the log-sum-exps; an empty split's partial was
        # never written (NaN, say) and weighs 0: the `where` keeps it out
        po = tl.load(po_ptr + (base + s).to(tl.int64) * (BM * BDV) + r[:, None] * BDV + dv[None, :],
                     mask=r[:, None] < BM, other=0.0).to(tl.float32)
        acc += ws[:, None] * tl.where(ws[:, None] > 0, po, 0.0)
    out = acc / tl.where(den > 0, den, 1.0)[:, None]
    tl.store(o_ptr + (b * L + t).to(tl.int64)[:, None] * s_ot + hq[:, None] * s_oh + dv[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & (dv[None, :] < DV))




def _np2(x: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(x))


def _config(g, L, d, dv, interp):
    rows = g * L
    cap = 128 if max(d, dv) <= 128 else 64
    bm = min(cap, _np2(rows))
    bn = 64 if max(d, dv) <= 128 else 32
    warps = 8 if bm * max(d, dv) >= 128 * 128 else 4
    stages = 3 if max(d, dv) <= 128 else 2
    return bm, triton.cdiv(rows, bm), bn, warps, stages


# Split choice, fitted on the H200 (2026-12-02, 132 SMs, Qwen3-8B heads; benchmarks/HISTORY.md "Split count"): bs 1 /
# 4K fastest at 16 splits of 256 keys (22 µs; 25 at 32 splits, 40 at 64: each part's partial costs a write and a
# read), bs 1 / 32K at 32 (62 µs; 16: 75, 64: 77), bs 8 / 4K at 4 (58 µs; 5: 73, 8: 65).
MIN_SPLIT_KEYS = 256  # prefix keys per split at least
MAX_SPLITS = 64
CTAS_PER_SM = 2  # programs resident per SM (the K / V stages' shared memory bounds it)


# Long prefixes at tiny batches (attention-small, kernel run 12, bs 1 / 32K on the H200): half the splits, each
# walking twice the keys in tiles of 128, beat the fill rule's splits of 64-key tiles (53.1 against 59.3 µs for one
# replay, 43.3 against 50.8 per call in a 36-layer graph); at 4K (16 splits of 256 keys) tiles of 128 lose.
LONG_SPLITS = 32  # the fill rule's split count from which ...
LONG_SPLIT_KEYS = 1024  # ... splits of at least this many keys are halved, at key tiles of 128
# the partials in the queries' own 16-bit dtype (half the write and read; 19.5 -> 18.6 µs at bs 1 / 4K in the same
# run); float32 calls keep float32 partials
SAME_PARTIALS = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def choose_splits(programs: int, max_prefix: int, sms: int) -> int:
    """Prefix splits for `programs` (request, KV head, row block) programs over prefixes of at most `max_prefix`
    keys: none when they nearly fill the GPU already (FlashDecoding's rule: 80% of the SMs); else the power of two
    nearest below one wave of resident programs (flashinfer's planner fills one wave), at least MIN_SPLIT_KEYS keys
    each, at most MAX_SPLITS."""
    if programs >= 0.8 * sms:
        return 1
    by_fill = triton.next_power_of_2(triton.cdiv(CTAS_PER_SM * sms, programs) + 1) // 2
    by_keys = max(1, triton.cdiv(max_prefix, MIN_SPLIT_KEYS))
    return max(1, min(by_fill, by_keys, MAX_SPLITS))


@dataclass(frozen=True)
class Launch:
    """How one call runs: the row blocks of BM rows, the prefix splits and the parts (programs per row block), the
    key tile BN; `parts` > 1 means a merge of the parts' partials (in `partials` dtype): a second launch, or in the
    kernel by each row block's last part when `fused`."""

    block_m: int
    row_blocks: int
    block_n: int
    warps: int
    stages: int
    splits: int  # at most: a prefix of fewer key tiles fills fewer
    parts: int
    merge_rows: int  # rows per merge program
    partials: str
    fused: bool
    merge_unroll: int  # parts a fused merge loads at once
    prefetch: bool = True  # each key tile's slots loaded one tile ahead, V before the QK dot
    pdl: bool = False  # programmatic dependent launch (on by default from Hopper on): each launch set up while the
    # kernel before it runs (kernel run 13: 0.6-0.9 µs off at bs 1, in a graph too; no change at bs 8 and 64)
    early: int = 1  # what a `prefix_ready` call reads of its prefix before the launch's wait: 0 nothing, 1 the index
    # (lengths, the first tile's slots), 2 the first key tile's K and V too (the loop's first tile peeled); not yet
    # timed on a GPU (bench_kernels.py --parts attention-early), so the server's adapter does not promise it yet


PARTIALS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _int_in(x, lo, hi, pow2=False):
    return isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi and not (pow2 and x & (x - 1))


# `tune` keys: (accepts, what it accepts)
TUNE = {
    "block_n": (lambda x: _int_in(x, 16, 256, pow2=True), "a power of two in 16..256 (keys per tile)"),
    "block_m": (lambda x: _int_in(x, 16, 128, pow2=True), "a power of two in 16..128 (query rows a program: its "
                "KV head's G query heads x the L tokens, packed)"),
    "num_warps": (lambda x: _int_in(x, 1, 16, pow2=True), "a power of two in 1..16"),
    "num_stages": (lambda x: _int_in(x, 1, 8), "an integer in 1..8"),
    "partials": (lambda x: isinstance(x, str) and x in PARTIALS, "one of " + ", ".join(PARTIALS)),
    "fused_merge": (lambda x: isinstance(x, bool), "a bool (merge in the kernel, no second launch)"),
    "tree_part": (lambda x: isinstance(x, bool), "a bool (False: the last split attends the tree too)"),
    "merge_rows": (lambda x: _int_in(x, 2, 128, pow2=True), "a power of two in 2..128 (rows per merge program)"),
    "merge_unroll": (lambda x: _int_in(x, 1, 16), "an integer in 1..16 (parts a fused merge loads at once)"),
    "prefetch": (lambda x: isinstance(x, bool), "a bool (each tile's KV slots loaded one tile ahead, V before the dot)"),
    "pdl": (lambda x: isinstance(x, bool), "a bool (programmatic dependent launch; taken on Hopper or newer only)"),
    "early": (lambda x: _int_in(x, 0, 2), "0, 1 or 2 (what a prefix_ready call reads before its launch's wait: "
              "nothing, the prefix's index, the index and the first key tile)"),
}


def _checked_tune(tune) -> dict:
    if tune is None:
        return {}
    if not isinstance(tune, dict):
        raise ValueError(f"tune={tune!r}: use a dict of launch overrides ({', '.join(TUNE)}) or None")
    for key, value in tune.items():
        if key not in TUNE:
            raise ValueError(f"tune: unknown key {key!r}; known: {', '.join(TUNE)}")
        accepts, what = TUNE[key]
        if not accepts(value):
            raise ValueError(f"tune[{key!r}]={value!r}: use {what}")
    return tune


def launch_choice(bs: int, hq: int, hkv: int, d: int, dv: int, L: int, max_prefix: int, device: torch.device,
                  num_splits: int | None = None, tune: dict | None = None, dtype: torch.dtype | None = None) -> Launch:
    """The launch of a call on `bs` requests of L verify tokens over prefixes of at most `max_prefix` keys, in
    `dtype` (the queries'); `tune` overrides parts of it (keys: `TUNE`). The split outputs' dtype, the tree's part
    and the merge only matter when there are splits (more than one part)."""
    t = _checked_tune(tune)
    bm, rb, bn, warps, stages = _config(hq // hkv, L, d, dv, device.type != "cuda")
    if "block_m" in t:  # fewer rows a program: more programs over the same splits, each key tile read by each
        bm = t["block_m"]
        rb = triton.cdiv((hq // hkv) * L, bm)
    sms = sm_count(device, 8)
    if num_splits is None:
        num_splits = choose_splits(bs * hkv * rb, max_prefix, sms)
        if num_splits >= LONG_SPLITS and max_prefix >= LONG_SPLIT_KEYS * num_splits and bn == 64:
            num_splits, bn = num_splits // 2, 128
    if not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits={num_splits!r}: use an integer >= 1, or None for the heuristic")
    # rows per merge program: enough merge programs to spread the partials' read over the SMs
    mr = max(2, min(16, triton.next_power_of_2(max(1, bs * hkv * rb * bm // (2 * sms)))))
    parts = 1 if num_splits == 1 else num_splits + (1 if t.get("tree_part", True) else 0)
    partials = t.get("partials", SAME_PARTIALS.get(dtype, "fp32"))
    # a fused merge of fp32 partials 4 at a time spills registers at 4 warps (sm_90 compile, 64 x 128 row blocks)
    unroll = t.get("merge_unroll", 2 if partials == "fp32" else 4)
    return Launch(bm, rb, t.get("block_n", bn), t.get("num_warps", warps), t.get("num_stages", stages), num_splits,
                  parts, t.get("merge_rows", mr), partials, parts > 1 and t.get("fused_merge", False), unroll,
                  t.get("prefetch", True), t.get("pdl", True) and _pdl_ok(device), t.get("early", 1))


def _run(q, k, v, kb, vb, kv_indptr, kv_indices, page_table, prefix_lens, page, custom_mask, L, sm_scale,
         mask_indptr, out, num_splits, max_prefix, tune, causal, prefix_ready=False):
    tokens, hq, d = q.shape
    hkv = k.shape[1]
    dv = v.shape[2]
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    if tokens % L:
        raise ValueError(f"q has {tokens} tokens, not a multiple of L = {L}")
    check_mask_args(custom_mask, causal)
    g = hq // hkv
    bs = tokens // L
    if out is None:
        out = torch.empty(tokens, hq, dv, dtype=q.dtype, device=q.device)
    if bs == 0:
        return out
    scale = (d ** -0.5 if sm_scale is None else sm_scale) * 1.4426950408889634
    c = launch_choice(bs, hq, hkv, d, dv, L, max_prefix, q.device, num_splits, tune, q.dtype)
    bm, rb, s = c.block_m, c.row_blocks, c.parts
    direct = s == 1
    bdv = _np2(dv)
    if direct:
        po = plse = out
    else:
        po = torch.empty(bs * hkv * rb * s * bm * bdv, dtype=PARTIALS[c.partials], device=q.device)
        plse = torch.empty(bs * hkv * rb * s * bm, dtype=torch.float32, device=q.device)
    paged = page_table is not None
    dummy = kv_indptr if not paged else prefix_lens
    mask = dummy if causal else custom_mask if custom_mask.dtype != torch.bool else custom_mask.view(torch.uint8)
    counters = zeroed_counters("verify-merge", bs * hkv * rb, q.device) if c.fused else dummy
    _verify_kernel[(bs, hkv * rb, s)](
        q, k, v, kb, vb,
        kv_indptr if not paged else dummy, kv_indices if not paged else dummy,
        page_table if paged else dummy, prefix_lens if paged else dummy, page_table.stride(0) if paged else 0,
        mask, mask_indptr if mask_indptr is not None else dummy,
        out, po, plse, counters, scale, c.splits,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        kb.stride(0), kb.stride(1), vb.stride(0), vb.stride(1), out.stride(0), out.stride(1),
        HKV=hkv, G=g, L=L, LP=_np2(L), D=d, BD=_np2(d), DV=dv, BDV=bdv, BM=bm, RB=rb, BN=c.block_n,
        PAGED=paged, PAGE=page, MASK_FULL=mask_indptr is not None, CAUSAL=causal, DIRECT=direct, FUSED=c.fused,
        MU=c.merge_unroll, PREFETCH=c.prefetch, PDL=c.pdl, EARLY=c.early if prefix_ready else 0,
        DOT_F32=q.device.type != "cuda", num_warps=c.warps, num_stages=c.stages, **_pdl(c.pdl),
    )
    if not direct and not c.fused:
        mr = c.merge_rows
        _merge_kernel[(bs, hkv * rb, triton.cdiv(bm, mr))](po, plse, out, out.stride(0), out.stride(1), HKV=hkv, G=g,
                                                            L=L, DV=dv, BDV=bdv, BM=bm, RB=rb, S=s, SP=_np2(s, 2),
                                                            MR=mr, PDL=c.pdl, num_warps=4, **_pdl(c.pdl))
    return out


def _pdl_ok(device: torch.device) -> bool:
    return gdc_wait is not None and has_pdl(device)


def _pdl(on: bool) -> dict:
    return {"launch_pdl": True} if on else {}


def _check_inner(x, name):
    if x.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last (head-dim) axis")


def tree_attention_triton(q, k, v, k_buffer, v_buffer, kv_indptr, kv_indices, custom_mask, L, sm_scale=None,
                          mask_indptr=None, out=None, num_splits=None, tune=None, causal=False, prefix_ready=False):
    """Same signature and result as `tree_attention_reference` (sglang's layout); returns (bs*L, Hq, DV).
    `num_splits` and `tune` override the launch (see `launch_choice`). `causal` with no mask: a chain verify, its
    mask computed in the kernel (no mask tensor built per call, none read). `prefix_ready`: a promise that the
    prefix's index (kv_indptr, kv_indices) was written before the kernel launched just before this call; with a
    programmatic dependent launch the kernel then reads it before waiting for that kernel (a server's verify: sglang's
    KV store, which writes only the verify tokens' own slots, runs just before; the index was built before the
    forward)."""
    for x, n in [(q, "q"), (k, "k"), (v, "v"), (k_buffer, "k_buffer"), (v_buffer, "v_buffer")]:
        _check_inner(x, n)
    bs = max(1, kv_indptr.shape[0] - 1)
    return _run(q, k, v, k_buffer, v_buffer, kv_indptr, kv_indices, None, None, 1, custom_mask, L, sm_scale,
                mask_indptr, out, num_splits, triton.cdiv(kv_indices.shape[0], bs), tune, causal, prefix_ready)


def tree_attention_paged_triton(q, k, v, k_cache, v_cache, page_table, prefix_lens, page_size, custom_mask, L,
                                sm_scale=None, mask_indptr=None, out=None, num_splits=None, tune=None,
                                prefix_ready=False):
    """Paged layout, same signature and result as `tree_attention_paged_reference` (`prefix_ready`: the page table
    and prefix_lens, as in `tree_attention_triton`)."""
    hkv = k_cache.shape[-2]
    kb = k_cache.reshape(-1, hkv, k_cache.shape[-1])
    vb = v_cache.reshape(-1, hkv, v_cache.shape[-1])
    for x, n in [(q, "q"), (k, "k"), (v, "v"), (kb, "k_cache"), (vb, "v_cache")]:
        _check_inner(x, n)
    return _run(q, k, v, kb, vb, None, None, page_table, prefix_lens, page_size, custom_mask, L, sm_scale,
                mask_indptr, out, num_splits, page_table.shape[1] * page_size, tune, False, prefix_ready)
