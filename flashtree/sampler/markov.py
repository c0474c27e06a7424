"""N draws of a draft block through a vanilla Markov head (DSPARK's `VanillaMarkov`), candidate rows request-major.

Step j of row i (request b = i // N) scores the vocabulary with
    logits = base_logits[b, j] + w2 @ w1[prev]          (prev: the anchor at j = 0, else row i's token at j - 1)
rounded as sglang's torch ops round them (the bias in the weights' dtype, the sum in the promoted dtype). Greedy rows
take the argmax (ties to the lowest id); the others take a Gumbel-max draw from softmax(logits * inv_temperature).
Noise comes from `state` = int64 (seed, call counter): each call reads it and adds 1 to the counter, so a call replayed
from a CUDA graph redraws without a host round trip.

`markov_draws` runs the Triton kernels on CUDA tensors (flashtree/sampler/triton_markov.py: K launches a block) and
the torch reference elsewhere; the two agree exactly on greedy rows and in distribution on the others. With
`return_logp` it also returns log q of each drawn token at temperature 1, log softmax(logits)[token], what the
probability tree policies rank by.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def new_state(seed: int, device) -> torch.Tensor:
    """The (seed, call counter) noise state `markov_draws` reads and advances."""
    return torch.tensor([int(seed), 0], dtype=torch.int64, device=device)


def candidate_rows(bs: int, n: int, temperature: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(inv_temperature, greedy), each (bs * N,), request-major: candidate 0 of each request greedy (the draft's own
    block, so a tree always holds the chain's block), candidates 1..N-1 drawn at `temperature`."""
    greedy = torch.zeros((bs, n), dtype=torch.bool, device=device)
    greedy[:, 0] = True
    inv = torch.full((bs * n,), 1.0 / float(temperature), dtype=torch.float32, device=device)
    return inv, greedy.view(-1)


def gumbel_pick(step_logits, exp_noise, inv_temperature, greedy) -> torch.Tensor:
    """Per row: argmax(logits) on greedy rows, else argmax(logits / T - log E) with E ~ Exp(1) (Gumbel-max: a draw
    from softmax(logits / T)). The noise comes in, so a CUDA graph can refill it in place on every replay;
    `exp_noise` is overwritten.

    The row sampler's reference (`reference.sample_rows`) stays apart: it filters top-k / top-p and races
    probabilities (argmax(p / E)), which rounds differently, and its kernel is tested bit-equal to it."""
    gumbel = exp_noise.clamp_min_(torch.finfo(torch.float32).tiny).log_()  # E = 0 would pick any token
    scores = torch.mul(step_logits.float(), inv_temperature[:, None]).sub_(gumbel)
    return torch.where(greedy, step_logits.argmax(dim=-1), scores.argmax(dim=-1))


def markov_draws(base_logits, anchor, w1, w2, n: int, inv_temperature, greedy, state, return_logp: bool = False):
    """base_logits (bs, K, V), anchor (bs,), w1 (V', r) embedding weight, w2 (V, r) projection weight,
    inv_temperature (bs*N,) float32, greedy (bs*N,) bool -> tokens (bs, N, K) int64, and with `return_logp` also
    logp (bs, N, K) float32."""
    if base_logits.is_cuda:
        from .triton_markov import markov_draws_triton

        return markov_draws_triton(base_logits, anchor, w1, w2, n, inv_temperature, greedy, state,
                                   return_logp=return_logp)
    return markov_draws_reference(base_logits, anchor, w1, w2, n, inv_temperature, greedy, state, return_logp)


def markov_draws_reference(base_logits, anchor, w1, w2, n, inv_temperature, greedy, state, return_logp=False):
    bs, k, _v = base_logits.shape
    generator = torch.Generator(device=base_logits.device)
    seed, calls = (int(x) for x in state.tolist())
    generator.manual_seed((seed * 1_000_003 + calls) % (1 << 63))
    state[1] += 1
    prev = anchor.long().repeat_interleave(n)
    out, logp = [], []
    for j in range(k):
        logits = base_logits[:, j].repeat_interleave(n, dim=0) + F.linear(F.embedding(prev, w1), w2)
        noise = torch.empty(logits.shape, dtype=torch.float32, device=logits.device).exponential_(generator=generator)
        prev = gumbel_pick(logits, noise, inv_temperature, greedy)
        out.append(prev)
        if return_logp:
            logp.append(logits.float().log_softmax(dim=-1).gather(1, prev[:, None])[:, 0])
    tokens = torch.stack(out, dim=1).view(bs, n, k)
    return (tokens, torch.stack(logp, dim=1).view(bs, n, k)) if return_logp else tokens


__all__ = ["candidate_rows", "gumbel_pick", "markov_draws", "markov_draws_reference", "new_state"]
