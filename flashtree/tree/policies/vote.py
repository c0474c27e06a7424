"""`vote`: trie-vote, the W - 1 trie nodes the most candidates pass through."""

from __future__ import annotations

import torch

from ..dispatch import build_vote_tree  # the Triton kernel on CUDA, the torch reference elsewhere
from ..types import VoteTree
from .registry import register_policy


@register_policy("vote", doc="trie-vote: the W - 1 trie nodes the most candidates pass through")
def vote(candidates: torch.Tensor, width: int, scores=None) -> VoteTree:
    return build_vote_tree(candidates, width)
