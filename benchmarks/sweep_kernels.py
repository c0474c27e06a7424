"""Launch-parameter sweep of the builder, the sampler and the verify attention on the GPU (graph times in µs), to
choose their defaults.

usage: python benchmarks/sweep_kernels.py --out DIR [--sections builder,sampler,stream,attention]
Builder: num_warps at the anchor's large shapes. Sampler: pass 1's tile size (`block`), warps, register cap and
splits per row, single draw and the 8-candidate form, at 960 x 151936. Stream: what pass 1's loop reaches with
nothing but the read and a sum (and with one exp2 per logit), against torch's own row sum: the attainable rate of
the loop, apart from the sampling. Attention: the verify kernel's split count and key tile / warps / stages at bs 1
(4K, 32K) and bs 8 (4K), Qwen3-8B heads (benchmarks/HISTORY.md, "Split count"). Every timed call's output is checked
(builder against the torch reference, greedy rows against torch.argmax, sampled draws by a mean-logit z-score, sums
against torch, attention against the unsplit kernel in fp32). Rows go to DIR/sweep.jsonl.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_kernels as bk  # noqa: E402

from flashtree.attention import triton_verify  # noqa: E402
from flashtree.sampler import triton_sampler  # noqa: E402
from flashtree.sampler.triton_sampler import sample_candidates_triton, sample_rows_triton  # noqa: E402
from flashtree.tree import triton_build  # noqa: E402
from flashtree.tree.build import build_vote_tree  # noqa: E402


def builder(bw):
    for bs, n, k, w in [(64, 32, 15, 32), (256, 16, 15, 16), (64, 8, 15, 16)]:
        cands = bk.anchor_candidates(bs, n, k)
        ref = build_vote_tree(cands, w)
        for warps in (4, 8, 16):
            with launch_options(triton_build._vote_tree_kernel, num_warps=warps):
                tree, _ = triton_build._launch(cands, w, eagle=True)
                same = torch.equal(tree.tokens, ref.tokens) and torch.equal(tree.parents, ref.parents)
                g = bk.try_graph(lambda: triton_build._launch(cands, w, eagle=True))
            bk.log(kind="sweep_builder", bs=bs, n=n, k=k, width=w, num_warps=warps, same_as_reference=same, graph_us=g)


@contextlib.contextmanager
def launch_options(kernel, **options):
    """Launches of `kernel` with some launch options (num_warps, maxnreg) replaced, its arguments as shipped."""
    original = kernel.run

    def run(*args, **kwargs):
        kwargs.update({k: v for k, v in options.items() if v is not None})
        return original(*args, **kwargs)

    kernel.run = run
    try:
        yield
    finally:
        kernel.run = original


@contextlib.contextmanager
def splits_per_row(splits, rows):
    """Pass 1's split count at `rows` rows, set through the SM count it plans with (~8 programs per SM)."""
    original = triton_sampler.sm_count
    triton_sampler.sm_count = lambda dev, default: splits * rows // 8
    try:
        yield
    finally:
        triton_sampler.sm_count = original


def z_score(draws, logits, temp):
    """How far the draws' mean logit lies from its expectation under softmax(logits / temp), in standard errors."""
    p = (logits.float() / temp).softmax(-1)
    mean = (p * logits.float()).sum(-1)
    var = (p * logits.float() ** 2).sum(-1) - mean**2
    got = logits.float().gather(1, draws.view(logits.shape[0], -1)).mean(-1)
    per = draws.numel() // logits.shape[0]
    return round(float(((got - mean) / (var / per).sqrt()).mean() * logits.shape[0] ** 0.5), 2)


def sampler(bw):
    rows, vocab = 960, 151936
    for dtype in (torch.bfloat16, torch.float32):
        logits = torch.randn(rows, vocab, device="cuda").to(dtype)
        t = torch.full((rows,), 0.7, device="cuda")
        t_greedy = torch.zeros(rows, device="cuda")
        floor = logits.numel() * logits.element_size() / bw * 1e6
        argmax = logits.argmax(-1)
        # maxnreg: a register cap that lets more programs share an SM
        for block, warps, splits, maxnreg in [
                (2048, 2, 2, None), (2048, 2, 1, None), (2048, 2, 3, None), (2048, 2, 4, None), (2048, 2, 2, 64),
                (2048, 4, 2, None), (1024, 1, 4, None), (1024, 2, 4, None), (4096, 4, 1, None), (4096, 4, 2, None),
                (4096, 2, 2, None)]:
            with launch_options(triton_sampler._pass1_kernel, num_warps=warps, maxnreg=maxnreg), \
                    splits_per_row(splits, rows):
                same = torch.equal(sample_rows_triton(logits, t_greedy, block=block), argmax)
                g = bk.try_graph(lambda: sample_rows_triton(logits, t, block=block))
                z = z_score(sample_candidates_triton(logits, t, 8, block=block), logits, 0.7)
                gc = None
                if dtype == torch.bfloat16:
                    gc = bk.try_graph(lambda: sample_candidates_triton(logits, t, 8, block=block))
                gg = bk.try_graph(lambda: sample_rows_triton(logits, t_greedy, block=block))
            bk.log(kind="sweep_sampler_launch", dtype=str(dtype).split(".")[-1], block=block, warps=warps,
                   splits=splits, maxnreg=maxnreg, greedy_equals_argmax=same, sampled_z=z, sampled_graph_us=g,
                   vs_floor=bk.ratio(g, floor), candidates8_graph_us=gc, greedy_rows_graph_us=gg, floor_us=floor)


@triton.jit
def _stream_kernel(x_ptr, stride_r, out_ptr, V, NT, TPS, S, BLOCK: tl.constexpr, EXP: tl.constexpr):
    # pass 1's loop with the sampling taken out: read each tile, sum it (optionally of exp2)
    r = tl.program_id(0)
    s = tl.program_id(1)
    row = x_ptr + r.to(tl.int64) * stride_r
    offs = tl.arange(0, BLOCK)
    acc = 0.0
    for t in range(s * TPS, tl.minimum(s * TPS + TPS, NT)):
        idx = t * BLOCK + offs
        x = tl.load(row + idx, mask=idx < V, other=-float("inf") if EXP else 0.0).to(tl.float32)
        if EXP:
            x = tl.exp2(x * 1.4426950408889634)
        acc += tl.sum(x, axis=0)
    tl.store(out_ptr + r * S + s, acc)


def stream(bw):
    rows, vocab, block = 960, 151936, 4096
    nt = triton.cdiv(vocab, block)
    for dtype in (torch.bfloat16, torch.float32):
        logits = torch.randn(rows, vocab, device="cuda").to(dtype)
        floor = logits.numel() * logits.element_size() / bw * 1e6
        ref = {False: logits.float().sum(-1), True: logits.float().exp().sum(-1)}
        for exp in (False, True):
            for warps, splits in [(4, 1), (4, 2), (8, 1), (2, 2)]:
                tps = triton.cdiv(nt, splits)
                s = triton.cdiv(nt, tps)
                out = torch.empty(rows * s, device="cuda")

                def run():
                    _stream_kernel[(rows, s)](logits, logits.stride(0), out, vocab, nt, tps, s, BLOCK=block, EXP=exp,
                                              num_warps=warps)

                run()
                ok = bool(torch.allclose(out.view(rows, s).sum(-1), ref[exp], rtol=1e-3, atol=1e-2))
                g = bk.try_graph(run)
                bk.log(kind="sweep_stream", dtype=str(dtype).split(".")[-1], exp2=exp, warps=warps, splits=splits,
                       block=block, sum_matches_torch=ok, graph_us=g, vs_floor=bk.ratio(g, floor), floor_us=floor)
        g = bk.try_graph(lambda: logits.sum(-1))
        bk.log(kind="sweep_stream", dtype=str(dtype).split(".")[-1], torch_sum=True, graph_us=g,
               vs_floor=bk.ratio(g, floor), floor_us=floor)


def attention(bw):
    hq, hkv, d = 32, 8, 128
    for bs, prefix, L, splits, tiles in [
        (1, 4096, 16, (8, 16, 24, 32, 48, 64), [(32, 4, 3), (64, 4, 3), (64, 4, 4), (128, 4, 3), (64, 8, 3)]),
        (1, 32768, 16, (8, 16, 24, 32, 48, 64), [(32, 4, 3), (64, 4, 3), (64, 4, 4), (128, 4, 3), (64, 8, 3)]),
        (8, 4096, 16, (1, 2, 3, 4, 6, 8, 16), [(64, 4, 3)]),
    ]:
        total = bs * prefix + 64
        kb = torch.randn(total, hkv, d, dtype=torch.bfloat16, device="cuda")
        vb = torch.randn(total, hkv, d, dtype=torch.bfloat16, device="cuda")
        idx = (torch.randperm(total - 64, device="cuda")[: bs * prefix] + 64).to(torch.int64)
        indptr = torch.arange(0, bs + 1, device="cuda", dtype=torch.int32) * prefix
        q = torch.randn(bs * L, hq, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(bs * L, hkv, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(bs * L, hkv, d, dtype=torch.bfloat16, device="cuda")
        mask = bk.tree_mask(bs, L).reshape(-1).to(torch.uint8)
        ref = triton_verify.tree_attention_triton(*(x.float() for x in (q, k, v, kb, vb)), indptr, idx, mask, L,
                                                  num_splits=1)  # unsplit, fp32
        o = torch.empty_like(q)
        floor = bs * prefix * hkv * d * 2 * 2 / bw * 1e6
        for n in splits:
            for bn, warps, stages in tiles:
                tune = dict(block_n=bn, num_warps=warps, num_stages=stages)
                f = lambda: triton_verify.tree_attention_triton(q, k, v, kb, vb, indptr, idx, mask, L, out=o,  # noqa
                                                                num_splits=n, tune=tune)
                f()
                err = ((o.float() - ref).norm() / ref.norm()).item()
                g = bk.try_graph(f)
                bk.log(kind="sweep_verify_attn", bs=bs, prefix=prefix, L=L, splits=n, block_n=bn, warps=warps,
                       stages=stages, err_vs_fp32=err, graph_us=g, floor_us=floor, vs_floor=bk.ratio(g, floor))
        del kb, vb
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results")
    ap.add_argument("--sections", default="builder,sampler")
    a = ap.parse_args()
    sections = a.sections.split(",")
    unknown = set(sections) - {"builder", "sampler", "stream", "attention"}
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
    if "stream" in sections:
        stream(bw)
    if "attention" in sections:
        attention(bw)


if __name__ == "__main__":
    main()
