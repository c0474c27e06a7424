"""Tree policies: which W - 1 nodes of a step's tree the target verifies (one module per policy, a registry).

  vote        trie-vote: the trie nodes the most of the N candidates pass through
  prob        the same trie, nodes ranked by the draft's path probability
  best-first  no candidates: grown from the root by the draft's path probability, DDTree-style
"""

from . import vote, prob, best_first  # noqa: F401, I001  (each registers its policy; this order is the listing's)
from .registry import DEFAULT_POLICY, POLICIES, DraftScores, Policy, UnknownPolicy, build_tree, get_policy, policy_names, register_policy

__all__ = ["DEFAULT_POLICY", "POLICIES", "DraftScores", "Policy", "UnknownPolicy", "build_tree", "get_policy",
           "policy_names", "register_policy"]
