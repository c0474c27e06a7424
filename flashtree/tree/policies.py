"""Tree policies: which W - 1 nodes of the candidates' trie a step verifies.

A policy is a registered name and a builder `(candidates (bs, N, K), width, scores) -> VoteTree`. Every builder keeps
the tree contract (parents-first, prefix-closed, padding after the valid nodes), so greedy and sampled verification
stay exact whatever it keeps: the target-only walk is exact for any tree. `scores` carries what a policy needs of the
draft beyond its tokens (None for policies that read the candidates alone).

A new policy is one function here (or in a module of its own) decorated with `@register_policy("name")`; the engine,
replay, warm-up and the server step all build through `build_tree`, the Hydra key `tree.policy` and the server toggle
`FLASHTREE_TREE_POLICY` select it by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .types import VoteTree

DEFAULT_POLICY = "vote"


@dataclass(frozen=True)
class Policy:
    name: str
    build: Callable[[torch.Tensor, int, object], VoteTree]
    needs_scores: bool  # whether the builder reads the draft's scores (else `scores` is ignored)
    doc: str


POLICIES: dict[str, Policy] = {}


class UnknownPolicy(ValueError):
    """A policy name that is not registered."""


def register_policy(name: str, *, needs_scores: bool = False, doc: str = ""):
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
    return get_policy(policy).build(candidates, width, scores)


@register_policy("vote", doc="trie-vote: the W - 1 trie nodes the most candidates pass through")
def _vote(candidates: torch.Tensor, width: int, scores=None) -> VoteTree:
    from .dispatch import build_vote_tree  # the Triton kernel on CUDA, the torch reference elsewhere

    return build_vote_tree(candidates, width)
