"""The data the tree step passes between the release adapter's primitives: plain dataclasses, one per stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Window:
    """The W verify slots of each request: positions (bs, W), slot ids flat (bs*W,) and (bs, W)."""

    positions_2d: torch.Tensor
    cache_loc: torch.Tensor
    cache_loc_2d: torch.Tensor
    native: Any = None  # the release's own VerifyWindow

    def narrowed(self, w: int) -> "Window":
        """The first w slots of each request (a verify graph captured at a narrower width)."""
        loc = self.cache_loc_2d[:, :w]
        return Window(self.positions_2d[:, :w], loc.reshape(-1), loc, self.native)


@dataclass
class DraftOut:
    """The tree step's draft forward: the anchor, and either the N candidates (graph draws) or what the eager draws
    need (base logits (bs, K, V), draft hidden (bs, K, H) or None)."""

    anchor: torch.Tensor
    base_logits: torch.Tensor | None
    draft_hidden: torch.Tensor | None
    candidates: torch.Tensor | None = None  # (bs, N, K) int64


@dataclass
class Verified:
    logits_output: Any  # the release's LogitsProcessorOutput (hidden_states filled, FULL capture)
    logits: torch.Tensor  # (bs*W, V)
    hidden: torch.Tensor  # (bs*W, H)
    can_run_cuda_graph: bool
