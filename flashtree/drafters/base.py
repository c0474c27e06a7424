"""The drafter protocol the reference engine drives.

A drafter is stateful for one generation. The engine calls, in order:
  start(state)                 once, after the target's prefill
  propose(n, generator) ...    once per step: N candidate blocks of K tokens after each request's anchor
  advance(state)               after each commit, with the new committed tokens (and target hidden states)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from ..tree import DraftScores


@dataclass
class DraftState:
    """What the drafter may read after a prefill or a commit (batch size bs, one row per request).

    tokens: (bs, L) every committed token so far, the prompt included; the anchor (the last committed token, which
        has no target KV yet) is tokens[b, lengths[b] - 1]. Rows are right-padded with -1 past lengths[b].
    lengths: (bs,) committed tokens per row.
    new_from: (bs,) index of the first token committed since the previous call (0 at start).
    hidden: target hidden states for every position that has target KV (positions 0 .. lengths[b] - 2), one
        (bs, L - 1, H) tensor per layer id in `Drafter.hidden_layers`, HF indexing (key i = output of layer i,
        i.e. `hidden_states[i + 1]`). Empty when the drafter reads no layers.
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    new_from: torch.Tensor
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)


@dataclass
class Proposal:
    """N candidate blocks per request. `probs` (bs, N, K, V), optional: the draft distribution at each slot;
    `scores`, optional: what the probability tree policies read (`flashtree.tree.DraftScores`)."""

    candidates: torch.Tensor  # (bs, N, K) int64
    probs: torch.Tensor | None = None
    scores: DraftScores | None = None


@runtime_checkable
class Drafter(Protocol):
    k: int  # block size: draft tokens per candidate
    vocab_size: int
    hidden_layers: tuple[int, ...]  # target layer ids whose hidden states the drafter reads (empty: none)

    def start(self, state: DraftState) -> None: ...

    def propose(self, n: int, generator: torch.Generator | None = None) -> Proposal: ...

    def advance(self, state: DraftState) -> None: ...
