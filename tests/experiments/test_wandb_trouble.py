"""W&B trouble never loses or blocks local results: every job finishes, summary.parquet is written, and the W&B
problem is one warning."""

from __future__ import annotations

import pandas as pd

from .helpers import REPO, TINY, run_app


def test_wandb_not_importable_is_one_warning_and_the_sweep_finishes(tmp_path):
    fake = tmp_path / "site" / "wandb"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('wandb is broken here')\n")
    sweep = tmp_path / "sweep"
    proc = run_app("sweep.py", ["--multirun", *TINY, "tree.n=1,4", f"hydra.sweep.dir={sweep}"], cwd=tmp_path,
                   env={"PYTHONPATH": f"{fake.parent}:{REPO}"})
    assert proc.stderr.count("W&B logging failed") == 1, proc.stderr
    assert "wandb is broken here" in proc.stderr
    assert len(pd.read_parquet(sweep / "summary.parquet")) == 2


def test_online_mode_without_a_key_keeps_the_run(tmp_path):
    run = tmp_path / "run"
    proc = run_app("sweep.py", [*TINY, "logger.wandb.mode=online", f"hydra.run.dir={run}"], cwd=tmp_path,
                   env={"HOME": str(tmp_path), "WANDB_API_KEY": "", "WANDB_MODE": "online"})
    assert "W&B logging failed (logger.wandb.mode='online'" in proc.stderr, proc.stderr
    assert (run / "summary.json").is_file() and (run / "steps.parquet").is_file()
