"""The tree algorithm: tree policies (`build_tree`, a registry; trie-vote first), the trie-vote builder, encoders, greedy and lossless-sampled verification, commit plans, and
chain rejection sampling against draft probabilities (`verify_rejection`, N = 1).

`build_vote_tree`, `verify_greedy`, `verify_sampled`, `commit_plan`, `walk_and_commit`, `sampled_draws` and
`verify_inputs` run the Triton kernels on CUDA tensors and the torch references (modules `build`, `verify`, `commit`,
`encode`) elsewhere (module `dispatch`).
"""

from .commit import apply_copies, apply_permutation
from .dispatch import (build_vote_tree, commit_plan, sampled_draws, verify_greedy, verify_inputs, verify_sampled,
                       walk_and_commit)
from .encode import ancestor_mask, chain_tree, child_links, pad_tree, to_eagle, tree_positions
from .policies import DEFAULT_POLICY, POLICIES, DraftScores, UnknownPolicy, build_tree, get_policy, policy_names, register_policy
from .rejection import verify_rejection
from .types import CommitPlan, EagleEncoding, VerifyInputs, VerifyResult, VoteTree

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "DraftScores",
    "UnknownPolicy",
    "build_tree",
    "get_policy",
    "policy_names",
    "register_policy",
    "CommitPlan",
    "EagleEncoding",
    "VerifyInputs",
    "VerifyResult",
    "VoteTree",
    "ancestor_mask",
    "chain_tree",
    "apply_copies",
    "apply_permutation",
    "build_vote_tree",
    "child_links",
    "pad_tree",
    "commit_plan",
    "to_eagle",
    "tree_positions",
    "verify_greedy",
    "verify_inputs",
    "verify_rejection",
    "verify_sampled",
    "sampled_draws",
    "walk_and_commit",
]
