"""Row sampling: greedy argmax or temperature / top-k / top-p draws, one token per row.

`sample_rows` runs the fused Triton Gumbel-max kernel on CUDA tensors and the torch reference elsewhere. Draft-side
draws: `candidate_rows` (candidate 0 greedy, the rest at a temperature) and `gumbel_pick` (one graph-safe Gumbel-max
step on noise the caller fills), both from `markov`. `row_topk_logprobs`: each row's k most probable tokens with their
log-probabilities (best-first's rounds), the Triton kernels on CUDA. `candidate_draws`: N draws per row for drafts
whose positions are independent (DFLASH), column 0 each row's argmax.
"""

from __future__ import annotations

import torch

from . import reference
from .markov import candidate_rows, gumbel_pick


def sample_rows(logits, temperature, generator=None, top_k=None, top_p=None) -> torch.Tensor:
    if logits.is_cuda:
        from .triton_sampler import sample_rows_triton

        return sample_rows_triton(logits, temperature, generator=generator, top_k=top_k, top_p=top_p)
    return reference.sample_rows(logits, temperature, generator=generator, top_k=top_k, top_p=top_p)


def candidate_draws(logits: torch.Tensor, n: int, temperature: float, generator=None) -> torch.Tensor:
    """(R, V) -> (R, n) int64: column 0 each row's argmax (the draft's own token), columns 1..n - 1 independent draws
    at `temperature` (argmax again when it is <= 0). The Triton sampler's N-candidate form reads each row once; the
    rows are never repeated n times (at 8B shapes, 16 candidates x 15 positions x 32 requests of a 152K vocabulary
    would be a 2.3 GB copy)."""
    greedy = logits.argmax(dim=-1, keepdim=True)
    if n == 1 or temperature <= 0:
        return greedy.expand(-1, n).contiguous()
    from .triton_sampler import sample_candidates_triton

    temperatures = torch.full((logits.shape[0],), float(temperature), device=logits.device)  # a fill: no host copy
    return torch.cat([greedy, sample_candidates_triton(logits, temperatures, n - 1, generator=generator)], dim=1)


def row_topk_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    if logits.is_cuda:
        from .triton_topk import TOPK_MAX, row_topk_logprobs as on_gpu

        if k > TOPK_MAX:  # trees of more than TOPK_MAX + 1 tokens: the sort
            return reference.row_topk_logprobs(logits, k)
        return on_gpu(logits, k)
    return reference.row_topk_logprobs(logits, k)


__all__ = ["candidate_draws", "candidate_rows", "gumbel_pick", "row_topk_logprobs", "sample_rows"]
