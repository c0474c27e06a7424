"""Expected committed tokens per step, per shape: a prior, then online estimates with counterfactual credit.

Every greedy step commits the target's own tokens g (accepted drafts, then the bonus). Any other tree built from the
same candidates would have committed the longest prefix of g that is a root path in it, plus its own bonus: so one
step's candidates and commit update every shape's estimate, not only the one that ran (the replay's exact argument).
When the other tree holds all of g, it would have gone further than the step can tell: that credit is a lower bound.
The chain (DSPARK's step) is credited as the single candidate 0 (the draft's greedy block) over its whole depth.
Best-first trees draw no candidates: a narrower one is the first nodes of the step's own widest tree (`first_nodes`),
so it is credited along those, exactly.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..tree import POLICIES, build_tree, get_policy
from ..tree.policies.best_first import NAME as GROWN, first_nodes
from ..tree.types import VoteTree
from .shapes import Shape

# Committed tokens per step before any step is seen, by tree width: flashtree's trained SmolLM2-135M drafter on held-out
# GSM8K as BENCHMARKS.md records it (replay: the chain 2.7, N = W = 32 3.66, N = W = 64 3.94; live trees of 16 tokens
# 3.24-3.41), rounded down; narrower widths interpolate. A server's own steps replace it within tens of steps.
PRIOR_TAU = {"chain": 2.7, 9: 2.9, 16: 3.2, 32: 3.6, 64: 3.9}


def prior_tau(shape: Shape) -> float:
    if shape.is_chain or (shape.n == 1 and not shape.grown):  # candidate 0 is the draft's greedy block: DSPARK's chain
        return PRIOR_TAU["chain"]
    widths = sorted(k for k in PRIOR_TAU if k != "chain")
    w = min(widths, key=lambda x: abs(x - shape.width))
    # fewer candidates fill less of the width; a best-first tree fills it whatever N
    scale = 1.0 if shape.grown else min(1.0, shape.n / max(shape.width - 1, 1)) ** 0.5
    return 1.0 + (PRIOR_TAU[w] - 1.0) * scale


def planned_policies() -> list[str]:
    """The policies whose every shape one step can credit (below): those that read the candidate tokens alone (a
    narrower tree is rebuilt from them) and best-first (a narrower tree is the first nodes of the step's own)."""
    return [p.name for p in POLICIES.values() if not p.needs_scores or p.name == GROWN]


def check_policy(policy: str) -> None:
    """ValueError (UnknownPolicy for an unknown name) unless the planner can plan `policy`'s trees."""
    needs = get_policy(policy).needs_scores
    if policy not in planned_policies():
        raise ValueError(f"the planner credits every shape from each step's own tree, which {policy!r} trees "
                         f"(ranked by the draft's {', '.join(needs)}) cannot be rebuilt from; allowed: "
                         f"tree.policy={' or '.join(planned_policies())} with tree.n=auto, or an integer tree.n "
                         f"with {policy}")


def counterfactual_commits(candidates: torch.Tensor, committed: torch.Tensor, shapes: list[Shape],
                           policy: str = "vote", grown: VoteTree | None = None) -> dict[Shape, torch.Tensor]:
    """(bs,) committed tokens each shape's tree would have given on this step. `committed` (bs, L): the step's
    committed tokens (accepted drafts then the bonus), -1 past each row's end. `grown`: the step's best-first tree,
    at least as wide as every best-first shape asked for (candidate 0: the draft's greedy block, for the chain)."""
    bs, n, k = candidates.shape
    valid = committed >= 0
    length = valid.sum(dim=1)
    out = {}
    grown_path = None  # the committed tokens' node indices in the step's best-first tree, for every width at once
    for shape in shapes:
        if shape.is_chain:
            chain = candidates[:, 0, :]
            m = min(k, committed.shape[1])
            match = (chain[:, :m] == committed[:, :m]) & valid[:, :m]
            out[shape] = match.long().cumprod(dim=1).sum(dim=1) + 1
            continue
        if shape.grown:
            if grown is None or shape.width > grown.tokens.shape[1] + 1:
                raise ValueError(f"{shape.label()} needs the step's best-first tree of at least its width")
            # the tree of W is the first W - 1 nodes (first_nodes) and a child comes after its parent, so its path
            # is the leading nodes of the widest tree's path numbered below W: one walk credits every width
            if grown_path is None:
                grown_path = _matched_nodes(grown, committed, length)
            inside = (grown_path > 0) & (grown_path < shape.width)
            out[shape] = inside.long().cumprod(dim=1).sum(dim=1) + 1
            continue
        tree = build_tree(candidates[:, : min(shape.n, n)], shape.width, policy)
        out[shape] = (_matched_nodes(tree, committed, length) > 0).long().sum(dim=1) + 1
    return out


def _matched_nodes(tree, committed: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """(bs, D) the node numbers (1 = the tree's first node) of the longest root path of `tree` spelling the leading
    committed tokens, 0 past its end."""
    bs, m = tree.tokens.shape
    d_max = min(tree.k, committed.shape[1])
    cur = torch.zeros(bs, dtype=torch.long, device=tree.tokens.device)
    alive = torch.ones(bs, dtype=torch.bool, device=tree.tokens.device)
    index = torch.arange(1, m + 1, device=tree.tokens.device).expand(bs, m)
    nodes = torch.zeros(bs, max(d_max, 0), dtype=torch.long, device=tree.tokens.device)
    for d in range(d_max):
        want = committed[:, d].view(bs, 1)
        child = tree.valid & (tree.parents == cur.view(bs, 1)) & (tree.tokens == want)
        ok = child.any(dim=1) & alive & (d < length)
        cur = torch.where(ok, torch.where(child, index, m + 1).min(dim=1).values, 0)
        nodes[:, d] = cur
        alive = ok
    return nodes


class AcceptanceModel:
    """Mean committed tokens per step for each shape: the prior counts as `prior_weight` steps, then every credited
    step counts once, so estimates follow the workload and settle as steps accumulate. The prior is light: it comes
    from another drafter (PRIOR_TAU), and a server credits one step in tens, one request each at one request."""

    def __init__(self, shapes: list[Shape], prior_weight: float = 8.0, prior: Callable[[Shape], float] = prior_tau):
        self.shapes = list(shapes)
        self.prior_weight = float(prior_weight)
        self.total = {s: prior(s) * prior_weight for s in self.shapes}
        self.count = {s: prior_weight for s in self.shapes}

    def update(self, credits: dict[Shape, torch.Tensor]) -> None:
        for shape, commits in credits.items():
            self.total[shape] += float(commits.sum())
            self.count[shape] += commits.numel()

    def tau(self, shape: Shape) -> float:
        return self.total[shape] / self.count[shape]
