"""Figures of a collected results table (summary.parquet): where does width pay?

    python -m flashtree.results.plots multirun/<name>      # writes <dir>/figures/*.png

Each function takes the collected table (one row per configuration; columns dataset, tree.n, tree.width, tau,
accept_per_depth, tokens_per_s, ...) and returns a matplotlib Figure (None when the table lacks what it needs).
One panel per dataset, and per tree policy when the table holds more than one.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from flashtree.results.collect import EmptyResults, load_results


def _on_grid(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of a fixed N: the planner's (tree.n = "auto") have no place on the (N, W) axes; the table shows them."""
    fixed = df["tree.n"].map(lambda v: not isinstance(v, str))
    return df if fixed.all() else df[fixed].assign(**{"tree.n": lambda d: pd.to_numeric(d["tree.n"])})


def _panels(df: pd.DataFrame):
    """(title, rows) per panel: per dataset, and per policy when more than one policy is in the table."""
    df = _on_grid(df)
    keys = ["dataset", "policy"] if "policy" in df and df["policy"].nunique() > 1 else ["dataset"]
    for key, part in df.groupby(keys, sort=True, dropna=False):
        yield " / ".join(map(str, key)), part


def _panel_count(df: pd.DataFrame) -> int:
    return sum(1 for _ in _panels(df))


def _grid(df: pd.DataFrame, value: str) -> dict[str, pd.DataFrame]:
    """Per panel: a (N rows x W columns) table of `value`, averaged over any other varied key."""
    return {
        name: part.pivot_table(index="tree.n", columns="tree.width", values=value, aggfunc="mean").sort_index()
        for name, part in _panels(df)
    }


def _axes(count: int, width: float = 4.2, height: float = 3.4):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, count, figsize=(width * count, height), squeeze=False)
    return fig, axes[0]


def tau_heatmaps(df: pd.DataFrame):
    """τ over the (N, W) grid, one panel per dataset (shared colour scale)."""
    grids = _grid(df, "tau")
    fig, axes = _axes(len(grids))
    lo = min(g.min().min() for g in grids.values())
    hi = max(g.max().max() for g in grids.values())
    for ax, (name, g) in zip(axes, grids.items()):
        im = ax.imshow(g.to_numpy(), origin="lower", cmap="viridis", vmin=lo, vmax=hi, aspect="auto")
        ax.set_xticks(range(len(g.columns)), [str(c) for c in g.columns])
        ax.set_yticks(range(len(g.index)), [str(i) for i in g.index])
        for (i, j), v in np.ndenumerate(g.to_numpy()):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", color="w" if v < (lo + hi) / 2 else "k", fontsize=8)
        ax.set(title=f"τ — {name}", xlabel="W (verify tokens)", ylabel="N (candidates)")
    fig.colorbar(im, ax=list(axes), shrink=0.8, label="τ (tokens / verify step)")
    return fig


def _lines_over_width(df: pd.DataFrame, value: str, label: str, band: bool = False):
    """`value` against W, one line per N, one panel each; with `band`, the prompts' 95% CI as a band when known."""
    fig, axes = _axes(_panel_count(df))
    columns = [value, f"{value}_ci_lo", f"{value}_ci_hi"] if band else [value]
    for ax, (name, part) in zip(axes, _panels(df)):
        for n, line in part.groupby("tree.n", sort=True):
            line = line.groupby("tree.width", as_index=False)[columns].mean()
            ax.plot(line["tree.width"], line[value], marker="o", label=f"N={n}")
            if band and line[f"{value}_ci_lo"].notna().all():
                ax.fill_between(line["tree.width"], line[f"{value}_ci_lo"], line[f"{value}_ci_hi"], alpha=0.15)
        ax.set_xscale("log", base=2)
        ax.set(title=f"{label} vs W — {name}", xlabel="W (verify tokens)", ylabel=label)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def tau_lines(df: pd.DataFrame):
    """τ against W, one line per N, one panel per dataset, with the prompts' 95% CI as a band when known."""
    return _lines_over_width(df, "tau", "τ", band=True)


def depth_curves(df: pd.DataFrame):
    """Conditional acceptance per depth, P(d accepted | d-1 accepted), for each N at the widest W."""
    fig, axes = _axes(_panel_count(df))
    for ax, (name, part) in zip(axes, _panels(df)):
        widest = part[part["tree.width"] == part["tree.width"].max()]
        for _, row in widest.sort_values("tree.n").iterrows():
            acc = np.asarray(row["accept_per_depth"], dtype=float)
            ax.plot(np.arange(1, len(acc) + 1), acc, marker="o", label=f"N={row['tree.n']}")
        ax.set(title=f"acceptance per depth — {name} (W={part['tree.width'].max()})", xlabel="depth d",
               ylabel="P(d | d-1)", ylim=(0, 1.02))
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def gain_table(df: pd.DataFrame) -> pd.DataFrame:
    """τ(N, W) / τ(N=1, W) − 1 per dataset and policy: what the extra candidates buy over the chain at the same
    width."""
    keys = [c for c in ("dataset", "policy") if c in df]
    df = _on_grid(df)
    chain = df[df["tree.n"] == 1].groupby([*keys, "tree.width"])["tau"].mean().rename("tau_chain")
    out = df.groupby([*keys, "tree.n", "tree.width"], as_index=False)["tau"].mean()
    out = out.join(chain, on=[*keys, "tree.width"])
    out["gain"] = out["tau"] / out["tau_chain"] - 1
    return out


def gain_over_chain(df: pd.DataFrame):
    if not (df["tree.n"] == 1).any():
        return None
    gains = gain_table(df)
    fig, axes = _axes(_panel_count(gains))
    for ax, (name, part) in zip(axes, _panels(gains)):
        for w, line in part.groupby("tree.width", sort=True):
            ax.plot(line["tree.n"], 100 * line["gain"], marker="o", label=f"W={w}")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set(title=f"τ gain over chain (N=1) — {name}", xlabel="N (candidates)", ylabel="gain (%)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def tokens_per_s(df: pd.DataFrame):
    """Measured tokens/s per (N, W) (replayed rows carry no timing and are left out)."""
    timed = df[df["tokens_per_s"].notna()] if "tokens_per_s" in df else df.iloc[:0]
    if not len(timed):
        return None
    return _lines_over_width(timed, "tokens_per_s", "tokens/s")


FIGURES = {
    "tau_heatmap": tau_heatmaps,
    "tau_lines": tau_lines,
    "accept_per_depth": depth_curves,
    "gain_over_chain": gain_over_chain,
    "tokens_per_s": tokens_per_s,
}


def save_all(df: pd.DataFrame, out_dir) -> list[Path]:
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, make in FIGURES.items():
        fig = make(df)
        if fig is None:
            continue
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


def main(argv=None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    parser = argparse.ArgumentParser(description="Figures of a sweep's collected table.")
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="default: <sweep_dir>/figures")
    args = parser.parse_args(argv)
    try:
        df = load_results(args.sweep_dir)
    except (FileNotFoundError, EmptyResults) as err:
        parser.exit(1, f"flashtree: {err}\n")
    for path in save_all(df, args.out or args.sweep_dir / "figures"):
        print(path)


if __name__ == "__main__":
    main()
