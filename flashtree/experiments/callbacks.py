"""Hydra callback of the sweep app: check a whole grid before any job runs, keep `summary.parquet` current after
every job (the job itself collects, so an interrupted sweep still has its table), hold the sweep directory's lock
(flashtree.results.lock) and print the collected table at the end (and log it to W&B as the sweep's own run)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class SweepCallback(Callback):
    def __init__(self) -> None:
        self.total: int | None = None
        self.done = 0
        self.lock: Path | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from flashtree.results.lock import acquire_or_exit

        from flashtree.experiments import progress

        self.lock = acquire_or_exit(config.hydra.sweep.dir)  # one sweep at a time per directory
        jobs = grid_jobs(config)
        if jobs is None:  # another sweeper (Optuna): its trials are checked one by one as they start
            trials = config.hydra.sweeper.get("n_trials")
            self.total = int(trials) if isinstance(trials, int) else None
            progress.start(self.total)
            return
        self.total = len(jobs)
        check_jobs(jobs, config.hydra.job.config_name)
        progress.start(self.total, jobs)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if HydraConfig.get().mode != RunMode.MULTIRUN:
            return
        from flashtree.experiments import progress

        self.done += 1
        progress.job_done()
        total = f"/{self.total}" if self.total else ""
        print(f"[flashtree] sweep: {self.done}{total} jobs ended here", flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from flashtree.results.collect import COLLECTED, collect, format_table
        from flashtree.results.lock import release

        sweep_dir = Path(config.hydra.sweep.dir)
        df = collect(sweep_dir)
        print(f"\n{format_table(df)}\n\n[flashtree] {len(df)} runs -> {sweep_dir / COLLECTED}", flush=True)
        log_sweep_table(config, sweep_dir, df)
        if self.lock is not None:
            release(self.lock)


def log_sweep_table(config: DictConfig, sweep_dir: Path, df) -> None:
    """The collected table as one W&B run of the sweep; W&B trouble is one warning (the local table stands)."""
    wcfg = config.get("logger", {}).get("wandb")
    if wcfg is None or wcfg.mode == "disabled" or not len(df):
        return
    from flashtree.results.wandb_log import log_sweep

    try:
        log_sweep(wcfg, sweep_dir, df, group=wcfg.group or config.name)
    except Exception as err:  # noqa: BLE001 - import errors, missing API key, network: the local table stands
        print(f"flashtree: warning: W&B logging of the sweep's table failed ({type(err).__name__}: {err}); "
              f"{sweep_dir / 'summary.parquet'} is complete", file=sys.stderr)


def grid_jobs(config: DictConfig) -> list[list[str]] | None:
    """Every job's overrides of a basic-sweeper multirun, or None under another sweeper."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not str(config.hydra.sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return None
    parser = OverridesParser.create()
    overrides = parser.parse_overrides(list(config.hydra.overrides.task))
    # The sweeper's own `params` (a config-defined grid) join the command line's overrides, as BasicSweeper does.
    params = config.hydra.sweeper.get("params") or {}
    overrides += parser.parse_overrides([f"{k}={v}" for k, v in params.items()])
    batches = BasicSweeper.split_arguments(overrides, max_batch_size=None)
    return [job for batch in batches for job in batch]


def check_jobs(jobs: list[list[str]], config_name: str) -> None:
    """Compose and validate every job's config; exit with the first bad one's message before any job runs."""
    from hydra import compose

    from flashtree.experiments.config import ConfigError, to_run_config

    for job in jobs:
        try:
            to_run_config(compose(config_name=config_name, overrides=job), job)
        except ConfigError as exc:
            print(f"flashtree: bad config ({' '.join(job)}): {exc}", file=sys.stderr)
            raise SystemExit(2) from None
