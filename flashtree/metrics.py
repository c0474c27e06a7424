"""The metrics every flashtree table, summary, W&B run and notebook uses, defined once.

τ (tau)             tokens committed per verify step, the bonus token included: Σ (accept_len + 1) / steps,
                    pooled over every step of every prompt (so a long prompt weighs by its steps).
reach per depth     P(accept_len >= d), d = 1..K: the expected tokens depth d contributes; τ = 1 + Σ_d reach_d.
acceptance per depth
                    conditional: P(depth d accepted | depth d-1 accepted) = #(accept_len >= d) / #(accept_len >= d-1).
oracle τ            1 + mean oracle_len: τ had the tree kept every node of the N candidates (W unbounded).
tokens/s            new tokens / generation wall time, summed over prompts (the untimed warm-up excluded).
stage time          mean seconds per verify step spent in each stage of STAGES, the one stage vocabulary of the engine
                    and the live server's timer (the engine times draft, build, verify, walk, commit; a stage a run
                    does not time is NaN).
CIs                 95% confidence intervals across prompts: every pooled figure above is a ratio Σ_i a_i / Σ_i b_i
                    over prompts i; its interval is the ratio ± t(0.975, n-1) · SE, SE from the linearised
                    (cluster) ratio estimator, so prompts, not steps, are the independent units.

The steps table (`steps.parquet`) has one row per verify step of one prompt; its layout is STEPS_SCHEMA_VERSION,
stored in the parquet metadata and in summary.json. Bump it when a column changes meaning.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np
import pandas as pd

STEPS_SCHEMA_VERSION = 2
STAGES = ("draft", "draws", "build", "verify", "walk", "commit", "output")
STEP_COLUMNS = (
    "prompt",  # prompt index within the dataset slice
    "request",  # row in the engine batch
    "step",  # verify step within the prompt's generation
    "position",  # committed tokens before the step
    "policy",  # the tree policy that built the step's tree (flashtree.tree.policies)
    "candidates",  # N drawn
    "distinct_candidates",
    "tree_size",  # valid non-root nodes (<= W - 1)
    "accept_len",  # accepted draft tokens
    "committed",  # accept_len + 1 (bonus included)
    "oracle_len",  # best prefix match among all N candidates
    "accepted_path",  # list[int] node indices, root excluded
    "accepted_depth_votes",  # list[int] votes of the accepted nodes
    *(f"time_{s}_s" for s in STAGES),
    "plan_n",  # tree.n=auto: the N and W the planner chose for the step (NaN for a fixed shape)
    "plan_width",
)
INT_COLUMNS = ("prompt", "request", "step", "position", "candidates", "distinct_candidates", "tree_size", "accept_len",
               "committed", "oracle_len", "plan_n", "plan_width")
PROMPT_COLUMNS = ("prompt", "prompt_tokens", "new_tokens", "steps", "wall_time_s")
SCHEMA_KEY = b"flashtree.steps_schema_version"


def step_rows(records: Iterable, prompt: int) -> list[dict]:
    """StepRecords (flashtree.engine.records) of one prompt -> rows of the steps table."""
    rows = []
    for r in records:
        row = {
            "prompt": prompt,
            "request": r.request,
            "step": r.step,
            "position": r.position,
            "policy": r.policy,
            "candidates": r.candidates,
            "distinct_candidates": r.distinct_candidates,
            "tree_size": r.tree_size,
            "accept_len": r.accept_len,
            "committed": r.accept_len + 1,
            "oracle_len": r.oracle_len,
            "accepted_path": list(r.accepted_path),
            "accepted_depth_votes": list(r.accepted_depth_votes),
        }
        for s in STAGES:
            row[f"time_{s}_s"] = float(r.time_s.get(s, math.nan))
        row["plan_n"] = math.nan if r.plan_n is None else r.plan_n
        row["plan_width"] = math.nan if r.plan_width is None else r.plan_width
        rows.append(row)
    return rows


def steps_frame(rows: list[dict]) -> pd.DataFrame:
    """The steps table with its fixed column order and dtypes (an empty run still has every column). An integer
    column a source cannot fill (NaN: e.g. oracle_len of a live server) stays float."""
    df = pd.DataFrame(rows, columns=list(STEP_COLUMNS))
    return df.astype({c: "int64" for c in INT_COLUMNS if df[c].notna().all()})


def write_steps(df: pd.DataFrame, path) -> None:
    """Parquet with the schema version in its metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[SCHEMA_KEY] = str(STEPS_SCHEMA_VERSION).encode()
    pq.write_table(table.replace_schema_metadata(meta), path)


def read_steps(path) -> pd.DataFrame:
    """Read a steps table, refusing one written under another schema version."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    version = int((table.schema.metadata or {}).get(SCHEMA_KEY, b"0"))
    if version != STEPS_SCHEMA_VERSION:
        raise ValueError(f"{path}: steps schema version {version}, this flashtree reads {STEPS_SCHEMA_VERSION}")
    return table.to_pandas()


def ratio_ci(num: np.ndarray, den: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """Σnum / Σden over clusters (prompts) with its confidence interval; NaN bounds with fewer than 2 clusters."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    total = den.sum()
    if total <= 0:
        return math.nan, math.nan, math.nan
    r = num.sum() / total
    n = len(num)
    if n < 2:
        return float(r), math.nan, math.nan
    from scipy.stats import t

    resid = (num - r * den) / den.mean()
    se = math.sqrt((resid**2).sum() / (n * (n - 1)))
    half = float(t.ppf(0.5 + level / 2, n - 1)) * se
    return float(r), float(r - half), float(r + half)


def _per_prompt(steps: pd.DataFrame, prompts: pd.DataFrame, values: pd.Series) -> np.ndarray:
    """Sum `values` (aligned with steps) per prompt, in prompts' order (0 for a prompt with no step)."""
    sums = values.groupby(steps["prompt"]).sum()
    return sums.reindex(prompts["prompt"], fill_value=0).to_numpy(dtype=float)


def summarize(steps: pd.DataFrame, prompts: pd.DataFrame, k: int) -> dict:
    """Every scalar and per-depth metric of one run (one configuration over its prompts)."""
    n_steps = _per_prompt(steps, prompts, pd.Series(1, index=steps.index))
    tau, tau_lo, tau_hi = ratio_ci(_per_prompt(steps, prompts, steps["committed"]), n_steps)
    known_oracle = steps["oracle_len"].notna().all()
    oracle = ratio_ci(_per_prompt(steps, prompts, steps["oracle_len"] + 1), n_steps)[0] if known_oracle else math.nan
    tps, tps_lo, tps_hi = ratio_ci(prompts["new_tokens"].to_numpy(), prompts["wall_time_s"].to_numpy())

    accept, accept_lo, accept_hi, reach = [], [], [], []
    for d in range(1, k + 1):
        hit = _per_prompt(steps, prompts, (steps["accept_len"] >= d).astype(int))
        tried = _per_prompt(steps, prompts, (steps["accept_len"] >= d - 1).astype(int))
        a, lo, hi = ratio_ci(hit, tried)
        accept.append(a), accept_lo.append(lo), accept_hi.append(hi)
        reach.append(ratio_ci(hit, n_steps)[0])

    total_steps = int(n_steps.sum())
    hist = np.bincount(steps["accept_len"].to_numpy(dtype=int), minlength=k + 1)[: k + 1] if total_steps else np.zeros(k + 1)
    out = {
        "prompts": int(len(prompts)),
        "steps": total_steps,
        "new_tokens": int(prompts["new_tokens"].sum()),
        "wall_time_s": float(prompts["wall_time_s"].sum()),
        "tau": tau,
        "tau_ci_lo": tau_lo,
        "tau_ci_hi": tau_hi,
        "tau_oracle": oracle,
        "tokens_per_s": tps,
        "tokens_per_s_ci_lo": tps_lo,
        "tokens_per_s_ci_hi": tps_hi,
        "distinct_candidates": float(steps["distinct_candidates"].mean()) if total_steps else math.nan,
        "tree_size": float(steps["tree_size"].mean()) if total_steps else math.nan,
        "k": int(k),
        "accept_per_depth": accept,
        "accept_per_depth_ci_lo": accept_lo,
        "accept_per_depth_ci_hi": accept_hi,
        "reach_per_depth": reach,
        "accept_len_hist": [int(x) for x in hist],
    }
    for s in STAGES:
        col = steps[f"time_{s}_s"]
        out[f"time_{s}_s"] = float(col.mean()) if total_steps and col.notna().any() else math.nan
    return out

