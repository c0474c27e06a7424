"""Random vote trees with heavy sharing, and target choices that follow them often enough to accept deeply."""

from __future__ import annotations

import torch

from flashtree.tree import build_vote_tree


def random_tree(seed: int, bs: int = 4, n: int = 6, k: int = 5, width: int = 10, vocab: int = 3):
    g = torch.Generator().manual_seed(seed)
    cands = torch.randint(0, vocab, (bs, n, k), generator=g)
    return build_vote_tree(cands, width), g


def following_targets(tree, g: torch.Generator, vocab: int = 3, follow: float = 0.7) -> torch.Tensor:
    """Target tokens per node (bs, W): with probability `follow`, the token of a random valid child."""
    bs, w = tree.batch_size, tree.width
    target = torch.randint(0, vocab, (bs, w), generator=g)
    for b in range(bs):
        for node in range(w):
            kids = [i for i in range(1, w) if tree.valid[b, i - 1] and tree.parents[b, i - 1] == node]
            if kids and torch.rand((), generator=g) < follow:
                pick = kids[int(torch.randint(0, len(kids), (), generator=g))]
                target[b, node] = tree.tokens[b, pick - 1]
    return target
