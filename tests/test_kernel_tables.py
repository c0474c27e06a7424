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
