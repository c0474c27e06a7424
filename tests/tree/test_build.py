import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flashtree.tree import build_vote_tree

from .brute import brute_tree


@st.composite
def candidate_sets(draw):
    bs = draw(st.integers(1, 3))
    n = draw(st.integers(1, 8))
    k = draw(st.integers(1, 6))
    vocab = draw(st.integers(1, 4))  # tiny vocabularies force heavy prefix sharing and duplicates
    data = draw(st.lists(st.integers(0, vocab - 1), min_size=bs * n * k, max_size=bs * n * k))
    width = draw(st.integers(2, n * k + 4))  # up to wider than the whole trie
    return torch.tensor(data, dtype=torch.long).view(bs, n, k), width


@settings(max_examples=300, deadline=None)
@given(candidate_sets())
def test_matches_brute_force_trie(case):
    cands, width = case
    bs, n, k = cands.shape
    tree = build_vote_tree(cands, width)
    assert tree.tokens.shape == (bs, width - 1) and tree.k == k and tree.width == width
    for b in range(bs):
        want = brute_tree(cands[b].tolist(), width)
        m = len(want)
        assert tree.valid[b].tolist() == [True] * m + [False] * (width - 1 - m)
        assert tree.tokens[b, :m].tolist() == [x["prefix"][-1] for x in want]
        assert tree.parents[b, :m].tolist() == [x["parent"] for x in want]
        assert tree.depth[b, :m].tolist() == [len(x["prefix"]) for x in want]
        assert tree.votes[b, :m].tolist() == [x["votes"] for x in want]
        assert tree.first_candidate[b, :m].tolist() == [x["first"] for x in want]
        # padding: hangs off the root, repeats node 1's token, no votes
        assert (tree.parents[b, m:] == 0).all() and (tree.votes[b, m:] == 0).all()
        assert (tree.tokens[b, m:] == tree.tokens[b, 0]).all() and (tree.first_candidate[b, m:] == n).all()
        # parents-first and prefix-closed
        for i, p in enumerate(tree.parents[b, :m].tolist(), start=1):
            assert p < i
            assert p == 0 or tree.depth[b, p - 1] == tree.depth[b, i - 1] - 1


def test_single_candidate_is_a_chain():
    cands = torch.tensor([[[5, 6, 7, 8]]])
    tree = build_vote_tree(cands, 5)
    assert tree.tokens.tolist() == [[5, 6, 7, 8]]
    assert tree.parents.tolist() == [[0, 1, 2, 3]]
    assert tree.valid.all()


def test_width_two_keeps_the_most_voted_root_child():
    cands = torch.tensor([[[1, 2], [3, 4], [3, 5]]])
    tree = build_vote_tree(cands, 2)
    assert tree.tokens.tolist() == [[3]] and tree.votes.tolist() == [[2]] and tree.first_candidate.tolist() == [[1]]


def test_bad_width_is_refused():
    import pytest

    with pytest.raises(ValueError, match="width"):
        build_vote_tree(torch.zeros(1, 2, 3, dtype=torch.long), 1)
