"""The N candidate blocks drawn from one draft forward's logits, as the tree step draws them eagerly (decode.py) and
as DFLASH's draft graph tail draws them (graph_draws.py, on torch's default generator): a FlashMap draft's noise
draws, else flashtree's row sampler or fused kernels through the adapter's `sample_blocks` (the Markov head's steps,
or N draws per independent position)."""

from __future__ import annotations

import torch

from flashtree.sampler import candidate_draws, candidate_rows
from flashtree.sampler.markov import markov_draws

from . import flashmap_draft, policy_draws
from .state import TreeRun


def draw_candidates(run: TreeRun, worker, base_logits, anchor, draft_hidden, n: int, with_logp: bool = False,
                    default_generator: bool = False):
    """The N candidate blocks (bs, N, K), drawn eagerly: a FlashMap draft's noise draws, else the Markov head's.
    with_logp (FLASHTREE_TREE_POLICY=prob): (candidates, log q of each token at temperature 1 (bs, N, K)).
    default_generator: the row samplers draw on torch's default generator, which CUDA graphs capture (DFLASH's draft
    graph tail), instead of FLASHTREE_SEED's."""
    plan = run.plan
    generator = None if default_generator else run.generator
    drawn = flashmap_draft.noise_draws(plan.adapter, worker, base_logits.shape[0])
    if drawn is not None:
        return drawn  # policy_draws.check refuses scored policies with a FlashMap draft
    temperature = plan.toggles.draft_temperature

    def sampler(step_logits: torch.Tensor) -> torch.Tensor:
        _inv, greedy = candidate_rows(step_logits.shape[0] // n, n, temperature, step_logits.device)
        return plan.sampler(step_logits, torch.where(greedy, 0.0, temperature), generator=generator)

    def fused(base, anchor, w1, w2):  # a vanilla Markov head: all K steps of the N draws in K launches on CUDA
        inv_temperature, greedy = candidate_rows(base.shape[0], n, temperature, base.device)
        return markov_draws(base, anchor, w1, w2, n, inv_temperature, greedy, run.noise, return_logp=with_logp)

    def row_draws(rows: torch.Tensor) -> torch.Tensor:  # independent positions (DFLASH): N per row, one read
        return candidate_draws(rows, n, temperature, generator)

    if with_logp:
        sampler, taken = policy_draws.recording_logp(sampler)
    fast = run.noise is not None  # FLASHTREE_FUSED_SAMPLER=1
    out = plan.adapter.sample_blocks(worker, base_logits, anchor, draft_hidden, n, sampler, fused if fast else None,
                                     row_draws if fast else None)
    if not with_logp or isinstance(out, tuple):
        return out
    return out, taken(base_logits.shape[0], n)
