import pytest
import torch
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from flashtree.sampler.reference import filter_logits, sample_rows


@pytest.mark.parametrize("k,p", [(1, 1.0), (5, 1.0), (0, 0.5), (7, 0.9), (3, 0.2)])
def test_filters_match_transformers(k, p):
    g = torch.Generator().manual_seed(k)
    logits = torch.randn(6, 50, generator=g)
    want = logits.clone()
    if k > 0:
        want = TopKLogitsWarper(k)(None, want)
    if p < 1:
        want = TopPLogitsWarper(p)(None, want)
    got = filter_logits(logits, torch.full((6,), k), torch.full((6,), p))
    assert torch.equal(torch.isinf(got), torch.isinf(want))


def test_greedy_rows_take_the_lowest_id_on_ties():
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0], [3.0, 3.0, 3.0, 3.0]])
    assert sample_rows(logits, torch.zeros(2)).tolist() == [1, 0]


def test_sampled_rows_follow_the_softmax():
    from scipy.stats import chisquare

    logits = torch.tensor([[0.0, 1.0, -1.0, 0.5]])
    rows = 100_000
    draws = sample_rows(logits.expand(rows, -1), torch.full((rows,), 0.7), torch.Generator().manual_seed(0))
    counts = torch.bincount(draws, minlength=4).double()
    expected = (logits[0] / 0.7).softmax(-1).double() * rows
    assert chisquare(counts.numpy(), expected.numpy() * (rows / expected.sum().item())).pvalue > 1e-3
