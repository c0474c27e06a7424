"""Shared by the experiment tests: run the Hydra apps in a subprocess as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "flashtree" / "configs"
# A tiny target and the oracle drafter: real engine runs with known, non-trivial acceptance, in seconds.
TINY = ["target=tiny-llama", "drafter=oracle", "dataset.limit=2", "engine.max_new_tokens=12", "logger.progress=false"]


def run_app(script: str, args: list[str], *, cwd: Path, check: bool = True, env: dict | None = None):
    full_env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",  # shared 2-core machines: one thread per process is fastest
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "PYTHONPATH": str(REPO),
        "HYDRA_FULL_ERROR": "0",
        **(env or {}),
    }
    proc = subprocess.run(
        [sys.executable, str(REPO / "experiments" / script), *args],
        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=600,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


class InterruptAfterFirstJob:
    """Hydra callback that stops a sweep after its first job, as Ctrl-C between two jobs would."""

    def on_job_end(self, config, job_return, **kwargs):
        raise KeyboardInterrupt

    def __getattr__(self, name):  # every other hook: do nothing
        return lambda *args, **kwargs: None
