"""The Optuna sweeper preset and the submitit launcher preset (through submitit's local executor)."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from .helpers import TINY, run_app

pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")


def test_optuna_preset_finds_the_best_feasible_configuration(tmp_path):
    sweep = tmp_path / "optuna"
    run_app("sweep.py", ["--multirun", *TINY, "logger.wandb.mode=disabled", "sweeper=optuna",
                         "hydra.sweeper.n_trials=4", "tree.n=choice(1,4)", "tree.width=choice(4,8)",
                         "objective.metric=tau", "objective.max_budget=4", f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert best["best_params"]["tree.width"] == 4  # W=8 is over the budget: scored 0 and never run
    table = pd.read_parquet(sweep / "summary.parquet")
    assert set(table["tree.width"]) == {4}
    assert best["best_value"] == pytest.approx(table["tau"].max())


def test_submitit_local_launcher_runs_each_configuration(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    sweep = tmp_path / "submitit"
    run_app("sweep.py", ["--multirun", *TINY, "logger.wandb.mode=disabled", "launcher=submitit-local",
                         "tree.n=1,2", "tree.width=4", f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    table = pd.read_parquet(sweep / "summary.parquet")
    assert sorted(table["tree.n"]) == [1, 2]
