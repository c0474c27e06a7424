"""Launch-parameter sweep of the builder and the sampler on the GPU (graph times in µs), to choose their defaults.

usage: python benchmarks/sweep_kernels.py --out DIR [--sections builder,sampler]
Builder: num_warps at the anchor's large shapes. Sampler: the tile size (`block`) of the sampled passes and the
N-candidate form at 960 x 151936. Every timed call's output is checked (builder against the torch reference, greedy
rows against torch.argmax). Rows go to DIR/sweep.jsonl.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_kernels as bk  # noqa: E402

from flashtree.sampler.triton_sampler import sample_candidates_triton, sample_rows_triton  # noqa: E402
from flashtree.tree import triton_build  # noqa: E402
from flashtree.tree.build import build_vote_tree  # noqa: E402


def builder(bw):
    for bs, n, k, w in [(64, 32, 15, 32), (256, 16, 15, 16), (64, 8, 15, 16)]:
        cands = bk.anchor_candidates(bs, n, k)
        ref = build_vote_tree(cands, w)
        for warps in (4, 8, 16):
            tree, _ = launch_with_warps(cands, w, warps)
            same = torch.equal(tree.tokens, ref.tokens) and torch.equal(tree.parents, ref.parents)
            g = bk.try_graph(lambda: launch_with_warps(cands, w, warps))
            bk.log(kind="sweep_builder", bs=bs, n=n, k=k, width=w, num_warps=warps, same_as_reference=same, graph_us=g)


def launch_with_warps(cands, width, warps):
    """triton_build._launch with its warp count replaced (the kernel and its other arguments as shipped)."""
    kernel = triton_build._vote_tree_kernel
    original = kernel.run

    def run(*args, **kwargs):
        kwargs["num_warps"] = warps
        return original(*args, **kwargs)

    kernel.run = run
    try:
        return triton_build._launch(cands, width, eagle=True)
    finally:
        kernel.run = original


def sampler(bw):
    for dtype in (torch.bfloat16, torch.float32):
        logits = torch.randn(960, 151936, device="cuda").to(dtype)
        t = torch.full((960,), 0.7, device="cuda")
        t_greedy = torch.zeros(960, device="cuda")
        floor = logits.numel() * logits.element_size() / bw * 1e6
        argmax = logits.argmax(-1)
        for block in (4096, 8192, 16384, 32768):
            same = torch.equal(sample_rows_triton(logits, t_greedy, block=block), argmax)
            g = bk.try_graph(lambda: sample_rows_triton(logits, t, block=block))
            gc = bk.try_graph(lambda: sample_candidates_triton(logits, t, 8, block=block))
            bk.log(kind="sweep_sampler", dtype=str(dtype).split(".")[-1], block=block, greedy_equals_argmax=same,
                   sampled_graph_us=g, vs_floor=bk.ratio(g, floor), candidates8_graph_us=gc, floor_us=floor)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results")
    ap.add_argument("--sections", default="builder,sampler")
    a = ap.parse_args()
    sections = a.sections.split(",")
    unknown = set(sections) - {"builder", "sampler"}
    if unknown:
        ap.error(f"unknown sections: {sorted(unknown)}")
    os.makedirs(a.out, exist_ok=True)
    bk.OUT_FILE = os.path.join(a.out, "sweep.jsonl")
    open(bk.OUT_FILE, "w").close()
    bk.log(kind="env", torch=torch.__version__, triton=triton.__version__, gpu=torch.cuda.get_device_name())
    bw = bk.ceiling()
    if "builder" in sections:
        builder(bw)
    if "sampler" in sections:
        sampler(bw)


if __name__ == "__main__":
    main()
