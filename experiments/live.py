#!/usr/bin/env python
"""The live benchmark: sglang servers from named presets, float32 greedy identity, tokens/s, sampled chi-square.

    python experiments/live.py +preset=best                 # DSPARK's chain against the best measured trees
    python experiments/live.py +preset=qwen3-8b-dummy       # 8B shapes, dummy weights (also llama31-8b-dummy, -4k)
    python experiments/live.py run=[speed] phases.speed.servers=[chain,tree8-w16] phases.speed.rounds=3
    python experiments/live.py +preset=best live.dry_run=true   # print the servers' commands, start nothing

Presets: configs/live/ (servers/*.yaml: the named servers; model/: paths, shared flags, precision profiles;
preset/: whole runs). Results in live.out_dir: <phase>_results.json, steps.parquet, summary.json, logs/.
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from flashtree.live.config import register

register()


@hydra.main(version_base="1.3", config_path=str(Path(__file__).resolve().parents[1] / "configs" / "live"),
            config_name="live")
def main(cfg: DictConfig) -> None:
    from flashtree.live.app import run

    status = run(cfg)
    if status:
        sys.exit(status)


if __name__ == "__main__":
    main()
