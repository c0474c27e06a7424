"""The per-batch choice: the shape with the most expected committed tokens per second of step time."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

import torch

from ..tree.types import VoteTree
from .acceptance import AcceptanceModel, counterfactual_commits
from .costs import CostTable
from .shapes import Shape


@dataclass(frozen=True)
class Choice:
    shape: Shape
    tau: float  # expected committed tokens per step and request
    step_s: float  # measured step time at this batch size

    @property
    def tokens_per_s(self) -> float:
        return self.tau / self.step_s


class Planner:
    """Holds the cost table and the acceptance estimates; `choose(bs)` reads host numbers only (no device sync)."""

    def __init__(self, costs: CostTable, acceptance: AcceptanceModel, max_n: Callable[[int], int] | None = None):
        self.costs = costs
        self.acceptance = acceptance
        self.max_n = max_n  # candidates a batch of bs draws (None: every tree shape at every size)
        self.chosen: Counter = Counter()  # (bs, shape label) -> steps, for the periodic summary

    def options(self, bs: int) -> list[Choice]:
        out = []
        for shape in self.acceptance.shapes:
            if not self.drawable(shape, bs):
                continue
            t = self.costs.time(shape, bs)
            if t is not None:
                out.append(Choice(shape, self.acceptance.tau(shape), t))
        return out

    def drawable(self, shape: Shape, bs: int) -> bool:
        """Whether a batch of bs draws the shape's N candidates (at the table size it pads to, if larger)."""
        if shape.is_chain or self.max_n is None:
            return True
        size = self.costs.size_for(shape, bs)
        return shape.n <= self.max_n(max(bs, size or bs))

    def choose(self, bs: int) -> Choice:
        options = self.options(bs)
        if not options:
            raise ValueError(f"the planner has no measured step time for a batch of {bs}: measure the shapes first")
        # ties: the cheaper step (fewer verify tokens) first
        best = max(options, key=lambda c: (c.tokens_per_s, -c.step_s))
        self.chosen[(bs, best.shape.label())] += 1
        return best

    def observe(self, candidates: torch.Tensor, committed: torch.Tensor, policy: str = "vote",
                grown: VoteTree | None = None) -> None:
        """Credit every shape with what it would have committed on this step: `candidates` (bs, N, K) as drawn,
        `committed` (bs, L) the step's committed tokens, -1 past each row's end (the walk's `tokens`), `grown` the
        step's best-first tree at the menu's widest best-first width (best-first shapes)."""
        self.acceptance.update(counterfactual_commits(candidates, committed, self.acceptance.shapes, policy, grown))

    def widest_grown(self) -> int:
        """The width a best-first step grows its tree to: the menu's widest best-first shape's, so that its first
        nodes are every best-first shape's tree (`first_nodes`) and one step credits them all."""
        return max(s.width for s in self.acceptance.shapes if s.grown)

    def summary(self) -> list[dict]:
        """The choices so far, per batch size and shape, with the current estimates (what the server logs)."""
        rows = []
        for (bs, label), steps in sorted(self.chosen.items()):
            rows.append({"bs": bs, "shape": label, "steps": steps})
        return rows
