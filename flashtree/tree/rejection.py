"""Chain speculative sampling (rejection sampling against the draft's probabilities), pure torch, for N = 1.

The walk `verify_sampled` needs no draft probabilities; this one does, and accepts more on a chain: draft token x_j
(drawn from q_j) is accepted with probability min(1, p_j(x_j) / q_j(x_j)); at the first rejection the step emits a
draw from normalize(max(p_j - q_j, 0)); after a fully accepted chain it emits a bonus draw from p_K. Each committed
token is then distributed as the target's p given the committed prefix (Leviathan et al. 2023, Chen et al. 2023).
"""

from __future__ import annotations

import torch

from ..sampler.reference import filter_logits
from .types import VerifyResult


def verify_rejection(
    chain_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_logits: torch.Tensor,
    temperature: torch.Tensor | float,
    generator: torch.Generator | None = None,
    top_k: torch.Tensor | int | None = None,
    top_p: torch.Tensor | float | None = None,
) -> VerifyResult:
    """Rejection-sample a chain of K draft tokens per request.

    chain_tokens (bs, K) int64; draft_probs (bs, K, V): the distribution each chain token was drawn from;
    target_logits (bs, K + 1, V): the target's logits at the root (the anchor) and after each chain token.
    temperature (> 0), top_k, top_p: scalars or (bs,), applied to the target as `verify_sampled` does (the draft's
    q is used as given). Node j of the chain is window offset j (0 = root), so `path` is 0..accept_len.
    """
    bs, k = chain_tokens.shape
    if draft_probs.shape[:2] != (bs, k) or target_logits.shape[:2] != (bs, k + 1):
        raise ValueError(
            f"for a (bs, K) = {(bs, k)} chain, draft_probs must be (bs, K, V) and target_logits (bs, K + 1, V); got "
            f"{tuple(draft_probs.shape)} and {tuple(target_logits.shape)}"
        )
    v = target_logits.shape[2]
    device = target_logits.device
    temperature = torch.as_tensor(temperature, dtype=torch.float32, device=device).expand(bs)
    if not (temperature > 0).all():
        raise ValueError("rejection sampling needs temperature > 0 (temperature 0 is the greedy walk)")

    def per_node(x):  # a scalar or (bs,) setting -> one value per (request, position) row
        return None if x is None else torch.as_tensor(x, device=device).expand(bs).repeat_interleave(k + 1)

    scaled = target_logits.float().reshape(bs * (k + 1), v) / per_node(temperature).view(-1, 1)
    p = filter_logits(scaled, per_node(top_k), per_node(top_p)).softmax(dim=-1).view(bs, k + 1, v)
    q = draft_probs.float()

    x = chain_tokens.unsqueeze(2)
    p_x, q_x = p[:, :k].gather(2, x).squeeze(2), q.gather(2, x).squeeze(2)
    u = torch.rand(bs, k, generator=generator, device=device)
    accepted = u * q_x < p_x  # u < p/q without dividing; p_x = 0 always rejects
    accept_len = accepted.long().cumprod(dim=1).sum(dim=1)

    # The emitted token: from the residual at the first rejection, from p_K after a fully accepted chain.
    at = accept_len.view(bs, 1, 1).expand(bs, 1, v)
    p_a = p.gather(1, at).squeeze(1)
    q_a = torch.cat([q, q.new_zeros(bs, 1, v)], dim=1).gather(1, at).squeeze(1)
    residual = (p_a - q_a).clamp(min=0)
    residual = torch.where(residual.sum(dim=1, keepdim=True) > 0, residual, p_a)  # p == q: no rejection mass left
    bonus = torch.multinomial(residual, 1, generator=generator).view(bs)

    idx = torch.arange(k + 1, device=device).expand(bs, k + 1)
    kept = idx <= accept_len.view(bs, 1)
    path = torch.where(kept, idx, -1)
    tokens = torch.where(kept, torch.cat([chain_tokens, chain_tokens.new_zeros(bs, 1)], dim=1), -1)
    tokens.scatter_(1, accept_len.view(bs, 1), bonus.view(bs, 1))
    return VerifyResult(path=path, accept_len=accept_len, bonus=bonus, tokens=tokens)
