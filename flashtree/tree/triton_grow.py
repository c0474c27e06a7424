"""best-first's tree over independent positions (a DFLASH draft) in one launch: `grow_marginal` of
`policies/best_first.py`, bit for bit.

The reference keeps a frontier of every kept node's W - 1 best children and takes its maximum W - 1 times. Each
position's top k is sorted, so of one parent's children not yet taken the next best is always its next rank: the
kernel keeps one frontier entry per parent (slot 0 the root, slot i + 1 kept node i), so the frontier has W entries and
the reference's tie rule (the earlier frontier slot: the lower parent, then the lower rank) is the lowest slot among
the maxima. One program per request, one warp. Each frontier slot is one int64 key (the score's bits as an int32
that orders as the float does, then the slot reversed, then its table cell), so one max over the keys gives the
winner's score, slot and cell at once. A pick opens two entries (its slot's next rank, its first child one position
further: two scalar loads), so the next pick is the best of the runner-up and those two: with PICKS = 2 one
reduction carries (largest key, its slot's parent score, second key) and takes two nodes, halving the dependent
reductions. On a GPU the program first pulls its tables into L1 (PREFETCH), so no round waits on memory. The
(position, rank) cell each pick came from is kept in registers and the tokens are gathered once after the loop.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .types import VoteTree

LINE = 32  # float32 scores per 128-byte cache line


@triton.jit
def _pick(vec, lanes, at):
    # vec[at] for a scalar index (one lane selected, the others summed as zeros: exact, -inf included)
    return tl.sum(tl.where(lanes == at, vec, tl.zeros_like(vec)), axis=0)


@triton.jit
def _key(score, slots, cell, FW: tl.constexpr):
    # + 0.0 turns -0.0 into +0.0 (the reference's float compare ties them); then the bits as an int32 that orders as
    # the float does, above the reversed slot (the lower slot wins a tie) and the cell
    bits = (score + 0.0).to(tl.int32, bitcast=True)
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return (ordered.to(tl.int64) << 32) | (tl.cast(FW - 1 - slots, tl.int64) << 16) | tl.cast(cell, tl.int64)


@triton.jit
def _unkey(key, FW: tl.constexpr):
    ordered = (key >> 32).to(tl.int32)
    score = tl.where(ordered < 0, ordered ^ 0x7FFFFFFF, ordered).to(tl.float32, bitcast=True)
    return score, FW - 1 - ((key >> 16) & 0xFFFF).to(tl.int32), (key & 0xFFFF).to(tl.int32)


@triton.jit
def _prefetch_l1(ptrs):
    tl.inline_asm_elementwise("prefetch.global.L1 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _top2(a1, ab, a2, b1, bb, b2):
    # the larger key with its slot's parent score, and the second-largest key, of two lanes' (key, base, runner-up)
    first = a1 > b1
    second = tl.maximum(tl.where(first, b1, a1), tl.where(first, a2, b2))
    return tl.where(first, a1, b1), tl.where(first, ab, bb), second


@triton.jit
def _opened(row, best, cell, K: tl.constexpr, KK: tl.constexpr):
    # the two scores a pick opens: its parent's next child (the next rank of the same position; nothing once the tree
    # is full: a spent slot's cell points past its position) and its own first child, one position further
    ok = best > float("-inf")
    pos = cell // KK
    nxt = tl.load(row + cell + 1, mask=ok & (cell - pos * KK + 1 < KK), other=float("-inf"))
    fst = tl.load(row + (pos + 1) * KK, mask=ok & (pos + 1 < K), other=float("-inf"))
    return ok, pos, nxt, fst


@triton.jit
def _grow_marginal_kernel(top_ptr, ids_ptr, tok_ptr, par_ptr, dep_ptr, val_ptr, vote_ptr, first_ptr,
                          K: tl.constexpr, KK: tl.constexpr, KEEP: tl.constexpr, FW: tl.constexpr,
                          PREFETCH: tl.constexpr, LINES: tl.constexpr, PICKS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    neg = float("-inf")
    row = top_ptr + b * (K * KK)  # log q[pos * KK + rank]
    if PREFETCH:
        # both tables (K * KK scores and token ids, a few lines each) in flight at once, so no round and not the
        # final gather waits on a line from L2 or memory
        _prefetch_l1(row + tl.minimum(tl.arange(0, LINES) * 32, K * KK - 1))
        _prefetch_l1(ids_ptr + b * (K * KK) + tl.minimum(tl.arange(0, 2 * LINES) * 16, K * KK - 1))
    slots = tl.arange(0, FW)
    # the frontier: per parent slot, its next child's score and table cell, and the parent's own score
    f_score = tl.where(slots == 0, tl.load(row), neg)
    f_cell = tl.zeros([FW], dtype=tl.int32)
    f_base = tl.zeros([FW], dtype=tl.float32)
    outs = tl.arange(0, FW)
    o_cell = tl.zeros([FW], dtype=tl.int32)
    o_par = tl.zeros([FW], dtype=tl.int32)
    o_ok = tl.zeros([FW], dtype=tl.int32)
    for i in range(0, KEEP, PICKS):
        keys = _key(f_score, slots, f_cell, FW)
        if PICKS == 1:
            top1 = tl.max(keys, axis=0)
            base1 = 0.0
            top2 = top1
        else:
            # two picks per reduction: the second is the best of the runner-up and the two entries the first opens
            top1, base1, top2 = tl.reduce((keys, f_base, tl.full([FW], -(2**63), tl.int64)), 0, _top2)
        best, j, cell = _unkey(top1, FW)
        ok, pos, nxt, fst = _opened(row, best, cell, K, KK)
        o_cell = tl.where(outs == i, cell, o_cell)
        o_par = tl.where(outs == i, j, o_par)
        o_ok = tl.where(outs == i, ok.to(tl.int32), o_ok)
        f_score = tl.where(slots == j, f_base + nxt, f_score)
        f_cell = tl.where(slots == j, cell + 1, f_cell)
        f_score = tl.where(slots == i + 1, best + fst, f_score)
        f_cell = tl.where(slots == i + 1, (pos + 1) * KK, f_cell)
        f_base = tl.where(slots == i + 1, best, f_base)
        if PICKS == 2:
            # (past KEEP when KEEP is odd: written to slots and outputs that are never read or stored)
            top2 = tl.maximum(top2, tl.maximum(_key(base1 + nxt, j, cell + 1, FW),
                                               _key(best + fst, i + 1, (pos + 1) * KK, FW)))
            best, j, cell = _unkey(top2, FW)
            ok, pos, nxt, fst = _opened(row, best, cell, K, KK)
            o_cell = tl.where(outs == i + 1, cell, o_cell)
            o_par = tl.where(outs == i + 1, j, o_par)
            o_ok = tl.where(outs == i + 1, ok.to(tl.int32), o_ok)
            f_score = tl.where(slots == j, f_base + nxt, f_score)
            f_cell = tl.where(slots == j, cell + 1, f_cell)
            f_score = tl.where(slots == i + 2, best + fst, f_score)
            f_cell = tl.where(slots == i + 2, (pos + 1) * KK, f_cell)
            f_base = tl.where(slots == i + 2, best, f_base)
    keep = outs < KEEP
    tokens = tl.load(ids_ptr + b * (K * KK) + o_cell, mask=keep & (o_cell < K * KK), other=0)
    first = _pick(tokens, outs, 0)
    valid = o_ok != 0
    row = b * KEEP + outs
    tl.store(tok_ptr + row, tl.where(valid, tokens, first), mask=keep)
    tl.store(par_ptr + row, tl.where(valid, o_par, 0).to(tl.int64), mask=keep)
    tl.store(dep_ptr + row, tl.where(valid, o_cell // KK + 1, 1).to(tl.int64), mask=keep)
    tl.store(val_ptr + row, valid.to(tl.int8), mask=keep)
    tl.store(vote_ptr + row, tl.zeros([FW], dtype=tl.int64), mask=keep)  # no votes: nothing is drawn
    tl.store(first_ptr + row, tl.full([FW], 1, dtype=tl.int64), mask=keep)  # the builder's one placeholder candidate


def grow_marginal_triton(top: torch.Tensor, ids: torch.Tensor, width: int, *, prefetch: bool | None = None,
                         picks: int = 2) -> VoteTree:
    """`policies.best_first.grow_marginal` on CUDA: top / ids (bs, K, k) each position's k best log q and tokens,
    largest first. `prefetch` (default: on a GPU) pulls each request's table into L1 before the rounds; `picks`
    (1 or 2) nodes taken per reduction."""
    bs, k, kk = top.shape
    if k * kk >= 1 << 16 or width > 1 << 15:
        raise ValueError(f"best-first grow packs a table cell and a slot in 16 bits each: K x k = {k * kk}, "
                         f"width {width}")
    if picks not in (1, 2):
        raise ValueError(f"picks={picks}: 1 or 2 nodes per reduction")
    keep = width - 1
    dev = top.device
    top = top.float().contiguous()
    ids = ids.long().contiguous()
    if prefetch is None:
        prefetch = top.is_cuda and os.environ.get("TRITON_INTERPRET") != "1"
    # every output written by the one launch (valid as int8, viewed as bool: no extra kernels on the step)
    tokens, parents, depth, votes, first = (torch.empty((bs, keep), dtype=torch.int64, device=dev) for _ in range(5))
    valid = torch.empty((bs, keep), dtype=torch.int8, device=dev)
    if bs:
        _grow_marginal_kernel[(bs,)](top, ids, tokens, parents, depth, valid, votes, first, K=k, KK=kk, KEEP=keep,
                                     FW=max(2, triton.next_power_of_2(keep + 1)), PREFETCH=prefetch,
                                     LINES=max(2, triton.next_power_of_2(triton.cdiv(k * kk, LINE))), PICKS=picks,
                                     num_warps=1)
    return VoteTree(tokens=tokens, parents=parents, depth=depth, votes=votes, valid=valid.view(torch.bool),
                    first_candidate=first, k=k)
