"""Figures a paper can use: PDF and PNG, plain tick labels, error bars set apart on every plot whose table has
intervals, an anchored colour scale, and gaps (not lines) where the grid has no point."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402

from flashtree.results import collect, plots  # noqa: E402

NS, WIDTHS = (1, 2, 4), (4, 8, 16)


@pytest.fixture
def table() -> pd.DataFrame:
    rows = []
    for n in NS:
        for w in WIDTHS:
            if (n, w) == (2, 8):
                continue  # a missing point of the grid
            tau = 2 + 0.1 * n + 0.01 * w
            rows.append({"dataset": "gsm8k", "policy": "vote", "mode": "direct", "tree.n": n, "tree.width": w,
                         "tau": tau, "tau_ci_lo": tau - 0.2, "tau_ci_hi": tau + 0.2,
                         "tokens_per_s": 10.0 * n, "tokens_per_s_ci_lo": 9.0 * n, "tokens_per_s_ci_hi": 11.0 * n,
                         "tau_gain": 0.05 * (n - 1), "tau_gain_ci_lo": 0.04 * (n - 1), "tau_gain_ci_hi": 0.06 * (n - 1),
                         "accept_per_depth": [0.8, 0.6], "accept_per_depth_ci_lo": [0.7, 0.5],
                         "accept_per_depth_ci_hi": [0.9, 0.7]})
    return pd.DataFrame(rows)


def errorbars(fig):
    return [c for ax in fig.axes for c in ax.containers if isinstance(c, ErrorbarContainer)]


def test_every_figure_is_written_as_pdf_and_png(table, tmp_path):
    written = plots.save_all(table, tmp_path)
    names = {p.name for p in written}
    for figure in plots.FIGURES:
        assert {f"{figure}.pdf", f"{figure}.png"} <= names
    assert all(p.stat().st_size > 1000 for p in written)
    assert (tmp_path / "tau_lines.pdf").read_bytes()[:4] == b"%PDF"
    from PIL import Image

    with Image.open(tmp_path / "tau_lines.png") as png:  # 256 colours: the tracked figures stay light
        assert png.mode == "P"


@pytest.mark.parametrize("make, values", [(plots.tau_lines, WIDTHS), (plots.gain_over_chain, NS),
                                          (plots.tokens_per_s, WIDTHS)])
def test_log_axes_are_ticked_at_the_grid_with_plain_labels(table, make, values):
    ax = make(table).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(v) for v in values]
    assert list(ax.get_xticks()) == list(values)


@pytest.mark.parametrize("make", [plots.tau_lines, plots.gain_over_chain, plots.tokens_per_s, plots.depth_curves])
def test_plots_whose_table_has_intervals_draw_them_set_apart(table, make):
    bars = errorbars(make(table))
    assert len(bars) >= 3 and all(b.has_yerr for b in bars)
    # the lines' points sit at different x, so their bars do not merge into one block
    first_x = [b.lines[0].get_xdata()[0] for b in bars]
    assert len(set(np.round(first_x, 6))) == len(first_x)


def test_the_heatmap_scale_is_anchored_at_tau_1(table):
    fig = plots.tau_heatmaps(table)
    (image,) = fig.axes[0].images
    assert image.norm.vmin == 1.0 and image.norm.vmax == pytest.approx(table["tau"].max())


def test_a_missing_grid_point_breaks_the_line(table):
    def line(fig, label):
        (bars,) = [b for b in errorbars(fig) if b.get_label() == label]
        return np.asarray(bars.lines[0].get_ydata(), dtype=float)

    y = line(plots.tau_lines(table), "N=2")
    assert len(y) == len(WIDTHS) and np.isnan(y[1]) and np.isfinite(y[[0, 2]]).all()
    assert np.isnan(line(plots.gain_over_chain(table), "W=8")[1])


def test_a_multirun_table_is_read_once_not_with_the_job_tables_under_it(table, tmp_path):
    (tmp_path / "job").mkdir()
    table.to_parquet(tmp_path / "summary.parquet")
    table.to_parquet(tmp_path / "job" / "summary.parquet")  # a replay job's own table, already in the outer one
    assert len(collect.load_results(tmp_path)) == len(table)
