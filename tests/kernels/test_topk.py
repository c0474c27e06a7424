import pytest
import torch

from flashtree.sampler import reference
from flashtree.sampler.triton_topk import row_topk_logprobs

from .common import CUDA, DEV


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_row_topk_matches_the_stable_sort(dtype):
    """Each row's k most probable tokens and their log q as a stable descending sort of the log-softmax gives them:
    bf16 logits (many ties: the lower id first), rows with -inf entries and with fewer than k finite ones, one tile
    or many, k from 1 to 64."""
    g = torch.Generator().manual_seed(3)
    shapes = [(64, 151936, 31), (8, 49152, 63), (3, 1000, 1)] if CUDA else [(3, 3000, 31), (2, 700, 64), (2, 90, 1)]
    for rows, vocab, k in shapes:
        x = (torch.randn(rows, vocab, generator=g) * 3).to(dtype)
        x[0, : vocab // 2] = float("-inf")
        x[-1, :] = float("-inf")
        x[-1, 5], x[-1, vocab - 1] = 2.0, 2.0  # two finite logits, tied: 5 first, then -inf at token 0
        for block_v in [None, 256]:
            values, ids = row_topk_logprobs(x.to(DEV), k, block_v=block_v)
            want_v, want_i = reference.row_topk_logprobs(x, k)
            assert torch.equal(ids.cpu(), want_i), (rows, vocab, k, block_v)
            finite = want_v > float("-inf")
            assert torch.equal(values.cpu() > float("-inf"), finite)
            assert torch.allclose(values.cpu()[finite], want_v[finite], atol=1e-5, rtol=0)


def test_row_topk_refuses_what_it_cannot_do():
    x = torch.zeros(2, 10, device=DEV)
    with pytest.raises(ValueError, match=r"k=11: use 1 <= k <= min\(vocab, 128\)"):
        row_topk_logprobs(x, 11)
    with pytest.raises(ValueError, match="logits must be \\(rows, vocab\\)"):
        row_topk_logprobs(x[0], 3)


def test_best_first_through_the_kernel_grows_the_reference_tree():
    """best-first's rounds through the top-k kernels (`step_topk`) grow the tree its full log-softmax and torch top-k
    grow, on a vanilla Markov head's conditionals (tie-free float32 logits)."""
    from flashtree.patches.policy_draws import vanilla_step_logits
    from flashtree.tree import DraftScores, build_tree

    g = torch.Generator().manual_seed(9)
    bs, k, vocab, rank, width = 3, 5, 700, 4, 16
    base = torch.randn(bs, k, vocab, generator=g).to(DEV)
    w1, w2 = (torch.randn(vocab, rank, generator=g).to(DEV) for _ in range(2))
    anchor = torch.randint(0, vocab, (bs,), generator=g).to(DEV)
    logits = vanilla_step_logits(base, w1, w2)
    full = DraftScores(anchor=anchor, step_logprobs=lambda r, p, t: logits(r, p, t).float().log_softmax(-1))
    fast = DraftScores(anchor=anchor, step_logprobs=full.step_logprobs,
                       step_topk=lambda r, p, t, n: row_topk_logprobs(logits(r, p, t), n))
    shape = torch.zeros((bs, 1, k), dtype=torch.long, device=DEV)
    want, got = build_tree(shape, width, "best-first", full), build_tree(shape, width, "best-first", fast)
    for f in ("tokens", "parents", "depth", "valid"):
        assert torch.equal(getattr(got, f).cpu(), getattr(want, f).cpu()), f
