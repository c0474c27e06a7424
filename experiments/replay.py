#!/usr/bin/env python
"""Counterfactual (N, W) sweeps at temperature 0 from one recording per prompt (flashtree.engine.replay).

    python experiments/replay.py dataset=gsm8k dataset.limit=20 engine.max_new_tokens=128 replay.n_max=16
    python experiments/replay.py replay.ns=[1,4] replay.widths=[4,8,16]        # another grid, same recording
    python experiments/replay.py --multirun dataset=mt-bench,humaneval,gsm8k    # one recording per dataset

Writes per (N, W) the same steps.parquet / summary.json a sweep run writes, and the collected summary.parquet.
"""

from pathlib import Path

import hydra
from omegaconf import DictConfig

from flashtree.experiments.config import register

register()


@hydra.main(version_base="1.3", config_path=str(Path(__file__).resolve().parents[1] / "configs"), config_name="replay")
def main(cfg: DictConfig) -> float:
    from flashtree.experiments.replay_app import run_replay

    return run_replay(cfg)


if __name__ == "__main__":
    main()
