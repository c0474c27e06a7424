"""best-first's tree over independent positions (a DFLASH draft) in one launch: `grow_marginal` of
`policies/best_first.py`, bit for bit.

The reference keeps a frontier of every kept node's W - 1 best children and takes its maximum W - 1 times. Each
position's top k is sorted, so of one parent's children not yet taken the next best is always its next rank: the
kernel keeps one frontier entry per parent (slot 0 the root, slot i + 1 kept node i), so the frontier has W entries and
the reference's tie rule (the earlier frontier slot: the lower parent, then the lower rank) is the lowest slot among
the maxima. One program per request, one warp; a round is one reduction over the frontier that carries the winner's
fields with it, and the two scores it needs next (its slot's next rank, the first child one position further) are
loaded for every slot before it, so their latency overlaps the reduction. The (position, rank) cell each pick came
from is kept in registers and the tokens are gathered once after the loop.
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
def _frontier_max(s1, j1, c1, n1, f1, s2, j2, c2, n2, f2):
    # the higher score, the lower slot on a tie (the reference's rule), carrying that slot's fields along
    first = (s1 > s2) | ((s1 == s2) & (j1 < j2))
    return (tl.where(first, s1, s2), tl.where(first, j1, j2), tl.where(first, c1, c2), tl.where(first, n1, n2),
            tl.where(first, f1, f2))


@triton.jit
def _grow_marginal_kernel(top_ptr, ids_ptr, tok_ptr, par_ptr, dep_ptr, val_ptr, vote_ptr, first_ptr,
                          K: tl.constexpr, KK: tl.constexpr, KEEP: tl.constexpr, FW: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    neg = float("-inf")
    row = top_ptr + b * (K * KK)  # log q[pos * KK + rank]
    slots = tl.arange(0, FW)
    # the frontier: per parent slot, its next child's score, table cell, and the parent's own score
    f_score = tl.where(slots == 0, tl.load(row), neg)
    f_cell = tl.zeros([FW], dtype=tl.int32)
    f_base = tl.zeros([FW], dtype=tl.float32)
    outs = tl.arange(0, FW)
    o_cell = tl.zeros([FW], dtype=tl.int32)
    o_par = tl.zeros([FW], dtype=tl.int32)
    o_ok = tl.zeros([FW], dtype=tl.int32)
    for i in range(KEEP):
        # every slot's two follow-ups, loaded (L1 hits after the first rounds) before the round's one reduction so
        # their latency overlaps it: its next rank's path score, and the best score one position further
        n_next = f_base + tl.load(row + f_cell + 1, mask=f_cell + 1 < K * KK, other=neg)
        f_pos = f_cell // KK + 1
        n_first = tl.load(row + f_pos * KK, mask=f_pos < K, other=neg)
        best, j, cell, nxt, fst = tl.reduce((f_score, slots, f_cell, n_next, n_first), 0, _frontier_max)
        ok = best > neg
        pos = cell // KK
        rank = cell - pos * KK
        o_cell = tl.where(outs == i, cell, o_cell)
        o_par = tl.where(outs == i, j, o_par)
        o_ok = tl.where(outs == i, ok.to(tl.int32), o_ok)
        # the parent's next child: the next rank of the same position (nothing moves once the tree is full: a spent
        # slot's cell points past its position)
        sib = tl.where(ok & (rank + 1 < KK), nxt, neg)
        f_score = tl.where(slots == j, sib, f_score)
        f_cell = tl.where(slots == j, cell + 1, f_cell)
        # the new node's first child, one position further
        child = tl.where(ok & (pos + 1 < K), best + fst, neg)
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
                                     FW=max(2, triton.next_power_of_2(keep + 1)), num_warps=1)
    return VoteTree(tokens=tokens, parents=parents, depth=depth, votes=votes, valid=valid.view(torch.bool),
                    first_candidate=first, k=k)
