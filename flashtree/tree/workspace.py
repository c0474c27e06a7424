"""Output buffers a serving loop lends the tree kernels' wrappers, so a step allocates no scratch tensors.

A wrapper given a `Workspace` takes the outputs its caller reads within the step only (the tree step's walk path,
permutation, copy plan, verify ids, positions, mask and statistics rows) from it; outputs that outlive the step
(new lengths, output and bonus tokens, commit lengths: sglang keeps them for the next step) stay fresh allocations.
Each key alternates between `depth` sets, so a call's buffers are not written again until `depth` calls later: with
the default 2, a reader one step behind (the overlap scheduler's next step) still sees them intact. Without a
workspace every output is a fresh allocation, as the references' are.
"""

from __future__ import annotations

from typing import Callable

import torch


class Workspace:
    def __init__(self, depth: int = 2):
        self.depth = depth
        self._sets: dict = {}

    def take(self, key, make: Callable[[], tuple]) -> tuple:
        """The next of `depth` sets of buffers for `key` (built by `make` on first use)."""
        entry = self._sets.get(key)
        if entry is None:
            entry = self._sets[key] = [[make() for _ in range(self.depth)], 0]
        sets, i = entry
        entry[1] = (i + 1) % self.depth
        return sets[i]

    def flat(self, key, numel: int, dtype: torch.dtype, device) -> torch.Tensor:
        """A 1-D buffer of `numel` elements, a view of the next of `depth` buffers for `key` that grow to the largest
        size asked (by a quarter more, so slowly growing sizes reallocate rarely)."""
        entry = self._sets.get(key)
        if entry is None:
            entry = self._sets[key] = [[None] * self.depth, 0]
        bufs, i = entry
        entry[1] = (i + 1) % self.depth
        buf = bufs[i]
        if buf is None or buf.numel() < numel:
            buf = bufs[i] = torch.empty(numel + numel // 4, dtype=dtype, device=device)
        return buf[:numel]
