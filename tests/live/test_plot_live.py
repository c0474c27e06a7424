"""benchmarks/live/plot_live.py on recorded live runs: the stage-time means per server and the figures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIVE = ROOT / "benchmarks" / "data" / "live"  # recorded runs

sys.path.insert(0, str(ROOT / "benchmarks" / "live"))
try:
    import plot_live
finally:
    sys.path.remove(str(ROOT / "benchmarks" / "live"))


def test_live_figures_from_the_recorded_smollm2_run(tmp_path):
    results = LIVE / "results-2026-11-30-smollm2"
    means = plot_live.stage_means(results / "stage_times.txt")
    assert list(means) == ["1", "2", "3", "4"]  # untagged (run 1): tree4, tree8, tree8b, tree8s in log order
    assert list(means["2"]) == ["draft", "draws", "tree", "verify", "walk", "commit", "output"]
    assert sum(means["2"].values()) == pytest.approx(5.98, abs=0.02)  # tree N = 8 at bs 1, BENCHMARKS.md section 6
    tagged = tmp_path / "stage_times.txt"  # pack_logs' tagged lines (two servers interleaved by server, not time)
    lines = (results / "stage_times.txt").read_text().splitlines()
    tagged.write_text("\n".join(f"[server_b_tree{i}] {line}" for i in (1, 8) for line in lines[:3]) + "\n")
    assert list(plot_live.stage_means(tagged)) == ["b_tree1", "b_tree8"]
    plot_live.main([str(results), "--out", str(tmp_path)])
    for name in ("speed", "stages"):
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000 and (tmp_path / f"{name}.pdf").stat().st_size > 5_000


def test_live_figures_at_32_requests_and_of_a_single_concurrency(tmp_path):
    """Run 18's stage phase ran at concurrency 1 and 32: stages.png gets a panel for the windows of 28-32 requests;
    run 19 measured concurrency 32 alone (one speed panel)."""
    run18 = LIVE / "results-2026-12-01-smollm2-run18"
    at32 = plot_live.stage_means(run18 / "stage_times.txt", 30.0, 2.0)
    assert list(at32) == ["b_tree1gt", "b_tree64w1t", "b_tree64wb512t"]
    assert sum(at32["b_tree64wb512t"].values()) == pytest.approx(5.348, abs=0.01)  # BENCHMARKS.md section 6, run 18
    assert at32["b_tree64wb512t"]["draft"] - at32["b_tree1gt"]["draft"] == pytest.approx(0.95, abs=0.01)
    plot_live.main([str(run18), "--out", str(tmp_path / "18")])
    assert (tmp_path / "18" / "stages.png").stat().st_size > 10_000
    plot_live.main([str(LIVE / "results-2026-12-01-smollm2-run19"), "--out", str(tmp_path / "19")])
    assert (tmp_path / "19" / "speed.png").stat().st_size > 10_000 and not (tmp_path / "19" / "stages.png").exists()


def test_live_figures_are_pdf_and_200_dpi_png_with_plain_ticks(tmp_path, monkeypatch):
    """A tiny speed_results.json (the app's layout) and no stage times: speed.pdf and speed.png, through the sweep
    figures' save_figure; tokens/s in the millions still read 1000000, not 1.0 with a 1e6 label."""
    from PIL import Image

    rows = lambda *tps: [{"concurrency": c, "tokens_per_s": t, "tokens_per_s_rounds": [t]} for c, t in zip((1, 8), tps)]
    speed = {"model": "tiny", "label": "synthetic", "servers": {"bf16-plain": rows(1.1e6, 2.0e6),
                                                               "bf16-tree8": rows(1.3e6, 2.4e6)}}
    (tmp_path / "speed_results.json").write_text(json.dumps(speed))
    figures = []
    save = plot_live.save_figure
    monkeypatch.setattr(plot_live, "save_figure", lambda fig, *a: figures.append(fig) or save(fig, *a))
    plot_live.main([str(tmp_path), "--out", str(tmp_path / "out")])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["speed.pdf", "speed.png"]
    assert (tmp_path / "out" / "speed.pdf").read_bytes().startswith(b"%PDF")
    assert Image.open(tmp_path / "out" / "speed.png").info["dpi"] == pytest.approx((200, 200), abs=0.1)
    (fig,) = figures
    fig.canvas.draw()
    for ax in fig.axes:
        assert ax.yaxis.get_offset_text().get_text() == ""
        assert "1000000" in [t.get_text() for t in ax.get_yticklabels()]


def test_the_speed_figure_names_the_gpu_and_release_the_run_recorded_or_the_flags_give(tmp_path, monkeypatch):
    rows = [{"concurrency": 1, "tokens_per_s": 500.0, "tokens_per_s_rounds": [500.0]}]
    titles = []
    monkeypatch.setattr(plot_live, "save_figure", lambda fig, *a: titles.append(fig._suptitle.get_text()) or [])
    for name, extra in (("recorded", {"gpu": "NVIDIA H100 80GB HBM3", "sglang": "0.5.17"}), ("old", {})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "speed_results.json").write_text(
            json.dumps({"model": "smollm2-135m", **extra, "servers": {"bf16-plain": rows}}))
    plot_live.main([str(tmp_path / "recorded")])
    plot_live.main([str(tmp_path / "old")])
    plot_live.main([str(tmp_path / "old"), "--gpu", "NVIDIA H200", "--sglang", "0.5.20"])
    assert titles == ["smollm2-135m on sglang 0.5.17, NVIDIA H100 80GB HBM3, bf16", "smollm2-135m, bf16",
                      "smollm2-135m on sglang 0.5.20, NVIDIA H200, bf16"]


def test_the_planner_figure_shows_each_auto_servers_choices_per_concurrency(tmp_path, monkeypatch):
    """From the app's tables: shares per shape from each level's summary (plan_choices), or its steps table where the
    summary predates them; servers that planned nothing get no panel, and a run without tables no figure."""
    from flashtree.results.live import write_live_run

    def rows(*shapes, chain=0):  # one request whose tree steps chose these (n, width), and `chain` chain steps
        return {"meta_info": {"customized_info": {"flashtree": [[0, 0, w - 1, 1, w, 0, n, w] for n, w in shapes]},
                              "completion_tokens": 2 * len(shapes) + chain, "prompt_tokens": 8,
                              "spec_verify_ct": len(shapes) + chain},
                "wall_time_s": 0.1}

    grown = {"tree": {"n": "auto", "policy": "best-first", "width": 32}}
    write_live_run(tmp_path / "runs" / "speed-bf16-auto-c1", [rows((1, 32), (1, 32), (1, 9))], grown, k=8, label="a")
    old = tmp_path / "runs" / "speed-bf16-auto-c8"
    write_live_run(old, [rows((1, 16), (1, 9), chain=3)], grown, k=8, label="b")
    summary = json.loads((old / "summary.json").read_text())
    del summary["plan_choices"]  # a run from before 2026-12-05: read from its steps table (the chain from its counts)
    (old / "summary.json").write_text(json.dumps(summary))
    write_live_run(tmp_path / "runs" / "speed-bf16-auto-c32", [rows(chain=4)], grown, k=8, label="d")  # chain only
    write_live_run(tmp_path / "runs" / "speed-bf16-chain-c1", [rows()], {"tree": {"n": 0}}, k=8, label="c")
    assert plot_live.plan_shares(tmp_path) == {
        "bf16-auto": {1: {"best-first,W=32": 2, "best-first,W=9": 1},
                      8: {"chain(W=32)": 3, "best-first,W=16": 1, "best-first,W=9": 1}, 32: {"chain(W=32)": 4}}}
    speed = [{"concurrency": c, "tokens_per_s": 100.0, "tokens_per_s_rounds": [100.0]} for c in (1, 8, 32)]
    (tmp_path / "speed_results.json").write_text(json.dumps({"model": "m", "servers": {"bf16-auto": speed}}))
    plot_live.main([str(tmp_path), "--out", str(tmp_path / "fig")])
    assert (tmp_path / "fig" / "planner.png").stat().st_size > 10_000
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "speed_results.json").write_text((tmp_path / "speed_results.json").read_text())
    plot_live.main([str(tmp_path / "plain")])
    assert not (tmp_path / "plain" / "planner.png").exists()
