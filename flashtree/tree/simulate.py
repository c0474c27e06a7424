"""Simulated acceptance: commit a drawn number of draft tokens along one root-to-leaf path of the built tree.

For profiling with random weights (sglang's `SGLANG_SIMULATE_ACC_LEN`, flashtree's `FLASHTREE_SIMULATE_ACC`), where
a verified walk accepts almost nothing: the path follows each node's first listed child, which for trie-vote trees
(nodes listed by depth, then first candidate) is candidate 0's path as far as it is kept, i.e. the draft's greedy
block, DSPARK's chain block; it stops at `accept_len` nodes or a leaf. The bonus is the target's token at the path's
last node, as in a verified walk. Fixed shapes, no host reads.

`simulated_walk` is the plain reference. `simulated_walk_and_commit` is what a server step runs: it hands the greedy
walk (the fused walk + commit kernel on CUDA) target tokens that lead it down that path, capped at the drawn length
in the same launch, so a simulated step costs what a verified one does.
"""

from __future__ import annotations

import torch

from .dispatch import walk_and_commit
from .types import VerifyResult, VoteTree


def simulated_targets(tree: VoteTree, target_tokens: torch.Tensor, accept_len: torch.Tensor) -> torch.Tensor:
    """(bs, W) tokens whose greedy walk takes each node's first child while the node is shallower than `accept_len`
    (bs,), and the target's own tokens (`target_tokens`, (bs, W)) from there on."""
    bs, m = tree.tokens.shape
    index = torch.arange(1, m + 1, device=tree.tokens.device).expand(bs, m)
    parent = torch.where(tree.valid, tree.parents, m + 1)  # invalid nodes scatter into a spare column
    first = torch.full((bs, m + 2), m + 1, dtype=torch.long, device=index.device)
    first.scatter_reduce_(1, parent, index, reduce="amin")
    first = first[:, : m + 1]  # node j's first child (m + 1: none)
    node_tokens = torch.cat([tree.tokens, tree.tokens.new_zeros(bs, 1)], dim=1)  # column m: "no child"
    lead = node_tokens.gather(1, (first - 1).clamp(min=0, max=m))
    depth = torch.cat([tree.depth.new_zeros(bs, 1), tree.depth], dim=1)
    follow = (first <= m) & (depth < accept_len.view(bs, 1).to(depth.dtype))
    return torch.where(follow, lead, target_tokens)


def simulated_walk_and_commit(tree: VoteTree, target_tokens: torch.Tensor, accept_len: torch.Tensor,
                              req_to_token: torch.Tensor | None = None, rows: torch.Tensor | None = None,
                              starts: torch.Tensor | None = None, **step):
    """`walk_and_commit` along the first-child path, capped at `accept_len` (bs,) draft tokens: (VerifyResult,
    CommitPlan, StepCommit or None; `step`: walk_and_commit's step-output arguments). A walk that could go past the
    cap (the target's token at the cap's node matches a child) stops there, its bonus that token."""
    return walk_and_commit(tree, simulated_targets(tree, target_tokens, accept_len), req_to_token, rows, starts,
                           cap=accept_len, **step)


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
