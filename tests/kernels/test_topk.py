import os
import subprocess
import sys

import pytest
import torch

from flashtree.sampler import reference
from flashtree.sampler.triton_topk import row_topk_logprobs

from .common import CUDA, DEV


def assert_matches_the_sort(x, k, **kw):
    """Ids exactly as a stable descending sort of the log-softmax orders them, values to a few ulps of the row's
    log-sum-exp (~20 at 152K bf16 logits, summed in another order: 1.2e-5 apart on either selection), -inf where it
    has."""
    values, ids = row_topk_logprobs(x.to(DEV), k, **kw)
    want_v, want_i = reference.row_topk_logprobs(x, k)
    assert torch.equal(ids.cpu(), want_i), (tuple(x.shape), k, kw)
    finite = want_v > float("-inf")
    assert torch.equal(values.cpu() > float("-inf"), finite)
    assert torch.allclose(values.cpu()[finite], want_v[finite], atol=3e-5, rtol=0)


@pytest.mark.parametrize("select", ["threshold", "rounds"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_row_topk_matches_the_stable_sort(dtype, select):
    """Each row's k most probable tokens and their log q as a stable descending sort of the log-softmax gives them:
    bf16 logits (many ties: the lower id first), rows with -inf entries and with fewer than k finite ones, one tile
    or many, k from 1 to 64, by either selection."""
    g = torch.Generator().manual_seed(3)
    shapes = [(64, 151936, 31), (8, 49152, 63), (3, 1000, 1)] if CUDA else [(3, 3000, 31), (2, 700, 64), (2, 90, 1)]
    for rows, vocab, k in shapes:
        x = (torch.randn(rows, vocab, generator=g) * 3).to(dtype)
        x[0, : vocab // 2] = float("-inf")
        x[-1, :] = float("-inf")
        x[-1, 5], x[-1, vocab - 1] = 2.0, 2.0  # two finite logits, tied: 5 first, then -inf at token 0
        for block_v in [None, 256]:
            assert_matches_the_sort(x, k, block_v=block_v, select=select)


@pytest.mark.parametrize("k", [1, 15, 63])
def test_threshold_select_edge_cases(k):
    """The threshold path where its bound does little or its tiles overflow: logits of 4 levels (every tile holds more
    than k ties at t0), a row's top 2k in one tile, -0.0 tied with +0.0, a row 90% -inf, one with 3 finite logits,
    fewer sub-blocks than k (t0 = -inf) and plain random rows, float32 and bf16, against the stable sort."""
    g = torch.Generator().manual_seed(k)
    vocab = 6000
    x = torch.randn(6, vocab, generator=g) * 3
    x[0] = torch.randint(0, 4, (vocab,), generator=g).float()  # ties
    x[1, 2500 : 2500 + 2 * k] += 30.0  # the top 2k in one tile
    x[2] = -1.0
    x[2, 9], x[2, 3000] = 0.0, -0.0  # equal: the lower id first
    x[3, : vocab * 9 // 10] = float("-inf")
    x[4] = float("-inf")
    x[4, [40, 4000, 5999]] = torch.tensor([1.0, 3.0, 1.0])  # fewer than k finite: -inf at token 0 after them
    assert_matches_the_sort(x, k)
    assert_matches_the_sort(x.bfloat16(), k, block_v=1024)
    assert_matches_the_sort(x[[0, 4], -300:], k, block_v=32)  # 300 logits in 19 sub-blocks


def test_row_topk_refuses_what_it_cannot_do():
    x = torch.zeros(2, 10, device=DEV)
    with pytest.raises(ValueError, match=r"k=11: use 1 <= k <= min\(vocab, 128\)"):
        row_topk_logprobs(x, 11)
    with pytest.raises(ValueError, match="logits must be \\(rows, vocab\\)"):
        row_topk_logprobs(x[0], 3)
    with pytest.raises(ValueError, match="select='sort': use 'threshold' or 'rounds'"):
        row_topk_logprobs(x, 3, select="sort")


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


HOPPER_BUILD = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import flashtree.sampler.triton_topk as t
kernels = [
    (t._stats_kernel, "x_ptr:*bf16 stride_x:i32 V:i32 pm_ptr:*fp32 ps_ptr:*fp32 pb_ptr:*fp32 T:i32",
     {"BV": 4096, "SUB": 256}, 4),
    (t._row_kernel, "pm_ptr:*fp32 ps_ptr:*fp32 pb_ptr:*fp32 lse_ptr:*fp32 t0_ptr:*fp32 cnt_ptr:*i32 T:i32 NB:i32",
     {"K": 63, "KP": 64, "TP": 64, "NBP": 1024}, 4),
    (t._select_kernel, "x_ptr:*bf16 stride_x:i32 V:i32 t0_ptr:*fp32 cnt_ptr:*i32 cv_ptr:*fp32 ci_ptr:*i32 C:i32",
     {"K": 63, "BV": 4096}, 4),
    (t._merge_keys_kernel, "cv_ptr:*fp32 ci_ptr:*i32 cnt_ptr:*i32 lse_ptr:*fp32 out_v_ptr:*fp32 out_i_ptr:*i64 C:i32",
     {"K": 63, "KP": 64, "CH": t.CH}, 1),
]
for fn, args, consts, warps in kernels:
    sig = dict(a.split(":") for a in args.split()) | {name: "constexpr" for name in consts}
    kernel = triton.compile(ASTSource(fn, sig, consts), target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    assert kernel.asm["cubin"]
"""


def test_threshold_kernels_compile_for_hopper():
    """The threshold path's launches (a scalar atomic, loops of a run-time length, tl.topk) assemble for sm_90 through
    ptxas, without a GPU (in a process of its own: the interpreter's kernels cannot be compiled)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", HOPPER_BUILD], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
