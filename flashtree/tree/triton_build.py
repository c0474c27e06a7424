"""Trie-vote tree builder as one Triton launch: one program per request, bit-identical to `reference.build_vote_tree`.

Per request the program
1. walks the K draft positions once, keeping an N x N "candidates i and j agree so far" matrix; at depth d a trie node
   is (d, first candidate i reaching it), its vote the row sum of that matrix;
2. packs each node's rank key (votes desc, depth asc, first candidate asc), its parent's first candidate and its
   listing order (depth, candidate) into one int64 and sorts the N*K slots once (a bitonic sort in registers);
3. writes the W-1 best keys to the output as scratch, then reads them back as a W-sized vector and settles listing
   positions, parents, tokens and the EAGLE encoding with W x W comparisons (no scatter, no second sort).

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
    vot_ptr,  # (bs, M) int64 (also the sort scratch)
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
    KEY_T: tl.constexpr,  # tl.int32 when rank, parent and order fit in 31 bits, else tl.int64
):
    b = tl.program_id(0).to(tl.int64)
    base = cand_ptr + b * (N * K)
    i = tl.arange(0, NP)
    kk = tl.arange(0, KP)
    agree = (i[:, None] < N) & (i[None, :] < N)
    key2d = tl.full([NP, KP], -1, KEY_T)
    prev_first = tl.zeros([NP], tl.int32)
    for d in tl.static_range(K):
        ci = tl.load(base + i * K + d, mask=i < N, other=0)
        agree = agree & (ci[:, None] == ci[None, :])
        votes = tl.sum(agree.to(tl.int32), axis=1)
        first = tl.min(tl.where(agree, i[None, :], NP), axis=1)
        real = (first == i) & (i < N)
        rank = votes * (N * K) + (K - 1 - d) * N + (N - 1 - i)
        packed = (rank.to(KEY_T) << (OB + PB)) | (prev_first.to(KEY_T) << OB) | (d * N + i).to(KEY_T)
        key_d = tl.where(real, packed, -1)
        key2d = tl.where(kk[None, :] == d, key_d[:, None], key2d)
        prev_first = first
    flat = tl.reshape(key2d, [NP * KP])
    ranked = tl.sort(flat, descending=True)
    p = tl.arange(0, NP * KP)
    row = b * M
    tl.store(vot_ptr + row + p, ranked.to(tl.int64), mask=p < M)
    tl.debug_barrier()
    q = tl.arange(0, MP)
    v = tl.load(vot_ptr + row + q, mask=(q < M) & (q < NP * KP), other=-1)
    tl.debug_barrier()

    valid = v >= 0
    o = (v & ((1 << OB) - 1)).to(tl.int32)
    pf = ((v >> OB) & ((1 << PB) - 1)).to(tl.int32)
    nvotes = (v >> (OB + PB)) // (N * K)
    d0 = o // N
    m = o % N
    # listing position: valid nodes by (depth, first candidate), padding keeps its rank slot (all after the valid).
    less = valid[None, :] & (o[None, :] < o[:, None])
    pos = tl.where(valid, tl.sum(less.to(tl.int32), axis=1), q)
    # parent = 1 + listing position of node (d-1, pf); kept sets are prefix-closed so it is among the valid.
    po = (d0 - 1) * N + pf
    up = valid[None, :] & (o[None, :] < po[:, None])
    parent = tl.where(valid & (d0 > 0), tl.sum(up.to(tl.int32), axis=1) + 1, 0).to(tl.int64)
    # node 1 is the depth-1 node of the smallest first candidate: order value o < N, the minimum over valid.
    m1 = tl.min(tl.where(valid, o, N * K), axis=0)
    tok_pad = tl.load(base + m1 * K)
    tok = tl.load(base + m * K + d0, mask=valid, other=0)
    tok = tl.where(valid, tok, tok_pad)
    out = row + pos
    qm = q < M
    tl.store(tok_ptr + out, tok, mask=qm)
    tl.store(par_ptr + out, parent, mask=qm)
    tl.store(dep_ptr + out, tl.where(valid, d0 + 1, 1).to(tl.int64), mask=qm)
    tl.store(vot_ptr + out, tl.where(valid, nvotes, 0), mask=qm)
    tl.store(val_ptr + out, valid, mask=qm)
    tl.store(fc_ptr + out, tl.where(valid, m, N).to(tl.int64), mask=qm)
    if WRITE_EAGLE:
        ids = parent * W + (pos + 1)
        tl.store(ids_ptr + out, ids, mask=qm)
        pl_row = pl_ptr + b * PL
        tl.store(pl_row + pos + 1, ids, mask=qm & (pos + 1 < PL))
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
    ob, pb = max(1, (n * k - 1).bit_length()), max(1, (n - 1).bit_length())
    rank_bits = ((n + 1) * n * k).bit_length()
    if rank_bits + ob + pb > 63:
        raise ValueError(f"N = {n}, K = {k} are too large for the packed sort keys")
    key_t = tl.int32 if rank_bits + ob + pb <= 31 else tl.int64
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
    np_, kp = _np2(n), _np2(k)
    warps = 4 if np_ * kp <= 1024 else 8
    if bs > 0:
        _vote_tree_kernel[(bs,)](
            cand, out[0], out[1], out[2], out[3], valid, fc, ids, pl,
            N=n, K=k, M=m, W=width, PL=pl_w, NP=np_, KP=kp, MP=_np2(m), PLP=_np2(pl_w),
            WRITE_EAGLE=eagle, OB=ob, PB=pb, KEY_T=key_t, num_warps=warps,
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
