"""The tree planner (`FLASHTREE_TREE_N=auto`, `tree.n=auto`): per decode batch, the shape with the most expected
committed tokens per second of step time.

  shapes.py      the candidate shapes: (N, W, draft rows) trees and DSPARK's own chain step
  costs.py       step time per shape and batch size, measured once (at server start: the warm-up)
  acceptance.py  expected committed tokens per step and shape: a stated prior, updated online from each step's
                 committed tokens, crediting every shape with what it would have committed on the same candidates
  plan.py        the choice: argmax over shapes of expected tokens / step time at the batch's size

Pure torch and Python (no sglang): the server plugin and the engine both drive it.
"""

from .acceptance import PRIOR_TAU, AcceptanceModel, check_policy, counterfactual_commits
from .costs import CostTable
from .plan import Choice, Planner
from .shapes import AUTO, CHAIN, Shape, default_shapes

__all__ = ["AUTO", "CHAIN", "PRIOR_TAU", "AcceptanceModel", "Choice", "CostTable", "Planner", "Shape", "check_policy",
           "counterfactual_commits", "default_shapes"]
