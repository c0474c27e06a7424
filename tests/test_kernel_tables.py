"""benchmarks/kernel_tables.py renders a bench_kernels.py run as the tables of BENCHMARKS.md section 1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def test_run7_tables_hold_the_figures_benchmarks_md_quotes():
    run7 = BENCH / "data" / "kernels" / "kernels_h200_run7.jsonl"
    out = subprocess.run([sys.executable, str(BENCH / "kernel_tables.py"), str(run7)],
                         capture_output=True, text=True, check=True).stdout
    # one table per kernel, every output check passed
    for kind in ("tree_build", "walk_commit", "verify_inputs", "markov_draws", "sampler", "sampler_candidates",
                 "verify_attn", "verify_attn_paged"):
        assert f"\n{kind}:\n" in out
    assert "NO" not in out.replace("NVIDIA", "")
    assert "| 64 | 32 | 32 | 8.0 (17.7) | 76.0 (718) | 9.46x | yes / yes |" in out
    assert "| 960 x 151936 | bf16 | 68.3 | 101.8 (96.7) | 1.49x |" in out
    assert "| 64 | 8192 | 16 | 503.1 | 581.0 (574.0) | 1.15x |" in out


def test_bad_usage_names_the_expected_argument():
    r = subprocess.run([sys.executable, str(BENCH / "kernel_tables.py")], capture_output=True, text=True)
    assert r.returncode != 0 and "usage: python benchmarks/kernel_tables.py KERNELS.jsonl" in r.stderr


def test_policy_rows_show_the_feeding_topk_where_timed(tmp_path):
    import json

    rows = [dict(kind="policy_build", policy="best-first", build="marginal", bs=64, n=0, k=15, width=32, vocab=151936,
                 same_as_reference=True, flashtree_eager_us=20.0, flashtree_graph_us=7.5, torch_eager_us=900.0,
                 torch_graph_us=400.0, topk_eager_us=60.0, topk_graph_us=50.0),
            dict(kind="policy_build", policy="prob", build="fused_auto", bs=64, n=32, k=15, width=32, vocab=None,
                 same_as_reference=True, flashtree_eager_us=60.0, flashtree_graph_us=9.6)]
    path = tmp_path / "k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = subprocess.run([sys.executable, str(BENCH / "kernel_tables.py"), str(path)],
                         capture_output=True, text=True, check=True).stdout
    assert "| best-first (marginal) | 64 | 0 | 15 | 32 | 151936 | 7.5 (20.0) | 400.0 (900.0) | 50.0 (60.0) | yes |" in out
    assert "| prob (fused_auto) | 64 | 32 | 15 | 32 | – | 9.6 (60.0) | – (–) | – | yes |" in out


def test_in_graph_rows_show_both_slot_layouts(tmp_path):
    """An in-graph attention row shows the per-call time with each layer's own slot list and with the one list a
    server's layers share; rows of runs before the second measurement show a dash there."""
    import json

    launch = dict(block_m=64, block_n=64, warps=4, stages=3, splits=16, parts=17, partials="bf16", prefetch=True,
                  pdl=True, fused=False, merge_rows=2, merge_unroll=4)
    row = dict(kind="verify_attn_small_in_graph", bs=1, prefix=4096, L=16, stage="default", tune={}, launch=launch,
               floor_us=4.0, graph_us=18.3, in_graph_us=13.06, layers=36)
    path = tmp_path / "k.jsonl"
    path.write_text(json.dumps({**row, "in_graph_shared_us": 12.44}) + "\n" + json.dumps(row) + "\n")
    out = subprocess.run([sys.executable, str(BENCH / "kernel_tables.py"), str(path)],
                         capture_output=True, text=True, check=True).stdout
    assert "| 1 | 4096 | 16 | 4.0 | 18.3 | 13.1 | 3.27x | 12.4 | default: " in out
    assert "| 1 | 4096 | 16 | 4.0 | 18.3 | 13.1 | 3.27x | – | default: " in out


def test_early_rows_show_both_graphs_and_a_failed_variant(tmp_path):
    """An attention-early row shows the per-call time back to back and with a KV store between the layers; a
    variant that failed shows its error instead of a number."""
    import json

    row = dict(kind="verify_attn_early", bs=1, prefix=4096, L=16, layers=36, variant="early2", prefix_ready=True,
               early=2, round=1, floor_us=4.0)
    path = tmp_path / "k.jsonl"
    path.write_text(json.dumps({**row, "in_graph_us": 12.31, "with_store_us": 14.02, "err": 0.0021}) + "\n"
                    + json.dumps({**row, "error": "OutOfResources()", "matches": False}) + "\n")
    out = subprocess.run([sys.executable, str(BENCH / "kernel_tables.py"), str(path)],
                         capture_output=True, text=True, check=True).stdout
    assert "| 1 | 4096 | 16 | early2 | 1 | 4.0 | 12.3 | 14.0 | 2.1e-03 |" in out
    assert "| 1 | 4096 | 16 | early2 | 1 | 4.0 | – | – | OutOfResources() |" in out
