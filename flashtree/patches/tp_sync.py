"""Tensor-parallel consistency of the tree step (FLASHTREE_TP=1): every TP rank runs the whole tree step on its own
copy of the batch, so every random choice must come from one rank, and a cheap check must catch ranks that drift.

What is broadcast from the group's first rank: the N candidate blocks (bs, N, K) after the draws (eager, graph tail or
FlashMap noise alike), the sampled walk's per-node target draws (bs, W) before the greedy walk over them, and a
simulated step's drawn lengths. The rest is a function of those and of the target logits, which TP gathers identically
on every rank (greedy batches need nothing beyond the candidates). Every `CHECK_EVERY` tree steps the ranks compare a
checksum of the tokens they committed since the last check and stop with one error naming the step if they differ.

`TpSync(None)` (TP 1) does nothing: no collective, no device op.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

CHECK_EVERY = 64
# Checksums stay below 2^40 so that -sum fits int64 and one MAX all-reduce of (sum, -sum) yields max and -min.
_MOD = 1 << 40


class TpDivergence(RuntimeError):
    """TP ranks committed different tokens: the server must stop rather than serve one rank's wrong output."""


class TpSync:
    def __init__(self, group: dist.ProcessGroup | None):
        self.group = group
        self.src = None if group is None else dist.get_global_rank(group, 0)
        self.checksum: torch.Tensor | None = None  # committed tokens since the last check (device int64 scalar)
        self.checked = 0  # the tree step of the last agreement

    def from_first(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` as the group's first rank holds it (unchanged at TP 1); a dense tensor is overwritten in place."""
        if self.group is None:
            return tensor
        tensor = tensor.contiguous()  # a graph-draws buffer's slice or an expanded length: broadcast needs a dense one
        dist.broadcast(tensor, src=self.src, group=self.group)
        return tensor

    def committed(self, tokens: torch.Tensor, lens: torch.Tensor, step: int) -> None:
        """Fold this step's committed tokens (the first lens[b] of tokens[b]) into the checksum, on device (no host
        wait); on every CHECK_EVERY-th step compare it across ranks. Raises TpDivergence naming the step."""
        if self.group is None:
            return
        bs, width = tokens.shape
        col = torch.arange(width, device=tokens.device)
        kept = torch.where(col < lens.view(bs, 1), tokens.long(), -1)  # -1 past the commit: lengths count too
        weight = 1 + col + width * torch.arange(bs, device=tokens.device).view(bs, 1)  # order counts too
        step_sum = (kept * weight).sum() % _MOD
        self.checksum = step_sum if self.checksum is None else (self.checksum + step_sum) % _MOD
        if step % CHECK_EVERY:
            return
        both = torch.stack([self.checksum, -self.checksum])
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self.group)
        high, neg_low = both.tolist()  # the one host wait, every CHECK_EVERY steps
        if high != -neg_low:
            raise TpDivergence(
                f"flashtree: tensor-parallel ranks committed different tokens between tree steps {self.checked + 1} "
                f"and {step} (checksums from {-neg_low} to {high}); stopping rather than serving diverged ranks. "
                "Serve at --tp-size 1, or without the tree path (unset FLASHTREE_TREE_N)"
            )
        self.checksum, self.checked = None, step
