"""Sampled tree decoding is distributed exactly as the target's own sampling (engine wiring: cache, positions, masks),
with the target-only tree walk and with chain rejection sampling against the draft's probabilities."""

import itertools

import pytest
import torch
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM

from flashtree.drafters.base import DraftState, Proposal
from flashtree.engine import tree_generate
from flashtree.sampler.reference import filter_logits

V, NEW, RUNS = 6, 3, 3000


class RandomBlocks:
    """Candidate blocks of uniform random tokens: over a 6-token vocabulary the trie catches real paths often."""

    hidden_layers = ()

    def __init__(self, k: int, seed: int):
        self.k, self.vocab_size, self.g = k, V, torch.Generator().manual_seed(seed)

    def start(self, state: DraftState) -> None:
        self.bs = state.tokens.shape[0]

    def advance(self, state: DraftState) -> None:
        pass

    def propose(self, n, generator=None) -> Proposal:
        return Proposal(candidates=torch.randint(0, V, (self.bs, n, self.k), generator=self.g))


class RandomDistributions(RandomBlocks):
    """Each slot drawn from its own random distribution q (new every step), returned as `probs`: a slot paired with
    another slot's q, or a q other than the one drawn from, would bias the rejection walk."""

    def propose(self, n, generator=None) -> Proposal:
        q = (2 * torch.randn(self.bs, n, self.k, V, generator=self.g)).softmax(-1)
        tokens = torch.multinomial(q.view(-1, V), 1, generator=self.g).view(self.bs, n, self.k)
        return Proposal(candidates=tokens, probs=q)


def _model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # sharper, context-dependent next-token distributions
    return model


def _exact(model, prompt, temperature, top_k, top_p):
    """P(first NEW tokens) under sequential sampling from the target, by enumerating every continuation."""
    seqs = torch.tensor(list(itertools.product(range(V), repeat=NEW)))
    full = torch.cat([prompt.expand(seqs.shape[0], -1), seqs], dim=1)
    with torch.no_grad():
        logits = model(full).logits[:, prompt.numel() - 1 : -1].float() / temperature
    rows = logits.reshape(-1, V)
    k = None if top_k is None else torch.full((rows.shape[0],), top_k)
    p = None if top_p is None else torch.full((rows.shape[0],), top_p)
    logp = filter_logits(rows, k, p).log_softmax(-1).view(seqs.shape[0], NEW, V)
    joint = logp.gather(2, seqs.unsqueeze(2)).squeeze(2).sum(1).exp()
    return {tuple(s.tolist()): float(q) for s, q in zip(seqs, joint)}


def _check(temperature, top_k=None, top_p=None, n=4, width=8, k=2, drafter=RandomBlocks, walk="target"):
    model = _model()
    prompt = torch.tensor([1, 4, 2])
    expected = _exact(model, prompt, temperature, top_k, top_p)
    counts = dict.fromkeys(expected, 0)
    g = torch.Generator().manual_seed(1)
    drafter = drafter(k, seed=2)
    accepted = steps = 0
    for _ in range(RUNS):
        res = tree_generate(model, drafter, prompt, n=n, width=width, max_new_tokens=NEW, temperature=temperature,
                            top_k=top_k, top_p=top_p, generator=g, walk=walk)
        counts[tuple(res.sequences[0, prompt.numel() :].tolist())] += 1
        accepted += sum(s.accept_len for s in res.steps)
        steps += len(res.steps)
    assert accepted / steps > 0.3  # trees were used, and steps continued from reordered caches
    assert steps > RUNS  # more than one step per run: the cache after a commit was exercised
    # pool the rare outcomes so every cell expects >= 5
    keys = sorted(expected, key=expected.get)
    f_obs, f_exp, acc_o, acc_e = [], [], 0, 0.0
    for key in keys:
        acc_o, acc_e = acc_o + counts[key], acc_e + expected[key] * RUNS
        if acc_e >= 5:
            f_obs.append(acc_o), f_exp.append(acc_e)
            acc_o, acc_e = 0, 0.0
    f_obs[-1] += acc_o
    f_exp[-1] += acc_e
    scale = sum(f_obs) / sum(f_exp)
    assert chisquare(f_obs, [e * scale for e in f_exp]).pvalue > 1e-3


def test_engine_sampling_matches_target_sampling():
    _check(temperature=1.0)


def test_engine_sampling_with_top_k_and_top_p():
    _check(temperature=0.7, top_k=4, top_p=0.9, n=8, width=6, k=1)


def test_engine_rejection_sampling_matches_target_sampling():
    _check(temperature=1.0, n=1, width=3, k=2, drafter=RandomDistributions, walk="rejection")


def test_engine_rejection_sampling_with_top_k_and_top_p():
    _check(temperature=0.7, top_k=4, top_p=0.9, n=1, width=3, k=2, drafter=RandomDistributions, walk="rejection")


@pytest.mark.parametrize(
    "kwargs,drafter,match",
    [
        (dict(n=2, temperature=1.0), RandomDistributions, "n == 1"),
        (dict(n=1, temperature=0.0), RandomDistributions, "temperature > 0"),
        (dict(n=1, temperature=1.0), RandomBlocks, "proposed no probs"),
        (dict(n=1, temperature=1.0, walk="draft"), RandomDistributions, "walk must be one of"),
    ],
)
def test_engine_refuses_a_rejection_walk_it_cannot_run(kwargs, drafter, match):
    kwargs = {"walk": "rejection", **kwargs}
    with pytest.raises(ValueError, match=match):
        tree_generate(_model(), drafter(2, seed=0), torch.tensor([1, 4, 2]), width=3, max_new_tokens=NEW, **kwargs)
