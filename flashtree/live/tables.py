"""Per-step tree statistics of live requests into the sweeps' table layout: steps.parquet (one row per verify step of
one request) and summary.json (tau per server and concurrency, through flashtree.metrics).

Each request record is {"server", "phase", "concurrency", "round", "request", "meta_info"}; flashtree's tree step
reports one row [candidates, distinct, tree size, accepted depth] per step in meta_info["flashtree"].
"""

from __future__ import annotations

import json
from pathlib import Path

STEP_FIELDS = ("candidates", "distinct", "tree_size", "accept_len")  # meta_info["flashtree"] rows, in this order
KEYS = ("server", "concurrency", "round", "request")


def request_record(server: str, phase: str, concurrency: int, rnd: int, request: int, response: dict) -> dict:
    return {"server": server, "phase": phase, "concurrency": concurrency, "round": rnd, "request": request,
            "meta_info": response.get("meta_info", {})}


def live_steps(requests: list[dict], config: dict):
    """-> pandas DataFrame [server, concurrency, round, request, step, candidates, distinct, tree_size, accept_len]."""
    import pandas as pd

    rows = []
    for r in requests:
        for step, row in enumerate(r["meta_info"].get("flashtree") or []):
            if isinstance(row, (list, tuple)) and len(row) == len(STEP_FIELDS):
                rows.append({**{k: r[k] for k in KEYS}, "step": step, **dict(zip(STEP_FIELDS, map(int, row)))})
    columns = [*KEYS, "step", *STEP_FIELDS]
    return pd.DataFrame(rows, columns=columns).astype({c: "int64" for c in columns if c != "server"})


def summary(steps, requests: list[dict], label: str) -> dict:
    """tau of the tree steps per (server, concurrency), and sglang's own per-request figures."""
    from flashtree.metrics import tau_of

    out: dict = {"label": label, "servers": {}}
    for (server, conc), df in steps.groupby(["server", "concurrency"]):
        out["servers"].setdefault(server, {})[str(conc)] = {
            "tree_steps": len(df), "tau": tau_of(df.assign(committed=df["accept_len"] + 1)),
            "mean_distinct": float(df["distinct"].mean()), "max_accept_len": int(df["accept_len"].max()),
        }
    for r in requests:
        m = r["meta_info"]
        entry = out["servers"].setdefault(r["server"], {}).setdefault(str(r["concurrency"]), {})
        entry["requests"] = entry.get("requests", 0) + 1
        entry["output_tokens"] = entry.get("output_tokens", 0) + int(m.get("completion_tokens") or 0)
        entry["verify_steps"] = entry.get("verify_steps", 0) + int(m.get("spec_verify_ct") or 0)
    for server in out["servers"].values():
        for entry in server.values():
            if entry.get("verify_steps"):
                entry["sglang_tau"] = entry["output_tokens"] / entry["verify_steps"]
    return out


def write_tables(requests: list[dict], config: dict, out_dir) -> tuple[Path, Path]:
    """steps.parquet and summary.json in out_dir -> their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = live_steps(requests, config)
    steps_path, summary_path = out_dir / "steps.parquet", out_dir / "summary.json"
    steps.to_parquet(steps_path, index=False)
    summary_path.write_text(json.dumps(summary(steps, requests, config.get("model", {}).get("label", "")), indent=1))
    return steps_path, summary_path
