"""best-first's tree over independent positions (a DFLASH draft) in one launch: `grow_marginal` of
`policies/best_first.py`, bit for bit.

The reference keeps a frontier of every kept node's W - 1 best children and takes its maximum W - 1 times. Each
position's top k is sorted, so of one parent's children not yet taken the next best is always its next rank: the
kernel keeps one frontier entry per parent (slot 0 the root, slot i + 1 kept node i), so the frontier has W entries and
the reference's tie rule (the earlier frontier slot: the lower parent, then the lower rank) is the lowest slot among
the maxima. One program per request, one warp, W - 1 dependent rounds; with one warp nothing hides a round's latency,
so a round is kept to few dependent instructions:
- each slot is a key of two int32 words: the score's bits as an int32 that orders as the float does, then the slot
  reversed above the entry's (position, rank) cell, so the winner's score, slot and cell come out of one max;
- on a GPU with W <= 32 (one slot a lane) that max is two warp `redux.sync` instructions (the high words' maximum,
  then the low words' among the lanes holding it), else one int64 max reduction (the interpreter, W > 32);
- the pick opens two entries (its slot's next rank, its own first child one position further): two scalar loads from
  tables the program pulled into L1 at its start (PREFETCH, on a GPU).
The cell each pick came from is kept in registers and the tokens are gathered once after the loop.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .types import VoteTree

LINE = 32  # float32 scores per 128-byte cache line
CELL_BITS = 8  # bits of rank in a cell (position << CELL | rank): K and k below 256


@triton.jit
def _pick(vec, lanes, at):
    # vec[at] for a scalar index (one lane selected, the others summed as zeros: exact, -inf included)
    return tl.sum(tl.where(lanes == at, vec, tl.zeros_like(vec)), axis=0)


@triton.jit
def _ordered(score):
    # + 0.0 turns -0.0 into +0.0 (the reference's float compare ties them); then the bits as an int32 that orders as
    # the float does
    bits = (score + 0.0).to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _warp_max(x):
    # the maximum of an int32 over the warp's lanes, in every lane (sm_80 on)
    return tl.inline_asm_elementwise("redux.sync.max.s32 $0, $1, 0xffffffff;", "=r,r", [x], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def _frontier_max(f_score, low, REDUX: tl.constexpr):
    """(the best ordered score, its slot's low word) over the frontier, in every lane."""
    high = _ordered(f_score)
    if REDUX:
        top = _warp_max(high)
        top_low = _warp_max(tl.where(high == top, low, -1))
    else:
        key = tl.max((high.to(tl.int64) << 32) | low.to(tl.int64), axis=0)
        top = (key >> 32).to(tl.int32) + tl.zeros_like(high)
        top_low = (key & 0x7FFFFFFF).to(tl.int32) + tl.zeros_like(high)
    return top, top_low


@triton.jit
def _prefetch_l1(ptrs):
    tl.inline_asm_elementwise("prefetch.global.L1 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _grow_marginal_kernel(top_ptr, ids_ptr, tok_ptr, par_ptr, dep_ptr, val_ptr, vote_ptr, first_ptr,
                          K: tl.constexpr, KK: tl.constexpr, KEEP: tl.constexpr, FW: tl.constexpr,
                          PREFETCH: tl.constexpr, LINES: tl.constexpr, REDUX: tl.constexpr, CELL: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    neg = float("-inf")
    row = top_ptr + b * (K * KK)  # log q[pos * KK + rank]
    if PREFETCH:
        # both tables (K * KK scores and token ids, a few lines each) in flight at once, so no round and not the
        # final gather waits on a line from L2 or memory
        _prefetch_l1(row + tl.minimum(tl.arange(0, LINES) * 32, K * KK - 1))
        _prefetch_l1(ids_ptr + b * (K * KK) + tl.minimum(tl.arange(0, 2 * LINES) * 16, K * KK - 1))
    slots = tl.arange(0, FW)
    rev = (FW - 1 - slots) << 16  # the low word's slot part: the lower slot wins a tie
    # the frontier: per parent slot, its next child's score and (position, rank) cell, and the parent's own score
    f_score = tl.where(slots == 0, tl.load(row), neg)
    f_cell = tl.zeros([FW], dtype=tl.int32)
    f_base = tl.zeros([FW], dtype=tl.float32)
    outs = tl.arange(0, FW)
    o_cell = tl.zeros([FW], dtype=tl.int32)
    o_par = tl.zeros([FW], dtype=tl.int32)
    o_ok = tl.zeros([FW], dtype=tl.int32)
    for i in range(KEEP):
        high, low = _frontier_max(f_score, rev | f_cell, REDUX)
        best = tl.where(high < 0, high ^ 0x7FFFFFFF, high).to(tl.float32, bitcast=True)
        j = FW - 1 - (low >> 16)
        cell = low & 0xFFFF
        pos = cell >> CELL
        rank = cell & ((1 << CELL) - 1)
        ok = best > neg
        o_cell = tl.where(outs == i, cell, o_cell)
        o_par = tl.where(outs == i, j, o_par)
        o_ok = tl.where(outs == i, ok.to(tl.int32), o_ok)
        # the parent's next child: the next rank of the same position (nothing once the tree is full: a spent slot's
        # rank runs past k), and the new node's first child, one position further
        nxt = tl.load(row + pos * KK + rank + 1, mask=ok & (rank + 1 < KK), other=neg)
        fst = tl.load(row + (pos + 1) * KK, mask=ok & (pos + 1 < K), other=neg)
        f_score = tl.where(slots == j, f_base + nxt, f_score)
        f_cell = tl.where(slots == j, cell + 1, f_cell)
        f_score = tl.where(slots == i + 1, best + fst, f_score)
        f_cell = tl.where(slots == i + 1, (pos + 1) << CELL, f_cell)
        f_base = tl.where(slots == i + 1, best, f_base)
    keep = outs < KEEP
    o_pos = o_cell >> CELL
    o_at = o_pos * KK + (o_cell & ((1 << CELL) - 1))
    tokens = tl.load(ids_ptr + b * (K * KK) + o_at, mask=keep & (o_at < K * KK), other=0)
    first = _pick(tokens, outs, 0)
    valid = o_ok != 0
    row = b * KEEP + outs
    tl.store(tok_ptr + row, tl.where(valid, tokens, first), mask=keep)
    tl.store(par_ptr + row, tl.where(valid, o_par, 0).to(tl.int64), mask=keep)
    tl.store(dep_ptr + row, tl.where(valid, o_pos + 1, 1).to(tl.int64), mask=keep)
    tl.store(val_ptr + row, valid.to(tl.int8), mask=keep)
    tl.store(vote_ptr + row, tl.zeros([FW], dtype=tl.int64), mask=keep)  # no votes: nothing is drawn
    tl.store(first_ptr + row, tl.full([FW], 1, dtype=tl.int64), mask=keep)  # the builder's one placeholder candidate


def _on_gpu(t: torch.Tensor) -> bool:
    return t.is_cuda and os.environ.get("TRITON_INTERPRET") != "1"


def grow_marginal_triton(top: torch.Tensor, ids: torch.Tensor, width: int, *, prefetch: bool | None = None,
                         redux: bool | None = None) -> VoteTree:
    """`policies.best_first.grow_marginal` on CUDA: top / ids (bs, K, k) each position's k best log q and tokens,
    largest first. `prefetch` (default: on a GPU) pulls each request's tables into L1 before the rounds; `redux`
    (default: on a GPU from sm_80, at W <= 32) takes each round's maximum with warp reductions."""
    bs, k, kk = top.shape
    if max(k, kk) >= 1 << CELL_BITS or width > 1 << 15:
        raise ValueError(f"best-first grow packs a (position, rank) cell in 16 bits and a slot in 15: K = {k}, "
                         f"k = {kk} (each at most {(1 << CELL_BITS) - 1}), width {width} (at most {1 << 15})")
    keep = width - 1
    fw = max(2, triton.next_power_of_2(keep + 1))
    dev = top.device
    top = top.float().contiguous()
    ids = ids.long().contiguous()
    if prefetch is None:
        prefetch = _on_gpu(top)
    if redux is None:
        redux = _on_gpu(top) and fw <= 32 and torch.cuda.get_device_capability(dev)[0] >= 8
    if redux and fw > 32:
        raise ValueError(f"redux takes one frontier slot a lane: width {width} is above 32")
    # every output written by the one launch (valid as int8, viewed as bool: no extra kernels on the step)
    tokens, parents, depth, votes, first = (torch.empty((bs, keep), dtype=torch.int64, device=dev) for _ in range(5))
    valid = torch.empty((bs, keep), dtype=torch.int8, device=dev)
    if bs:
        _grow_marginal_kernel[(bs,)](top, ids, tokens, parents, depth, valid, votes, first, K=k, KK=kk, KEEP=keep,
                                     FW=fw, PREFETCH=prefetch, REDUX=redux, CELL=CELL_BITS,
                                     LINES=max(2, triton.next_power_of_2(triton.cdiv(k * kk, LINE))), num_warps=1)
    return VoteTree(tokens=tokens, parents=parents, depth=depth, votes=votes, valid=valid.view(torch.bool),
                    first_candidate=first, k=k)
