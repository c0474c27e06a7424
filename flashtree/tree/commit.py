"""Commit plans: make the verify window's KV sequential once the accepted path is known.

The verify window holds W KV slots per request in node order (offset 0 = the root / anchor). After acceptance the
first `1 + accept_len` offsets must hold the root and the accepted nodes, in path order.
"""

from __future__ import annotations

import torch

from .types import CommitPlan, VerifyResult, VoteTree


def commit_plan(tree: VoteTree, result: VerifyResult) -> CommitPlan:
    bs, w, k = tree.batch_size, tree.width, tree.k
    device = result.path.device
    idx = torch.arange(w, device=device).expand(bs, w)
    # Permutation: the path first (rank = depth), then every other node in increasing index. Padded path entries
    # scatter into a spare column.
    target = torch.where(result.path >= 0, result.path, w)
    rank = torch.full((bs, w + 1), w, dtype=torch.long, device=device)
    rank.scatter_(1, target, torch.arange(k + 1, device=device).expand(bs, k + 1))
    rank = rank[:, :w]
    permutation = torch.argsort(torch.where(rank < w, rank, w + idx), dim=1)

    # Copy form: path[j] >= j (a node at depth j has index >= j) and the path increases, so no destination j is the
    # source of a later copy; copies whose source already sits in place are masked off.
    depth = torch.arange(1, k + 1, device=device).expand(bs, k)
    src = result.path[:, 1:]
    copy_mask = (src > 0) & (src != depth)
    return CommitPlan(
        permutation=permutation,
        copy_src=torch.where(copy_mask, src, depth),
        copy_dst=depth,
        copy_mask=copy_mask,
        kv_len=result.accept_len + 1,
    )


def apply_permutation(req_to_token: torch.Tensor, rows: torch.Tensor, starts: torch.Tensor, plan: CommitPlan) -> None:
    """Page size 1: rewrite each request's window `req_to_token[rows[b], starts[b] : starts[b] + W]` in place so the
    accepted path's slots come first. No KV moves."""
    w = plan.permutation.shape[1]
    cols = starts.view(-1, 1).to(torch.long) + torch.arange(w, device=req_to_token.device)
    r = rows.view(-1, 1).to(torch.long)
    window = req_to_token[r, cols]
    req_to_token[r, cols] = window.gather(1, plan.permutation)


def apply_copies(kv: torch.Tensor, window_slots: torch.Tensor, plan: CommitPlan) -> None:
    """Paged KV: copy accepted entries into sequential window positions. `window_slots` (bs, W) are the KV slot ids of
    each window offset; `kv` is indexed by slot on dim 0. All sources are read before any destination is written."""
    src = window_slots.gather(1, plan.copy_src)[plan.copy_mask]
    dst = window_slots.gather(1, plan.copy_dst)[plan.copy_mask]
    kv[dst] = kv[src]
