"""Figures of a collected results table (summary.parquet): where does width pay?

    python -m flashtree.results.plots multirun/<name>      # writes <dir>/figures/*.pdf and *.png

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


def _log2_axis(ax, values) -> None:
    """A base-2 log x axis ticked at exactly `values`, labelled 4, 8, 16 (not 2^2, 2^3)."""
    from matplotlib.ticker import NullLocator

    values = sorted(set(int(v) for v in values))
    ax.set_xscale("log", base=2)
    ax.set_xticks(values, [str(v) for v in values])
    ax.xaxis.set_minor_locator(NullLocator())


def _series(part: pd.DataFrame, x: str, columns: list[str], xs) -> pd.DataFrame:
    """`columns` of `part` against every x of the panel (`xs`), averaged over other keys; a point the table lacks is
    NaN, so its line breaks there instead of joining its neighbours."""
    present = [c for c in columns if c in part]
    return part.groupby(x)[present].mean().reindex(sorted(xs))


def _errorbars(ax, x, series: pd.DataFrame, value: str, label: str, scale: float = 1.0) -> None:
    """One line of `series[value]` at `x` with its 95% interval as error bars (when the table has it)."""
    y = series[value] * scale
    lo, hi = f"{value}_ci_lo", f"{value}_ci_hi"
    if lo in series and series[lo].notna().any():
        yerr = np.vstack([y - series[lo] * scale, series[hi] * scale - y]).clip(min=0)
        ax.errorbar(x, y, yerr=yerr, marker="o", ms=4, capsize=2.5, lw=1.4, elinewidth=0.9, label=label)
    else:
        ax.plot(x, y, marker="o", ms=4, lw=1.4, label=label)


def _dodge(count: int, spread: float) -> np.ndarray:
    """Offsets in [-spread, spread] that set `count` lines' points apart at each x, so their error bars do not merge
    into one block (on a log-2 axis they are exponents: ±spread of an octave)."""
    return np.linspace(-spread, spread, count) if count > 1 else np.zeros(1)


def tau_heatmaps(df: pd.DataFrame):
    """τ over the (N, W) grid, one panel per dataset; one colour scale for every panel, anchored at τ = 1 (no draft
    token accepted), so a colour means the same τ in every panel and every figure of one table."""
    import matplotlib

    grids = _grid(df, "tau")
    fig, axes = _axes(len(grids))
    lo, hi = 1.0, max(1.0 + 1e-9, max(g.max().max() for g in grids.values()))
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="0.9")  # missing (N, W): light grey
    for ax, (name, g) in zip(axes, grids.items()):
        im = ax.imshow(g.to_numpy(), origin="lower", cmap=cmap, vmin=lo, vmax=hi, aspect="auto")
        ax.set_xticks(range(len(g.columns)), [str(c) for c in g.columns])
        ax.set_yticks(range(len(g.index)), [str(i) for i in g.index])
        for (i, j), v in np.ndenumerate(g.to_numpy()):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", color="w" if v < (lo + hi) / 2 else "k", fontsize=8)
        ax.set(title=f"τ — {name}", xlabel="W (verify tokens)", ylabel="N (candidates)")
    fig.colorbar(im, ax=list(axes), shrink=0.8, label="τ (tokens / verify step)")
    return fig


def _lines_over_width(df: pd.DataFrame, value: str, label: str):
    """`value` against W, one line per N, one panel each, with the prompts' 95% interval as error bars when known."""
    fig, axes = _axes(_panel_count(df))
    columns = [value, f"{value}_ci_lo", f"{value}_ci_hi"]
    for ax, (name, part) in zip(axes, _panels(df)):
        widths = part["tree.width"].unique()
        ns = sorted(part["tree.n"].unique())
        for n, shift in zip(ns, _dodge(len(ns), 0.12)):
            line = _series(part[part["tree.n"] == n], "tree.width", columns, widths)
            _errorbars(ax, line.index * 2**shift, line, value, f"N={n}")
        _log2_axis(ax, widths)
        ax.set(title=f"{label} vs W — {name}", xlabel="W (verify tokens)", ylabel=label)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def tau_lines(df: pd.DataFrame):
    """τ against W, one line per N, one panel per dataset, with the prompts' 95% intervals."""
    return _lines_over_width(df, "tau", "τ")


def depth_curves(df: pd.DataFrame):
    """Conditional acceptance per depth, P(d accepted | d-1 accepted), for each N at the widest W, with the prompts'
    95% intervals. Conditional, unlike vLLM's per-position acceptance rate (flashtree's reach: P(accept_len >= d))."""
    fig, axes = _axes(_panel_count(df))
    for ax, (name, part) in zip(axes, _panels(df)):
        widest = part[part["tree.width"] == part["tree.width"].max()].sort_values("tree.n")
        for (_, row), shift in zip(widest.iterrows(), _dodge(len(widest), 0.25)):
            acc = np.asarray(row["accept_per_depth"], dtype=float)
            depth = pd.DataFrame({"a": acc}, index=np.arange(1, len(acc) + 1))
            if "accept_per_depth_ci_lo" in row and row["accept_per_depth_ci_lo"] is not None:
                depth["a_ci_lo"] = np.asarray(row["accept_per_depth_ci_lo"], dtype=float)
                depth["a_ci_hi"] = np.asarray(row["accept_per_depth_ci_hi"], dtype=float)
            _errorbars(ax, depth.index + shift, depth, "a", f"N={row['tree.n']}")
        ax.set(title=f"acceptance per depth — {name} (W={part['tree.width'].max()})",
               xlabel="depth d (conditional; vLLM's per-position rate is reach)",
               ylabel="P(d accepted | d−1 accepted)", ylim=(0, 1.02))
        ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return fig


def gain_table(df: pd.DataFrame) -> pd.DataFrame:
    """The gain in τ over the chain (collected column tau_gain, paired intervals tau_gain_ci_lo/hi; see
    flashtree.metrics) per dataset, policy, N and W."""
    keys = [c for c in ("dataset", "policy") if c in df]
    df = _on_grid(df)
    columns = [c for c in ("tau", "tau_gain", "tau_gain_ci_lo", "tau_gain_ci_hi") if c in df]
    out = df.groupby([*keys, "tree.n", "tree.width"], as_index=False)[columns].mean()
    return out.rename(columns={"tau_gain": "gain", "tau_gain_ci_lo": "gain_ci_lo", "tau_gain_ci_hi": "gain_ci_hi"})


def gain_over_chain(df: pd.DataFrame):
    """τ gain over the chain (%) against N, one line per W, with the paired 95% intervals."""
    gains = gain_table(df)
    if "gain" not in gains or not gains["gain"].notna().any():
        return None
    fig, axes = _axes(_panel_count(gains))
    for ax, (name, part) in zip(axes, _panels(gains)):
        ns = part["tree.n"].unique()
        widths = sorted(part["tree.width"].unique())
        for w, shift in zip(widths, _dodge(len(widths), 0.12)):
            line = _series(part[part["tree.width"] == w], "tree.n", ["gain", "gain_ci_lo", "gain_ci_hi"], ns)
            _errorbars(ax, line.index * 2**shift, line, "gain", f"W={w}", scale=100)
        ax.axhline(0, color="grey", lw=0.8)
        _log2_axis(ax, ns)
        ax.set(title=f"τ gain over the chain — {name}", xlabel="N (candidates)", ylabel="gain over N=1 vote (%)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def tokens_per_s(df: pd.DataFrame):
    """Measured tokens/s per (N, W) with the prompts' 95% intervals (replayed rows carry no timing and are left out)."""
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


FORMATS = ("pdf", "png")  # vector for papers, raster for notebooks and READMEs
PNG_DPI = 200


def save_figure(fig, out_dir, name: str) -> list[Path]:
    """`fig` as <out_dir>/<name>.pdf and .png (PNG_DPI), then closed; returns the paths written."""
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in FORMATS:
        path = out_dir / f"{name}.{fmt}"
        fig.savefig(path, dpi=PNG_DPI, bbox_inches="tight")
        if fmt == "png":
            _to_palette(path)
        written.append(path)
    plt.close(fig)
    return written


def _to_palette(path: Path) -> None:
    """Rewrite a PNG with 256 colours (a plot has a few, plus their antialiasing): about a third of the bytes, since
    every tracked figure travels with every GPU call."""
    from PIL import Image

    with Image.open(path) as im:
        palette = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        dpi = im.info.get("dpi", (PNG_DPI, PNG_DPI))
    palette.save(path, optimize=True, dpi=dpi)


def save_all(df: pd.DataFrame, out_dir) -> list[Path]:
    """Every figure the table supports, as <out_dir>/<name>.pdf and .png; returns the paths written."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)  # also when the table supports no figure
    written = []
    for name, make in FIGURES.items():
        fig = make(df)
        if fig is not None:
            written += save_figure(fig, out_dir, name)
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
