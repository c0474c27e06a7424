"""The public tree API refuses bad arguments with one message naming them (checks of flashtree/tree/checks.py)."""

import pytest
import torch

from flashtree.tree.checks import check_logits, check_sampling, check_tokens, check_width


@pytest.mark.parametrize("bad,match", [
    (torch.zeros(1, 2, 3), "integer token ids"),
    (torch.zeros(1, 2, 3, dtype=torch.bool), "integer token ids"),
    (torch.tensor([[[0, -1, 2]]]), "negative token id"),
    (torch.zeros(1, 0, 3, dtype=torch.long), "at least one entry"),
    (torch.zeros(1, 2, 0, dtype=torch.long), "at least one entry"),
    (torch.zeros(2, 3, dtype=torch.long), "3 dimensions"),
    (torch.tensor([[[0, 7, 2]]]), "outside the vocabulary of 5"),
])
def test_bad_candidates(bad, match):
    with pytest.raises(ValueError, match=match):
        check_tokens("candidates", bad, dims=3, vocab=5)


@pytest.mark.parametrize("bad", [1, 0, -3, 2.0, True, "8"])
def test_bad_width(bad):
    with pytest.raises(ValueError, match="width must be an int >= 2"):
        check_width(bad)


@pytest.mark.parametrize("kw,match", [
    (dict(temperature=-1.0), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"), (dict(temperature=torch.tensor([0.5, -0.1])), "temperature"),
    (dict(temperature=1.0, top_p=0.0), "top_p"), (dict(temperature=1.0, top_p=1.5), "top_p"),
    (dict(temperature=1.0, top_k=-3), "top_k"), (dict(temperature=1.0, top_k=2.5), "top_k"),
])
def test_bad_sampling_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        check_sampling(**kw)


def test_bad_logits():
    with pytest.raises(ValueError, match="NaN"):
        check_logits("target_logits", torch.tensor([[0.0, float("nan")]]))
    with pytest.raises(ValueError, match="-inf everywhere"):
        check_logits("target_logits", torch.full((2, 3), float("-inf")))
    with pytest.raises(ValueError, match="floating-point"):
        check_logits("target_logits", torch.zeros(2, 3, dtype=torch.long))


def test_good_arguments_pass():
    check_tokens("candidates", torch.randint(0, 5, (2, 3, 4)), dims=3, vocab=5)
    check_width(2)
    check_sampling(0.0, 0, 1.0)
    check_sampling(torch.tensor([0.0, 0.7]), torch.tensor([0, 5]), torch.tensor([0.9, 1.0]))
    check_logits("target_logits", torch.randn(2, 3))


def test_the_public_entry_points_check_their_arguments():
    from flashtree.tree import build_tree, build_vote_tree, verify_sampled

    with pytest.raises(ValueError, match="integer token ids"):
        build_vote_tree(torch.zeros(1, 2, 3), 4)
    with pytest.raises(ValueError, match="negative token id"):
        build_tree(torch.tensor([[[0, -1, 2]]]), 4)
    with pytest.raises(ValueError, match="width must be an int >= 2"):
        build_vote_tree(torch.zeros(1, 2, 3, dtype=torch.long), 1)
    tree = build_vote_tree(torch.zeros(1, 2, 3, dtype=torch.long), 4)
    logits = torch.randn(1, 4, 5)
    for kw, match in [(dict(temperature=float("nan")), "temperature"), (dict(temperature=-1.0), "temperature"),
                      (dict(temperature=1.0, top_p=1.5), "top_p"), (dict(temperature=1.0, top_k=-3), "top_k")]:
        with pytest.raises(ValueError, match=match):
            verify_sampled(tree, logits, **kw)
    with pytest.raises(ValueError, match="NaN"):
        verify_sampled(tree, torch.full((1, 4, 5), float("nan")), 1.0)
    # A tree of token ids the target's logits do not cover (it was walked silently).
    with pytest.raises(ValueError, match="tree holds token id 7, outside target_logits' vocabulary of 5"):
        verify_sampled(build_vote_tree(torch.tensor([[[7, 1, 2]]]), 4), logits, 1.0)
