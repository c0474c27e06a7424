"""`best-first`: no candidates; the tree grows from the root by the draft's path probability (DDTree's construction).

Each step adds the frontier node with the highest path log-probability and puts its best children on the frontier,
their distribution from `DraftScores.step_logprobs` (conditioned on the node's token where the draft has a Markov
head), until W - 1 nodes or depth K. With W - 1 children per node the result is exactly the W - 1 most probable
nodes of the draft's whole tree (no tree of W - 1 nodes uses more children of one node), prefix-closed and listed
parents-first (a child reaches the frontier only after its parent is kept). Ties: the earlier frontier entry.
"""

from __future__ import annotations

import torch

from ..types import VoteTree
from .registry import DraftScores, register_policy

NAME = "best-first"  # the policy that grows its tree from the draft's probabilities: no candidates, a width only


@register_policy(NAME, needs_scores=("anchor", "step_logprobs"),
                 doc="no sampling: the most probable nodes of the draft's tree, grown from the root")
def best_first(candidates: torch.Tensor, width: int, scores) -> VoteTree:
    bs, n, k = candidates.shape
    device = candidates.device
    keep = width - 1
    rows = torch.arange(bs, device=device)
    neg = torch.full((), float("-inf"), device=device)  # a fill, not a host copy: capturable in a CUDA graph
    size = keep * (keep + 1)  # the root's children, then each kept node's
    f_score = torch.full((bs, size), float("-inf"), device=device)
    f_token = torch.zeros(bs, size, dtype=torch.long, device=device)
    f_parent = torch.zeros(bs, size, dtype=torch.long, device=device)
    f_depth = torch.zeros(bs, size, dtype=torch.long, device=device)
    tokens, parents, depth, valid = (torch.zeros(bs, keep, dtype=t, device=device)
                                     for t in (torch.long, torch.long, torch.long, torch.bool))

    def push(at: int, parent: int, prev: torch.Tensor, pos: torch.Tensor, base: torch.Tensor) -> None:
        if scores.step_topk is not None:  # the drafter's own top-k (a kernel), else the full log q's
            top, tok = scores.step_topk(rows, pos, prev, keep)
        else:
            logp = scores.step_logprobs(rows, pos, prev).float()
            top, tok = logp.topk(min(keep, logp.shape[-1]), dim=-1)
        cols = slice(at, at + top.shape[1])
        f_score[:, cols] = torch.where((pos < k).unsqueeze(1), base.unsqueeze(1) + top, neg)
        f_token[:, cols] = tok
        f_parent[:, cols] = parent
        f_depth[:, cols] = (pos + 1).unsqueeze(1)

    push(0, 0, scores.anchor.long(), torch.zeros(bs, dtype=torch.long, device=device), torch.zeros(bs, device=device))
    for i in range(keep):
        best, j = f_score.max(dim=1)  # the first maximum: the earlier frontier entry wins ties
        ok = best > float("-inf")
        tokens[:, i] = f_token.gather(1, j[:, None])[:, 0]
        parents[:, i] = torch.where(ok, f_parent.gather(1, j[:, None])[:, 0], 0)
        depth[:, i] = torch.where(ok, f_depth.gather(1, j[:, None])[:, 0], 1)
        valid[:, i] = ok
        f_score.scatter_(1, j[:, None], float("-inf"))
        if i + 1 < keep:
            push(keep * (i + 1), i + 1, tokens[:, i], depth[:, i], torch.where(ok, best, neg))
    first = tokens[:, :1].expand_as(tokens)
    return VoteTree(tokens=torch.where(valid, tokens, first), parents=parents, depth=depth,
                    votes=torch.zeros_like(tokens), valid=valid,
                    first_candidate=torch.full_like(tokens, n), k=k)


def marginal_topk_scores(top: torch.Tensor, ids: torch.Tensor) -> DraftScores:
    """best-first's DraftScores where the draft's positions are independent given the context (DFLASH: no Markov
    head): every node at position p has the same children, p's top k (top / ids (bs, K, k), largest first)."""
    bs, k, _ = top.shape

    def step_topk(rows: torch.Tensor, pos: torch.Tensor, prev: torch.Tensor, n: int):
        at = pos.clamp(max=k - 1)
        return top[rows, at, :n], ids[rows, at, :n]

    return DraftScores(anchor=torch.zeros(bs, dtype=torch.int64, device=top.device), step_topk=step_topk)


def grow_marginal(top: torch.Tensor, ids: torch.Tensor, width: int) -> VoteTree:
    """The best-first tree of `width` tokens (root included) over independent positions, from each position's top
    k: one Triton launch on CUDA (`triton_grow`), the rounds above elsewhere; the same tree either way."""
    if top.is_cuda:
        from ..triton_grow import grow_marginal_triton

        return grow_marginal_triton(top, ids, width)
    bs, k, _ = top.shape
    shape = torch.zeros((bs, 1, k), dtype=torch.int64, device=top.device)  # the builder reads (N, K) only
    return best_first(shape, width, marginal_topk_scores(top, ids))


def first_nodes(tree: VoteTree, width: int) -> VoteTree:
    """The tree's first width - 1 nodes: best-first lists nodes in the order it adds them, so these are exactly the
    best-first tree of `width` (its first picks never depend on how many follow: a node's m-th child is picked only
    after its m - 1 better siblings, and a tie goes to the earlier frontier entry at any width). So one step's widest
    tree holds every narrower one (the planner credits them from it: flashtree.planner.acceptance)."""
    m = width - 1
    if m == tree.tokens.shape[1]:
        return tree
    return VoteTree(tokens=tree.tokens[:, :m], parents=tree.parents[:, :m], depth=tree.depth[:, :m],
                    votes=tree.votes[:, :m], valid=tree.valid[:, :m], first_candidate=tree.first_candidate[:, :m],
                    k=tree.k)
