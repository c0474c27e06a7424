"""Chain rejection sampling (`verify_rejection`) commits tokens distributed exactly as the target's own sampling.

Target and draft are Markov chains over a 5-token vocabulary (the next-token distribution depends on the previous
token only), so P(first two committed tokens) = p(t0 | c) p(t1 | t0) is known exactly. Each trial drafts a chain of
K = 2 from the draft's q after the context token c, rejection-samples it, and, when only one token was committed,
runs a second step after it; many trials run as one batch.
"""

import pytest
import torch
from scipy.stats import chisquare

from flashtree.sampler.reference import filter_logits
from flashtree.tree import verify_rejection

V, K, TRIALS, CONTEXT = 5, 2, 200_000, 3


def _target_logits():
    g = torch.Generator().manual_seed(0)
    return torch.randn(V, V, generator=g)  # row = previous token


def _step(anchor, target, q, g, **sampling):
    """One rejection step per row after `anchor` (rows,): draft K tokens from q, verify them against the target."""
    chain, probs, prev = [], [], anchor
    for _ in range(K):
        probs.append(q[prev])
        prev = torch.multinomial(q[prev], 1, generator=g).squeeze(1)
        chain.append(prev)
    chain, probs = torch.stack(chain, 1), torch.stack(probs, 1)
    logits = target[torch.cat([anchor.view(-1, 1), chain], 1)]  # the target after the anchor and each chain token
    return verify_rejection(chain, probs, logits, generator=g, **sampling)


def _first_two(q, temperature=1.0, top_k=None, top_p=None, seed=1):
    target, g = _target_logits(), torch.Generator().manual_seed(seed)
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    first = _step(torch.full((TRIALS,), CONTEXT), target, q, g, **sampling)
    # the walk's bookkeeping: the path is the chain's nodes 0..accept_len, then the emitted token
    a = first.accept_len
    idx = torch.arange(K + 1)
    assert torch.equal(first.path, torch.where(idx <= a.view(-1, 1), idx, -1))
    assert torch.equal(first.tokens.gather(1, a.view(-1, 1)).squeeze(1), first.bonus)
    t0, t1 = first.tokens[:, 0], first.tokens[:, 1].clone()
    short = a == 0  # one token committed: the second comes from the next step, after t0
    t1[short] = _step(t0[short], target, q, g, **sampling).tokens[:, 0]
    return t0, t1, a


def _exact(temperature=1.0, top_k=None, top_p=None):
    target = _target_logits() / temperature
    k = None if top_k is None else torch.full((V,), top_k)
    p = None if top_p is None else torch.full((V,), top_p)
    probs = filter_logits(target, k, p).softmax(-1)
    return probs[CONTEXT].view(V, 1) * probs  # [t0, t1]


def _p_value(t0, t1, exact):
    counts = torch.bincount(t0 * V + t1, minlength=V * V).double()
    expected = exact.flatten().double() * TRIALS
    assert counts[expected == 0].sum() == 0, "a filtered-out token was committed"
    keep = expected > 0
    return chisquare(counts[keep], expected[keep] * counts[keep].sum() / expected[keep].sum()).pvalue


def _draft(kind):
    g = torch.Generator().manual_seed(5)
    if kind == "close":  # a draft that roughly knows the target
        return (_target_logits() + torch.randn(V, V, generator=g)).softmax(-1)
    if kind == "far":  # mass where the target has little: most drafts are rejected
        return (-_target_logits()).softmax(-1)
    return torch.full((V, V), 1.0 / V)


@pytest.mark.parametrize("draft", ["close", "far", "uniform"])
def test_rejection_sampling_is_exact(draft):
    t0, t1, accept = _first_two(_draft(draft))
    assert _p_value(t0, t1, _exact()) > 1e-3
    assert 0 < accept.float().mean() < K  # both acceptances and rejections happened
    if draft == "close":
        assert (accept == K).float().mean() > 0.2  # whole chains accepted: the bonus draw from p_K ran


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.8, 3, None), (1.0, None, 0.7), (1.3, 2, 0.9)])
def test_rejection_sampling_with_temperature_top_k_top_p(temperature, top_k, top_p):
    t0, t1, _ = _first_two(_draft("close"), temperature, top_k, top_p)
    assert _p_value(t0, t1, _exact(temperature, top_k, top_p)) > 1e-3


def test_chi_square_catches_a_wrong_draft_distribution():
    """Rejecting against a q other than the one the tokens were drawn from is biased; the test must see it."""
    target, g = _target_logits(), torch.Generator().manual_seed(2)
    q, claimed = _draft("close"), _draft("uniform")
    anchor = torch.full((TRIALS,), CONTEXT)
    chain = torch.multinomial(q[anchor], 1, generator=g)
    res = verify_rejection(chain, claimed[anchor].unsqueeze(1), target[torch.cat([anchor.view(-1, 1), chain], 1)],
                           1.0, generator=g)
    counts = torch.bincount(res.tokens[:, 0], minlength=V).double()
    expected = _exact().sum(1).double() * TRIALS  # the marginal of t0
    assert chisquare(counts, expected * counts.sum() / expected.sum()).pvalue < 1e-3


def test_temperature_zero_and_bad_shapes_are_refused():
    chain, probs, logits = torch.zeros(1, K, dtype=torch.long), torch.full((1, K, V), 1.0 / V), torch.zeros(1, K + 1, V)
    with pytest.raises(ValueError, match="temperature > 0"):
        verify_rejection(chain, probs, logits, 0.0)
    with pytest.raises(ValueError, match="target_logits"):
        verify_rejection(chain, probs, logits[:, :K], 1.0)
