"""A test drafter with known behaviour: it knows each request's reference greedy sequence and corrupts it on purpose.

Each step, for each request, the oracle draws (from its own seeded generator, so the pattern is reproducible and
independent of the engine's sampling):
  ceiling D   uniform in 0..K: the deepest correct prefix any candidate has, so rejections happen at every depth
              (D = 0: every candidate is wrong at its first token; D = K: one candidate is fully right);
  per candidate, its first wrong slot e = min(D, Geometric(rate)), one random candidate getting e = D exactly;
  at slot e a decoy token, picked among `decoys` per (step, slot), so wrong candidates often share a branch and
  outvote the right one; after it the candidate rejoins the reference tokens (deep wrong subtrees to prune).
Candidate order is shuffled, so the right branch is often neither the first child nor the most voted one.

It also checks what the engine committed: `divergence` holds the first (request, position) where committed tokens left
the reference sequence (None while they match); strict=True raises there instead.
"""

from __future__ import annotations

import torch

from .base import DraftState, Proposal


class OracleDrafter:
    hidden_layers: tuple[int, ...] = ()

    def __init__(
        self,
        sequences,
        vocab_size: int,
        *,
        k: int = 4,
        rate: float = 0.35,
        decoys: int = 2,
        seed: int = 0,
        strict: bool = False,
    ):
        """sequences: per request, the reference token ids (prompt included): the target's own greedy decoding."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate (per-slot corruption probability) must be in [0, 1], got {rate}")
        if decoys < 1 or decoys >= vocab_size:
            raise ValueError(f"decoys must be in 1..vocab_size-1, got {decoys}")
        self.sequences = [torch.as_tensor(list(s), dtype=torch.long) for s in sequences]
        for b, seq in enumerate(self.sequences):
            if seq.numel() and not (0 <= int(seq.min()) and int(seq.max()) < vocab_size):
                raise ValueError(f"reference sequence {b} has token ids outside the vocabulary 0..{vocab_size - 1}")
        self.k, self.vocab_size = k, vocab_size
        self.rate, self.decoys, self.seed, self.strict = rate, decoys, seed, strict
        self.generator = torch.Generator().manual_seed(seed)
        self.divergence: tuple[int, int] | None = None
        self.ceilings: list[list[int]] = []  # per step, per request: the ceiling D that was drawn
        self._lengths: list[int] = []
        self._device = torch.device("cpu")

    def start(self, state: DraftState) -> None:
        if state.tokens.shape[0] != len(self.sequences):
            raise ValueError(f"the oracle knows {len(self.sequences)} sequences, the batch has {state.tokens.shape[0]}")
        self.generator.manual_seed(self.seed)
        self.divergence, self.ceilings = None, []
        self._observe(state)

    def advance(self, state: DraftState) -> None:
        self._observe(state)

    def _observe(self, state: DraftState) -> None:
        tokens, lengths = state.tokens.cpu(), state.lengths.cpu().tolist()
        self._device = state.tokens.device
        self._lengths = lengths
        for b, length in enumerate(lengths):
            reference = self.sequences[b]
            seen = min(length, reference.numel())
            wrong = (tokens[b, :seen] != reference[:seen]).nonzero()
            if wrong.numel() and self.divergence is None:
                self.divergence = (b, int(wrong[0]))
                if self.strict:
                    raise AssertionError(
                        f"request {b}: committed token {int(tokens[b, int(wrong[0])])} at position {int(wrong[0])} "
                        f"differs from the reference {int(reference[int(wrong[0])])}"
                    )

    def truth(self, b: int) -> torch.Tensor:
        """The K reference tokens after request b's anchor (0-padded past the end of the reference)."""
        reference, length = self.sequences[b], self._lengths[b]
        block = torch.zeros(self.k, dtype=torch.long)
        tail = reference[length : length + self.k]
        block[: tail.numel()] = tail
        return block

    def propose(self, n: int, generator: torch.Generator | None = None) -> Proposal:
        """`generator` is unused: the corruption pattern comes from the oracle's own seed."""
        if not self._lengths:
            raise RuntimeError("propose() before start(): the drafter has no context")
        if n < 1:
            raise ValueError(f"n (candidates) must be >= 1, got {n}")
        blocks, ceilings = [], []
        for b in range(len(self._lengths)):
            block, ceiling = self._corrupt(self.truth(b), n)
            blocks.append(block)
            ceilings.append(ceiling)
        self.ceilings.append(ceilings)
        return Proposal(candidates=torch.stack(blocks).to(self._device))

    def _corrupt(self, truth: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:
        g, k = self.generator, self.k
        ceiling = int(torch.randint(0, k + 1, (), generator=g))
        # Geometric(rate): correct slots before the first corruption.
        hits = torch.rand(n, k, generator=g) < self.rate
        first_error = torch.where(hits.any(1), hits.float().argmax(1), torch.full((n,), k)).clamp(max=ceiling)
        first_error[int(torch.randint(0, n, (), generator=g))] = ceiling
        # Decoy offsets in 1..V-1 (never the true token), `decoys` choices per slot shared by all candidates.
        offsets = torch.randint(1, self.vocab_size, (k, self.decoys), generator=g)
        pick = torch.randint(0, self.decoys, (n,), generator=g)
        block = truth.expand(n, k).clone()
        rows = (first_error < k).nonzero().flatten()
        slots = first_error[rows]
        block[rows, slots] = (truth[slots] + offsets[slots, pick[rows]]) % self.vocab_size
        return block[torch.randperm(n, generator=g)], ceiling
