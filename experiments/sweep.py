#!/usr/bin/env python
"""flashtree sweeps: τ, per-depth acceptance and tokens/s per configuration, to parquet + W&B.

    python experiments/sweep.py                                    # one run of the defaults (flashtree/configs/config.yaml)
    python experiments/sweep.py --multirun tree.n=1,4,8,16 tree.width=8,16,32 dataset=gsm8k,humaneval
    python experiments/sweep.py --multirun sweeper=optuna objective.min_tau=1.4
    python experiments/sweep.py --multirun launcher=slurm hydra.launcher.partition=gpu tree.n=1,4 tree.width=8,16

Every run writes steps.parquet and summary.json to its own directory; a multirun also keeps
multirun/<name>/summary.parquet (one row per configuration). Rerunning a sweep skips configurations already finished.

The same app as `flashtree sweep ...` (flashtree/cli.py).
"""

from flashtree.cli import run_app

if __name__ == "__main__":
    run_app("sweep")
