"""What the planner chooses among: tree shapes that fit the server's window, and DSPARK's chain step."""

from __future__ import annotations

from dataclasses import dataclass

from ..tree.policies.best_first import NAME as GROWN


@dataclass(frozen=True, order=True)
class Shape:
    """n candidates, a tree of `width` tokens (root included); n = 0 is DSPARK's own chain step over its window.
    A best-first tree (policy GROWN) draws no candidates: its n is 1, the placeholder its step carries."""

    n: int
    width: int
    rows: int = 0  # draft rows the step's forward runs (0: DSPARK's whole window)
    policy: str = "vote"

    @property
    def is_chain(self) -> bool:
        return self.n == 0

    @property
    def grown(self) -> bool:
        return self.policy == GROWN and not self.is_chain

    def label(self) -> str:
        if self.is_chain:
            return f"chain(W={self.width})"
        head = f"{GROWN}," if self.grown else f"N={self.n},"
        return head + f"W={self.width}" + (f",rows={self.rows}" if self.rows else "")


CHAIN = "chain"
AUTO = "auto"  # the toggle's value that turns the planner on (FLASHTREE_TREE_N=auto, tree.n=auto)


def default_shapes(window: int, depth: int, max_n: int = 64, policy: str = "vote") -> list[Shape]:
    """The planner's menu for a server whose DSPARK window is `window` tokens (--speculative-num-draft-tokens) and
    whose draft keeps `depth` positions: the chain, and trees of N in {1, 4, 8, 16, 32, 64} candidates (at most
    `max_n` and the width) at widths {depth + 1, 16, 32, 64} up to the window, and the window itself. N candidates
    hold at most N x depth + 1 nodes, so a tree of N is offered only at widths it can fill (and at the narrowest):
    a wider one is the same tree with padding, verified at a higher cost (N = 1 is the draft's greedy block, DSPARK's
    chain, at depth + 1). With policy best-first the trees are widths only, the same and 8 (a best-first tree fills
    any width, so one narrower than depth + 1 still branches; 8 is the narrowest the accept tables record)."""
    shapes = [Shape(0, window)]
    if policy == GROWN:
        widths = sorted({w for w in (8, depth + 1, 16, 32, 64, window) if 2 <= w <= window})
        return shapes + [Shape(1, w, policy=GROWN) for w in widths]
    widths = sorted({w for w in (depth + 1, 16, 32, 64, window) if 2 <= w <= window})
    for w in widths:
        shapes += [Shape(n, w) for n in (1, 4, 8, 16, 32, 64)
                   if n <= min(w, max_n) and (w <= n * depth + 1 or w == widths[0])]
    return shapes
