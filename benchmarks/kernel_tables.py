"""Markdown tables of a `bench_kernels.py` run: one table per kernel, the rows as BENCHMARKS.md section 1 shows them.

    python benchmarks/kernel_tables.py benchmarks/data/kernels/kernels_h200_run7.jsonl
"""

from __future__ import annotations

import json
import sys


def num(v, digits=1):
    return "–" if v is None else f"{v:.{digits}f}"


def yes(*flags):
    return "yes" if all(flags) else "NO"


def speedup(peer, ours):
    return "–" if peer is None or ours is None else f"{peer / ours:.2f}x"


def launch_cell(c):
    """A verify-attention launch in a few words."""
    # runs before the knob existed logged none; kernel run 12 also tried 2 (K / V a tile ahead too)
    ahead = {0: "", 1: ", slots prefetched", 2: ", K / V prefetched"}[int(c.get("prefetch") or 0)]
    ahead += ", PDL" if c.get("pdl") else ""
    if c["parts"] == 1:
        return f"unsplit, BM {c['block_m']}, BN {c['block_n']}, {c['warps']} warps, {c['stages']} stages{ahead}"
    tree = " + tree part" if c["parts"] > c["splits"] else ""
    merge = f"fused merge x{c['merge_unroll']}" if c["fused"] else f"merge launch ({c['merge_rows']} rows)"
    return (f"{c['splits']} splits{tree}, BM {c['block_m']}, BN {c['block_n']}, {c['warps']} warps, {c['stages']} stages, "
            f"{c['partials']} partials, {merge}{ahead}")


# kind -> (header, one row's cells)
TABLES = {
    "tree_build": (
        ["bs", "N", "W", "flashtree graph (eager)", "flashmap compiled + graph (eager, not compiled)",
         "speed-up vs flashmap", "same as reference / flashmap"],
        lambda d: [d["bs"], d["n"], d["width"], f"{num(d['flashtree_graph_us'])} ({num(d['flashtree_eager_us'])})",
                   f"{num(d.get('flashmap_compiled_graph_us'))} ({num(d.get('flashmap_eager_us'), 0)})",
                   speedup(d.get("flashmap_compiled_graph_us"), d["flashtree_graph_us"]),
                   f"{yes(d['same_as_reference'])} / {yes(d.get('same_as_flashmap', False))}"]),
    "policy_build": (
        ["policy", "bs", "N", "K", "W", "vocab", "flashtree graph (eager)", "torch builder graph (eager)",
         "its per-position top-k graph (eager)", "same as reference"],
        # prob's rows name their build (fused_auto: the default launch, fused_radix, fused_rank, cumsum_scored);
        # earlier runs' one row, none, was cumsum_scored; best-first's `marginal` rows (DFLASH) time the top-k apart
        lambda d: [d["policy"] + (f" ({d['build']})" if d.get("build") else ""), d["bs"], d["n"], d["k"], d["width"],
                   d.get("vocab") or "–",
                   f"{num(d['flashtree_graph_us'])} ({num(d['flashtree_eager_us'])})",
                   f"{num(d.get('torch_graph_us'))} ({num(d.get('torch_eager_us'))})",
                   f"{num(d.get('topk_graph_us'))} ({num(d.get('topk_eager_us'))})" if "topk_graph_us" in d else "–",
                   yes(d["same_as_reference"])]),
    "walk_commit": (
        ["bs", "N", "W", "mean accepted", "walk + commit graph (eager)", "build + walk + commit graph",
         "torch reference eager", "same as reference"],
        lambda d: [d["bs"], d["n"], d["width"], num(d["mean_accept"], 2),
                   f"{num(d['flashtree_graph_us'])} ({num(d['flashtree_eager_us'])})",
                   num(d["build_plus_walk_graph_us"]), num(d["torch_reference_eager_us"], 0),
                   yes(d["same_as_reference"])]),
    "verify_inputs": (
        ["bs", "N", "K", "W", "flashtree graph", "flashtree wall", "sglang path wall", "speed-up (wall)",
         "same as sglang"],
        lambda d: [d["bs"], d["n"], d["k"], d["width"], num(d["flashtree_graph_us"]), num(d["flashtree_wall_us"]),
                   num(d.get("sglang_wall_us")), speedup(d.get("sglang_wall_us"), d["flashtree_wall_us"]),
                   yes(d.get("same_as_sglang", False))]),
    "markov_draws": (
        ["bs x N", "K", "V", "rank", "torch ops graph", "fused graph", "GEMM + pick graph", "with log q", "shipped",
         "speed-up (shipped)", "greedy candidate = torch's"],
        # runs before the GEMM form (run 7) named the fused form's shipped tiles "autox16"
        lambda d: [f"{d['bs']} x {d['n']}", d["k"], d["vocab"], d["rank"], num(d["torch_graph_us"], 0),
                   num(d.get("flashtree_graph_us_fused", d.get("flashtree_graph_us_autox16")), 0),
                   num(d.get("flashtree_graph_us_gemm"), 0), num(d.get("flashtree_graph_us_gemm_logp"), 0),
                   d.get("shipped", "fused"),
                   speedup(d["torch_graph_us"], d.get("flashtree_graph_us_shipped", d.get("flashtree_graph_us_autox16"))),
                   yes(d.get("greedy_same_shipped", d.get("greedy_same_autox16")))]),
    "sampler": (
        ["rows x vocab", "logits", "floor", "flashtree sampled graph (eager)", "vs floor", "greedy rows, mixed batch",
         "all-greedy launch", "torch argmax", "all-greedy vs argmax", "flashmap `sample_rows` graph",
         "speed-up vs flashmap", "greedy = argmax"],
        lambda d: [f"{d['rows']} x {d['vocab']}", {"bfloat16": "bf16", "float32": "fp32"}.get(d["dtype"], d["dtype"]),
                   num(d["floor_us"]), f"{num(d['flashtree_sample_graph_us'])} ({num(d['flashtree_sample_eager_us'])})",
                   speedup(d["flashtree_sample_graph_us"], d["floor_us"]), num(d["flashtree_greedy_graph_us"]),
                   num(d["flashtree_greedy_only_graph_us"]), num(d["torch_argmax_graph_us"]),
                   speedup(d["flashtree_greedy_only_graph_us"], d["torch_argmax_graph_us"]),
                   num(d.get("flashmap_graph_us")), speedup(d.get("flashmap_graph_us"), d["flashtree_sample_graph_us"]),
                   yes(d["greedy_equals_torch_argmax"], d["greedy_only_equals_torch_argmax"])]),
    "sampler_candidates": (
        ["rows x vocab", "draws per row", "floor", "flashtree graph (eager)", "vs floor"],
        lambda d: [f"{d['rows']} x {d['vocab']}", d["n"], num(d["floor_us"]),
                   f"{num(d['flashtree_graph_us'])} ({num(d['flashtree_eager_us'])})",
                   speedup(d["flashtree_graph_us"], d["floor_us"])]),
    "verify_attn": (
        ["bs", "prefix", "L", "floor", "flashtree graph (eager)", "vs floor", "flashmap split-KV", "sglang extend",
         "SDPA", "flex_attention", "speed-up vs flashmap / sglang / SDPA / flex",
         "max rel. err (flashtree / flashmap / sglang)", "launch (splits, BM x BN)"],
        lambda d: [d["bs"], d["prefix"], d["L"], num(d["floor_us"]),
                   f"{num(d['flashtree_graph_us'])} ({num(d['flashtree_eager_us'])})",
                   speedup(d["flashtree_graph_us"], d["floor_us"]), num(d.get("flashmap_graph_us")),
                   num(d.get("sglang_graph_us"), 0), num(d.get("sdpa_graph_us"), 0), num(d.get("flex_graph_us"), 0),
                   " / ".join(speedup(d.get(k), d["flashtree_graph_us"])
                              for k in ("flashmap_graph_us", "sglang_graph_us", "sdpa_graph_us", "flex_graph_us")),
                   " / ".join("–" if d.get(k) is None else f"{d[k]:.1e}"
                              for k in ("flashtree_err", "flashmap_err", "sglang_err")),
                   "–" if "splits" not in d else f"{d['splits']}, {d['block_m']} x {d['block_n']}"]),
    "verify_attn_splits": (
        ["bs", "prefix", "L", "splits", "floor", "flashtree graph", "vs floor", "rel. err", "the heuristic's"],
        lambda d: [d["bs"], d["prefix"], d["L"], d["splits"], num(d["floor_us"]), num(d["flashtree_graph_us"]),
                   speedup(d["flashtree_graph_us"], d["floor_us"]), f"{d['flashtree_err']:.1e}",
                   "yes" if d["chosen"] else ""]),
    "verify_attn_tune_best": (
        ["bs", "prefix", "L", "floor", "default graph", "best graph", "vs floor", "speed-up vs default",
         "best launch", "points (failed)"],
        lambda d: [d["bs"], d["prefix"], d["L"], num(d.get("floor_us")), num(d["default_us"]), num(d.get("graph_us")),
                   speedup(d.get("graph_us"), d.get("floor_us")), speedup(d["default_us"], d.get("graph_us")),
                   launch_cell(d["launch"]) if "launch" in d else "–", f"{d['points']} ({d['failed']})"]),
    "verify_attn_small_in_graph": (
        ["bs", "prefix", "L", "floor", "one replay", "per call, in a graph of 36", "vs floor (in graph)",
         "in a graph, the layers' slots shared", "launch"],
        lambda d: [d["bs"], d["prefix"], d["L"], num(d["floor_us"]), num(d["graph_us"]), num(d["in_graph_us"]),
                   speedup(d["in_graph_us"], d["floor_us"]), num(d.get("in_graph_shared_us")),
                   ("default: " if d["stage"] == "default" else "") + launch_cell(d["launch"])]),
    "verify_attn_small_best": (
        ["bs", "prefix", "L", "floor", "default: one replay / in graph", "fastest replay", "its launch",
         "fastest in graph (its replay)", "its launch", "points (failed)"],
        lambda d: [d["bs"], d["prefix"], d["L"], num(d["floor_us"]),
                   f"{num(d['default_us'])} / {num(d.get('default_in_graph_us'))}", num(d.get("graph_us")),
                   launch_cell(d["launch"]) if d.get("launch") else "–",
                   f"{num(d.get('best_in_graph_us'))} ({num(d.get('best_in_graph_graph_us'))})",
                   launch_cell(d["best_in_graph_launch"]) if d.get("best_in_graph_launch") else "–",
                   f"{d['points']} ({d['failed']})"]),
    "verify_attn_early": (
        ["bs", "prefix", "L", "variant", "round", "floor", "per call in a graph", "with a KV store between",
         "rel. err"],
        lambda d: [d["bs"], d["prefix"], d["L"], d["variant"], d["round"], num(d["floor_us"]),
                   num(d.get("in_graph_us")), num(d.get("with_store_us")),
                   f"{d['err']:.1e}" if "err" in d else d.get("error", "–")]),
    "verify_attn_paged": (
        ["bs", "prefix", "L", "page", "floor", "flashtree graph (eager)", "vs floor"],
        lambda d: [d["bs"], d["prefix"], d["L"], d["page"], num(d["floor_us"]),
                   f"{num(d['flashtree_graph_us'])} ({num(d['flashtree_eager_us'])})",
                   speedup(d["flashtree_graph_us"], d["floor_us"])]),
}


def tables(rows: list[dict]) -> str:
    out = []
    for d in rows:
        if d["kind"] in ("env", "ceiling", "graph_floor"):
            out.append(", ".join(f"{k} {v}" for k, v in d.items() if k != "kind"))
    for kind, (header, cells) in TABLES.items():
        mine = [d for d in rows if d["kind"] == kind]
        if mine:
            out += ["", f"{kind}:", "", "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
            out += ["| " + " | ".join(str(c) for c in cells(d)) + " |" for d in mine]
    return "\n".join(out)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python benchmarks/kernel_tables.py KERNELS.jsonl")
    with open(sys.argv[1]) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    print(tables(rows))


if __name__ == "__main__":
    main()
