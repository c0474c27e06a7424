"""Row sampler reference: greedy argmax or temperature / top-k / top-p sampling, one token per row.

Filters follow Hugging Face's order and semantics (temperature, then top-k keeping ties at the k-th value, then
top-p keeping the smallest high-probability set whose mass exceeds p), so the engine samples as `generate` does.
Sampling is Gumbel-max in its exponential-race form: argmax(p / E) with E ~ Exp(1), exact and tie-free in practice;
greedy rows (temperature 0) take the argmax, ties to the lowest token id.
"""

from __future__ import annotations

import torch


def filter_logits(logits: torch.Tensor, top_k: torch.Tensor | None = None, top_p: torch.Tensor | None = None) -> torch.Tensor:
    """Mask (to -inf) what top-k / top-p remove, per row. top_k <= 0 and top_p >= 1 switch a row's filter off."""
    logits = logits.float()
    v = logits.shape[-1]
    if top_k is not None:
        k = top_k.to(torch.long).clamp(max=v)
        k = torch.where(k > 0, k, v)
        kth = logits.sort(dim=-1, descending=True).values.gather(-1, (k - 1).view(-1, 1))
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        p = top_p.to(torch.float32).view(-1, 1)
        ascending, order = logits.sort(dim=-1, stable=True)
        cum = ascending.softmax(dim=-1).cumsum(dim=-1)
        remove = cum <= (1 - p)
        remove[:, -1] = False  # always keep the most likely token
        remove = remove & (p < 1)
        logits = logits.masked_fill(remove.scatter(1, order, remove), float("-inf"))
    return logits


def sample_rows(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    generator: torch.Generator | None = None,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """(R, V) logits, (R,) temperatures -> (R,) int64 tokens."""
    greedy = temperature <= 0
    scaled = logits.float() / torch.where(greedy, 1.0, temperature.float()).view(-1, 1)
    probs = filter_logits(scaled, top_k, top_p).softmax(dim=-1)
    race = torch.empty_like(probs).exponential_(generator=generator)
    sampled = (probs / race).argmax(dim=-1)
    return torch.where(greedy, logits.argmax(dim=-1), sampled)


def row_topk_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probabilities (R, k), token ids (R, k)) of each row's k most probable tokens, largest first, ties to the
    lower id (a stable descending sort); slots past a row's finite logits are -inf at token 0."""
    logp = logits.float().log_softmax(dim=-1)
    values, ids = logp.sort(dim=-1, descending=True, stable=True)
    values, ids = values[:, :k], ids[:, :k]
    return values, torch.where(values == float("-inf"), 0, ids)
