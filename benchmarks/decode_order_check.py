"""Decode-order split-KV verify against sglang's own decode kernel, bit for bit, on the GPU; and what each costs.

For random trees, batch sizes and prefixes that span several deterministic splits (tile 256), every verify token runs
(a) as a decode row through sglang's `decode_attention_fwd` (FLASHTREE_EXACT_VERIFY's path: what a plain decode at
that position computes), (b) through flashtree's decode-order kernel (FLASHTREE_SPLITKV_VERIFY on a deterministic
server), and (c) through flashtree's fast split-KV tree kernel (FLASHTREE_SPLITKV_VERIFY elsewhere: same maths, its
own order). The claim is torch.equal(a, b) in every case; (c) is reported by its largest difference. Times are
CUDA-graph replays (mean of 100 after warm-up). Writes one JSON line per case and exits 1 if any case differs.

    python benchmarks/decode_order_check.py [--out FILE] [--quick]

Needs sglang (its decode kernel is the reference) and a CUDA device; `--quick --cpu` runs one tiny case under the
Triton interpreter (numpy dots: close, not bit-equal) to keep the script itself tested.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from bench_kernels import graphed, tree_mask  # benchmarks/ is on sys.path when this runs as a script

from flashtree.attention.triton_decode_order import decode_order_verify_triton
from flashtree.attention.triton_verify import tree_attention_triton
from flashtree.patches.exact_verify import path_rows, path_slots

TILE = 256  # sglang's default SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE
MAX_CONTEXT = 4096

# bs, Hq, Hkv, D, W, max prefix, dtype: SmolLM2-135M's heads at its live widths, then a Llama-8B-like head layout
CASES = [
    (1, 9, 3, 64, 9, 700, torch.float32),
    (8, 9, 3, 64, 16, 1200, torch.float32),
    (8, 9, 3, 64, 64, 900, torch.float32),
    (32, 9, 3, 64, 9, 1500, torch.float32),
    (32, 9, 3, 64, 16, 600, torch.bfloat16),
    (4, 32, 8, 128, 16, 3000, torch.bfloat16),
    (16, 32, 8, 128, 32, 2000, torch.float32),
]
QUICK = [(2, 6, 2, 16, 5, 70, torch.float32)]


def make_case(bs, hq, hkv, d, w, max_prefix, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(1, max_prefix + 1, (bs,), generator=g)
    prefix[0] = max_prefix
    pool = int(prefix.sum()) + bs * w + 1
    kb = torch.randn(pool, hkv, d, generator=g).to(dtype)
    vb = torch.randn(pool, hkv, d, generator=g).to(dtype)
    slots = torch.randperm(pool - 1, generator=g) + 1
    kv_indices, loc = slots[: int(prefix.sum())], slots[int(prefix.sum()) : int(prefix.sum()) + bs * w]
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32)
    kv_indptr[1:] = prefix.cumsum(0)
    q = torch.randn(bs * w, hq, d, generator=g).to(dtype)
    blocks = tree_mask(bs, w, g, "cpu")
    t = [x.to(device) for x in (q, kb, vb, kv_indptr, kv_indices, loc, blocks)]
    return t, prefix


def sglang_rows(q, kb, vb, kv_indptr, kv_indices, loc, blocks, out, decode_attention_fwd, max_splits):
    """Every verify token as a decode row through sglang's decode kernel, with its deterministic split count."""
    bs, w, _ = blocks.shape
    capacity = w * kv_indices.numel() + bs * w * w
    row_indptr, row_indices, row_lens = path_rows(kv_indptr, kv_indices, loc, blocks, capacity)
    splits = ((row_lens + TILE - 1) // TILE).to(torch.int32)
    logits = torch.empty(q.shape[0], q.shape[1], max_splits, vb.shape[2], dtype=torch.float32, device=q.device)
    lse = torch.empty(q.shape[0], q.shape[1], max_splits, dtype=torch.float32, device=q.device)

    def run():
        decode_attention_fwd(q, kb, vb, out, row_indptr, row_indices, logits, lse, splits, max_splits,
                             q.shape[2] ** -0.5, 1.0, 1.0)
        return out

    return run


def timed(fn, device) -> float:
    """Mean µs of a CUDA-graph replay of fn (0 off CUDA)."""
    if device.type != "cuda":
        fn()
        return 0.0
    replay = graphed(fn)
    for _ in range(10):
        replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(100):
        replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 10.0  # ms per 100 -> µs per replay


def check(case, device, seed=0) -> dict:
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd

    bs, hq, hkv, d, w, max_prefix, dtype = case
    (q, kb, vb, kv_indptr, kv_indices, loc, blocks), prefix = make_case(*case, device, seed)
    max_splits = MAX_CONTEXT // TILE
    want = torch.empty_like(q)
    run_sglang = sglang_rows(q, kb, vb, kv_indptr, kv_indices, loc, blocks, want, decode_attention_fwd, max_splits)
    slots, lens = path_slots(loc, blocks)
    got = torch.empty_like(q)

    def run_ours():
        return decode_order_verify_triton(q, kb, vb, kv_indptr, kv_indices, slots, lens, w, d**-0.5, TILE, max_splits,
                                          out=got)

    mask = torch.cat([torch.cat([torch.ones(w, int(p), dtype=torch.bool, device=device), blocks[b]], 1).flatten()
                      for b, p in enumerate(prefix)])
    mask_indptr = torch.zeros(bs + 1, dtype=torch.int64, device=device)
    mask_indptr[1:] = (w * (prefix + w)).cumsum(0).to(device)
    fast = torch.empty_like(q)

    def run_fast():
        return tree_attention_triton(q, kb[loc], vb[loc], kb, vb, kv_indptr, kv_indices, mask, w, sm_scale=d**-0.5,
                                     mask_indptr=mask_indptr, out=fast)

    us = {name: timed(fn, device) for name, fn in
          (("sglang_decode_rows", run_sglang), ("decode_order", run_ours), ("splitkv_fast", run_fast))}
    equal = torch.equal(got, want)
    return {
        "bs": bs, "hq": hq, "hkv": hkv, "d": d, "w": w, "max_prefix": max_prefix, "dtype": str(dtype).split(".")[-1],
        "rows_differing": int((got != want).flatten(1).any(1).sum()), "rows": q.shape[0], "bit_equal": equal,
        "max_abs_diff": float((got.float() - want.float()).abs().max()),
        "fast_max_abs_diff": float((fast.float() - want.float()).abs().max()),
        "us": {k: round(v, 2) for k, v in us.items()},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="also append the JSON lines to this file")
    parser.add_argument("--quick", action="store_true", help="one tiny case")
    parser.add_argument("--cpu", action="store_true", help="run on CPU (Triton interpreter; not bit-equal)")
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.cpu else "cuda")
    failed = 0
    for i, case in enumerate(QUICK if args.quick else CASES):
        result = check(case, device, seed=i)
        line = json.dumps(result)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")
        failed += not result["bit_equal"]
    return 1 if failed and device.type == "cuda" else 0


if __name__ == "__main__":
    sys.exit(main())
