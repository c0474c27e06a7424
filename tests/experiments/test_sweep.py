"""A real 2 x 2 multirun on a tiny model: collected table, τ, W&B offline run; resume after an interruption."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from flashtree.results.wandb_log import SUMMARY_FILE, offline_records, offline_runs, offline_summary

from .helpers import CONFIGS, TINY, run_app


def direct_tau(n: int, width: int) -> float:
    """τ of the same configuration computed straight from the engine, outside the experiment layer."""
    from flashtree.datasets import encode_prompts, load_prompts
    from flashtree.drafters import load_drafter
    from flashtree.engine import tree_generate
    from flashtree.models import load_target

    model, tok = load_target("tiny-llama")
    stop = [tok.eos_token_id]
    committed = steps = 0
    for ids in encode_prompts(tok, load_prompts("builtin", limit=2)):
        x = torch.tensor([ids])
        ref = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=28, do_sample=False,
                             eos_token_id=stop, pad_token_id=stop[0])
        drafter = load_drafter("oracle", model, sequences=[ref[0].tolist()])
        res = tree_generate(model, drafter, x, n=n, width=width, max_new_tokens=12, stop_token_ids=stop)
        committed += sum(s.accept_len + 1 for s in res.steps)
        steps += len(res.steps)
    return committed / steps


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    sweep = tmp_path_factory.mktemp("grid") / "sweep"
    proc = run_app("sweep.py", ["--multirun", *TINY, "tree.n=1,4", "tree.width=4,8", f"hydra.sweep.dir={sweep}"],
                   cwd=sweep.parent)
    return sweep, proc


def test_grid_collects_one_row_per_configuration_with_the_engines_tau(grid):
    sweep, proc = grid
    table = pd.read_parquet(sweep / "summary.parquet")
    assert len(table) == 4
    assert sorted(zip(table["tree.n"], table["tree.width"])) == [(1, 4), (1, 8), (4, 4), (4, 8)]
    assert {"dataset", "policy", "tau", "accept_per_depth", "tokens_per_s"} <= set(table.columns)
    assert (table["dataset"] == "builtin").all()
    assert (table["policy"] == "vote").all() and (table["tree.policy"] == "vote").all()
    taus = {}
    for _, row in table.iterrows():
        n, w = int(row["tree.n"]), int(row["tree.width"])
        taus[n, w] = row["tau"]
        assert row["tau"] == pytest.approx(direct_tau(n, w), abs=1e-12)
        steps = pd.read_parquet(f"{row['run_dir']}/steps.parquet")
        assert row["tau"] == pytest.approx(steps["committed"].mean())
        assert (steps["policy"] == "vote").all()
        # τ = 1 + Σ_d P(accept_len >= d): the per-depth figures add up.
        assert row["tau"] == pytest.approx(1 + sum(row["reach_per_depth"]))
    assert max(taus.values()) > 1.5  # the oracle gives real acceptance, so the check above is not vacuous
    assert "tree.n" in proc.stdout and "4 runs" in proc.stdout  # the printed table


def test_explicit_vote_policy_gives_the_default_runs_rows(grid, tmp_path):
    sweep, _ = grid
    run = tmp_path / "run"
    run_app("sweep.py", [*TINY, "logger.wandb.mode=disabled", "tree.n=4", "tree.width=8", "tree.policy=vote",
                         f"hydra.run.dir={run}"], cwd=tmp_path)
    (default_dir,) = sweep.glob("*tree.n=4,tree.width=8")
    timing = [c for c in pd.read_parquet(run / "steps.parquet") if c.startswith("time_")]
    explicit = pd.read_parquet(run / "steps.parquet").drop(columns=timing)
    pd.testing.assert_frame_equal(explicit, pd.read_parquet(default_dir / "steps.parquet").drop(columns=timing))
    assert (explicit["policy"] == "vote").all() and len(explicit)
    local, default = (json.loads((d / "summary.json").read_text()) for d in (run, default_dir))
    assert local["params"]["tree.policy"] == "vote"
    assert (local["tau"], local["accept_per_depth"]) == (default["tau"], default["accept_per_depth"])


def test_wandb_offline_run_holds_the_summary(grid):
    sweep, _ = grid
    (run_dir,) = sweep.glob("*tree.n=4,tree.width=8")
    local = json.loads((run_dir / "summary.json").read_text())
    (wandb_run,) = offline_runs(run_dir)
    logged = offline_summary(wandb_run)  # decoded from the run's .wandb log, as `wandb sync` reads it
    assert logged["tau"] == pytest.approx(local["tau"])
    assert logged["accept_per_depth"] == pytest.approx(local["accept_per_depth"])
    assert json.loads((wandb_run / "files" / SUMMARY_FILE).read_text())["tau"] == pytest.approx(local["tau"])
    assert local["wandb"]["mode"] == "offline"


def test_wandb_run_opens_at_job_start_logs_each_step_by_prompt_and_the_tables_as_an_artifact(grid):
    sweep, _ = grid
    (run_dir,) = sweep.glob("*tree.n=4,tree.width=8")
    local = json.loads((run_dir / "summary.json").read_text())
    (wandb_run,) = offline_runs(run_dir)
    records = [(r.WhichOneof("record_type"), r) for r in offline_records(wandb_run)]
    (run,) = [r.run for kind, r in records if kind == "run"]
    assert run.start_time.ToMicroseconds() / 1e6 <= local["started_at"]  # opened before the first prompt ran
    assert json.loads(next(r.config for kind, r in records if kind == "config").update[0].value_json)
    history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
               for kind, r in records if kind == "history"]
    per_step = [h for h in history if "verify_step" in h]
    steps = pd.read_parquet(run_dir / "steps.parquet")
    assert [(h["prompt"], h["verify_step"], h["accept_len"]) for h in per_step] == \
        list(zip(steps["prompt"], steps["step"], steps["accept_len"]))
    assert steps["prompt"].nunique() == 2
    manifests = [{e.path for e in r.artifact.manifest.contents} for kind, r in records if kind == "artifact"]
    assert {"steps.parquet", "prompts.parquet", "summary.json"} in manifests
    assert local["wandb"]["artifact"].startswith("tables-")


def test_interrupted_sweep_keeps_finished_runs_and_resume_skips_them(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["--multirun", *TINY, "logger.wandb.mode=disabled", "tree.n=1,2", "tree.width=4", f"hydra.sweep.dir={sweep}"]
    stop = "+hydra.callbacks.stop._target_=tests.experiments.helpers.InterruptAfterFirstJob"
    first = run_app("sweep.py", [*args, stop], cwd=tmp_path, check=False)
    assert first.returncode != 0
    (done,) = sweep.glob("*tree.n=1,tree.width=4")  # run dirs are named by every override
    assert (done / "summary.json").is_file() and (done / "steps.parquet").is_file()
    assert not list(sweep.glob("*tree.n=2,tree.width=4/summary.json"))
    assert len(pd.read_parquet(sweep / "summary.parquet")) == 1  # collected after every job
    stamp = (done / "summary.json").stat().st_mtime_ns

    again = run_app("sweep.py", args, cwd=tmp_path)
    assert "tree.n=1,tree.width=4: finished earlier, skipped" in again.stdout
    assert "tree.n=2,tree.width=4: finished earlier" not in again.stdout
    assert (done / "summary.json").stat().st_mtime_ns == stamp
    table = pd.read_parquet(sweep / "summary.parquet")
    assert sorted(table["tree.n"]) == [1, 2]


@pytest.mark.parametrize(
    "override, key",
    [("tree.width=1", "tree.width"), ("tree.n=0", "tree.n"), ("dataset=nope", "dataset"),
     ("dataset.name=nope", "dataset.name"), ("logger.wandb.mode=sometimes", "logger.wandb.mode"),
     ("tree.policy=nope", "tree.policy='nope': unknown tree policy 'nope'; registered: vote")],
)
def test_bad_override_fails_naming_the_key(tmp_path, override, key):
    proc = run_app("sweep.py", [*TINY, override, f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path, check=False)
    assert proc.returncode != 0
    message = proc.stdout + proc.stderr
    assert key in message, message
    assert not (tmp_path / "run" / "summary.json").exists()


def test_bad_value_in_a_grid_fails_before_any_job(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_app("sweep.py", ["--multirun", *TINY, "tree.width=4,1", f"hydra.sweep.dir={sweep}"], cwd=tmp_path,
                   check=False)
    assert proc.returncode != 0
    assert "tree.width=1" in proc.stderr
    assert not list(sweep.rglob("summary.json"))


def test_unknown_policy_in_a_grid_fails_before_any_job_listing_the_registered_names(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_app("sweep.py", ["--multirun", *TINY, "tree.policy=vote,nope", f"hydra.sweep.dir={sweep}"],
                   cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert "unknown tree policy 'nope'; registered: vote" in proc.stderr
    assert not list(sweep.rglob("summary.json"))


@pytest.mark.parametrize("grid, message", [
    ("target.name=tiny-llama,nope", "target.name='nope': unknown target 'nope'"),
    ("target.name=tiny-llama,/no/such/folder", "target.name='/no/such/folder': target '/no/such/folder': no such local"),
    ("drafter.name=oracle,nope", "drafter.name='nope': unknown drafter; use one of default, prompt-lookup"),
    ("dataset.split=null,third_half", "dataset.split='third_half': use one of first_half, second_half"),
])
def test_a_bad_target_drafter_or_split_in_a_grid_fails_before_any_job(tmp_path, grid, message):
    sweep = tmp_path / "sweep"
    dataset = ["dataset=gsm8k"] if "split" in grid else []
    proc = run_app("sweep.py", ["--multirun", *TINY, *dataset, grid, f"hydra.sweep.dir={sweep}"], cwd=tmp_path,
                   check=False)
    assert proc.returncode == 2
    assert message in proc.stderr, proc.stderr
    assert not list(sweep.rglob("summary.json"))


def test_every_run_records_its_machine_versions_and_warmup(grid):
    sweep, _ = grid
    (run_dir,) = sweep.glob("*tree.n=4,tree.width=8")
    summary = json.loads((run_dir / "summary.json").read_text())
    machine = summary["machine"]
    assert machine["threads"] == 1  # the test runs the app under OMP_NUM_THREADS=1
    assert machine["cpu"] and machine["cpu_count"] >= 1 and machine["gpu"] is None
    assert len(machine["load_average"]) == 3 and len(machine["load_average_after"]) == 3
    assert {"python", "flashtree", "torch", "triton"} <= set(summary["versions"])
    assert summary["warmup"]["generations"] == 1 and summary["warmup"]["time_s"] > 0
    assert (pd.read_parquet(sweep / "summary.parquet")["threads"] == 1).all()


def test_engine_threads_fixes_the_thread_count_and_no_warmup_is_recorded(tmp_path):
    run = tmp_path / "run"
    run_app("sweep.py", [*TINY, "logger.wandb.mode=disabled", "engine.threads=2", "engine.warmup=false",
                         f"hydra.run.dir={run}"], cwd=tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["machine"]["threads"] == 2 and summary["config"]["engine"]["threads"] == 2
    assert summary["warmup"] == {"generations": 0}


def test_the_optuna_preset_maximises_tau_not_raw_tokens_per_s():
    from hydra import compose, initialize_config_dir

    from flashtree.experiments.config import register, to_run_config
    from flashtree.experiments.run import objective

    register()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["sweeper=optuna", *TINY])
    rc = to_run_config(cfg)
    assert rc.objective.metric == "tau"
    assert objective({"tau": 2.5, "tokens_per_s": 99.0}, rc) == 2.5


def test_the_sweep_logs_its_collected_table_as_one_wandb_run(grid):
    """Besides one run per configuration, the sweep's own W&B run (job type "sweep") holds the collected table: a W&B
    table of its scalar columns and summary.parquet as an artifact."""
    sweep, _ = grid
    (wandb_run,) = offline_runs(sweep)  # under the sweep directory itself, not a job's
    records = [(r.WhichOneof("record_type"), r) for r in offline_records(wandb_run)]
    (run,) = [r.run for kind, r in records if kind == "run"]
    assert run.job_type == "sweep" and run.display_name.endswith("(sweep)")
    manifests = [{e.path for e in r.artifact.manifest.contents} for kind, r in records if kind == "artifact"]
    assert any("summary.parquet" in m for m in manifests)
    history = [{i.key or "/".join(i.nested_key) for i in r.history.item} for kind, r in records if kind == "history"]
    assert any("runs/_type" in keys for keys in history)  # the table, logged as W&B's table-file reference
