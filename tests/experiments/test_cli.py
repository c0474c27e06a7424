"""The `flashtree` command of an installed wheel: its configs ship inside it, so a user without a checkout sweeps;
`--help` describes the groups and keys; the job log file holds the job's log; progress labels are short."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import pytest

from flashtree import cli
from flashtree.experiments import progress
from flashtree.experiments.config import RunConfig

from .helpers import REPO, TINY


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """flashtree's wheel built from this checkout and installed (no dependencies) into a folder of its own."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(REPO / "flashtree", src / "flashtree", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", str(src), "-w", str(tmp / "dist")], check=True, timeout=600)
    (wheel,) = (tmp / "dist").glob("flashtree-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(tmp / "site"), str(wheel)], check=True, timeout=600)
    return tmp / "site"


def flashtree(site, args, cwd):
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled",
           "HYDRA_FULL_ERROR": "0"}
    # the console script pip wrote, run by this interpreter (its shebang may name another)
    return subprocess.run([sys.executable, str(site / "bin" / "flashtree"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_an_installed_wheel_sweeps_from_its_own_configs_and_logs_the_job(installed, tmp_path):
    proc = flashtree(installed, ["sweep", *TINY, "logger=disabled", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["run_dir"].startswith(str(tmp_path))
    assert str(installed) in subprocess.run(
        [sys.executable, "-c", "import flashtree.apps as a; print(a.CONFIGS)"], env={**os.environ, "PYTHONPATH": str(installed)},
        cwd=tmp_path, capture_output=True, text=True).stdout  # the configs came from the wheel, not the checkout
    log = (tmp_path / "run" / "sweep.log").read_text()  # Hydra's job log file: the job logs through `logging`
    assert "tau=" in log and "flashtree.experiments.run" in log


def test_sweep_help_describes_every_group_and_key_without_schema_options(installed, tmp_path):
    proc = flashtree(installed, ["sweep", "--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "  tree: auto, chain, default" in text and "  sweeper: grid, optuna" in text
    assert "schema" not in text.split("== Keys")[0]  # the structured schemas are no option of any group
    keys = [f"{g.name}.{f.name}" for g in dataclasses.fields(RunConfig) if dataclasses.is_dataclass(g.type)
            for f in dataclasses.fields(g.type)]
    for key in ("tree.n", "tree.width", "engine.threads", "objective.metric", "logger.wandb.mode", "name", "seed"):
        assert f"  {key} = " in text, key
    assert "W: verify tokens per step" in text and "== Composed config" in text
    assert all(f"  {k} = " in text for k in keys if not k.startswith("logger."))
    replay = flashtree(installed, ["replay", "--help"], tmp_path).stdout
    assert "  replay.widths = [4, 8, 16, 32]" in replay



@pytest.mark.parametrize("app, script", [("train-drafter", "train_drafter.py"), ("live", "live.py")])
def test_train_and_live_help_describe_their_keys_from_the_schemas(installed, tmp_path, app, script):
    """The same help as sweep's, from the installed command and from the checkout's script."""
    proc = flashtree(installed, [app, "--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    script_help = subprocess.run([sys.executable, str(REPO / "experiments" / script), "--help"], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=600)
    assert script_help.returncode == 0, script_help.stderr
    assert script_help.stdout.split("== Composed")[0] == text.split("== Composed")[0]
    assert text.startswith(f"flashtree {app}: ") and "powered by Hydra" not in text and "== Composed config" in text
    if app == "train-drafter":
        assert "--config-name NAME; each is flashtree/configs/train/NAME.yaml) ==\n  default, tiny\n" in text
        assert "  optim.lr = 0.0006" in text and "  model.block_size = 8" in text
        assert "steps between resumable checkpoints" in text  # a trailing comment
        assert "the cosine schedule ends here" in text.split("optim.time_limit_s = null")[1]  # a comment above
    else:
        assert "  preset: auto-qwen3-8b-simtab, auto-smollm2, best, " in text
        assert "  servers: auto, baseline, dflash, flashinfer, paged, simulated, wide, window" in text
        assert "  servers.<name>.tree_n = null" in text and "FLASHTREE_TREE_N" in text  # the catalog's values
        assert "  phases.identity.precision = fp32" in text and "  model.dummy.architecture = ???" in text
        assert "  logger.wandb.mode = disabled" in text  # LiveConfig's own logger default, not the sweep's

def test_the_command_lists_its_subcommands(capsys):
    cli.main([])
    out = capsys.readouterr().out
    for name in ("sweep", "replay", "train-drafter", "live", "plots", "collect", "accept-table"):
        assert f"flashtree {name}" in out
    with pytest.raises(SystemExit, match="unknown command 'swep'"):
        cli.main(["swep"])


def test_progress_labels_are_short_and_the_eta_covers_the_whole_sweep(monkeypatch):
    jobs = [["target=tiny-llama", f"tree.n={n}", f"tree.width={w}"] for n in (1, 4) for w in (4, 8)]
    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    progress.start(len(jobs), jobs)
    label = "dataset.limit=20,dataset.split=second_half,dataset=gsm8k,target=tiny-llama,tree.n=4,tree.width=8"
    assert progress.short_label(label).startswith("[1/4] limit=20 split=second_half dataset=")
    assert len(progress.short_label(label)) <= 6 + progress.LABEL_CHARS
    assert progress.short_label("target=tiny-llama,tree.n=4,tree.width=8") == "[1/4] n=4 width=8"
    clock[0] = 110.0
    progress.job_done()  # one job of four in 10 s, half of the second in 5 s more
    clock[0] = 115.0
    assert progress.sweep_eta(0.5) == "0:25"
    progress.start(None)
    assert progress.sweep_eta(0.5) is None
