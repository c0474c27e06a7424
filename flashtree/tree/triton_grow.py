"""best-first's tree over independent positions (a DFLASH draft) in one launch: `grow_marginal` of
`policies/best_first.py`, bit for bit.

The reference keeps a frontier of every kept node's W - 1 best children and takes its maximum W - 1 times. Each
position's top k is sorted, so of one parent's children not yet taken the next best is always its next rank: the
kernel keeps one frontier entry per parent (slot 0 the root, slot i + 1 kept node i), so the frontier has W entries and
the reference's tie rule (the earlier frontier slot: the lower parent, then the lower rank) is the lowest slot among
the maxima. One program per request, one warp (every reduction stays in registers); the (position, rank) cell each
pick came from is kept in registers and the tokens are gathered once after the loop.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .types import VoteTree


@triton.jit
def _pick(vec, lanes, at):
    # vec[at] for a scalar index (one lane selected, the others summed as zeros: exact, -inf included)
    return tl.sum(tl.where(lanes == at, vec, tl.zeros_like(vec)), axis=0)


@triton.jit
def _grow_marginal_kernel(top_ptr, ids_ptr, tok_ptr, par_ptr, dep_ptr, val_ptr, vote_ptr, first_ptr,
                          K: tl.constexpr, KK: tl.constexpr, KEEP: tl.constexpr,
                          FW: tl.constexpr, TW: tl.constexpr, KW: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    neg = float("-inf")
    cells = tl.arange(0, TW)
    table = tl.load(top_ptr + b * (K * KK) + cells, mask=cells < K * KK, other=neg)  # log q[pos * KK + rank]
    pos_lanes = tl.arange(0, KW)
    firsts = tl.load(top_ptr + b * (K * KK) + pos_lanes * KK, mask=pos_lanes < K, other=neg)  # each position's best
    slots = tl.arange(0, FW)
    # the frontier: per parent slot, its next child's score, table cell, and the parent's own score
    f_score = tl.where(slots == 0, _pick(firsts, pos_lanes, 0), neg)
    f_cell = tl.zeros([FW], dtype=tl.int32)
    f_base = tl.zeros([FW], dtype=tl.float32)
    outs = tl.arange(0, FW)
    o_cell = tl.zeros([FW], dtype=tl.int32)
    o_par = tl.zeros([FW], dtype=tl.int32)
    o_ok = tl.zeros([FW], dtype=tl.int32)
    for i in range(KEEP):
        best = tl.max(f_score, axis=0)
        ok = best > neg
        j = tl.min(tl.where(f_score == best, slots, FW), axis=0)
        cell = _pick(f_cell, slots, j)
        base = _pick(f_base, slots, j)
        pos = cell // KK
        rank = cell - pos * KK
        o_cell = tl.where(outs == i, cell, o_cell)
        o_par = tl.where(outs == i, j, o_par)
        o_ok = tl.where(outs == i, ok.to(tl.int32), o_ok)
        # the parent's next child: the next rank of the same position (nothing moves once the tree is full: a spent
        # slot's cell points past its position)
        sib = tl.where(ok & (rank + 1 < KK), base + _pick(table, cells, cell + 1), neg)
        f_score = tl.where(slots == j, sib, f_score)
        f_cell = tl.where(slots == j, cell + 1, f_cell)
        # the new node's first child, one position further
        child = tl.where(ok & (pos + 1 < K), best + _pick(firsts, pos_lanes, pos + 1), neg)
        f_score = tl.where(slots == i + 1, child, f_score)
        f_cell = tl.where(slots == i + 1, (pos + 1) * KK, f_cell)
        f_base = tl.where(slots == i + 1, best, f_base)
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


def grow_marginal_triton(top: torch.Tensor, ids: torch.Tensor, width: int) -> VoteTree:
    """`policies.best_first.grow_marginal` on CUDA: top / ids (bs, K, k) each position's k best log q and tokens,
    largest first."""
    bs, k, kk = top.shape
    keep = width - 1
    dev = top.device
    top = top.float().contiguous()
    ids = ids.long().contiguous()
    # every output written by the one launch (valid as int8, viewed as bool: no extra kernels on the step)
    tokens, parents, depth, votes, first = (torch.empty((bs, keep), dtype=torch.int64, device=dev) for _ in range(5))
    valid = torch.empty((bs, keep), dtype=torch.int8, device=dev)
    if bs:
        _grow_marginal_kernel[(bs,)](top, ids, tokens, parents, depth, valid, votes, first, K=k, KK=kk, KEEP=keep,
                                     FW=max(2, triton.next_power_of_2(keep + 1)),
                                     TW=max(2, triton.next_power_of_2(k * kk)), KW=max(2, triton.next_power_of_2(k)),
                                     num_warps=1)
    return VoteTree(tokens=tokens, parents=parents, depth=depth, votes=votes, valid=valid.view(torch.bool),
                    first_candidate=first, k=k)
