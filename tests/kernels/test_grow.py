"""best-first over independent positions (DFLASH): the one-launch kernel against the reference's W - 1 rounds."""

import os
import subprocess
import sys

import pytest
import torch

from flashtree.tree.policies.best_first import grow_marginal
from flashtree.tree.triton_grow import grow_marginal_triton

from .common import CUDA, DEV

FIELDS = ["tokens", "parents", "depth", "votes", "valid", "first_candidate"]


def topk_table(bs, k, kk, g, vocab=1000, levels=None):
    """Each position's kk best log q, largest first, and distinct token ids; `levels`: values on a grid of that many
    steps, so scores tie often (the tie rule is part of the contract)."""
    logq = -torch.rand(bs, k, kk, generator=g) * 6
    if levels:
        logq = (logq * levels / 6).round() * 6 / levels
    top = logq.sort(dim=-1, descending=True).values
    ids = torch.stack([torch.randperm(vocab, generator=g)[:kk] for _ in range(bs * k)]).view(bs, k, kk)
    return top, ids


def reference(top, ids, width):
    """The registered best-first builder's rounds (the CPU path of `grow_marginal`)."""
    return grow_marginal(top, ids, width)


# (bs, K, kept per position, W, grid levels): the K cap, fewer ranks than W - 1, ties, W = 2
CASES = [(3, 4, 7, 8, None), (2, 8, 15, 16, None), (2, 15, 31, 32, 4), (3, 3, 3, 32, None), (2, 1, 5, 9, None),
         (2, 6, 1, 2, 3), (2, 8, 31, 32, 2), (1, 7, 63, 64, None)]


@pytest.mark.parametrize("bs,k,kk,w,levels", CASES)
def test_kernel_equals_the_rounds(bs, k, kk, w, levels):
    g = torch.Generator().manual_seed(bs * 1000 + k * 10 + w)
    top, ids = topk_table(bs, k, kk, g, levels=levels)
    want = reference(top, ids, w)
    assert tree_nodes(want) == plain_best_first(top, ids, w)
    got = grow_marginal_triton(top.to(DEV), ids.to(DEV), w)
    for f in FIELDS:
        assert torch.equal(getattr(got, f).cpu(), getattr(want, f)), f
    assert got.k == want.k


def test_unreachable_nodes_are_padding():
    """-inf log q (a masked vocabulary) never enters the tree: the rest is invalid padding, as the rounds leave it."""
    g = torch.Generator().manual_seed(3)
    top, ids = topk_table(2, 3, 4, g)
    top[:, :, 2:] = float("-inf")  # two reachable tokens per position: 2 + 4 + 8 = 14 nodes
    top[1, 1:] = float("-inf")  # request 1: only its first position's two
    want = reference(top, ids, 32)
    got = grow_marginal_triton(top.to(DEV), ids.to(DEV), 32)
    assert want.valid.sum(1).tolist() == [14, 2]
    for f in FIELDS:
        assert torch.equal(getattr(got, f).cpu(), getattr(want, f)), f


def plain_best_first(top, ids, width, later_ties=False):
    """A third construction, in plain Python: every (parent, rank) child scored, the best taken W - 1 times; ties go
    to the earlier (parent, rank), or with `later_ties` to the later one (the wrong rule)."""
    bs, k, kk = top.shape
    out = []
    for b in range(bs):
        nodes, front = [], [(float(top[b, 0, r]), 0, r, 0) for r in range(kk)]  # (score, parent, rank, position)
        for _ in range(width - 1):
            live = [f for f in front if f[0] > float("-inf")]
            if not live:
                break
            key = (lambda f: (f[0], f[1], f[2])) if later_ties else (lambda f: (f[0], -f[1], -f[2]))
            best = max(live, key=key)
            front.remove(best)
            score, parent, rank, pos = best
            nodes.append((int(ids[b, pos, rank]), parent, pos + 1))
            if pos + 1 < k:
                # float32 sums, as the builders add
                front += [((torch.tensor(score) + top[b, pos + 1, r]).item(), len(nodes), r, pos + 1) for r in range(kk)]
        out.append(nodes)
    return out


def tree_nodes(tree):
    return [[(int(t), int(p), int(d)) for t, p, d, v in zip(*(x[b] for x in (tree.tokens, tree.parents, tree.depth,
             tree.valid))) if v] for b in range(tree.tokens.shape[0])]


def test_ties_follow_the_reference_rule():
    """On a grid of tied scores the kernel keeps the earlier frontier entry, as the rounds do; the reverse rule gives
    another tree on these inputs (the negative control: the parametrised cases above would catch it)."""
    g = torch.Generator().manual_seed(11)
    top, ids = topk_table(2, 8, 31, g, levels=2)
    got = tree_nodes(grow_marginal_triton(top.to(DEV), ids.to(DEV), 32))
    assert got == plain_best_first(top, ids, 32) == tree_nodes(reference(top, ids, 32))
    assert plain_best_first(top, ids, 32, later_ties=True) != got


@pytest.mark.skipif(not CUDA, reason="CUDA graph capture needs a GPU")
def test_kernel_replays_in_a_graph():
    g = torch.Generator().manual_seed(5)
    top, ids = (t.cuda() for t in topk_table(64, 15, 31, g))
    grow_marginal_triton(top, ids, 32)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tree = grow_marginal_triton(top, ids, 32)
    new_top, new_ids = topk_table(64, 15, 31, g)
    top.copy_(new_top.cuda()), ids.copy_(new_ids.cuda())
    graph.replay()
    want = reference(new_top, new_ids, 32)
    assert all(torch.equal(getattr(tree, f).cpu(), getattr(want, f)) for f in FIELDS)


HOPPER_BUILD = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from flashtree.tree.triton_grow import _grow_marginal_kernel
names = ["top_ptr", "ids_ptr", "tok_ptr", "par_ptr", "dep_ptr", "val_ptr", "vote_ptr", "first_ptr"]
sig = dict(zip(names, ["*fp32", "*i64", "*i64", "*i64", "*i64", "*i8", "*i64", "*i64"]))
for redux in (True, False):
    consts = {"K": 15, "KK": 31, "KEEP": 31, "FW": 32, "PREFETCH": True, "LINES": 16, "REDUX": redux, "CELL": 8}
    sig.update({name: "constexpr" for name in consts})
    kernel = triton.compile(ASTSource(_grow_marginal_kernel, sig, consts), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": 1})
    ptx = kernel.asm["ptx"]
    assert "prefetch.global.L1" in ptx and kernel.asm["cubin"]
    # one slot a lane: two warp reductions a round, none of them repeated per register
    assert ptx.count("redux.sync.max.s32") == (2 if redux else 0)
"""


def test_gpu_variant_compiles_for_hopper():
    """The GPU variants (the L1 prefetch and the warp reductions, inline PTX the interpreter skips) assemble for sm_90
    through ptxas, without a GPU (in a process of its own: the interpreter's kernels cannot be compiled)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", HOPPER_BUILD], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
