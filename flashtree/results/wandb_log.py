"""W&B logging of one finished run: config, summary, per-depth acceptance (table + line plot), per-step history.

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


def log_run(wcfg, run_dir: Path, summary: dict, *, label: str, group: str, steps=None) -> dict:
    """Log `summary` (and the steps, if given) as one W&B run; returns where it went."""
    # wandb reads its mode from the environment in some code paths; make the config's choice the only one.
    os.environ["WANDB_MODE"] = wcfg.mode
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    run = wandb.init(
        mode=wcfg.mode,
        project=wcfg.project,
        entity=wcfg.entity,
        group=group,
        name=label,
        tags=list(wcfg.tags) or None,
        dir=str(run_dir),
        config=summary.get("params", {}),
        reinit="finish_previous",
    )
    try:
        if steps is not None and len(steps):
            # Per-step history: accepted length and tree size, so W&B can chart them against the step.
            for row in steps[["accept_len", "committed", "tree_size", "distinct_candidates"]].itertuples(index=False):
                run.log(row._asdict())
        depth_rows = [
            [d + 1, _num(a), _num(r)] for d, (a, r) in enumerate(zip(summary["accept_per_depth"], summary["reach_per_depth"]))
        ]
        table = wandb.Table(columns=["depth", "acceptance", "reach"], data=depth_rows)
        run.log({
            "accept_per_depth": table,
            "accept_per_depth_plot": wandb.plot.line(table, "depth", "acceptance", title=f"acceptance per depth: {label}"),
        })
        run.summary.update({k: _num(summary[k]) for k in SCALARS if k in summary})
        run.summary["accept_per_depth"] = [_num(a) for a in summary["accept_per_depth"]]
        run.summary["reach_per_depth"] = [_num(a) for a in summary["reach_per_depth"]]
        # The full summary (config, versions, CIs) as a run file too: `wandb sync` uploads the files folder.
        store.write_json_atomic(Path(run.dir) / SUMMARY_FILE, summary)
        info = {"mode": wcfg.mode, "id": run.id, "dir": str(Path(run.dir).parent)}
    finally:
        run.finish()
    return info


def _num(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def offline_runs(run_dir: Path) -> list[Path]:
    """The offline W&B run folders under a flashtree run directory."""
    return sorted((Path(run_dir) / "wandb").glob("offline-run-*"))


def offline_summary(wandb_run: Path) -> dict:
    """The run summary recorded in an offline W&B run's transaction log (what `wandb sync` would upload).

    The .wandb file is a LevelDB-style log (7-byte file header, 32 KiB blocks of chunks with a 7-byte header:
    crc32, length, type full/first/middle/last) of protobuf `Record`s; summary records are folded in order.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    (log,) = Path(wandb_run).glob("run-*.wandb")
    summary: dict = {}
    for blob in _log_records(log.read_bytes()):
        record = pb.Record()
        record.ParseFromString(blob)
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
