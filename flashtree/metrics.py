"""The metrics every flashtree table, summary, W&B run and notebook uses, defined once.

τ (tau)             tokens committed per verify step, the bonus token included: Σ (accept_len + 1) / steps,
                    pooled over every step of every prompt (so a long prompt weighs by its steps). sglang logs it as
                    "accept len", vLLM as "mean acceptance length" (both count the bonus token).
reach per depth     P(accept_len >= d), d = 1..K: the expected tokens depth d contributes; τ = 1 + Σ_d reach_d.
                    Unconditional: this is vLLM's "per-position acceptance rate" (accepted at position d / drafts).
acceptance per depth
                    conditional: P(depth d accepted | depth d-1 accepted) = #(accept_len >= d) / #(accept_len >= d-1);
                    not vLLM's per-position rate (that is reach), and it is shown labelled "conditional".
oracle τ            1 + mean oracle_len: τ had the tree kept every node of the N candidates (W unbounded).
tokens/s            new tokens / generation wall time, summed over prompts (the untimed warm-up excluded).
stage time          mean seconds per verify step spent in each stage of STAGES, the one stage vocabulary of the engine
                    and the live server's timer (the engine times draft, build, verify, walk, commit; a stage a run
                    does not time is NaN).
gain over the chain τ(policy, N, W) / τ(chain, W) − 1, the chain being N = 1 under the trie vote (one candidate:
                    its own block) at the same W with everything else equal (a policy that grows trees from the
                    draft's scores, best-first, is a tree even at N = 1); speedup over the chain is the same ratio of
                    tokens/s (without the − 1).
CIs                 95% paired percentile bootstrap over prompts (the independent units): every pooled figure above
                    is a ratio Σ_i a_i / Σ_i b_i over prompts i, recomputed on BOOTSTRAP_RESAMPLES resamples of the
                    prompts (fixed seed, so a summary is reproducible); a comparison with the chain resamples the
                    same prompts for both configurations (scipy.stats.bootstrap(..., paired=True,
                    method="percentile") computes the same interval). A ratio of positive sums stays positive, so
                    no interval of τ, tokens/s or a speedup goes below 0 (nor a gain below −100%).

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


def plan_choices(steps: pd.DataFrame, label) -> dict[str, int]:
    """Steps (request-steps) per shape the planner chose, `label(n, width)` naming each; {} when no row was planned."""
    planned = steps.dropna(subset=["plan_n", "plan_width"])
    counts = planned.groupby(["plan_n", "plan_width"]).size() if len(planned) else {}
    return {label(int(n), int(w)): int(c) for (n, w), c in dict(counts).items()}


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


BOOTSTRAP_RESAMPLES = 4000
BOOTSTRAP_SEED = 0
# Per-prompt sums a summary keeps (summary key -> what it sums), so that comparisons between runs can be paired.
PER_PROMPT = ("prompt_ids", "prompt_committed", "prompt_steps", "prompt_new_tokens", "prompt_wall_time_s")


def bootstrap_ci(statistic, *per_prompt, level: float = 0.95) -> tuple[float, float, float]:
    """`statistic` of per-prompt arrays (aligned: entry i of each is prompt i) with its paired percentile bootstrap
    interval: every resample draws prompts with replacement and takes the same prompts from every array.
    `statistic(*arrays)` reduces over the last axis. NaN bounds with fewer than 2 prompts; NaN throughout when the
    statistic is undefined (e.g. a ratio over untimed prompts)."""
    arrays = [np.asarray(a, dtype=float) for a in per_prompt]
    with np.errstate(divide="ignore", invalid="ignore"):
        point = float(statistic(*arrays))
        n = len(arrays[0])
        if not math.isfinite(point) or n < 2:
            return point if math.isfinite(point) else math.nan, math.nan, math.nan
        idx = np.random.default_rng(BOOTSTRAP_SEED).integers(0, n, size=(BOOTSTRAP_RESAMPLES, n))
        stats = statistic(*(a[idx] for a in arrays))
    stats = stats[np.isfinite(stats)]  # a resample whose denominator is 0 (no prompt reached that depth)
    lo, hi = np.percentile(stats, [50 * (1 - level), 50 * (1 + level)])
    return point, float(lo), float(hi)


def _ratio(num, den):
    return num.sum(-1) / den.sum(-1)


def ratio_ci(num: np.ndarray, den: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """Σnum / Σden over prompts with its bootstrap interval (NaN when Σden is not positive)."""
    den = np.asarray(den, dtype=float)
    if not den.sum() > 0:
        return math.nan, math.nan, math.nan
    return bootstrap_ci(_ratio, num, den, level=level)


def ratio_of_ratios_ci(num, den, base_num, base_den, level: float = 0.95) -> tuple[float, float, float]:
    """(Σnum / Σden) / (Σbase_num / Σbase_den) over the same prompts, resampled together (paired)."""
    return bootstrap_ci(lambda a, b, c, d: _ratio(a, b) / _ratio(c, d), num, den, base_num, base_den, level=level)


def compare_with_chain(run, chain) -> dict:
    """Gain in τ and speedup in tokens/s of `run` over `chain` (two summaries or collected rows). With their
    PER_PROMPT lists the intervals are paired over the prompts both ran; without them (tables written before they
    existed) the point values come from the pooled τ and tokens/s, with NaN bounds."""
    nan3 = (math.nan,) * 3
    out = dict(zip(("tau_gain", "tau_gain_ci_lo", "tau_gain_ci_hi"), nan3))
    out.update(zip(("speedup", "speedup_ci_lo", "speedup_ci_hi"), nan3))
    if not all(_has_list(run, k) and _has_list(chain, k) for k in PER_PROMPT):
        with np.errstate(divide="ignore", invalid="ignore"):
            out["tau_gain"] = float(_value(run, "tau") / _value(chain, "tau") - 1)
            out["speedup"] = float(_value(run, "tokens_per_s") / _value(chain, "tokens_per_s"))
        return out
    a, b = (pd.DataFrame({k: list(r[k]) for k in PER_PROMPT}).set_index("prompt_ids") for r in (run, chain))
    shared = a.index.intersection(b.index)
    if not len(shared):
        return out
    a, b = a.loc[shared].astype(float), b.loc[shared].astype(float)
    gain = ratio_of_ratios_ci(a["prompt_committed"], a["prompt_steps"], b["prompt_committed"], b["prompt_steps"])
    out.update(zip(("tau_gain", "tau_gain_ci_lo", "tau_gain_ci_hi"), (g - 1 for g in gain)))
    if a["prompt_wall_time_s"].notna().all() and b["prompt_wall_time_s"].notna().all():
        speed = ratio_of_ratios_ci(a["prompt_new_tokens"], a["prompt_wall_time_s"], b["prompt_new_tokens"],
                                   b["prompt_wall_time_s"])
        out.update(zip(("speedup", "speedup_ci_lo", "speedup_ci_hi"), speed))
    return out


def _value(row, key) -> np.float64:
    """A scalar of a summary or row as a float64 (None, the JSON of NaN, and a missing key read as NaN)."""
    value = row.get(key)
    return np.float64(math.nan if value is None else value)


def _has_list(row, key) -> bool:
    value = row.get(key) if hasattr(row, "get") else None
    return value is not None and not isinstance(value, (float, str)) and len(value) > 0


def _pooled(num, den) -> float:
    return float(num.sum() / den.sum()) if den.sum() > 0 else math.nan


def _per_prompt(steps: pd.DataFrame, prompts: pd.DataFrame, values: pd.Series) -> np.ndarray:
    """Sum `values` (aligned with steps) per prompt, in prompts' order (0 for a prompt with no step)."""
    sums = values.groupby(steps["prompt"]).sum()
    return sums.reindex(prompts["prompt"], fill_value=0).to_numpy(dtype=float)


def summarize(steps: pd.DataFrame, prompts: pd.DataFrame, k: int) -> dict:
    """Every scalar and per-depth metric of one run (one configuration over its prompts)."""
    n_steps = _per_prompt(steps, prompts, pd.Series(1, index=steps.index))
    committed = _per_prompt(steps, prompts, steps["committed"])
    tau, tau_lo, tau_hi = ratio_ci(committed, n_steps)
    known_oracle = steps["oracle_len"].notna().all()
    oracle = _pooled(_per_prompt(steps, prompts, steps["oracle_len"] + 1), n_steps) if known_oracle else math.nan
    wall = prompts["wall_time_s"].to_numpy(dtype=float)
    tps, tps_lo, tps_hi = ratio_ci(prompts["new_tokens"].to_numpy(), wall)

    accept, accept_lo, accept_hi, reach = [], [], [], []
    for d in range(1, k + 1):
        hit = _per_prompt(steps, prompts, (steps["accept_len"] >= d).astype(int))
        tried = _per_prompt(steps, prompts, (steps["accept_len"] >= d - 1).astype(int))
        a, lo, hi = ratio_ci(hit, tried)
        accept.append(a), accept_lo.append(lo), accept_hi.append(hi)
        reach.append(_pooled(hit, n_steps))

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
        # per-prompt sums (PER_PROMPT), so that comparisons with another run pair their prompts
        "prompt_ids": [int(p) for p in prompts["prompt"]],
        "prompt_committed": [int(c) for c in committed],
        "prompt_steps": [int(c) for c in n_steps],
        "prompt_new_tokens": [int(t) for t in prompts["new_tokens"]],
        "prompt_wall_time_s": [float(t) for t in wall],
    }
    for s in STAGES:
        col = steps[f"time_{s}_s"]
        out[f"time_{s}_s"] = float(col.mean()) if total_steps and col.notna().any() else math.nan
    return out

