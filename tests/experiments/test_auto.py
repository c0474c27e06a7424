"""tree.n=auto through the apps: a sweep and the replay run the planner, their rows and summaries say what it chose,
and the collected table and figures take a tree.n that is not a count."""

from __future__ import annotations

import json

import pytest

from flashtree import metrics
from flashtree.results.collect import format_table, load_results

from .helpers import REPO, TINY, run_app

RECORDING = REPO / "benchmarks" / "recordings" / "smollm2-dspark-gsm8k.pt"


def check_planned_run(run_dir) -> dict:
    """The run's steps carry the chosen shapes and its summary counts them."""
    steps = metrics.read_steps(run_dir / "steps.parquet")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert steps["plan_n"].dtype == "int64" and steps["plan_width"].dtype == "int64"
    assert (steps["candidates"] == steps["plan_n"]).all()
    assert sum(summary["plan_choices"].values()) == summary["steps"] == len(steps)
    assert set(summary["plan_choices"]) <= set(summary["plan_costs_ms"]) == set(summary["plan_tau"])
    return summary


def test_a_sweep_with_auto_beside_fixed_shapes(tmp_path):
    sweep = tmp_path / "sweep"
    run_app("sweep.py", ["--multirun", *TINY, "tree.n=1,auto", "tree.width=8", "logger.wandb.mode=disabled",
                         f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    run = "dataset.limit=2,drafter=oracle,engine.max_new_tokens=12,target=tiny-llama,tree.n={},tree.width=8"
    check_planned_run(sweep / run.format("auto"))
    fixed = metrics.read_steps(sweep / run.format(1) / "steps.parquet")
    assert fixed["plan_n"].isna().all()
    table = load_results(sweep)
    assert list(table["tree.n"]) == [1, "auto"]
    assert "auto" in format_table(table)

    from flashtree.results.plots import save_all

    assert save_all(table, tmp_path / "figures")  # the fixed rows still plot; the planner's is in the table


@pytest.mark.parametrize("overrides, message", [
    (["tree.n=automatic"], "tree.n='automatic': use an int >= 1 (the candidate count N; 1 = the chain) or 'auto'"),
    (["+tree.costs={8:1.0}"], "tree.costs={8: 1.0}: prices the planner's shapes: tree.n=auto only"),
    (["tree.n=auto", "tree.policy=prob"], "tree.policy='prob' with tree.n=auto: the planner credits every shape from "
     "each step's own tree"),
])
def test_a_bad_auto_setting_fails_naming_the_key(tmp_path, overrides, message):
    proc = run_app("sweep.py", [*TINY, *overrides, f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path, check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_the_replay_with_auto_lands_between_the_narrowest_and_widest_shapes(tmp_path):
    out = tmp_path / "replay"
    run_app("replay.py", [f"replay.recording={RECORDING}", "replay.n_max=32", "replay.ns=[1,32]",
                          "replay.widths=[9,64]", "tree.n=auto", "tree.width=64", "logger.wandb.mode=disabled",
                          "logger.progress=false", f"hydra.run.dir={out}"], cwd=tmp_path)
    summary = check_planned_run(out / "tree.n=auto,tree.width=64")
    table = load_results(out)
    tau = {(n, w): t for n, w, t in zip(table["tree.n"], table["tree.width"], table["tau"])}
    assert tau[(1, 9)] < summary["tau"] <= tau[(32, 64)]
    assert summary["plan_costs_ms"]["N=1,W=9"] == pytest.approx(3.08 + 0.0082 * 9, abs=1e-3)  # the documented model


def test_the_replay_plans_best_first_widths_and_names_them_as_the_server_does(tmp_path):
    out = tmp_path / "replay"
    run_app("replay.py", [f"replay.recording={RECORDING}", "replay.n_max=32", "replay.ns=[1]",
                          "replay.widths=[8,64]", "tree.policy=best-first", "tree.n=auto", "tree.width=64",
                          "logger.wandb.mode=disabled", "logger.progress=false", f"hydra.run.dir={out}"], cwd=tmp_path)
    summary = check_planned_run(out / "tree.n=auto,tree.width=64")
    widths = ["best-first,W=8", "best-first,W=9", "best-first,W=16", "best-first,W=32", "best-first,W=64"]
    assert list(summary["plan_tau"]) == widths and set(summary["plan_choices"]) <= set(widths)
    steps = metrics.read_steps(out / "tree.n=auto,tree.width=64" / "steps.parquet")
    assert (steps["plan_n"] == 1).all() and steps["plan_width"].isin([8, 9, 16, 32, 64]).all()
    table = load_results(out)
    tau = {(n, w): t for n, w, t in zip(table["tree.n"], table["tree.width"], table["tau"])}
    assert tau[(1, 8)] < summary["tau"] <= tau[(1, 64)]
