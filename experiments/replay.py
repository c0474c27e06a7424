#!/usr/bin/env python
"""Counterfactual (N, W) sweeps at temperature 0 from one recording per prompt (flashtree.engine.replay).

    python experiments/replay.py dataset=gsm8k dataset.limit=20 engine.max_new_tokens=128 replay.n_max=16
    python experiments/replay.py replay.ns=[1,4] replay.widths=[4,8,16]        # another grid, same recording
    python experiments/replay.py --multirun dataset=mt-bench,humaneval,gsm8k    # one recording per dataset

Writes per (N, W) the same steps.parquet / summary.json a sweep run writes, and the collected summary.parquet.

The same app as `flashtree replay ...` (flashtree/cli.py).
"""

from flashtree.cli import run_app

if __name__ == "__main__":
    run_app("replay")
