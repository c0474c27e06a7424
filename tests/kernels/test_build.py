import pytest
import torch

from flashtree.tree import to_eagle
from flashtree.tree.build import build_vote_tree
from flashtree.tree.triton_build import build_vote_tree_eagle_triton, build_vote_tree_triton

from .common import CUDA, DEV, anchor_candidates

FIELDS = ["tokens", "parents", "depth", "votes", "valid", "first_candidate"]


def check(cands, width):
    ref = build_vote_tree(cands, width)
    enc = to_eagle(ref)
    tree, tenc = build_vote_tree_eagle_triton(cands.to(DEV), width)
    for f in FIELDS:
        assert torch.equal(getattr(tree, f).cpu(), getattr(ref, f)), f
    assert tree.k == ref.k
    assert torch.equal(tenc.top_scores_index.cpu(), enc.top_scores_index)
    assert torch.equal(tenc.parent_list.cpu(), enc.parent_list)
    assert (tenc.topk, tenc.spec_steps, tenc.num_verify_tokens) == (enc.topk, enc.spec_steps, enc.num_verify_tokens)
    plain = build_vote_tree_triton(cands.to(DEV), width)
    assert all(torch.equal(getattr(plain, f), getattr(tree, f)) for f in FIELDS)
    return ref


# (bs, N, K, W, vocab): heavy sharing, duplicates, N=1, K=1, W=2, W larger than the trie, odd sizes
SMALL = [(3, 6, 5, 10, 3), (2, 1, 1, 2, 5), (2, 3, 1, 8, 2), (2, 4, 3, 40, 2), (2, 5, 7, 3, 4), (2, 7, 4, 2, 2),
         (3, 8, 6, 17, 2)]


@pytest.mark.parametrize("bs,n,k,w,vocab", SMALL)
def test_builder_matches_reference_small(bs, n, k, w, vocab):
    g = torch.Generator().manual_seed(hash((bs, n, k, w, vocab)) % 2**31)
    for _ in range(2):
        check(torch.randint(0, vocab, (bs, n, k), generator=g), w)


# N = 32 fills a 32-bit candidate mask, N > 32 takes the 64-bit one; vocab 2 shares deep prefixes, vocab 50 leaves
# mostly 1-vote nodes, whose ties the slot order breaks
WIDE = [(2, 32, 15, 32, 2), (2, 32, 15, 32, 50), (2, 32, 16, 32, 4), (1, 33, 6, 32, 2), (1, 64, 4, 40, 3)]


@pytest.mark.parametrize("bs,n,k,w,vocab", WIDE)
def test_builder_matches_reference_wide(bs, n, k, w, vocab):
    g = torch.Generator().manual_seed(hash((bs, n, k, w, vocab)) % 2**31)
    check(torch.randint(0, vocab, (bs, n, k), generator=g), w)


def test_builder_large_tokens_and_too_many_candidates():
    # tokens differing only in their high 32 bits must not match
    c = torch.tensor([[[1, 2], [1 + (1 << 32), 2], [1, 2 - (1 << 40)]]])
    check(c, 6)
    with pytest.raises(ValueError, match="too large"):
        build_vote_tree_triton(torch.zeros(1, 65, 2, dtype=torch.long, device=DEV), 4)


def test_builder_all_identical_candidates():
    c = torch.tensor([[[1, 2, 3]] * 4, [[0, 0, 0]] * 4])
    ref = check(c, 8)
    assert ref.valid.sum(1).tolist() == [3, 3]


def test_builder_anchor_mix():
    g = torch.Generator().manual_seed(7)
    shapes = [(1, 8, 15, 16), (16, 8, 15, 16), (64, 32, 15, 32), (256, 16, 15, 16)] if CUDA else [(2, 8, 15, 16),
                                                                                                    (1, 32, 15, 32)]
    for bs, n, k, w in shapes:
        check(anchor_candidates(bs, n, k, g), w)


@pytest.mark.skipif(not CUDA, reason="graph capture needs a CUDA device")
def test_builder_graph_capture():
    g = torch.Generator().manual_seed(3)
    c = anchor_candidates(64, 32, 15, g).cuda()
    static = c.clone()
    build_vote_tree_eagle_triton(static, 32)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tree, enc = build_vote_tree_eagle_triton(static, 32)
    for _ in range(3):
        static.copy_(anchor_candidates(64, 32, 15, g).cuda())
        graph.replay()
        ref = build_vote_tree(static.cpu(), 32)
        assert torch.equal(tree.tokens.cpu(), ref.tokens) and torch.equal(tree.parents.cpu(), ref.parents)


# ---- the prob policy's build: the same trie ranked by path log-probability (build_scored_tree) -----------------
def path_scores(cands, g, levels: int):
    """Path log-probabilities (bs, N, K) consistent over shared prefixes, as a draft's are: cumulative sums of a log q
    <= 0 that is a function of (depth, token, previous token) from a random table, on a grid of `levels` values (so
    nodes tie and probability-1 steps keep a score), with a few -inf (probability 0)."""
    vocab = int(cands.max()) + 1
    k = cands.shape[2]
    table = -torch.randint(0, levels, (k, vocab + 1, vocab), generator=g).float() / 4
    table[torch.rand(table.shape, generator=g) < 0.03] = float("-inf")
    prev = torch.cat([torch.full_like(cands[:, :, :1], vocab), cands[:, :, :-1]], dim=2)
    depth = torch.arange(k).view(1, 1, k).expand_as(cands)
    return table[depth, prev, cands].cumsum(dim=2)


SCORED = [(3, 6, 5, 10, 3), (2, 1, 1, 2, 5), (2, 4, 3, 40, 2), (2, 7, 4, 2, 2), (2, 32, 8, 32, 4), (1, 40, 6, 32, 3)]


@pytest.mark.parametrize("bs,n,k,w,vocab", SCORED)
def test_scored_builder_matches_reference(bs, n, k, w, vocab):
    from flashtree.tree.build import build_scored_tree
    from flashtree.tree.triton_build import build_scored_tree_triton

    g = torch.Generator().manual_seed(hash((bs, n, k, w, vocab, "scored")) % 2**31)
    for levels in (3, 1000):  # many ties, then nearly none
        cands = torch.randint(0, vocab, (bs, n, k), generator=g)
        scores = path_scores(cands, g, levels)
        ref = build_scored_tree(cands, w, scores)
        tree = build_scored_tree_triton(cands.to(DEV), w, scores.to(DEV))
        for f in FIELDS:
            assert torch.equal(getattr(tree, f).cpu(), getattr(ref, f)), (levels, f)
    if 2 < w <= n * k and n > 1:  # a choice to make: not the vote tree, the ranking is the scores'
        votes = build_vote_tree(cands, w)
        assert any(not torch.equal(getattr(ref, f), getattr(votes, f)) for f in ("tokens", "parents"))
