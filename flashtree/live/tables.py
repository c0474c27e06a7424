"""Live requests into the sweeps' tables: one sweep-style run per (phase, server, concurrency) under
<out>/runs/ (steps.parquet, prompts.parquet, summary.json through `flashtree.results.live`), collected into
<out>/runs/summary.parquet, so `flashtree.results.collect`, the plots and the notebook read a live run as a sweep.

Each request record is {"server", "phase", "concurrency", "round", "request", "meta_info"}; a tree server reports one
row [candidates, distinct, tree size, accepted depth] per step in its meta_info. Tokens/s of a live run are the speed
phase's (whole levels, `speed_results.json`): a request's own wall time is not recorded, so the tables' per-request
tokens/s are NaN.
"""

from __future__ import annotations

import math
from pathlib import Path

from flashtree.results.collect import collect
from flashtree.results.live import write_live_run


def log_live_run(wandb: dict, run_dir: Path, summary: dict, group: str) -> None:
    """The run in W&B as a sweep run is logged (flashtree.results.wandb_log); a W&B failure costs only the W&B run."""
    from types import SimpleNamespace

    from flashtree.results.store import write_json_atomic
    from flashtree.results.wandb_log import log_run

    wcfg = SimpleNamespace(**{"project": "flashtree", "entity": None, "group": None, "tags": [], **wandb})
    try:
        info = log_run(wcfg, run_dir, summary, label=run_dir.name, group=wcfg.group or group)
    except Exception as err:  # noqa: BLE001 - the tables are written; W&B is a copy
        print(f"[live] W&B logging of {run_dir.name} failed ({type(err).__name__}: {err}); the tables are kept")
        return
    write_json_atomic(run_dir / "summary.json", {**summary, "wandb": info})


def request_record(server: str, phase: str, concurrency: int, rnd: int, request: int, response: dict) -> dict:
    return {"server": server, "phase": phase, "concurrency": concurrency, "round": rnd, "request": request,
            "meta_info": response.get("meta_info", {})}


def run_params(server: str, spec: dict, model: dict, phase: str, concurrency: int) -> dict:
    """The columns a live run's row shows: the sweep's tree keys (N = 1 and the window for DSPARK's chain) and the
    server's own settings."""
    block = int(model.get("draft_block_size") or 1)
    window = spec.get("window") or block + 1
    return {"target.name": model.get("name"), "drafter.name": str(model.get("algorithm") or "DSPARK").lower(),
            "dataset.name": "live",
            "tree.n": spec.get("tree_n") or 1, "tree.width": window, "tree.policy": spec.get("policy") or "vote",
            "live.phase": phase, "live.server": server, "live.concurrency": concurrency,
            "live.speculative": bool(spec.get("speculative", True)), "live.label": model.get("label", "")}


def write_tables(records: list[dict], config: dict, out_dir, presets: dict | None = None) -> tuple[Path, Path] | None:
    """The runs and the collected table -> (runs folder, summary.parquet); None when no phase recorded requests (only
    the features phase ran, say). `presets`: a server instance's name (its precision profile and preset, e.g.
    bf16-tree8) -> its preset in config["servers"] (tree8)."""
    if not records:
        return None
    runs = Path(out_dir) / "runs"
    servers, model = config.get("servers", {}), config.get("model", {})
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["phase"], r["server"], r["concurrency"]), []).append(r)
    for (phase, server, conc), group in sorted(groups.items()):
        spec = servers.get((presets or {}).get(server, server)) or {}
        depth = spec.get("depth") or (spec.get("window") or int(model.get("draft_block_size") or 1) + 1) - 1
        requests = [{"meta_info": r["meta_info"], "wall_time_s": math.nan} for r in group]
        run_dir = runs / f"{phase}-{server}-c{conc}"
        summary = write_live_run(run_dir, requests, run_params(server, spec, model, phase, conc), k=depth,
                                 label=f"{phase}-{server}-c{conc}")
        wandb = (config.get("logger") or {}).get("wandb") or {}
        if wandb.get("mode", "disabled") != "disabled":
            log_live_run(wandb, run_dir, summary, group=model.get("name", "live"))
    collect(runs)
    return runs, runs / "summary.parquet"
