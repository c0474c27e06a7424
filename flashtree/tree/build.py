"""Trie-vote tree builder, pure torch: fixed shapes, no host synchronisation.

A trie node is identified by (depth d, first candidate m whose length-d prefix reaches it). Candidate n passes
through node (d, m) iff its length-d prefix equals candidate m's; the node's vote is the number of such n.
"""

from __future__ import annotations

import torch

from .types import VoteTree


def build_vote_tree(candidates: torch.Tensor, width: int) -> VoteTree:
    """Merge N candidate blocks per request into a trie and keep its `width - 1` most-voted nodes.

    Ranking: votes desc, depth asc, first candidate asc. A parent has at least its child's votes and a smaller depth,
    so it always ranks above the child: every top set is prefix-closed. Kept nodes are listed by (depth, first
    candidate), which puts each parent before its children.
    """
    if candidates.dim() != 3:
        raise ValueError(f"candidates must be (bs, N, K), got shape {tuple(candidates.shape)}")
    if width < 2:
        raise ValueError(f"width must be >= 2 (the root plus at least one node), got {width}")
    bs, n, k = candidates.shape
    device = candidates.device
    keep = width - 1
    slots = n * k
    rep, is_node, votes = trie(candidates)
    cand_idx = torch.arange(n, device=device).view(1, n, 1)

    depth0 = torch.arange(k, device=device).view(1, 1, k).expand(bs, n, k)
    cand = cand_idx.expand(bs, n, k)
    # Slots are laid out [depth, candidate]. Rank key, smaller is better, unique per node; non-nodes (and the extra
    # slots that pad a trie smaller than W-1) share a sentinel that sorts last.
    tie = (depth0 * n + cand).permute(0, 2, 1).reshape(bs, slots)  # depth asc, then first candidate asc
    node = is_node.permute(0, 2, 1).reshape(bs, slots)
    node_votes = votes.permute(0, 2, 1).reshape(bs, slots)
    sentinel = (n + 1) * slots
    key = torch.where(node, (n - node_votes) * slots + tie, sentinel)
    if keep > slots:
        key = torch.cat([key, key.new_full((bs, keep - slots), sentinel)], dim=1)
        tie = torch.cat([tie, tie.new_full((bs, keep - slots), slots)], dim=1)

    top_key, top_slot = torch.topk(key, keep, dim=1, largest=False, sorted=True)
    kept = top_key < sentinel
    # List kept nodes by (depth, first candidate); padding after them.
    order = torch.argsort(torch.where(kept, tie.gather(1, top_slot), slots), dim=1, stable=True)
    valid = kept.gather(1, order)
    slot = torch.where(valid, top_slot.gather(1, order), 0)

    return _assemble(candidates, rep, valid, slot, node_votes, keep)


def trie(candidates: torch.Tensor):
    """rep (bs, N, K): the first candidate sharing candidate i's length-(d+1) prefix; is_node: (d+1, m) is a trie node
    with m its first candidate; votes [m, d]: candidates sharing m's prefix (valid where is_node)."""
    n = candidates.shape[1]
    # same[b, i, j, d]: candidates i and j share their first d+1 tokens.
    eq = candidates.unsqueeze(2) == candidates.unsqueeze(1)
    same = torch.cumprod(eq.to(torch.int32), dim=3).bool()
    rep = same.to(torch.int8).argmax(dim=2)  # argmax takes the first True
    is_node = rep == torch.arange(n, device=candidates.device).view(1, n, 1)
    return rep, is_node, same.sum(dim=1)


def _assemble(candidates, rep, valid, slot, node_votes, keep: int) -> VoteTree:
    """The VoteTree of the kept slots `slot` (bs, W-1), listed parents-first with padding (valid False) last."""
    bs, n, k = candidates.shape
    device = candidates.device
    slots = n * k
    m = slot % n
    d0 = slot // n  # 0-based depth
    tokens = candidates.reshape(bs, slots).gather(1, m * k + d0)

    # Parent of (d, m) is (d-1, rep[m, d-1]); map slots to output positions (1-based) through a scatter whose padding
    # entries land in a spare column.
    position_of = torch.zeros(bs, slots + 1, dtype=torch.long, device=device)
    position = torch.arange(1, keep + 1, device=device).expand(bs, keep)
    position_of.scatter_(1, torch.where(valid, slot, slots), position)
    rep_dm = rep.permute(0, 2, 1).reshape(bs, slots)
    up = (d0 - 1).clamp(min=0) * n
    parents = torch.where(d0 > 0, position_of.gather(1, up + rep_dm.gather(1, up + m)), 0)

    first_token = tokens[:, :1].expand_as(tokens)
    return VoteTree(
        tokens=torch.where(valid, tokens, first_token),
        parents=torch.where(valid, parents, 0),
        depth=torch.where(valid, d0 + 1, 1),
        votes=torch.where(valid, node_votes.gather(1, slot), 0),
        valid=valid,
        first_candidate=torch.where(valid, m, n),
        k=k,
    )


def build_scored_tree(candidates: torch.Tensor, width: int, node_scores: torch.Tensor) -> VoteTree:
    """The trie of `candidates` (bs, N, K), keeping its `width - 1` best-scored nodes.

    `node_scores` (bs, N, K) [m, d] scores node (d + 1, m) (read where m is the node's first candidate); larger is
    better. Ranking: score desc, depth asc, first candidate asc, as trie-vote ranks votes: a score that never rises
    along a path (a path log-probability, a vote count) keeps every top set prefix-closed. Listed like trie-vote.
    """
    bs, n, k = candidates.shape
    keep = width - 1
    slots = n * k
    rep, is_node, votes = trie(candidates)
    node = is_node.permute(0, 2, 1).reshape(bs, slots)  # slots [depth, candidate]: slot order is (depth, first cand)
    score = node_scores.float().permute(0, 2, 1).reshape(bs, slots)
    score = torch.where(score.isnan(), float("-inf"), score)  # NaN as -inf (nan_to_num would also clamp the infinities)
    order = torch.argsort(-score, dim=1, stable=True)
    order = order.gather(1, torch.argsort((~node.gather(1, order)).to(torch.int8), dim=1, stable=True))
    if keep > slots:
        order = torch.cat([order, order[:, :1].expand(bs, keep - slots)], dim=1)
    top = order[:, :keep]
    kept = node.gather(1, top)
    if keep > slots:
        kept[:, slots:] = False
    listed = torch.argsort(torch.where(kept, top, slots), dim=1, stable=True)
    valid = kept.gather(1, listed)
    slot = torch.where(valid, top.gather(1, listed), 0)
    return _assemble(candidates, rep, valid, slot, votes.permute(0, 2, 1).reshape(bs, slots), keep)


def build_prob_tree(candidates: torch.Tensor, width: int, logp: torch.Tensor) -> VoteTree:
    """`build_scored_tree` with each node scored by its path log-probability: the cumulative sum over depths of the
    per-position log q `logp` (bs, N, K) as float32 (the `prob` policy; torch's CPU cumsum accumulates it in float64,
    which the Triton kernel reproduces)."""
    return build_scored_tree(candidates, width, logp.float().cumsum(dim=2))
