"""The run store: what a run directory holds, and how it is written so an interruption never leaves a half-finished
run marked done. Sweeps, replay and live runs all write through `write_run`, so `collect` reads them alike.

    <run dir>/steps.parquet    one row per verify step (flashtree.metrics.STEP_COLUMNS, schema version in metadata)
    <run dir>/prompts.parquet  one row per prompt (tokens, steps, wall time)
    <run dir>/summary.json     metrics + config + provenance (versions, machine, warm-up, git); written last, atomically. `resume` trusts a run whose
                               summary has status "complete" and a matching config hash, and whose steps.parquet
                               is readable, of this schema version and as long as the summary says
    <run dir>/wandb/           the W&B run (offline runs: offline-run-*/, `wandb sync` uploads them)
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from flashtree import metrics
from flashtree.files import DamagedFile, load_json, set_aside
from flashtree.results import provenance

SUMMARY = "summary.json"
STEPS = "steps.parquet"
PROMPTS = "prompts.parquet"


def write_json_atomic(path: Path, data: dict) -> None:
    """Write to a temp file in the same folder, then rename: readers see the old file or the new one, never half."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(_jsonable(data), f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


def _jsonable(x: Any) -> Any:
    # NaN is not JSON; null reads back as None (pandas turns it into NaN again).
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def read_summary(run_dir: Path) -> dict | None:
    """The run's summary, None when it has none; DamagedFile (naming it) when it cannot be read."""
    path = Path(run_dir) / SUMMARY
    if not path.is_file():
        return None
    return load_json(path, "the run summary")


def config_hash(measured: dict) -> str:
    """Fingerprint of everything that changes what a run measures (the caller leaves out what does not)."""
    blob = json.dumps(measured, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def finished(run_dir: Path, digest: str) -> dict | None:
    """The summary of a finished run of exactly this configuration in `run_dir`, else None. A damaged summary is set
    aside and a run whose steps do not back its summary is reported: either way the run is redone."""
    run_dir = Path(run_dir)
    try:
        summary = read_summary(run_dir)
    except DamagedFile as err:
        set_aside(err, "the run is redone")
        return None
    if not summary or summary.get("status") != "complete" or summary.get("config_hash") != digest:
        return None
    problem = steps_problem(run_dir, summary)
    if problem:
        print(f"flashtree: {run_dir / SUMMARY} says finished, but {problem}; the run is redone")
        return None
    return summary


def steps_problem(run_dir: Path, summary: dict) -> str | None:
    """Why `run_dir`'s steps.parquet does not back `summary` (missing, damaged, another schema, other length)."""
    import pyarrow.parquet as pq

    path = Path(run_dir) / STEPS
    version = summary.get("steps_schema_version")
    if version != metrics.STEPS_SCHEMA_VERSION:
        return f"it was written with steps schema version {version} (this flashtree writes {metrics.STEPS_SCHEMA_VERSION})"
    if not path.is_file():
        return f"{path} is missing"
    try:
        meta = pq.read_metadata(path)
    except Exception as err:  # noqa: BLE001 - pyarrow reports truncation and garbage alike as ArrowInvalid/OSError
        return f"{path} is damaged ({type(err).__name__}: {err})"
    written = int((meta.metadata or {}).get(metrics.SCHEMA_KEY, b"0"))
    if written != metrics.STEPS_SCHEMA_VERSION:
        return f"{path} has steps schema version {written} (this flashtree writes {metrics.STEPS_SCHEMA_VERSION})"
    if "steps" in summary and meta.num_rows != summary["steps"]:
        return f"{path} holds {meta.num_rows} steps, the summary {summary['steps']}"
    return None


def write_run(run_dir: Path, steps, prompts, head: dict, *, params: dict, config: dict) -> dict:
    """Write a finished run: steps.parquet, prompts.parquet, then summary.json (`head`: label, config hash and the
    metrics of `flashtree.metrics.summarize`; `params`: the flat `group.key` parameters the collected table shows;
    `config`: the whole configuration, for provenance). Returns the summary."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics.write_steps(steps, run_dir / STEPS)
    prompts.to_parquet(run_dir / PROMPTS, index=False)
    summary = {
        "status": "complete",
        **head,
        "steps_schema_version": metrics.STEPS_SCHEMA_VERSION,
        "params": params,
        "config": config,
        "versions": provenance.versions(),
        # the caller's machine record (taken before its run, so the load average is the run's) or one taken now
        "machine": head.get("machine") or provenance.machine(),
        "git": provenance.git_commit(),
        "run_dir": str(run_dir.resolve()),
    }
    write_json_atomic(run_dir / SUMMARY, summary)
    return summary


def flatten(d: dict, prefix: str = "") -> dict:
    """{'tree': {'n': 4}} -> {'tree.n': 4}; lists stay values."""
    out = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out
