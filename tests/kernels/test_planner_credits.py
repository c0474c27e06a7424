"""The planner's credits on the device: every trie-vote shape ranked in the candidates' one trie equals each shape's
tree built (the Triton builder on CUDA) and walked, and a credit waits for nothing on the host (a served step's credit
runs on the scheduler's thread between launches)."""

import contextlib

import torch

from flashtree.planner import Shape, counterfactual_commits, default_shapes
from flashtree.planner.acceptance import rebuilt_commits

from .common import CUDA, DEV


def _step(bs, n, k, vocab, g):
    """Candidates sharing prefixes, and commits that follow one candidate for a while, then end (-1)."""
    cands = torch.randint(0, vocab, (bs, n, k), generator=g)
    committed = torch.randint(0, vocab, (bs, k + 1), generator=g)
    for b in range(bs):
        i, d = int(torch.randint(0, n, (), generator=g)), int(torch.randint(0, k + 1, (), generator=g))
        committed[b, :d] = cands[b, i, :d]
        committed[b, int(torch.randint(1, k + 2, (), generator=g)):] = -1
    return cands.to(DEV), committed.to(DEV)


def test_device_credits_equal_every_tree_built_and_walked():
    g = torch.Generator().manual_seed(0)
    for bs, n, window in ((1, 64, 64), (8, 64, 64), (32, 16, 16), (5, 8, 9)):
        shapes = [s for s in default_shapes(window, 8) if s.n <= n]
        for vocab in (2, 3, 50):
            cands, committed = _step(bs, n, 8, vocab, g)
            fast, slow = counterfactual_commits(cands, committed, shapes), rebuilt_commits(cands, committed, shapes)
            for shape in shapes:
                assert torch.equal(fast[shape], slow[shape]), (bs, n, vocab, shape)


def test_a_device_credit_never_waits_on_the_host():
    g = torch.Generator().manual_seed(1)
    shapes = default_shapes(64, 8)
    cands, committed = _step(4, 64, 8, 3, g)
    counterfactual_commits(cands, committed, shapes)  # the menu's constants, once per server
    syncs = _sync_errors() if CUDA else contextlib.nullcontext()
    with syncs:
        credits = counterfactual_commits(cands, committed, shapes)
    assert set(credits) == set(shapes) and all(c.device == cands.device for c in credits.values())
    assert all(int(c.min()) >= 1 for c in credits.values())
    assert credits[Shape(0, 64)].shape == (4,)


@contextlib.contextmanager
def _sync_errors():
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")
