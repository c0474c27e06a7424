"""Simulated acceptance: commit a drawn number of draft tokens along one root-to-leaf path of the built tree.

For profiling with random weights (sglang's `SGLANG_SIMULATE_ACC_LEN`), where a verified walk accepts almost nothing:
the path follows each node's first listed child, which for trie-vote trees (nodes listed by depth, then first
candidate) is candidate 0's path as far as it is kept, i.e. the draft's greedy block, DSPARK's chain block; it stops
at `accept_len` nodes or a leaf. The bonus
is the target's token at the path's last node, as in a verified walk. Fixed shapes, no host reads.
"""

from __future__ import annotations

import torch

from .types import VerifyResult, VoteTree


def simulated_walk(tree: VoteTree, target_tokens: torch.Tensor, accept_len: torch.Tensor) -> VerifyResult:
    """`accept_len` (bs,) wanted draft tokens per request, capped by the path's depth -> the VerifyResult of that
    path, committing its nodes' tokens and the target's token after it (`target_tokens` (bs, W))."""
    bs, m = tree.tokens.shape
    k = tree.k
    device = tree.tokens.device
    index = torch.arange(1, m + 1, device=device).expand(bs, m)
    cur = torch.zeros(bs, dtype=torch.long, device=device)
    alive = torch.ones(bs, dtype=torch.bool, device=device)
    want = accept_len.to(torch.long).view(bs)
    path = torch.full((bs, k + 1), -1, dtype=torch.long, device=device)
    path[:, 0] = 0
    taken = torch.zeros(bs, dtype=torch.long, device=device)
    for d in range(1, k + 1):
        child = tree.valid & (tree.parents == cur.view(bs, 1))
        has = child.any(dim=1) & alive & (taken < want)
        first = torch.where(child, index, m + 1).min(dim=1).values
        cur = torch.where(has, first, cur)
        path[:, d] = torch.where(has, cur, -1)
        taken = taken + has.long()
        alive = has
    bonus = target_tokens.gather(1, cur.view(bs, 1)).view(bs)
    node_tokens = torch.cat([tree.tokens.new_zeros(bs, 1), tree.tokens], dim=1)  # node 0 (the root) carries none
    tokens = torch.where(path[:, 1:] >= 0, node_tokens.gather(1, path[:, 1:].clamp(min=0)), -1)
    tokens = torch.cat([tokens, tokens.new_full((bs, 1), -1)], dim=1)
    tokens.scatter_(1, taken.view(bs, 1), bonus.view(bs, 1))
    return VerifyResult(path=path, accept_len=taken, bonus=bonus, tokens=tokens)
