"""Commit plans: make the verify window's KV sequential once the accepted path is known.

The verify window holds W KV slots per request in node order (offset 0 = the root / anchor). After acceptance the
first `1 + accept_len` offsets must hold the root and the accepted nodes, in path order.
"""

from __future__ import annotations

import torch

from .types import CommitPlan, StepCommit, VerifyResult, VoteTree


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


def step_commit(result: VerifyResult, plan: CommitPlan, seq_lens: torch.Tensor, out_width: int = 0,
                window_slots: torch.Tensor | None = None, stats: torch.Tensor | None = None) -> StepCommit:
    """What a serving step hands on after the walk: the commit lengths (int32), the new sequence lengths, the
    committed tokens zero-padded to `out_width` (at least K + 1 columns), with `window_slots` (bs, W) the window's
    slots in commit order, and with `stats` (bs, 4) the accepted depth written into its column 3 (in place)."""
    commit_len = plan.kv_len.to(torch.int32)
    tokens = result.tokens.clamp(min=0)
    if tokens.shape[1] < out_width:
        tokens = torch.cat([tokens, tokens.new_zeros((tokens.shape[0], out_width - tokens.shape[1]))], dim=1)
    if stats is not None:
        stats[:, 3] = result.accept_len
    slots = None if window_slots is None else window_slots.gather(1, plan.permutation)
    return StepCommit(commit_len=commit_len, seq_lens=seq_lens + commit_len, out_tokens=tokens, slots=slots)


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
