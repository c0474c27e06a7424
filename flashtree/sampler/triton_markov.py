"""Triton kernels for `flashtree.sampler.markov.markov_draws`: a block's N Markov draws, step by step, in two forms.

* fused (`markov_draws_fused`), narrow heads: launch j (grid: vocabulary tiles x row blocks) is step j for all rows.
  Each program loads its tile of w2 and its rows' step j - 1 tokens (the anchor at j = 0), gathers w1[prev], forms
  its tile of w2 @ w1[prev] with one `tl.dot`, adds the base logits, rounds as sglang's torch ops would, adds
  in-kernel Philox Gumbel noise on sampled rows and writes its tile's maximum and argmax per row; the row block's last
  program to finish (a ticket counter) merges the tiles into the step's tokens. One launch per step, nothing of size
  rows x V in memory. It reads w2 once per row block and step: right for SmolLM2's rank 32 (w2 9 MB), 3-5x slower
  than torch at Qwen3-8B's rank 256 (w2 78 MB; H200, BENCHMARKS.md, kernels).
* GEMM + pick (`markov_draws_gemm`), wide heads: per step the bias w1[prev] @ w2^T for all rows is one cuBLAS GEMM
  (sglang's own `F.linear`, so its rounding is DSPARK's bit for bit: w2 read once per step), and one Triton launch
  picks the tokens from base + bias with the same Philox noise as the fused form; a program takes a chunk of the
  vocabulary for a row block, so the merge reads a few dozen partials. It can also return log q of each drawn token
  at temperature 1 (an online log-sum-exp in the same pass), what the probability tree policies rank by.

The last launch's last program advances the noise state's call counter. The ticket counters are shared with the row
sampler's (zero between launches): calls must not overlap on two streams.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ..gpu import sm_count
from .triton_sampler import _ticket_buffer, _uniform

_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
GEMM_MIN_RANK = 128  # heads of at least this rank take the GEMM + pick form (H200: fused 3-5x slower at rank 256)


@triton.jit
def _merge_tiles(pmax_ptr, parg_ptr, rows, live, NT, NTP: tl.constexpr):
    """Each row's token: the first tile at the row's maximum holds its lowest id, and that tile's index. (.cg: other
    programs of this launch wrote the partials; no stale L1 lines.)"""
    t = tl.arange(0, NTP)
    offs = rows[:, None] * NT + t[None, :]
    m = live[:, None] & (t[None, :] < NT)
    pm = tl.load(pmax_ptr + offs, mask=m, other=-float("inf"), cache_modifier=".cg")
    pa = tl.load(parg_ptr + offs, mask=m, other=0, cache_modifier=".cg")
    best = tl.max(pm, axis=1)
    first = tl.min(tl.where(pm == best[:, None], t[None, :], NTP), axis=1)
    return tl.sum(tl.where(t[None, :] == first[:, None], pa, 0), axis=1), first


@triton.jit
def _scores(logits, invt, greedy, seed, calls, cols, rows, step, in_v, BR: tl.constexpr, BV: tl.constexpr):
    """Greedy rows score by their logits, sampled rows by logits / T + Gumbel noise (Philox counter = (token, row,
    step, call): the fused and GEMM forms draw the same noise)."""
    z = tl.zeros((BR, BV), dtype=tl.uint32)
    u = _uniform(seed, (z + cols[None, :]).to(tl.uint32), (z + rows[:, None]).to(tl.uint32),
                 (z + step).to(tl.uint32), (z + calls).to(tl.uint32))
    score = tl.where(greedy[:, None], logits, logits * invt[:, None] - tl.log(-tl.log(u)))
    return tl.where(in_v[None, :], score, -float("inf"))


@triton.jit
def _advance_calls(ticket_ptr, state_ptr, calls, PROGRAMS):
    # the launch's very last program advances the call counter: every program has read it by then
    if tl.atomic_add(ticket_ptr, 1, sem="acq_rel") == PROGRAMS - 1:
        tl.store(ticket_ptr, 0)
        tl.store(state_ptr + 1, calls + 1)


# Integer arguments that change per call or per step: one compiled kernel for all their values.
@triton.jit(do_not_specialize=["ROWS", "V", "N", "K", "step", "NT", "BLOCKS"])
def _fused_step_kernel(
    base_ptr, stride_bb, stride_bk, anchor_ptr, w1_ptr, stride_w1, w2_ptr, stride_w2,
    invt_ptr, greedy_ptr, pmax_ptr, parg_ptr, ticket_ptr, out_ptr, state_ptr,
    ROWS, V, N, K, step, NT, BLOCKS,
    R: tl.constexpr, RP: tl.constexpr, BR: tl.constexpr, BV: tl.constexpr, NTP: tl.constexpr,
    FIRST: tl.constexpr, LAST: tl.constexpr, BIAS_DT: tl.constexpr, SUM_DT: tl.constexpr, PREC: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pv = tl.program_id(0)
    pb = tl.program_id(1)
    calls = tl.load(state_ptr + 1)
    c = tl.arange(0, RP)
    cols = pv * BV + tl.arange(0, BV)
    in_v = cols < V
    w2t = tl.load(w2_ptr + cols[None, :].to(tl.int64) * stride_w2 + c[:, None],
                  mask=in_v[None, :] & (c[:, None] < R), other=0.0)
    rows = pb * BR + tl.arange(0, BR)
    live = rows < ROWS
    if FIRST:
        prev = tl.load(anchor_ptr + rows // N, mask=live, other=0).to(tl.int64)
    else:  # the previous launch's merge wrote them
        prev = tl.load(out_ptr + rows * K + step - 1, mask=live, other=0)
    emb = tl.load(w1_ptr + prev[:, None] * stride_w1 + c[None, :], mask=live[:, None] & (c[None, :] < R), other=0.0)
    # sglang's bias is a GEMM in the weights' dtype, accumulated in float32, and its sum with the base logits is
    # rounded to the promoted dtype: the same here, so greedy rows pick what DSPARK's own step picks (products of
    # bf16 / fp16 weights are exact in the float32 accumulator)
    if UPCAST:
        bias = tl.dot(emb.to(tl.float32), w2t.to(tl.float32), input_precision=PREC)
    else:
        bias = tl.dot(emb, w2t, out_dtype=tl.float32)
    bias = bias.to(BIAS_DT).to(tl.float32)
    req = (rows // N).to(tl.int64)
    base = tl.load(base_ptr + req[:, None] * stride_bb + step * stride_bk + cols[None, :],
                   mask=live[:, None] & in_v[None, :], other=0.0).to(tl.float32)
    logits = (base + bias).to(SUM_DT).to(tl.float32)
    invt = tl.load(invt_ptr + rows, mask=live, other=1.0)
    greedy = tl.load(greedy_ptr + rows, mask=live, other=1) != 0
    score = _scores(logits, invt, greedy, tl.load(state_ptr), calls, cols, rows, step, in_v, BR, BV)
    tmax, targ = tl.max(score, axis=1, return_indices=True)
    tl.store(pmax_ptr + rows * NT + pv, tmax, mask=live)
    tl.store(parg_ptr + rows * NT + pv, pv * BV + targ, mask=live)
    tl.debug_barrier()  # the partials' stores happen-before this program's release below
    # the row block's last tile to finish merges its tiles (ticket counters are zero between launches)
    if tl.atomic_add(ticket_ptr + pb, 1, sem="acq_rel") == NT - 1:
        tl.store(ticket_ptr + pb, 0)
        tok, _ = _merge_tiles(pmax_ptr, parg_ptr, rows, live, NT, NTP)
        tl.store(out_ptr + rows * K + step, tok.to(tl.int64), mask=live)
    if LAST:
        _advance_calls(ticket_ptr + BLOCKS, state_ptr, calls, NT * BLOCKS)


@triton.jit(do_not_specialize=["ROWS", "V", "N", "K", "step", "NT", "BLOCKS", "CHUNK"])
def _pick_step_kernel(
    base_ptr, stride_bb, stride_bk, bias_ptr, stride_bias, invt_ptr, greedy_ptr,
    pmax_ptr, parg_ptr, plogit_ptr, pm_ptr, ps_ptr, ticket_ptr, out_ptr, logp_ptr, state_ptr,
    ROWS, V, N, K, step, NT, BLOCKS, CHUNK,
    BR: tl.constexpr, BV: tl.constexpr, NTP: tl.constexpr, LAST: tl.constexpr, SUM_DT: tl.constexpr,
    LOGP: tl.constexpr,
):
    # program (row block, chunk): the chunk's tiles of BV tokens, a running best score (and, with LOGP, the logit at
    # it and an online log-sum-exp of the logits) per row; the row block's last chunk to finish merges
    pb = tl.program_id(0)
    pc = tl.program_id(1)
    calls = tl.load(state_ptr + 1)
    seed = tl.load(state_ptr)
    rows = pb * BR + tl.arange(0, BR)
    live = rows < ROWS
    req = (rows // N).to(tl.int64)
    invt = tl.load(invt_ptr + rows, mask=live, other=1.0)
    greedy = tl.load(greedy_ptr + rows, mask=live, other=1) != 0
    best = tl.full((BR,), -float("inf"), tl.float32)
    arg = tl.zeros((BR,), tl.int32)
    at = tl.zeros((BR,), tl.float32)
    m = tl.full((BR,), -float("inf"), tl.float32)
    s = tl.zeros((BR,), tl.float32)
    lo = pc * CHUNK
    for v0 in range(lo, tl.minimum(lo + CHUNK, V), BV):
        cols = v0 + tl.arange(0, BV)
        in_v = cols < V
        mask = live[:, None] & in_v[None, :]
        base = tl.load(base_ptr + req[:, None] * stride_bb + step * stride_bk + cols[None, :], mask=mask, other=0.0)
        bias = tl.load(bias_ptr + rows[:, None].to(tl.int64) * stride_bias + cols[None, :], mask=mask, other=0.0)
        logits = (base.to(tl.float32) + bias.to(tl.float32)).to(SUM_DT).to(tl.float32)
        score = _scores(logits, invt, greedy, seed, calls, cols, rows, step, in_v, BR, BV)
        tmax, targ = tl.max(score, axis=1, return_indices=True)
        better = tmax > best  # strictly: ties keep the earlier tile's lower id
        best = tl.where(better, tmax, best)
        arg = tl.where(better, v0 + targ, arg)
        if LOGP:
            hit = tl.arange(0, BV)[None, :] == targ[:, None]
            at = tl.where(better, tl.sum(tl.where(hit, logits, 0.0), axis=1), at)
            x = tl.where(in_v[None, :], logits, -float("inf"))
            m_new = tl.maximum(m, tl.max(x, axis=1))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
            m = m_new
    offs = rows * NT + pc
    tl.store(pmax_ptr + offs, best, mask=live)
    tl.store(parg_ptr + offs, arg, mask=live)
    if LOGP:
        tl.store(plogit_ptr + offs, at, mask=live)
        tl.store(pm_ptr + offs, m, mask=live)
        tl.store(ps_ptr + offs, s, mask=live)
    tl.debug_barrier()  # the partials' stores happen-before this program's release below
    if tl.atomic_add(ticket_ptr + pb, 1, sem="acq_rel") == NT - 1:
        tl.store(ticket_ptr + pb, 0)
        tok, first = _merge_tiles(pmax_ptr, parg_ptr, rows, live, NT, NTP)
        tl.store(out_ptr + rows * K + step, tok.to(tl.int64), mask=live)
        if LOGP:
            t = tl.arange(0, NTP)
            pt = rows[:, None] * NT + t[None, :]
            ok = live[:, None] & (t[None, :] < NT)
            pm = tl.load(pm_ptr + pt, mask=ok, other=-float("inf"), cache_modifier=".cg")
            ps = tl.load(ps_ptr + pt, mask=ok, other=0.0, cache_modifier=".cg")
            pl = tl.load(plogit_ptr + pt, mask=ok, other=0.0, cache_modifier=".cg")
            top = tl.max(pm, axis=1)
            lse = top + tl.log(tl.sum(ps * tl.exp(pm - top[:, None]), axis=1))
            chosen = tl.sum(tl.where(t[None, :] == first[:, None], pl, 0.0), axis=1)
            tl.store(logp_ptr + rows * K + step, chosen - lse, mask=live)
    if LAST:
        _advance_calls(ticket_ptr + BLOCKS, state_ptr, calls, NT * BLOCKS)


def _prepare(base_logits, anchor, inv_temperature, greedy, w1, w2):
    if base_logits.stride(2) != 1:
        base_logits = base_logits.contiguous()
    # the kernels index these densely (DSPARK's graph tail hands over the anchors as a strided column view)
    return (base_logits, anchor.contiguous(), inv_temperature.contiguous(), greedy.contiguous(), w1.contiguous(),
            w2.contiguous())


def markov_draws_fused(base_logits, anchor, w1, w2, n, inv_temperature, greedy, state, *, block_v: int | None = None,
                       block_rows: int = 16, num_warps: int = 4) -> torch.Tensor:
    base_logits, anchor, inv_temperature, greedy, w1, w2 = _prepare(base_logits, anchor, inv_temperature, greedy, w1,
                                                                    w2)
    bs, k, v = base_logits.shape
    rank = w2.shape[1]
    rows = bs * n
    dev = base_logits.device
    out = torch.empty((bs, n, k), dtype=torch.int64, device=dev)
    # H200, bf16 (BENCHMARKS.md, kernels): at one request's 8 rows 128-token tiles win for V = 49152 (82 vs 102 µs)
    # and lose for V = 151936 (946 vs 641: the merge reads twice the tiles); 256 from 8 requests up; 16 rows per
    # program beat 32 at 256 and 512 rows (694 vs 900, 1365 vs 1644 µs). A program holds an R x BV tile of w2.
    rank_p = max(16, triton.next_power_of_2(rank))
    block_v = block_v or min(128 if rows <= 16 and v <= 65536 else 256, max(32, 16384 // rank_p))
    nt = triton.cdiv(v, block_v)
    pmax = torch.empty((rows, nt), dtype=torch.float32, device=dev)
    parg = torch.empty((rows, nt), dtype=torch.int32, device=dev)
    blocks = triton.cdiv(rows, block_rows)
    tickets = _ticket_buffer(blocks + 1, dev)
    meta = dict(
        R=rank, RP=rank_p, BR=block_rows, BV=block_v, NTP=max(16, triton.next_power_of_2(nt)),
        BIAS_DT=_TL_DTYPES[w2.dtype], SUM_DT=_TL_DTYPES[torch.promote_types(base_logits.dtype, w2.dtype)],
        PREC="ieee" if w2.dtype == torch.float32 else "tf32", num_warps=num_warps,
        # float32 weights take the ieee dot; Triton's interpreter computes bf16 / fp16 dots wrongly, so it upcasts
        UPCAST=w2.dtype == torch.float32 or os.environ.get("TRITON_INTERPRET") == "1",
    )
    for j in range(k):
        _fused_step_kernel[(nt, blocks)](
            base_logits, base_logits.stride(0), base_logits.stride(1), anchor, w1, w1.stride(0), w2, w2.stride(0),
            inv_temperature, greedy, pmax, parg, tickets, out, state, rows, v, n, k, j, nt, blocks,
            FIRST=j == 0, LAST=j == k - 1, **meta,
        )
    return out


def markov_draws_gemm(base_logits, anchor, w1, w2, n, inv_temperature, greedy, state, *, return_logp: bool = False,
                      block_rows: int | None = None, block_v: int = 256, chunks: int | None = None,
                      num_warps: int = 4):
    base_logits, anchor, inv_temperature, greedy, w1, w2 = _prepare(base_logits, anchor, inv_temperature, greedy, w1,
                                                                    w2)
    bs, k, v = base_logits.shape
    rows = bs * n
    dev = base_logits.device
    out = torch.empty((bs, n, k), dtype=torch.int64, device=dev)
    logp = torch.empty((bs, n, k), dtype=torch.float32, device=dev) if return_logp else out
    br = block_rows or min(16, max(2, triton.next_power_of_2(rows)))
    blocks = triton.cdiv(rows, br)
    # about four programs per SM, at most 64 chunks a row (the merge reads them all)
    nt = chunks or min(64, max(1, triton.cdiv(4 * sm_count(dev, 4), blocks)))
    chunk = triton.cdiv(triton.cdiv(v, nt), block_v) * block_v
    nt = triton.cdiv(v, chunk)
    pmax = torch.empty((rows, nt), dtype=torch.float32, device=dev)
    parg = torch.empty((rows, nt), dtype=torch.int32, device=dev)
    # with log q: each chunk's logit at its best score and its log-sum-exp as (max, sum)
    plogit, pm, ps = (torch.empty_like(pmax) for _ in range(3)) if return_logp else (pmax, pmax, pmax)
    tickets = _ticket_buffer(blocks + 1, dev)
    sum_dt = _TL_DTYPES[torch.promote_types(base_logits.dtype, w2.dtype)]
    prev = anchor.long().repeat_interleave(n)
    flat = out.view(rows, k)
    for j in range(k):
        bias = F.linear(F.embedding(prev, w1), w2)  # (rows, V): sglang's VanillaMarkov bias, the same op
        _pick_step_kernel[(blocks, nt)](
            base_logits, base_logits.stride(0), base_logits.stride(1), bias, bias.stride(0), inv_temperature, greedy,
            pmax, parg, plogit, pm, ps, tickets, out, logp, state, rows, v, n, k, j, nt, blocks, chunk,
            BR=br, BV=block_v, NTP=max(16, triton.next_power_of_2(nt)), LAST=j == k - 1, SUM_DT=sum_dt,
            LOGP=return_logp, num_warps=num_warps,
        )
        prev = flat[:, j]
    return (out, logp) if return_logp else out


def markov_draws_triton(base_logits, anchor, w1, w2, n, inv_temperature, greedy, state, *, return_logp: bool = False):
    """The form for this head: GEMM + pick for wide heads or when log q is asked for, else fused."""
    if return_logp or w2.shape[1] >= GEMM_MIN_RANK:
        return markov_draws_gemm(base_logits, anchor, w1, w2, n, inv_temperature, greedy, state,
                                 return_logp=return_logp)
    return markov_draws_fused(base_logits, anchor, w1, w2, n, inv_temperature, greedy, state)
