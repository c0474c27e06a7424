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
from ..tree.build import trie
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
    at least as wide as every best-first shape asked for (candidate 0: the draft's greedy block, for the chain).
    Trie-vote shapes are credited all at once from the candidates' one trie (`_vote_commits`: a fixed number of
    launches whatever the menu); other policies rebuild each shape's tree (`rebuilt_commits`)."""
    if policy != "vote" or grown is not None:
        return rebuilt_commits(candidates, committed, shapes, policy, grown)
    trees = [s for s in shapes if not s.is_chain]
    out = {s: _chain_commits(candidates, committed) for s in shapes if s.is_chain}
    if trees:
        out.update(_vote_commits(candidates, committed, trees))
    return out


def rebuilt_commits(candidates: torch.Tensor, committed: torch.Tensor, shapes: list[Shape], policy: str = "vote",
                    grown: VoteTree | None = None) -> dict[Shape, torch.Tensor]:
    """`counterfactual_commits` by building every shape's tree and walking the committed tokens down it (about 70
    launches a shape on CUDA): any policy that reads the candidates alone, and the reference `_vote_commits` is
    tested against."""
    bs, n, k = candidates.shape
    valid = committed >= 0
    length = valid.sum(dim=1)
    out = {}
    grown_path = None  # the committed tokens' node indices in the step's best-first tree, for every width at once
    for shape in shapes:
        if shape.is_chain:
            out[shape] = _chain_commits(candidates, committed)
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


def _chain_commits(candidates: torch.Tensor, committed: torch.Tensor) -> torch.Tensor:
    """DSPARK's chain: candidate 0 (the draft's greedy block) over its whole depth."""
    m = min(candidates.shape[2], committed.shape[1])
    match = (candidates[:, 0, :m] == committed[:, :m]) & (committed[:, :m] >= 0)
    return match.long().cumprod(dim=1).sum(dim=1) + 1


def _vote_commits(candidates: torch.Tensor, committed: torch.Tensor, shapes: list[Shape]) -> dict[Shape, torch.Tensor]:
    """Every trie-vote shape's credit from one pass over the candidates' trie, without building its tree.

    The tree of (N, W) keeps the W - 1 best nodes of the first N candidates' trie, ranked as `build.build_vote_tree`
    ranks them (votes desc, depth asc, first candidate asc), and that set is prefix-closed. Its committed path ends at
    the deepest committed prefix that is one of those nodes: the prefix of length d is a node of the first N iff its
    first candidate is below N, and kept iff fewer than W - 1 nodes of the first N rank above it. So every shape of N
    candidates reads one rank per committed prefix: the vote counts for each N on the menu are the cumulative counts
    of the candidates' first-candidate ids, the ranks one comparison of rank keys against every node's."""
    bs, n, k = candidates.shape
    m = min(k, committed.shape[1])
    menu = _Menu.of(tuple(shapes), n, k, candidates.device)
    u = menu.first_n.numel()
    rep, is_node, _ = trie(candidates)  # rep[b, i, d]: the first candidate sharing i's length-(d + 1) prefix
    # votes[b, u, d, j]: how many of the first first_n[u] candidates pass through node (d + 1, j)
    votes = (rep.unsqueeze(-1) == menu.ids).to(torch.int32).cumsum(dim=1).index_select(1, menu.first_n - 1)
    nodes = is_node.transpose(1, 2).unsqueeze(1) & menu.among  # (bs, U, K, N): nodes of the first N
    # the committed prefixes: which candidates spell them (cumulative over depth), and their first such candidate
    spells = ((candidates[:, :, :m] == committed[:, None, :m]) & (committed[:, None, :m] >= 0)).to(torch.int32)
    spells = spells.cumprod(dim=2).bool()  # (bs, N, m)
    first = spells.to(torch.int8).argmax(dim=1)  # (bs, m); 0 where none spells it (masked by `present`)
    present = spells.any(dim=1).unsqueeze(1) & (first.unsqueeze(1) < menu.first_n.view(1, -1, 1))  # (bs, U, m)
    # each node's rank key as the builder forms it (fewer votes, then depth, then first candidate: larger), the
    # nodes outside the first N last; a prefix's rank is the number of nodes whose key is below its own
    slots = n * k
    key = torch.where(nodes, (n - votes) * slots + menu.order, (n + 1) * slots).reshape(bs, u, slots)
    own = key.gather(2, (menu.depths[:m] * n + first).unsqueeze(1).expand(bs, u, m))
    rank = (key.unsqueeze(2) < own.unsqueeze(-1)).sum(dim=-1)  # (bs, U, m)
    kept = present[:, menu.count_of] & (rank[:, menu.count_of] < menu.keep.view(1, -1, 1))  # (bs, S, m)
    credits = kept.to(torch.int64).cumprod(dim=2).sum(dim=2) + 1  # (bs, S)
    return {shape: credits[:, i] for i, shape in enumerate(shapes)}


class _Menu:
    """The device constants `_vote_commits` indexes with, made once per (menu, N, K, device): a tensor made from a
    Python list is a host-to-device copy, which would wait for the stream on every credited server step."""

    _made: dict = {}

    def __init__(self, shapes: tuple[Shape, ...], n: int, k: int, device):
        counts = sorted({min(s.n, n) for s in shapes})
        self.ids = torch.arange(n, device=device)  # candidate ids
        self.depths = torch.arange(k, device=device)
        self.first_n = torch.tensor(counts, device=device)  # the distinct candidate counts, ascending
        self.among = self.ids < self.first_n.view(-1, 1, 1)  # (U, 1, N)
        self.order = torch.arange(n * k, device=device).view(1, 1, k, n)  # depth * N + first candidate
        self.count_of = torch.tensor([counts.index(min(s.n, n)) for s in shapes], device=device)  # (S,)
        self.keep = torch.tensor([s.width - 1 for s in shapes], device=device)  # (S,)

    @classmethod
    def of(cls, shapes: tuple[Shape, ...], n: int, k: int, device) -> "_Menu":
        key = (shapes, n, k, str(device))
        menu = cls._made.get(key)
        if menu is None:
            menu = cls._made[key] = cls(shapes, n, k, device)
        return menu


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
