"""The tree algorithm: trie-vote builder, encoders, greedy and lossless-sampled verification, commit plans."""

from .build import build_vote_tree
from .commit import apply_copies, apply_permutation, commit_plan
from .encode import ancestor_mask, child_links, to_eagle, tree_positions
from .types import CommitPlan, EagleEncoding, VerifyResult, VoteTree
from .verify import verify_greedy, verify_sampled

__all__ = [
    "CommitPlan",
    "EagleEncoding",
    "VerifyResult",
    "VoteTree",
    "ancestor_mask",
    "apply_copies",
    "apply_permutation",
    "build_vote_tree",
    "child_links",
    "commit_plan",
    "to_eagle",
    "tree_positions",
    "verify_greedy",
    "verify_sampled",
]
