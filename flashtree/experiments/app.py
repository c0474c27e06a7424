"""The job function of `experiments/sweep.py`: one Hydra job = one configuration."""

from __future__ import annotations

import dataclasses
import logging
import sys
from pathlib import Path

from omegaconf import DictConfig

from flashtree.experiments.config import ConfigError, to_run_config
from flashtree.results import store


log = logging.getLogger(__name__)  # Hydra's job logging: the console and <output dir>/<job>.log

def params_of(cfg) -> dict:
    """Flat `group.key` parameters of a run (what the collected table and W&B config show), logger excluded."""
    d = dataclasses.asdict(cfg)
    d.pop("logger")
    return store.flatten(d)


def run_job(cfg: DictConfig) -> float:
    """Validate, run (or resume) one configuration in Hydra's output dir; return the sweep objective."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from flashtree.experiments.run import objective, run_configuration
    from flashtree.results.collect import collect
    from flashtree.results.lock import holding

    hc = HydraConfig.get()
    try:
        rc = to_run_config(cfg, hc.overrides.task)
    except ConfigError as exc:
        print(f"flashtree: bad config: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    label = hc.job.override_dirname or "default"
    if rc.objective.max_budget is not None and rc.tree.width > rc.objective.max_budget:
        # Over the verify budget: infeasible whatever it measures, so do not spend the compute.
        log.info(f"[flashtree] {label}: tree.width={rc.tree.width} > objective.max_budget={rc.objective.max_budget}, "
              "not run (objective 0)")
        return 0.0
    out = Path(hc.runtime.output_dir)
    if hc.mode == RunMode.MULTIRUN:  # the sweep (SweepCallback) holds the sweep directory's lock
        summary = run_configuration(rc, out, label=label, params=params_of(rc))
        # Part of the job itself, so the table is current even if the sweep is killed right after this job.
        collect(Path(hc.sweep.dir))
    else:
        with holding(out):
            summary = run_configuration(rc, out, label=label, params=params_of(rc))
    return objective(summary, rc)
