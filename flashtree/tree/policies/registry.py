"""The tree-policy registry: which W - 1 nodes a step verifies, by name.

A policy is a registered name and a builder `(candidates (bs, N, K), width, scores) -> VoteTree`. Every builder keeps
the tree contract (parents-first, prefix-closed, padding after the valid nodes), so greedy and sampled verification
stay exact whatever it keeps: the target-only walk is exact for any tree. `scores` carries what a policy needs of the
draft beyond its tokens (None for policies that read the candidates alone).

A new policy is one module of this package with one function decorated `@register_policy("name")`, imported in the
package's `__init__`; the engine, replay, warm-up and the server step all build through `build_tree`, and the Hydra key
`tree.policy` and the server toggle `FLASHTREE_TREE_POLICY` select it by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..checks import check_tokens, check_width
from ..types import VoteTree

DEFAULT_POLICY = "vote"


@dataclass
class DraftScores:
    """What a draft knows beyond its tokens, for policies that rank nodes by the draft's own probability.

    logp: (bs, N, K) log q of each candidate's token given its own prefix (a Markov head: the head's conditional; a
        draft with independent positions: the position's marginal), at the draft's own temperature 1.
    anchor: (bs,) the root token (what the first position conditions on).
    step_logprobs: `(rows (R,), position (R,) 0-based, prev (R,) the parent's token) -> (R, V)` log q of the next token
        after a node (a policy that grows trees beyond the candidates calls it).
    step_topk: optionally, `(rows, position, prev, k) -> (log q (R, k), tokens (R, k))`, the k most probable of the
        same, largest first, ties to the lower token (without the full-vocabulary log q: `sampler.row_topk_logprobs`).
    """

    logp: torch.Tensor | None = None
    anchor: torch.Tensor | None = None
    step_logprobs: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    step_topk: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]] | None = None


@dataclass(frozen=True)
class Policy:
    name: str
    build: Callable[[torch.Tensor, int, object], VoteTree]
    needs_scores: tuple[str, ...]  # the DraftScores fields the builder reads (empty: the candidates alone)
    doc: str


POLICIES: dict[str, Policy] = {}


class UnknownPolicy(ValueError):
    """A policy name that is not registered."""


def register_policy(name: str, *, needs_scores: tuple[str, ...] = (), doc: str = ""):
    def add(fn):
        if name in POLICIES:
            raise ValueError(f"tree policy {name!r} is registered twice")
        POLICIES[name] = Policy(name, fn, needs_scores, doc or (fn.__doc__ or "").strip().splitlines()[0])
        return fn

    return add


def policy_names() -> tuple[str, ...]:
    return tuple(POLICIES)


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except (KeyError, TypeError):
        raise UnknownPolicy(f"unknown tree policy {name!r}; registered: {', '.join(POLICIES)}") from None


def build_tree(candidates: torch.Tensor, width: int, policy: str = DEFAULT_POLICY, scores=None) -> VoteTree:
    """The tree of `width` tokens (root included) that `policy` keeps from `candidates` (bs, N, K)."""
    check_tokens("candidates", candidates, dims=3)
    check_width(width)
    chosen = get_policy(policy)
    missing = [f for f in chosen.needs_scores if getattr(scores, f, None) is None]
    if missing:
        raise ValueError(f"tree policy {policy!r} needs the draft's {', '.join(missing)} (DraftScores), which this "
                         f"drafter does not provide; policies that need none: "
                         f"{', '.join(p.name for p in POLICIES.values() if not p.needs_scores)}")
    return chosen.build(candidates, width, scores)
