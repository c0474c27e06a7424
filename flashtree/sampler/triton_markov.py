"""Fused Triton kernel for `flashtree.sampler.markov.markov_draws`: a block's N Markov draws in K launches.

Launch j (grid: vocabulary tiles x groups of row blocks) is step j for all rows. Each program loads its tile of w2
once, then per row block of its group loads their step j - 1 tokens (the anchor at j = 0), gathers w1[prev], forms its tile of w2 @ w1[prev] with one
`tl.dot`, adds the base logits,
rounds as sglang's torch ops would, adds in-kernel Philox Gumbel noise on sampled rows and writes its tile's maximum
and argmax per row; the row block's last program to finish (a ticket counter) merges the tiles into the step's tokens.
The last launch's last program advances the noise state's call counter. Against the torch ops DSPARK's Markov head
and a Gumbel-max sampler run per step (embedding, GEMV, add, exponential fill, log, scale, two argmaxes, select: about
ten launches and several rows x V buffers), this is one launch per step and keeps nothing of size rows x V. The
ticket counters are shared with the row sampler's (zero between launches): calls must not overlap on two streams.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .triton_sampler import _ticket_buffer, _uniform

_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def _merge_tiles(pmax_ptr, parg_ptr, rows, live, NT, NTP: tl.constexpr):
    """Each row's token: the first tile at the row's maximum holds its lowest id. (.cg: other programs of this launch
    wrote the partials; no stale L1 lines.)"""
    t = tl.arange(0, NTP)
    offs = rows[:, None] * NT + t[None, :]
    m = live[:, None] & (t[None, :] < NT)
    pm = tl.load(pmax_ptr + offs, mask=m, other=-float("inf"), cache_modifier=".cg")
    pa = tl.load(parg_ptr + offs, mask=m, other=0, cache_modifier=".cg")
    best = tl.max(pm, axis=1)
    first = tl.min(tl.where(pm == best[:, None], t[None, :], NTP), axis=1)
    return tl.sum(tl.where(t[None, :] == first[:, None], pa, 0), axis=1)


# Integer arguments that change per call or per step: one compiled kernel for all their values.
@triton.jit(do_not_specialize=["ROWS", "V", "N", "K", "step", "NT", "BLOCKS", "GROUPS"])
def _markov_step_kernel(
    base_ptr, stride_bb, stride_bk, anchor_ptr, w1_ptr, stride_w1, w2_ptr, stride_w2,
    invt_ptr, greedy_ptr, pmax_ptr, parg_ptr, ticket_ptr, out_ptr, state_ptr,
    ROWS, V, N, K, step, NT, BLOCKS, GROUPS,
    R: tl.constexpr, RP: tl.constexpr, BR: tl.constexpr, BV: tl.constexpr, NTP: tl.constexpr,
    FIRST: tl.constexpr, LAST: tl.constexpr, BIAS_DT: tl.constexpr, SUM_DT: tl.constexpr, PREC: tl.constexpr,
    UPCAST: tl.constexpr,
):
    # Program (tile, group) loads its tile of w2 once and streams the group's row blocks past it: GROUPS = BLOCKS
    # gives a program per row block (the most parallel), fewer groups read w2 fewer times (all of it once per
    # group and step: 78 MB at Qwen3-8B's rank 256).
    pv = tl.program_id(0)
    pg = tl.program_id(1)
    calls = tl.load(state_ptr + 1)
    c = tl.arange(0, RP)
    cols = pv * BV + tl.arange(0, BV)
    in_v = cols < V
    w2t = tl.load(w2_ptr + cols[None, :].to(tl.int64) * stride_w2 + c[:, None],
                  mask=in_v[None, :] & (c[:, None] < R), other=0.0)
    for pb in range(pg, BLOCKS, GROUPS):
        rows = pb * BR + tl.arange(0, BR)
        live = rows < ROWS
        if FIRST:
            prev = tl.load(anchor_ptr + rows // N, mask=live, other=0).to(tl.int64)
        else:  # the previous launch's merge wrote them
            prev = tl.load(out_ptr + rows * K + step - 1, mask=live, other=0)
        emb = tl.load(w1_ptr + prev[:, None] * stride_w1 + c[None, :], mask=live[:, None] & (c[None, :] < R),
                      other=0.0)
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
        z = tl.zeros((BR, BV), dtype=tl.uint32)
        u = _uniform(tl.load(state_ptr), (z + cols[None, :]).to(tl.uint32), (z + rows[:, None]).to(tl.uint32),
                     (z + step).to(tl.uint32), (z + calls).to(tl.uint32))
        score = tl.where(greedy[:, None], logits, logits * invt[:, None] - tl.log(-tl.log(u)))
        score = tl.where(in_v[None, :], score, -float("inf"))
        tmax, targ = tl.max(score, axis=1, return_indices=True)
        tl.store(pmax_ptr + rows * NT + pv, tmax, mask=live)
        tl.store(parg_ptr + rows * NT + pv, pv * BV + targ, mask=live)
        tl.debug_barrier()  # the partials' stores happen-before this program's release below
        # the row block's last tile to finish merges its tiles (ticket counters are zero between launches)
        if tl.atomic_add(ticket_ptr + pb, 1, sem="acq_rel") == NT - 1:
            tl.store(ticket_ptr + pb, 0)
            tl.store(out_ptr + rows * K + step, _merge_tiles(pmax_ptr, parg_ptr, rows, live, NT, NTP).to(tl.int64),
                     mask=live)
    if LAST:  # the launch's very last program advances the call counter: every program has read it by then
        if tl.atomic_add(ticket_ptr + BLOCKS, 1, sem="acq_rel") == NT * GROUPS - 1:
            tl.store(ticket_ptr + BLOCKS, 0)
            tl.store(state_ptr + 1, calls + 1)


def markov_draws_triton(base_logits, anchor, w1, w2, n, inv_temperature, greedy, state, *, block_v: int | None = None,
                        block_rows: int = 16, groups: int | None = None, num_warps: int = 4) -> torch.Tensor:
    bs, k, v = base_logits.shape
    rank = w2.shape[1]
    rows = bs * n
    dev = base_logits.device
    if base_logits.stride(2) != 1:
        base_logits = base_logits.contiguous()
    # the kernel indexes these densely (DSPARK's graph tail hands over the anchors as a strided column view)
    anchor, inv_temperature, greedy = anchor.contiguous(), inv_temperature.contiguous(), greedy.contiguous()
    w1, w2 = w1.contiguous(), w2.contiguous()
    out = torch.empty((bs, n, k), dtype=torch.int64, device=dev)
    # H200, bf16 (BENCHMARKS.md, kernels): at one request's 8 rows 128-token tiles win for V = 49152 (82 vs 102 µs) and
    # lose for V = 151936 (946 vs 641: the merge reads twice the tiles); 256 from 8 requests up; 16 rows per program
    # beat 32 at 256 and 512 rows (694 vs 900, 1365 vs 1644 µs), and a program per row block beat one per tile
    # streaming every row block (1388 vs 694 µs at 256 rows, rank 32)
    # A program holds its R x BV tile of w2: wide ranks take narrower tiles (at most 16K elements), so Qwen3-8B's
    # DSPARK head (rank 256) runs 64-token tiles, not 256 x 256 (live at 8B shapes the draft graph with the N draws
    # took 8.9 ms at 32 requests against 1.2 ms at 1; the narrower tile is not yet measured: bench_kernels.py
    # --parts markov --markov-min-rank 256 does)
    rank_p = max(16, triton.next_power_of_2(rank))
    block_v = block_v or min(128 if rows <= 16 and v <= 65536 else 256, max(32, 16384 // rank_p))
    nt = triton.cdiv(v, block_v)
    pmax = torch.empty((rows, nt), dtype=torch.float32, device=dev)
    parg = torch.empty((rows, nt), dtype=torch.int32, device=dev)
    br = block_rows
    blocks = triton.cdiv(rows, br)
    # A wide head's w2 (V x R: 78 MB at Qwen3-8B's rank 256) read once per row block was most of the 8B draft
    # graph's time (8.9 ms at 32 requests, linear in the rows): there its tiles alone give thousands of programs, so
    # each streams every row block (read once per step; not yet measured). Narrow heads keep a program per row
    # block, measured fastest at rank 32.
    groups = min(groups or (1 if rank > 64 else blocks), blocks)
    tickets = _ticket_buffer(blocks + 1, dev)
    sum_dtype = torch.promote_types(base_logits.dtype, w2.dtype)
    meta = dict(
        R=rank, RP=rank_p, BR=br, BV=block_v, NTP=max(16, triton.next_power_of_2(nt)),
        BIAS_DT=_TL_DTYPES[w2.dtype], SUM_DT=_TL_DTYPES[sum_dtype],
        PREC="ieee" if w2.dtype == torch.float32 else "tf32", num_warps=num_warps,
        # float32 weights take the ieee dot; Triton's interpreter computes bf16 / fp16 dots wrongly, so it upcasts
        UPCAST=w2.dtype == torch.float32 or os.environ.get("TRITON_INTERPRET") == "1",
    )
    for j in range(k):
        _markov_step_kernel[(nt, groups)](
            base_logits, base_logits.stride(0), base_logits.stride(1), anchor, w1, w1.stride(0), w2, w2.stride(0),
            inv_temperature, greedy, pmax, parg, tickets, out, state, rows, v, n, k, j, nt, blocks, groups,
            FIRST=j == 0, LAST=j == k - 1, **meta,
        )
    return out
