import pytest
import torch

from flashtree.tree.build import build_vote_tree
from flashtree.tree.encode import verify_inputs
from flashtree.tree.triton_mask import verify_inputs_triton
from flashtree.tree.types import VoteTree

from .common import CUDA, DEV, anchor_candidates

FIELDS = ["ids", "positions", "mask", "stats"]


def on(tree, dev):
    return type(tree)(**{f: getattr(tree, f).to(dev) if torch.is_tensor(getattr(tree, f)) else getattr(tree, f)
                         for f in tree.__dataclass_fields__})


def check(tree, anchor, seq_lens, candidates, slack: int = 0):
    """slack > 0: the mask is sized by a host bound above the sum of seq_lens (a serving step's reserved lengths); the
    blocks stay where the exact sum puts them, the cells after them are unused."""
    exact = int(seq_lens.sum())
    ref = verify_inputs(tree, anchor, seq_lens, exact + slack, candidates)
    out = verify_inputs_triton(on(tree, DEV), anchor.to(DEV), seq_lens.to(DEV), exact + slack,
                               None if candidates is None else candidates.to(DEV))
    used = (exact + tree.batch_size * tree.width) * tree.width
    assert ref.mask.shape == out.mask.shape == (used + slack * tree.width,)
    assert not ref.mask[used:].any()
    if slack:
        assert torch.equal(ref.mask[:used], verify_inputs(tree, anchor, seq_lens, exact, candidates).mask)
    for f in FIELDS:
        want, got = getattr(ref, f), getattr(out, f)
        assert (want is None) == (got is None), f
        if want is not None:
            got, want = (got[:used], want[:used]) if f == "mask" else (got, want)
            assert got.dtype == want.dtype and torch.equal(got.cpu(), want), f
    return ref


# (bs, N, K, W, vocab): W above the trie size (padding nodes), W = 2, N = 1, K = 1, bs = 1, duplicate candidates,
# W - 1 < K, and N = 1 chains whose depth is exactly 2^j (the closure's last squaring) or just above
SMALL = [(3, 6, 5, 10, 3), (1, 4, 3, 20, 2), (2, 1, 1, 2, 5), (2, 3, 1, 8, 2), (3, 5, 4, 7, 2), (2, 8, 6, 17, 3),
         (2, 3, 8, 5, 2), (1, 1, 8, 9, 5), (2, 1, 9, 12, 5)]


@pytest.mark.parametrize("bs,n,k,w,vocab", SMALL)
def test_verify_inputs_matches_reference(bs, n, k, w, vocab):
    g = torch.Generator().manual_seed(hash((bs, n, k, w, vocab)) % 2**31)
    for stats in (True, False):
        cands = torch.randint(0, vocab, (bs, n, k), generator=g)
        tree = build_vote_tree(cands, w)
        anchor = torch.randint(0, 1000, (bs,), generator=g)
        seq_lens = torch.randint(0, 40, (bs,), generator=g).to(torch.int32)
        seq_lens[0] = 0
        check(tree, anchor, seq_lens, cands if stats else None)
        check(tree, anchor, seq_lens, cands if stats else None, slack=2 * bs * w + 3)


def test_verify_inputs_long_prefix_many_requests():
    """Prefixes longer than one sweep chunk and more requests than one offset block."""
    g = torch.Generator().manual_seed(11)
    bs, n, k, w = 260, 2, 2, 3
    cands = anchor_candidates(bs, n, k, g)
    seq_lens = torch.randint(0, 4, (bs,), generator=g)
    seq_lens[-1] = 700
    check(build_vote_tree(cands, w), torch.randint(0, 1000, (bs,), generator=g), seq_lens, cands)


@pytest.mark.parametrize("fill", [0, 1])
def test_kernel_writes_every_element(monkeypatch, fill):
    """The wrapper allocates with torch.empty: outputs that start all 0 or all 1 come out the same."""
    g = torch.Generator().manual_seed(5)
    cands = torch.randint(0, 2, (3, 4, 3), generator=g)
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(fill))
    check(build_vote_tree(cands, 9), torch.tensor([1, 2, 3]), torch.tensor([5, 0, 2]), cands)


@pytest.mark.skipif(not CUDA, reason="real shapes and graph capture need a CUDA device")
def test_verify_inputs_real_shapes_graph_capture():
    g = torch.Generator().manual_seed(9)
    bs, n, k, w = 256, 32, 16, 64
    cands = anchor_candidates(bs, n, k, g)
    tree, anchor = build_vote_tree(cands, w), torch.randint(0, 1000, (bs,), generator=g)
    seq_lens = torch.randint(0, 2000, (bs,), generator=g)
    check(tree, anchor, seq_lens, cands)
    # capture once, replay on new trees and seq_lens with the same sum (the mask's size)
    static = [on(tree, DEV), anchor.cuda(), seq_lens.cuda(), cands.cuda()]
    total = int(seq_lens.sum())
    verify_inputs_triton(*static[:3], total, static[3])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = verify_inputs_triton(*static[:3], total, static[3])
    for _ in range(2):
        cands = anchor_candidates(bs, n, k, g)
        tree, anchor = build_vote_tree(cands, w), torch.randint(0, 1000, (bs,), generator=g)
        seq_lens = seq_lens[torch.randperm(bs, generator=g)]
        for f in ["tokens", "parents", "depth", "valid"]:
            getattr(static[0], f).copy_(getattr(tree, f))
        for dst, src in zip(static[1:], (anchor, seq_lens, cands)):
            dst.copy_(src)
        graph.replay()
        ref = verify_inputs(tree, anchor, seq_lens, total, cands)
        assert all(torch.equal(getattr(out, f).cpu(), getattr(ref, f)) for f in FIELDS)


def test_reference_by_hand():
    """Root 0 -> 1 -> 2 and 0 -> 3, then a padding node 4 (invalid, parent 0, depth 1)."""
    tree = VoteTree(
        tokens=torch.tensor([[5, 6, 7, 5]]),
        parents=torch.tensor([[0, 1, 0, 0]]),
        depth=torch.tensor([[1, 2, 1, 1]]),
        votes=torch.tensor([[3, 2, 1, 0]]),
        valid=torch.tensor([[True, True, True, False]]),
        first_candidate=torch.tensor([[0, 0, 2, 3]]),
        k=2,
    )
    tree = VoteTree(**{f: torch.cat([v, v]) if torch.is_tensor(v) else v for f, v in vars(tree).items()})
    cands = torch.tensor([[[5, 6], [5, 6], [7, 1]], [[5, 6], [5, 2], [7, 1]]])
    seq_lens = torch.tensor([2, 0])
    out = check(tree, torch.tensor([9, 8]), seq_lens, cands)
    assert out.ids.tolist() == [[9, 5, 6, 7, 5], [8, 5, 6, 7, 5]]
    assert out.positions.tolist() == [2, 3, 4, 3, 3, 0, 1, 2, 1, 1]
    anc = [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 1, 0], [1, 0, 0, 0, 1]]
    want = [[1, 1] + r for r in anc] + anc
    assert out.mask.tolist() == [bool(x) for r in want for x in r]
    assert out.stats.tolist() == [[3, 2, 3, 0], [3, 3, 3, 0]]
