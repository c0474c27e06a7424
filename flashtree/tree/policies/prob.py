"""`prob`: the trie of the N candidates, nodes ranked by the draft's own path probability.

A node's score is the log-probability of its path under the draft: the sum of the candidates' per-position log q up to
it (candidates sharing a prefix share its conditionals, so any of them gives the node's score). Log-probabilities
never rise along a path, so every top set is prefix-closed, as with votes.
"""

from __future__ import annotations

import torch

from ..dispatch import build_prob_tree  # the Triton kernel on CUDA, the torch reference elsewhere
from ..types import VoteTree
from .registry import register_policy


@register_policy("prob", needs_scores=("logp",), doc="the candidates' trie, nodes ranked by the draft's path probability")
def prob(candidates: torch.Tensor, width: int, scores) -> VoteTree:
    return build_prob_tree(candidates, width, scores.logp)
