"""Figures of a live run: tokens/s per server and concurrency, and where a tree step's time goes.

usage: python benchmarks/live/plot_live.py RESULTS_DIR [--out DIR] [--gpu NAME] [--sglang RELEASE]
RESULTS_DIR holds speed_results.json and stage_times.txt (experiments/live.py's live.out_dir, or a recorded run of
the earlier scripts under benchmarks/data/live/results-*); figures, each as .pdf and .png (flashtree.results.plots's
save_figure): speed (bars: the mean over rounds; dots: each round, since rounds of one server can differ by more than
servers do), planner (per FLASHTREE_TREE_N=auto server, the share of its request-steps each shape took at each
concurrency, its chain's included; only when RESULTS_DIR holds the app's tables, runs/), stages (mean ms per tree step
per stage per stage-timed tree server, at batch size 1 and, where the stage phase ran at concurrency 32, at 28-32
requests; only when a server ran with FLASHTREE_STAGE_TIMES).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from flashtree.results.plots import save_figure

LINE = re.compile(r"steps (\d+)-\d+; mean bs ([\d.]+)\): (.*); total")
TAG = re.compile(r"^\[server_(\S+)\] ")  # each line tagged with its server's log
PREFIXES = ("b_", "bf16-")  # the precision of a recorded tag / of the app's instance names


# stages.png's panels: (title, mean batch size of the windows, tolerance)
PANELS = (("batch size 1", 1.0, 0.15), ("batch size 28-32", 30.0, 2.0))


def stage_means(path: Path, batch: float = 1.0, tolerance: float = 0.15) -> dict[str, dict]:
    """Server -> (stage -> mean ms) from stage_times.txt, over the windows whose mean batch size is within `tolerance`
    of `batch`, the first window (Triton compiles) left out. A server's block restarts at steps 1-...; untagged files name their
    blocks "1", "2", ... in log order."""
    blocks: list[tuple[str, list]] = []
    for line in path.read_text().splitlines():
        m = LINE.search(line)
        if not m:
            continue
        tag = TAG.match(line)
        if m.group(1) == "1" or not blocks:
            blocks.append((tag.group(1) if tag else str(len(blocks) + 1), []))
        if m.group(1) != "1" and abs(float(m.group(2)) - batch) <= tolerance:
            blocks[-1][1].append(dict((k, float(v)) for k, v in (part.split() for part in m.group(3).split(", "))))
    return {name: {k: sum(w[k] for w in ws) / len(ws) for k in ws[0]} for name, ws in blocks if ws}


def short(tag: str) -> str:
    for prefix in PREFIXES:
        tag = tag.removeprefix(prefix)
    return tag


RUN_DIR = re.compile(r"^speed-(.+)-c(\d+)$")  # the app's tables: runs/speed-SERVER-cCONCURRENCY


def plan_shares(results: Path) -> dict[str, dict[int, dict[str, int]]]:
    """Planner servers -> concurrency -> request-steps per shape it chose, its chain's included (`plan_choices`), from
    the app's tables in RESULTS_DIR/runs (each level's summary.json, or its steps.parquet where the summary predates
    plan_choices; the chain's steps, where a summary predates them, from its verify and tree step counts)."""
    import pandas as pd

    from flashtree import metrics
    from flashtree.planner.shapes import Shape
    from flashtree.results.live import planner_choices

    shares: dict[str, dict[int, dict[str, int]]] = {}
    for run in sorted((results / "runs").glob("speed-*")):
        m = RUN_DIR.match(run.name)
        if not m:
            continue
        summary = json.loads((run / "summary.json").read_text())
        choices = summary.get("plan_choices")
        if choices is None and (run / "steps.parquet").exists():
            steps = pd.read_parquet(run / "steps.parquet")
            policy = steps["policy"].iloc[0] if len(steps) else ""
            choices = metrics.plan_choices(steps, lambda n, w: Shape(n, w, policy=policy).label())
        if choices is not None and "verify_steps" in summary:
            choices = planner_choices(choices, summary.get("params", {}), summary["verify_steps"], summary["steps"])
        if choices:
            shares.setdefault(m.group(1), {})[int(m.group(2))] = choices
    return shares


def speed_figure(plt, result: dict, title: str):
    speed = result["servers"]
    tags = list(speed)
    concs = [r["concurrency"] for r in speed[tags[0]]]
    fig, axes = plt.subplots(1, len(concs), figsize=(4.2 * len(concs), 3.4), squeeze=False)
    for ax, i in zip(axes[0], range(len(concs))):
        vals = [speed[t][i].get("tokens_per_s", 0) for t in tags]
        ax.bar(range(len(tags)), vals, color=["0.6" if "plain" in t else "C0" if "chain" in t else "C1" for t in tags])
        for x, t in enumerate(tags):
            rounds = speed[t][i].get("tokens_per_s_rounds", [])
            ax.plot([x] * len(rounds), rounds, "k.", ms=4)
        ax.set_xticks(range(len(tags)), [short(t) for t in tags], rotation=45, ha="right")
        ax.set_title(f"concurrency {concs[i]}")
        ax.set_ylabel("output tokens / s")
        ax.ticklabel_format(axis="y", style="plain", useOffset=False)  # 1200000, not 1.2 under a 1e6 label
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def planner_figure(plt, shares: dict[str, dict[int, dict[str, int]]], title: str):
    """Per planner server, the share of its request-steps at each concurrency that each shape (its chain among them)
    took (stacked)."""
    fig, axes = plt.subplots(1, len(shares), figsize=(4.2 * len(shares), 3.4), squeeze=False)
    # one colour per shape across the panels; the chain first, in grey
    every = sorted({label for by_conc in shares.values() for choices in by_conc.values() for label in choices},
                   key=lambda x: (not x.startswith("chain"),
                                  [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", x)]))  # W=9 before W=16
    trees = [label for label in every if not label.startswith("chain")]
    colour = {label: "0.6" if label.startswith("chain") else f"C{trees.index(label) % 10}" for label in every}
    for ax, (server, by_conc) in zip(axes[0], shares.items()):
        concs = sorted(by_conc)
        bottom = [0.0] * len(concs)
        for label in [x for x in every if any(x in choices for choices in by_conc.values())]:
            vals = [by_conc[c].get(label, 0) / sum(by_conc[c].values()) for c in concs]
            ax.bar([str(c) for c in concs], vals, bottom=bottom, label=label, color=colour[label])
            bottom = [a + b for a, b in zip(bottom, vals)]
        ax.set_title(short(server))
        ax.set_xlabel("concurrency")
        ax.set_ylabel("share of request-steps")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def stages_figure(plt, panels: list):
    fig, axes = plt.subplots(len(panels), 1, figsize=(6.5, 2.2 + 1.2 * len(panels)), squeeze=False, sharex=True)
    for ax, (title, means) in zip(axes[:, 0], panels):
        names = [short(t) for t in means]
        rows = list(means.values())
        left = [0.0] * len(rows)
        for k in rows[0]:
            vals = [m[k] for m in rows]
            ax.barh(names, vals, left=left, label=k)
            left = [a + b for a, b in zip(left, vals)]
        ax.set_title(title, fontsize=9)
        ax.ticklabel_format(axis="x", style="plain", useOffset=False)
    axes[-1, 0].set_xlabel("ms per tree step")
    fig.tight_layout()
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, ncol=len(labels), fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 0.0))
    return fig


def main(argv=None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ap = argparse.ArgumentParser()
    ap.add_argument("results", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    # for results that do not record them (before 2026-12-05)
    ap.add_argument("--gpu", default=None, help="the GPU the run measured")
    ap.add_argument("--sglang", default=None, help="the servers' sglang release")
    args = ap.parse_args(argv)
    out = args.out or args.results

    result = json.loads((args.results / "speed_results.json").read_text())
    label = f" ({result['label']})" if result.get("label") else ""
    release, gpu = args.sglang or result.get("sglang"), args.gpu or result.get("gpu")
    where = ", ".join(x for x in (release and f"sglang {release}", gpu) if x)
    title = f"{result.get('model', 'smollm2-135m')}{' on ' + where if where else ''}, bf16{label}"
    written = save_figure(speed_figure(plt, result, title), out, "speed")

    shares = plan_shares(args.results)
    if shares:  # a planner server (FLASHTREE_TREE_N=auto) ran, and the run's tables are there
        written += save_figure(planner_figure(plt, shares, f"the planner's choices: {title}"), out, "planner")

    stages = args.results / "stage_times.txt"
    panels = [(title, stage_means(stages, batch, tol)) for title, batch, tol in PANELS] if stages.exists() else []
    panels = [(title, means) for title, means in panels if means]
    if panels:  # a stage-timed server ran
        written += save_figure(stages_figure(plt, panels), out, "stages")
    print(*written)


if __name__ == "__main__":
    main()
