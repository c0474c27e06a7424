#!/usr/bin/env python
"""The live benchmark: sglang servers from named presets, float32 greedy identity, tokens/s, sampled chi-square.

    python experiments/live.py +preset=best                 # DSPARK's chain against the best measured trees
    python experiments/live.py +preset=qwen3-8b-dummy       # 8B shapes, dummy weights (also llama31-8b-dummy, -4k)
    python experiments/live.py +preset=qwen3-8b-simtab      # at SmolLM2 τ (also llama31-8b-simtab, qwen3-8b-4k-simtab)
    python experiments/live.py run=[speed] phases.speed.servers=[chain,tree8-w16] phases.speed.rounds=3
    python experiments/live.py +preset=best live.dry_run=true   # print the servers' commands, start nothing

Presets: flashtree/configs/live/ (servers/*.yaml: the named servers; model/: paths, shared flags, precision profiles;
preset/: whole runs). Results in live.out_dir: <phase>_results.json, steps.parquet, summary.json, logs/.

The same app as `flashtree live ...` (flashtree/cli.py).
"""

from flashtree.cli import run_app

if __name__ == "__main__":
    run_app("live")
