#!/usr/bin/env python
"""flashtree sweeps: τ, per-depth acceptance and tokens/s per configuration, to parquet + W&B.

    python experiments/sweep.py                                    # one run of the defaults (configs/config.yaml)
    python experiments/sweep.py --multirun tree.n=1,4,8,16 tree.width=8,16,32 dataset=gsm8k,humaneval
    python experiments/sweep.py --multirun sweeper=optuna objective.min_tau=1.4
    python experiments/sweep.py --multirun launcher=slurm hydra.launcher.partition=gpu tree.n=1,4 tree.width=8,16

Every run writes steps.parquet and summary.json to its own directory; a multirun also keeps
multirun/<name>/summary.parquet (one row per configuration). Rerunning a sweep skips configurations already finished.
"""

from pathlib import Path

import hydra
from omegaconf import DictConfig

from flashtree.experiments.config import register

register()


@hydra.main(version_base="1.3", config_path=str(Path(__file__).resolve().parents[1] / "configs"), config_name="config")
def main(cfg: DictConfig) -> float:
    from flashtree.experiments.app import run_job

    return run_job(cfg)


if __name__ == "__main__":
    main()
