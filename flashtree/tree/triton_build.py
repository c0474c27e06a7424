"""Trie-vote tree builder as one Triton launch: one program per request, bit-identical to `reference.build_vote_tree`.

Per request the program
1. loads the N x K candidate block once and finds, for every pair (i, j), the first draft position where candidates
   i and j differ; i and j then agree through depth d iff d is below it. A trie node is (d, first candidate i
   reaching it), its vote the number of j agreeing with i through d: all (d, i) at once, no loop over depths;
2. selects the W-1 best nodes (votes desc, depth asc, first candidate asc) without sorting: the (W-1)-th largest
   vote v* comes from counting nodes per vote threshold; nodes above v* are all kept, nodes at v* are taken in
   (depth, candidate) order, which is the flat slot order, so one prefix sum gives each node's tie rank and its
   listing position (kept nodes listed by (depth, first candidate), parents before children);
3. writes the kept nodes to their listing positions in the output as scratch, then reads them back as a W-sized
   vector and settles parents, tokens and the EAGLE encoding with W x W comparisons.

Fixed shapes, no host synchronisation: graph-capturable. The same launch fills `VoteTree` and `EagleEncoding`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .types import EagleEncoding, VoteTree


@triton.jit
def _vote_tree_kernel(
    cand_ptr,  # (bs, N, K) int64, contiguous
    tok_ptr,  # (bs, M) int64
    par_ptr,  # (bs, M) int64
    dep_ptr,  # (bs, M) int64
    vot_ptr,  # (bs, M) int64 (also the scratch of the kept nodes)
    val_ptr,  # (bs, M) bool
    fc_ptr,  # (bs, M) int64
    ids_ptr,  # (bs, M) int64  EAGLE node ids
    pl_ptr,  # (bs, PL) int64  EAGLE parent_list
    N: tl.constexpr,
    K: tl.constexpr,
    M: tl.constexpr,  # W - 1
    W: tl.constexpr,
    PL: tl.constexpr,  # W * (K - 1) + 1
    NP: tl.constexpr,
    KP: tl.constexpr,
    MP: tl.constexpr,
    PLP: tl.constexpr,
    WRITE_EAGLE: tl.constexpr,
    OB: tl.constexpr,  # bits of the listing order d * N + i
    PB: tl.constexpr,  # bits of a candidate index
):
    b = tl.program_id(0).to(tl.int64)
    base = cand_ptr + b * (N * K)
    i = tl.arange(0, NP)
    kk = tl.arange(0, KP)
    blk = tl.load(base + i[:, None] * K + kk[None, :], mask=(i[:, None] < N) & (kk[None, :] < K), other=0)
    # miss[i, j]: first position where candidates i and j differ (K if none, 0 for padding candidates)
    differ = blk[:, None, :] != blk[None, :, :]
    miss = tl.min(tl.where(differ, kk[None, None, :], K), axis=2)
    miss = tl.where((i[:, None] < N) & (i[None, :] < N), miss, 0)
    # [depth d, candidate i, candidate j]: i and j agree through depth d (d - 1 for the parent level)
    dd = kk[:, None, None]
    mm = miss[None, :, :]
    jj = i[None, None, :]
    votes = tl.sum((dd < mm).to(tl.int32), axis=2)
    first = tl.min(tl.where(dd < mm, jj, NP), axis=2)
    parent_first = tl.min(tl.where(dd <= mm, jj, NP), axis=2)
    real = (first == i[None, :]) & (i[None, :] < N) & (kk[:, None] < K)
    # flat slot p = d * NP + i: slots in (depth, candidate) order, the ranking's tie-break; 0 votes = not a node
    nv = tl.reshape(tl.where(real, votes, 0), [KP * NP])
    pf = tl.reshape(parent_first, [KP * NP])
    p = tl.arange(0, KP * NP)

    # v*: the largest v with at least M nodes of >= v votes (0 when the trie has fewer than M nodes)
    t = tl.arange(0, NP)
    more = tl.sum((nv[None, :] > t[:, None]).to(tl.int32), axis=1)  # more[t]: nodes with votes > t
    vstar = tl.max(tl.where(more >= M, t + 1, 0), axis=0)
    above = tl.sum(tl.where(t == vstar, more, 0), axis=0)
    is_above = nv > vstar
    is_tie = (nv == vstar) & (nv > 0)
    # one prefix sum counts both classes before each slot: above-nodes in the high 16 bits, tie-nodes in the low
    flags = (is_above.to(tl.int32) << 16) | is_tie.to(tl.int32)
    before = tl.cumsum(flags, axis=0) - flags
    tie_rank = before & 0xFFFF
    rest = M - above
    kept = is_above | (is_tie & (tie_rank < rest))
    pos = (before >> 16) + tl.minimum(tie_rank, rest)
    nkept = tl.minimum(tl.sum((nv > 0).to(tl.int32), axis=0), M)

    row = b * M
    o = (p // NP) * N + p % NP
    packed = (nv.to(tl.int64) << (OB + PB)) | (pf.to(tl.int64) << OB) | o
    q = tl.arange(0, MP)
    tl.store(vot_ptr + row + pos, packed, mask=kept)
    tl.store(vot_ptr + row + q, tl.full([MP], -1, tl.int64), mask=(q >= nkept) & (q < M))
    tl.debug_barrier()
    v = tl.load(vot_ptr + row + q, mask=q < M, other=-1)
    tl.debug_barrier()

    # q is the listing position: valid nodes by (depth, first candidate), then padding
    valid = v >= 0
    o = (v & ((1 << OB) - 1)).to(tl.int32)
    pf = ((v >> OB) & ((1 << PB) - 1)).to(tl.int32)
    nvotes = v >> (OB + PB)
    d0 = o // N
    m = o % N
    # parent = 1 + listing position of node (d-1, pf); kept sets are prefix-closed so it is among the valid.
    po = (d0 - 1) * N + pf
    up = valid[None, :] & (o[None, :] < po[:, None])
    parent = tl.where(valid & (d0 > 0), tl.sum(up.to(tl.int32), axis=1) + 1, 0).to(tl.int64)
    # node 1 is the depth-1 node of the smallest first candidate: order value o < N, the minimum over valid.
    m1 = tl.min(tl.where(valid, o, N * K), axis=0)
    tok_pad = tl.load(base + m1 * K)
    tok = tl.load(base + m * K + d0, mask=valid, other=0)
    tok = tl.where(valid, tok, tok_pad)
    out = row + q
    qm = q < M
    tl.store(tok_ptr + out, tok, mask=qm)
    tl.store(par_ptr + out, parent, mask=qm)
    tl.store(dep_ptr + out, tl.where(valid, d0 + 1, 1).to(tl.int64), mask=qm)
    tl.store(vot_ptr + out, tl.where(valid, nvotes, 0), mask=qm)
    tl.store(val_ptr + out, valid, mask=qm)
    tl.store(fc_ptr + out, tl.where(valid, m, N).to(tl.int64), mask=qm)
    if WRITE_EAGLE:
        ids = parent * W + (q + 1)
        tl.store(ids_ptr + out, ids, mask=qm)
        pl_row = pl_ptr + b * PL
        tl.store(pl_row + q + 1, ids, mask=qm & (q + 1 < PL))
        c = tl.arange(0, PLP)
        tl.store(pl_row + c, tl.full([PLP], -1, tl.int64), mask=(c < PL) & ((c == 0) | (c >= W)))


def _np2(x: int) -> int:
    return max(2, triton.next_power_of_2(x))


def _launch(candidates: torch.Tensor, width: int, eagle: bool):
    if candidates.dim() != 3:
        raise ValueError(f"candidates must be (bs, N, K), got shape {tuple(candidates.shape)}")
    if width < 2:
        raise ValueError(f"width must be >= 2 (the root plus at least one node), got {width}")
    bs, n, k = candidates.shape
    np_, kp = _np2(n), _np2(k)
    if np_ * kp >= 1 << 15:
        raise ValueError(f"N = {n}, K = {k} are too large: the slot counts must fit 15 bits")
    ob, pb = max(1, (n * k - 1).bit_length()), max(1, (n - 1).bit_length())
    cand = candidates.to(torch.int64).contiguous()
    m = width - 1
    dev = cand.device
    out = [torch.empty(bs, m, dtype=torch.int64, device=dev) for _ in range(4)]
    valid = torch.empty(bs, m, dtype=torch.bool, device=dev)
    fc = torch.empty(bs, m, dtype=torch.int64, device=dev)
    pl_w = width * (k - 1) + 1
    if eagle:
        ids = torch.empty(bs, m, dtype=torch.int64, device=dev)
        pl = torch.empty(bs, pl_w, dtype=torch.int64, device=dev)
    else:
        ids = pl = fc  # never written
    # the pair-by-depth tensors hold N^2 K lanes: more warps once they pass 4096
    warps = 4 if np_ * np_ * kp <= 4096 else 8
    if bs > 0:
        _vote_tree_kernel[(bs,)](
            cand, out[0], out[1], out[2], out[3], valid, fc, ids, pl,
            N=n, K=k, M=m, W=width, PL=pl_w, NP=np_, KP=kp, MP=_np2(m), PLP=_np2(pl_w),
            WRITE_EAGLE=eagle, OB=ob, PB=pb, num_warps=warps,
        )
    tree = VoteTree(tokens=out[0], parents=out[1], depth=out[2], votes=out[3], valid=valid, first_candidate=fc, k=k)
    if not eagle:
        return tree, None
    enc = EagleEncoding(draft_tokens=tree.tokens, top_scores_index=ids, parent_list=pl, topk=width, spec_steps=k,
                        num_verify_tokens=width)
    return tree, enc


def build_vote_tree_triton(candidates: torch.Tensor, width: int) -> VoteTree:
    """Same signature and result as `flashtree.tree.build_vote_tree`, one launch."""
    return _launch(candidates, width, eagle=False)[0]


def build_vote_tree_eagle_triton(candidates: torch.Tensor, width: int) -> tuple[VoteTree, EagleEncoding]:
    """The VoteTree and its EAGLE encoding (`to_eagle`) from the same single launch."""
    return _launch(candidates, width, eagle=True)
