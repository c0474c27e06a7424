"""W&B logging of one run: config at its start, per-step history (with the prompt index) as it runs, then summary,
per-depth acceptance (table + line plot) and its parquet tables as an artifact; and of a whole sweep, its collected
table (`log_sweep`).

The local files (summary.json, steps.parquet) are written first and stay the source of truth; W&B is a view of them.
Offline runs land in <run dir>/wandb/offline-run-*/ and upload later with `wandb sync <that folder>`.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

from flashtree.metrics import STAGES
from flashtree.results import store

SUMMARY_FILE = "flashtree-summary.json"

SCALARS = (
    "tau", "tau_ci_lo", "tau_ci_hi", "tau_oracle", "tokens_per_s", "tokens_per_s_ci_lo", "tokens_per_s_ci_hi",
    "distinct_candidates", "tree_size", "prompts", "steps", "new_tokens", "wall_time_s", "k",
    *(f"time_{s}_s" for s in STAGES),
)


HISTORY = ("accept_len", "committed", "tree_size", "distinct_candidates")  # per verify step, with prompt and step


class WandbRun:
    """One W&B run, opened when its job starts (so W&B's system monitor covers the run and its config is there from
    the start), fed each prompt's steps as they finish, closed with the summary, per-depth table and the run's
    parquet tables as an artifact."""

    def __init__(self, wcfg, run_dir: Path, *, label: str, group: str, config: dict) -> None:
        # wandb reads its mode from the environment in some code paths; make the config's choice the only one.
        os.environ["WANDB_MODE"] = wcfg.mode
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        self.mode, self.label = wcfg.mode, label
        self.run = wandb.init(
            mode=wcfg.mode,
            project=wcfg.project,
            entity=wcfg.entity,
            group=group,
            name=label,
            tags=list(wcfg.tags) or None,
            dir=str(run_dir),
            config=config,
            reinit="finish_previous",
        )

    def log_steps(self, rows) -> None:
        """Per-step history of one prompt (rows of the steps table: dicts or a DataFrame), keyed by its prompt and
        verify step, so W&B charts acceptance against the step and filters by prompt."""
        records = rows.to_dict("records") if hasattr(rows, "to_dict") else rows
        for r in records:
            self.run.log({"prompt": int(r["prompt"]), "verify_step": int(r["step"]), **{k: r[k] for k in HISTORY}})

    def finish(self, summary: dict, run_dir: Path) -> dict:
        """Summary, per-depth table and plot, the run's files as an artifact; returns where the run went."""
        import wandb

        run = self.run
        try:
            depth_rows = [[d + 1, _num(a), _num(r)]
                          for d, (a, r) in enumerate(zip(summary["accept_per_depth"], summary["reach_per_depth"]))]
            table = wandb.Table(columns=["depth", "acceptance", "reach"], data=depth_rows)
            run.log({
                "accept_per_depth": table,
                "accept_per_depth_plot": wandb.plot.line(table, "depth", "acceptance",
                                                         title=f"acceptance per depth (conditional): {self.label}"),
            })
            run.summary.update({k: _num(summary[k]) for k in SCALARS if k in summary})
            run.summary["accept_per_depth"] = [_num(a) for a in summary["accept_per_depth"]]
            run.summary["reach_per_depth"] = [_num(a) for a in summary["reach_per_depth"]]
            # The full summary (config, provenance, CIs) as a run file too: `wandb sync` uploads the files folder.
            store.write_json_atomic(Path(run.dir) / SUMMARY_FILE, summary)
            tables = wandb.Artifact(f"tables-{run.id}", type="results", description=f"flashtree run {self.label}")
            for name in (store.STEPS, store.PROMPTS, store.SUMMARY):
                if (Path(run_dir) / name).is_file():
                    tables.add_file(str(Path(run_dir) / name), name=name)
            run.log_artifact(tables)
            return {"mode": self.mode, "id": run.id, "dir": str(Path(run.dir).parent), "artifact": tables.name}
        finally:
            run.finish()


def log_run(wcfg, run_dir: Path, summary: dict, *, label: str, group: str, steps=None) -> dict:
    """Log a stored run as one W&B run after the fact (a resumed or replayed run): open, history, finish."""
    run = WandbRun(wcfg, run_dir, label=label, group=group, config=summary.get("params", {}))
    if steps is not None and len(steps):
        run.log_steps(steps)
    return run.finish(summary, run_dir)


def log_sweep(wcfg, sweep_dir: Path, table, *, group: str) -> dict:
    """One W&B run for a whole sweep (job type "sweep", in the runs' group): the collected table as a W&B table of its
    scalar columns, and summary.parquet as an artifact."""
    import pandas as pd

    from flashtree.results.collect import COLLECTED

    os.environ["WANDB_MODE"] = wcfg.mode
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    run = wandb.init(mode=wcfg.mode, project=wcfg.project, entity=wcfg.entity, group=group, name=f"{group} (sweep)",
                     job_type="sweep", tags=list(wcfg.tags) or None, dir=str(sweep_dir), reinit="finish_previous")
    try:
        scalar = [c for c in table.columns if pd.api.types.is_numeric_dtype(table[c])
                  or table[c].map(lambda v: v is None or isinstance(v, str)).all()]
        run.log({"runs": wandb.Table(dataframe=table[scalar].reset_index(drop=True))})
        artifact = wandb.Artifact(f"sweep-{run.id}", type="results", description=f"flashtree sweep {group}")
        artifact.add_file(str(Path(sweep_dir) / COLLECTED), name=COLLECTED)
        run.log_artifact(artifact)
        return {"mode": wcfg.mode, "id": run.id, "artifact": artifact.name}
    finally:
        run.finish()


def _num(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def offline_runs(run_dir: Path) -> list[Path]:
    """The offline W&B run folders under a flashtree run directory."""
    return sorted((Path(run_dir) / "wandb").glob("offline-run-*"))


def offline_records(wandb_run: Path):
    """The protobuf `Record`s of an offline W&B run's transaction log, in order (what `wandb sync` would upload).

    The .wandb file is a LevelDB-style log (7-byte file header, 32 KiB blocks of chunks with a 7-byte header:
    crc32, length, type full/first/middle/last) of protobuf `Record`s.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    (log,) = Path(wandb_run).glob("run-*.wandb")
    for blob in _log_records(log.read_bytes()):
        record = pb.Record()
        record.ParseFromString(blob)
        yield record


def offline_summary(wandb_run: Path) -> dict:
    """The run summary recorded in an offline W&B run: its summary records folded in order."""
    summary: dict = {}
    for record in offline_records(wandb_run):
        if record.WhichOneof("record_type") == "summary":
            for item in record.summary.update:
                key = item.key or "/".join(item.nested_key)
                summary[key] = json.loads(item.value_json)
    return summary


def _log_records(data: bytes, block: int = 32768):
    pos, parts = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is zero padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            parts = chunk
        elif kind == 3:
            parts += chunk
        elif kind == 4:
            yield parts + chunk
        elif kind == 0 and length == 0:
            return
