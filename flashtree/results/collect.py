"""Collect every finished run under a sweep directory into one table, `summary.parquet` (one row per configuration).

The table is derived from the runs' summary.json files, so it can be rebuilt at any time:
    python -m flashtree.results.collect multirun/<name>

Sweeps, replay and live runs land in it alike (column `mode`: direct, replay, live); rows are sorted by dataset,
target, drafter, tree policy, N, W and seed. `load_results` reads one or more such tables for the
notebook.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import pandas as pd

from flashtree import metrics
from flashtree.files import DamagedFile
from flashtree.results import store
from flashtree.tree import DEFAULT_POLICY

COLLECTED = "summary.parquet"
SKIP_DIRS = {"wandb", ".submitit", ".hydra"}
# Columns of the printed table, in order (all others stay in the parquet); `gain` and `speedup` are the paired
# comparisons with the chain (flashtree.metrics.compare_with_chain) written with their intervals.
SHOWN = ("dataset", "policy", "tree.n", "tree.width", "tau", "tau_ci_lo", "tau_ci_hi", "gain", "tau_oracle",
         "tokens_per_s", "speedup", "distinct_candidates", "tree_size", "prompts", "steps")
LIST_COLUMNS = ("accept_per_depth", "accept_per_depth_ci_lo", "accept_per_depth_ci_hi", "reach_per_depth",
                "accept_len_hist", *metrics.PER_PROMPT)
COMPARED = ("tau_gain", "tau_gain_ci_lo", "tau_gain_ci_hi", "speedup", "speedup_ci_lo", "speedup_ci_hi")


def summaries(sweep_dir: Path) -> list[dict]:
    """Finished runs' summaries under `sweep_dir` (any depth: override names may contain '/')."""
    found = []
    for root, dirs, files in os.walk(sweep_dir):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        if store.SUMMARY in files:
            try:
                summary = store.read_summary(Path(root))
            except DamagedFile as err:
                print(f"flashtree: {err}; left out of the table (rerun the sweep to redo that run)")
                continue
            if summary and summary.get("status") == "complete":
                found.append(summary)
    return found


def row(summary: dict) -> dict:
    params = summary.get("params", {})
    out = {
        "dataset": params.get("dataset.name"),
        "target": params.get("target.name"),
        "drafter": params.get("drafter.name"),
        "policy": params.get("tree.policy"),
        **params,
    }
    for key, value in summary.items():
        if key in ("params", "config", "versions", "git", "wandb", "status", "machine", "warmup"):
            continue
        out[key] = value
    out["threads"] = (summary.get("machine") or {}).get("threads")
    out["git_commit"] = (summary.get("git") or {}).get("commit")
    out["wandb_dir"] = (summary.get("wandb") or {}).get("dir")
    return out


def collect(sweep_dir, write: bool = True) -> pd.DataFrame:
    """The collected table of `sweep_dir`; written atomically to <sweep_dir>/summary.parquet when `write`."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"{sweep_dir}: no such sweep directory (a sweep writes multirun/<name>)")
    rows = [row(s) for s in summaries(sweep_dir)]
    df = pd.DataFrame(rows)
    if len(df):
        keys = [c for c in ("dataset", "target", "drafter", "policy", "tree.n", "tree.width", "seed") if c in df]
        df = df.sort_values(keys, kind="stable", key=_order).reset_index(drop=True)
        df = with_chain_comparison(df)
        # Options dicts and other mixed objects do not round-trip through parquet; keep them as text.
        for col in df.columns:
            if col not in LIST_COLUMNS and df[col].map(lambda v: isinstance(v, (dict, list))).any():
                df[col] = df[col].map(str)
    if write:
        fd, tmp = tempfile.mkstemp(dir=sweep_dir, prefix=f".{COLLECTED}.", suffix=".tmp")
        os.close(fd)
        _as_stored(df).to_parquet(tmp, index=False)
        os.replace(tmp, sweep_dir / COLLECTED)
    return df


def _order(col: pd.Series) -> pd.Series:
    """Sort key: tree.n mixes counts and "auto" (the planner's runs), which sort after them."""
    return pd.to_numeric(col, errors="coerce").fillna(float("inf")) if col.name == "tree.n" else col


def _as_stored(df: pd.DataFrame) -> pd.DataFrame:
    """The table as parquet holds it: tree.n as text when it mixes counts and "auto" (`load_results` reads it back)."""
    if "tree.n" in df and df["tree.n"].map(lambda v: isinstance(v, str)).any():
        return df.assign(**{"tree.n": df["tree.n"].map(str)})
    return df


def _tree_n(v):
    return int(v) if isinstance(v, str) and v.isdigit() else v


def with_chain_comparison(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with the COMPARED columns: each row against the chain (tree.n = 1 under the trie vote, see
    flashtree.metrics) that equals it in every other parameter (same W, prompt set, mode, source table), paired over
    their prompts; NaN where the table holds no such chain."""
    if "tree.n" not in df or not len(df):
        return df
    other = ("tree.n", "tree.policy")
    keys = [c for c in df.columns if ("." in c and c not in other) or c in ("mode", "source")]

    def key(r):
        return tuple(str(r[c]) for c in keys)

    chain_rows = df[(df["tree.n"] == 1) & (df["policy"] == DEFAULT_POLICY)]
    chains = {key(r): r for _, r in chain_rows.iterrows()}
    nan = dict.fromkeys(COMPARED, float("nan"))
    compared = [metrics.compare_with_chain(r, chains[key(r)]) if key(r) in chains else nan for _, r in df.iterrows()]
    return df.assign(**pd.DataFrame(compared, index=df.index)[list(COMPARED)])


class EmptyResults(ValueError):
    """A results table holds no finished runs: nothing to plot or compare."""


def load_results(source) -> pd.DataFrame:
    """The collected tables under `source` (a sweep directory, a summary.parquet, or a folder of them), concatenated,
    each row tagged with its table's folder (`source`); FileNotFoundError / EmptyResults when there is nothing. Tables written before a column existed read with its value of
    then: `mode` "direct", `policy` the trie vote (the only tree before the policy registry)."""
    source = Path(source)
    files = [source] if source.suffix == ".parquet" else _outermost(sorted(source.rglob(COLLECTED))) or sorted(source.glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no {COLLECTED} under {source}; run a sweep or `python -m flashtree.results.collect DIR`")
    tables = [pd.read_parquet(f).assign(source=f.parent.name) for f in files]
    tables = [t for t in tables if len(t)]
    if not tables:
        raise EmptyResults(f"no finished runs in {', '.join(map(str, files))}: the table is empty; finish a sweep "
                           "into it first (its runs' summary.json files are what `collect` reads)")
    df = pd.concat(tables, ignore_index=True)
    for col, then in (("mode", "direct"), ("policy", DEFAULT_POLICY)):
        df[col] = df[col].fillna(then) if col in df else then
    if "tree.n" in df:
        df["tree.n"] = df["tree.n"].map(_tree_n)  # counts stored as text beside "auto" (`_as_stored`)
    # tables collected before the comparisons with the chain existed get them (point values, no per-prompt sums)
    return df if "tau_gain" in df else with_chain_comparison(df)


def _outermost(tables: list[Path]) -> list[Path]:
    """The tables not inside another one's folder: a multirun's summary.parquet already holds the rows of the
    per-job tables under it (a replay job collects its own grid), which would otherwise count twice."""
    folders = {t.parent for t in tables}
    return [t for t in tables if not any(p in folders for p in t.parent.parents)]


def varying(df: pd.DataFrame) -> list[str]:
    """Parameter columns (`group.key`) outside SHOWN whose value differs between rows: what tells rows apart that the
    printed table would otherwise show as identical (another engine.max_new_tokens, dataset.limit, seed...)."""
    aliases = ("dataset.name", "tree.policy")  # shown as `dataset` and `policy`
    return [c for c in df.columns if "." in c and c not in (*SHOWN, *aliases) and df[c].astype(str).nunique() > 1]


def mixed_prompt_sets(df: pd.DataFrame) -> list[str]:
    """One line per dataset whose rows were measured on different prompt sets (limit, split, chat template)."""
    keys = [c for c in df.columns if c.startswith("dataset.") and c != "dataset.name"]
    if "dataset" not in df or not keys:
        return []
    notes = []
    for name, part in df.groupby("dataset", dropna=False):
        differ = {k: sorted(part[k].astype(str).unique()) for k in keys if part[k].astype(str).nunique() > 1}
        if differ:
            what = "; ".join(f"{k} = {', '.join(v)}" for k, v in differ.items())
            notes.append(f"note: the {name} rows come from different prompt sets ({what}): compare rows of one set only")
    return notes


def format_table(df: pd.DataFrame) -> str:
    if not len(df):
        return "(no finished runs)"
    extra = varying(df)
    at = SHOWN.index("tree.n")
    df = df.assign(**{name: [_interval(r, column, scale, fmt) for _, r in df.iterrows()]
                      for name, column, scale, fmt in (("gain", "tau_gain", 100, "{:+.1f}%"),
                                                       ("speedup", "speedup", 1, "{:.2f}x"))
                      if column in df})
    shown = df[[c for c in (*SHOWN[:at], *extra, *SHOWN[at:]) if c in df]].copy()
    for c in ("tau", "tau_ci_lo", "tau_ci_hi", "tau_oracle", "distinct_candidates", "tree_size"):
        if c in shown:
            shown[c] = shown[c].map(lambda v: f"{v:.3f}" if pd.notna(v) else "-")
    if "tokens_per_s" in shown:
        shown["tokens_per_s"] = shown["tokens_per_s"].map(lambda v: f"{v:.1f}" if pd.notna(v) else "-")
    return "\n".join([shown.to_string(index=False), *mixed_prompt_sets(df)])


def _interval(row, column: str, scale: float, fmt: str) -> str:
    """'+9.7% [+6.1, +13.4]': a comparison with the chain and its paired 95% interval; '-' where there is none."""
    if row.get("tree.n") == 1 and row.get("policy") == DEFAULT_POLICY:
        return "chain"
    value, lo, hi = (row[column] * scale, row[f"{column}_ci_lo"] * scale, row[f"{column}_ci_hi"] * scale)
    if pd.isna(value):
        return "-"
    if pd.isna(lo):
        return fmt.format(value)
    bounds = fmt.replace("%", "").replace("x", "")
    return f"{fmt.format(value)} [{bounds.format(lo)}, {bounds.format(hi)}]"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path)
    args = parser.parse_args(argv)
    try:
        df = collect(args.sweep_dir)
    except FileNotFoundError as err:
        parser.error(str(err))
    print(format_table(df))
    print(f"\n{len(df)} runs -> {args.sweep_dir / COLLECTED}")


if __name__ == "__main__":
    main()
