"""Live sglang runs in the sweep's tables: per-request tree statistics -> steps.parquet, prompts.parquet, summary.

A tree server (flashtree's sglang plugin) returns with every request one statistics row per verify step,
`[candidates, distinct candidates, tree size, accepted depth, ...]` (LIVE_ROW), under the key `flashtree` of
`meta_info["customized_info"]` (or of `meta_info` itself, where the release flattens customized_info into it), padded
with None entries up to the request's token count; sglang adds `completion_tokens`, `prompt_tokens` and
`spec_verify_ct` (its verify steps, the tree's and any chain fallback's).

`requests`: one dict per request, sglang's /generate response with the client's wall time of that request added:
    {"meta_info": {"customized_info": {"flashtree": [[8, 5, 15, 3], None, ...]}, "completion_tokens": 128,
                   "prompt_tokens": 40, "spec_verify_ct": 37, ...},
     "wall_time_s": 0.61}
Each request is one unit of the table (column `prompt` = its index in the list), as one prompt is in a sweep.

`config`: the run's parameters, flat (`{"tree.n": 8, "tree.width": 16}`), nested (`{"tree": {"n": 8}}`) or a config
dataclass (nested as `dataclasses.asdict` does), with the keys a sweep's table shows: `dataset.name`, `target.name`,
`drafter.name`, `tree.n`, `tree.width`, `tree.policy` (default: the trie vote) and whatever else the live app varies
(concurrency, toggles).

What the server does not report is left unknown in the steps table: `oracle_len` NaN (so `tau_oracle` is NaN),
`accepted_path` and `accepted_depth_votes` None, every `time_<stage>_s` NaN (the server's stage timer logs per step,
not per request). `position` is derived: prompt tokens + 1 (the token prefill emits) + tokens committed by the
request's earlier steps (NaN where sglang reports no prompt_tokens). The summary is the sweep's
(`flashtree.metrics.summarize`): τ over the tree steps the rows report, and tokens/s per request (Σ tokens / Σ request
wall time; at concurrency c the server's aggregate is about c times it), plus `verify_steps` (Σ spec_verify_ct) and
`tau_server` (Σ completion_tokens / Σ spec_verify_ct, sglang's own τ, chain fallback steps included).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd

from flashtree import metrics
from flashtree.patches.decode import STATS_KEY
from flashtree.planner.shapes import AUTO, CHAIN, Shape
from flashtree.results import store
from flashtree.tree import DEFAULT_POLICY

# one statistics row of the server; rows of older servers stop after accept_len
LIVE_ROW = ("candidates", "distinct_candidates", "tree_size", "accept_len", "verify_width", "simulated", "plan_n",
            "plan_width")
STEP_FIELDS = LIVE_ROW[:4]  # those the steps table keeps, with the planner's shape (0, 0 in the row: a fixed one)


def _stats_rows(request: dict) -> list[list[int]]:
    """The request's statistics rows, padding dropped."""
    meta = request["meta_info"]
    rows = (meta.get("customized_info") or {}).get(STATS_KEY, meta.get(STATS_KEY)) or []
    return [[int(v) for v in row] for row in rows if row is not None]


def _as_dict(config) -> dict:
    return dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)


def _params(config) -> dict:
    """Flat `group.key` parameters of a live run, the tree policy always among them."""
    return {"tree.policy": DEFAULT_POLICY, **store.flatten(_as_dict(config))}


def live_steps(requests: list[dict], config) -> pd.DataFrame:
    """The steps table (flashtree.metrics.STEP_COLUMNS, as a sweep's steps.parquet) of a live run's requests."""
    policy = _params(config)["tree.policy"]
    unknown_times = {f"time_{s}_s": math.nan for s in metrics.STAGES}
    out = []
    for i, request in enumerate(requests):
        prompt_tokens = request["meta_info"].get("prompt_tokens")
        position = math.nan if prompt_tokens is None else int(prompt_tokens) + 1
        for step, values in enumerate(_stats_rows(request)):
            row = dict(zip(STEP_FIELDS, values))
            plan_n, plan_width = values[6:8] if len(values) >= 8 and values[6] else (math.nan, math.nan)
            out.append({"prompt": i, "request": i, "step": step, "position": position, "policy": policy, **row,
                        "plan_n": plan_n, "plan_width": plan_width,
                        "committed": row["accept_len"] + 1, "oracle_len": math.nan, "accepted_path": None,
                        "accepted_depth_votes": None, **unknown_times})
            position += row["accept_len"] + 1
    return metrics.steps_frame(out)


def live_prompts(requests: list[dict]) -> pd.DataFrame:
    """The prompts table (flashtree.metrics.PROMPT_COLUMNS) of a live run: one row per request."""
    rows = [{
        "prompt": i,
        "prompt_tokens": r["meta_info"].get("prompt_tokens"),
        "new_tokens": int(r["meta_info"]["completion_tokens"]),
        "steps": len(_stats_rows(r)),
        "wall_time_s": float(r["wall_time_s"]),
    } for i, r in enumerate(requests)]
    return pd.DataFrame(rows, columns=list(metrics.PROMPT_COLUMNS))


def planner_choices(tree_choices: dict[str, int], params: dict, verify_steps: int, tree_steps: int) -> dict[str, int]:
    """A planner server's request-steps per shape, its chain among them: every verify step sglang counted
    (spec_verify_ct) that left no tree statistics row was the chain's step. A fixed server's: `tree_choices` ({})."""
    if params.get("tree.n") != AUTO:
        return dict(tree_choices)
    chain = max(0, int(verify_steps) - int(tree_steps))
    width = params.get("tree.width")
    label = Shape(0, int(width)).label() if width else CHAIN
    return {**({label: chain} if chain else {}), **tree_choices}


def live_tables(requests: list[dict], config, *, k: int) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(steps, prompts, summary) of a live run; `k`: the deepest a tree can accept (the draft block the trees are
    built from), the length of the per-depth lists."""
    steps, prompts = live_steps(requests, config), live_prompts(requests)
    policy = _params(config)["tree.policy"]
    verify = sum(int(r["meta_info"].get("spec_verify_ct") or 0) for r in requests)
    summary = {
        "mode": "live",
        **metrics.summarize(steps, prompts, k),
        "verify_steps": verify,
        "tau_server": float(prompts["new_tokens"].sum()) / verify if verify else math.nan,
        # steps whose accepted length was drawn (FLASHTREE_SIMULATE_ACC / SGLANG_SIMULATE_ACC_LEN), not verified
        "simulated_steps": sum(int(row[5]) for r in requests for row in _stats_rows(r) if len(row) > 5),
        # FLASHTREE_TREE_N=auto: request-steps per shape it chose, its chain's included ({} on a fixed server)
        "plan_choices": planner_choices(metrics.plan_choices(steps, lambda n, w: Shape(n, w, policy=policy).label()),
                                        _params(config), verify, len(steps)),
    }
    return steps, prompts, summary


def write_live_run(run_dir, requests: list[dict], config, *, k: int, label: str) -> dict:
    """Store a live run in `run_dir` as a sweep run is stored (steps.parquet, prompts.parquet, summary.json), so
    `flashtree.results.collect` gathers it with sweeps; returns its summary."""
    steps, prompts, summary = live_tables(requests, config, k=k)
    params = _params(config)
    head = {"label": label, "config_hash": store.config_hash({**params, "mode": "live"}), **summary}
    return store.write_run(Path(run_dir), steps, prompts, head, params=params, config=_as_dict(config))
