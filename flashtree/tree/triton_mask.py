"""The verify forward's inputs in one Triton launch (one program per request), bit-identical to the reference
`encode.verify_inputs`: token ids, positions, sglang's FULL_MASK tree mask and the statistics rows.

Each program sums its mask offset over the earlier requests' seq_lens itself (no prefix-sum launch), writes its
prefix columns True in blocks, and gets the ancestor bits as a boolean transitive closure: A = self | parent,
squared ceil(log2(min(K, W-1))) times (a parent chain is at most K deep and W-1 long) with tl.dot, so the W x W
block takes a few tensor-core products instead of K dependent steps. Fixed shapes, no host synchronisation:
graph-capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .types import VerifyInputs, VoteTree
from .workspace import Workspace


@triton.jit
def _verify_inputs_kernel(
    tok_ptr, par_ptr, dep_ptr, val_ptr,  # (bs, M) tree
    anchor_ptr, seq_ptr,  # (bs,)
    cand_ptr,  # (bs, N, K) optional
    ids_ptr, pos_ptr, mask_ptr, stats_ptr,  # (bs, W), (bs*W,), flat FULL_MASK, (bs, 4) int32 optional
    M: tl.constexpr, W: tl.constexpr, WP: tl.constexpr, SQ: tl.constexpr,
    N: tl.constexpr, K: tl.constexpr, NP: tl.constexpr,
    SB: tl.constexpr,  # seq_lens summed per iteration
    PB: tl.constexpr,  # prefix columns written per iteration
    HAS_STATS: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    idx = tl.arange(0, WP)  # node index, 0 = root
    node = (idx >= 1) & (idx < W)
    row = idx < W

    # mask offset: sum over earlier requests of (seq_len + W) * W
    sb = tl.arange(0, SB)
    before = tl.zeros([], tl.int64)
    for j0 in range(0, b, SB):
        before += tl.sum(tl.load(seq_ptr + j0 + sb, mask=j0 + sb < b, other=0).to(tl.int64), axis=0)
    base = mask_ptr + (before + b * W) * W
    s = tl.load(seq_ptr + b).to(tl.int64)
    stride = s + W  # one mask row

    tok = tl.load(tok_ptr + b * M + idx - 1, mask=node, other=0)
    tl.store(ids_ptr + b * W + idx, tl.where(idx == 0, tl.load(anchor_ptr + b), tok), mask=row)
    dep = tl.load(dep_ptr + b * M + idx - 1, mask=node, other=0)
    tl.store(pos_ptr + b * W + idx, s + dep, mask=row)

    # the prefix: W rows of s True, PB columns at a time
    cols = tl.arange(0, PB)
    ones = tl.full([WP, PB], 1, tl.int1)
    for c0 in range(0, s, PB):
        c = c0 + cols
        tl.store(base + idx[:, None] * stride + c[None, :], ones, mask=row[:, None] & (c[None, :] < s))

    # ancestor-or-self bits: A = self | parent, squared SQ times (paths of up to 2^SQ steps); the 0/1 products'
    # counts (<= W) are exact in fp16 inputs and fp32 sums
    par = tl.load(par_ptr + b * M + idx - 1, mask=node, other=0)
    anc = ((idx[:, None] == idx[None, :]) | (par[:, None] == idx[None, :])).to(tl.float16)
    for _ in tl.static_range(SQ):
        anc = (tl.dot(anc, anc) > 0).to(tl.float16)
    tl.store(base + idx[:, None] * stride + s + idx[None, :], anc > 0, mask=row[:, None] & row[None, :])

    if HAS_STATS:
        n = tl.arange(0, NP)
        differ = tl.zeros([NP, NP], tl.int32)  # positions where candidates i and j differ
        for d in tl.static_range(K):
            col = tl.load(cand_ptr + b * (N * K) + n * K + d, mask=n < N, other=0)
            differ += (col[:, None] != col[None, :]).to(tl.int32)
        dup = tl.sum(((differ == 0) & (n[None, :] < n[:, None])).to(tl.int32), axis=1) > 0
        distinct = tl.sum(((n < N) & ~dup).to(tl.int32), axis=0)
        size = tl.sum(tl.load(val_ptr + b * M + idx - 1, mask=node, other=0).to(tl.int32), axis=0)
        q = tl.arange(0, 4)
        out = tl.where(q == 0, N, tl.where(q == 1, distinct, tl.where(q == 2, size, 0)))
        tl.store(stats_ptr + b * 4 + q, out.to(tl.int32))


def _np2(x: int) -> int:
    return max(2, triton.next_power_of_2(x))


def verify_inputs_triton(tree: VoteTree, anchor: torch.Tensor, seq_lens: torch.Tensor, seq_lens_sum: int,
                         candidates: torch.Tensor | None = None, workspace: Workspace | None = None) -> VerifyInputs:
    """Same signature and result as `flashtree.tree.verify_inputs`, one launch (mask cells past the last block, when
    `seq_lens_sum` is a bound above the sum, are left unwritten); with a `workspace`, every output comes from it."""
    bs, w = tree.batch_size, tree.width
    dev = tree.tokens.device
    has_stats = candidates is not None

    def outputs():  # ids, positions, statistics rows
        return (torch.empty(bs, w, dtype=torch.int64, device=dev), torch.empty(bs * w, dtype=torch.int64, device=dev),
                torch.empty(bs, 4, dtype=torch.int32, device=dev) if has_stats else None)

    numel = seq_lens_sum * w + bs * w * w
    if workspace is None:
        ids, positions, stats = outputs()
        mask = torch.empty(numel, dtype=torch.bool, device=dev)
    else:
        ids, positions, stats = workspace.take(("verify_inputs", bs, w, has_stats, dev), outputs)
        mask = workspace.flat(("mask", dev), numel, torch.bool, dev)
    n, k = candidates.shape[1:] if has_stats else (1, 1)
    wp = max(16, _np2(w))  # tl.dot's smallest tile
    steps = min(tree.k, w - 1)
    if bs > 0:
        _verify_inputs_kernel[(bs,)](
            tree.tokens.contiguous(), tree.parents.contiguous(), tree.depth.contiguous(), tree.valid.contiguous(),
            anchor.contiguous(), seq_lens.contiguous(),
            candidates.contiguous() if has_stats else ids,
            ids, positions, mask, stats if has_stats else ids,
            M=w - 1, W=w, WP=wp, SQ=(steps - 1).bit_length(), N=n, K=k, NP=_np2(n),
            SB=256, PB=max(16, 4096 // wp), HAS_STATS=has_stats, num_warps=4,
        )
    return VerifyInputs(ids=ids, positions=positions, mask=mask, stats=stats)
