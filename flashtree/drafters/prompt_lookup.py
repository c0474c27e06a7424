"""Prompt-lookup drafter: training-free, candidates are continuations of earlier matches of the context's last tokens.

For the last 3, then 2, then 1 committed tokens (the anchor last), every earlier occurrence in prompt + output is a
match, most recent first; the K tokens after a match are a candidate. Distinct matches give distinct candidates, so
N > 1 comes for free. A continuation that runs into the present repeats itself (an overlapping copy, as in LZ77), which
is what the target does when it loops.
"""

from __future__ import annotations

import torch

from .base import DraftState, Proposal


class PromptLookupDrafter:
    """N candidate blocks of K tokens from n-gram matches in the committed tokens.

    Candidates are ordered by match quality (longer n-gram first, then most recent); identical continuations count
    once. When fewer than N distinct ones exist, the best is repeated: duplicates add no node to the tree and raise
    the votes of the most trusted path. With no match at all the block is the anchor repeated (a cheap guess that is
    right when the target repeats a token).
    """

    hidden_layers: tuple[int, ...] = ()

    def __init__(self, vocab_size: int, k: int = 8, ngrams: tuple[int, ...] = (3, 2, 1), max_matches: int = 64):
        if k < 1:
            raise ValueError(f"k (draft tokens per candidate) must be >= 1, got {k}")
        if not ngrams or any(n < 1 for n in ngrams):
            raise ValueError(f"ngrams must be positive lengths, got {ngrams}")
        self.k = k
        self.vocab_size = vocab_size
        self.ngrams = tuple(sorted(set(ngrams), reverse=True))
        self.max_matches = max_matches  # most recent matches examined per n-gram length (bounds the work per step)
        self._rows: list[torch.Tensor] = []
        self._device = torch.device("cpu")

    def start(self, state: DraftState) -> None:
        self._remember(state)

    def advance(self, state: DraftState) -> None:
        self._remember(state)

    def _remember(self, state: DraftState) -> None:
        # The search runs on the CPU: it is a handful of small comparisons, not worth device launches.
        tokens, lengths = state.tokens.cpu(), state.lengths.cpu().tolist()
        self._rows = [tokens[b, : lengths[b]] for b in range(tokens.shape[0])]
        self._device = state.tokens.device

    def propose(self, n: int, generator: torch.Generator | None = None) -> Proposal:
        """Deterministic: `generator` is unused. `probs` is None (each candidate token is a point mass)."""
        if not self._rows:
            raise RuntimeError("propose() before start(): the drafter has no context")
        if n < 1:
            raise ValueError(f"n (candidates) must be >= 1, got {n}")
        blocks = [self.candidates(row, n) for row in self._rows]
        return Proposal(candidates=torch.stack(blocks).to(self._device))

    def candidates(self, tokens: torch.Tensor, n: int) -> torch.Tensor:
        """(n, K) candidate blocks after the last token of the 1-D sequence `tokens`."""
        found: list[torch.Tensor] = []
        seen: set[tuple[int, ...]] = set()
        length = tokens.numel()
        offsets = torch.arange(self.k)
        for size in self.ngrams:
            if len(found) == n or length <= size:
                continue
            suffix = tokens[length - size :]
            # windows that end before the anchor: starts 0 .. length-1-size
            windows = tokens[: length - 1].unfold(0, size, 1)
            starts = (windows == suffix).all(dim=1).nonzero().flatten().flip(0)[: self.max_matches]
            if starts.numel() == 0:
                continue
            ends = (starts + size)[:, None]  # first continuation index, <= length - 1
            period = length - ends
            blocks = tokens[ends + offsets % period]  # overlapping copy past the present
            for block in blocks:
                key = tuple(block.tolist())
                if key not in seen:
                    seen.add(key)
                    found.append(block)
                    if len(found) == n:
                        break
        if not found:
            found.append(tokens[-1:].expand(self.k))
        found.extend(found[:1] * (n - len(found)))
        return torch.stack(found)
