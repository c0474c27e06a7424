"""Live server statistics land in the sweep's tables: same steps columns, the sweep's summary, collected alike."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest

from flashtree import metrics
from flashtree.results import store
from flashtree.results.collect import collect, load_results
from flashtree.results.live import live_steps, live_tables, write_live_run

CONFIG = {"dataset": {"name": "gsm8k"}, "target": {"name": "smollm2-135m"}, "drafter": {"name": "dspark"},
          "tree": {"n": 8, "width": 16}, "concurrency": 8}


def response(rows, completion, prompt_tokens=40, verify=None, wall=0.5, flat=False):
    """A /generate response as a tree server returns it (rows padded with None), plus the client's wall time."""
    meta = {"completion_tokens": completion, "prompt_tokens": prompt_tokens,
            "spec_verify_ct": len(rows) if verify is None else verify}
    padded = [x for row in rows for x in (row, None)]
    if flat:
        meta["flashtree"] = padded
    else:
        meta["customized_info"] = {"flashtree": padded}
    return {"text": "...", "meta_info": meta, "wall_time_s": wall}


REQUESTS = [
    response([[8, 5, 15, 3], [8, 2, 15, 0], [8, 8, 12, 4]], completion=10),
    response([[8, 1, 15, 1]], completion=3, wall=0.25, flat=True),
    response([[8, 6, 15, 2], [8, 4, 14, 2]], completion=7, verify=3),  # one step on the chain fallback
]


def test_live_steps_have_the_sweeps_columns_and_drop_the_padding():
    steps = live_steps(REQUESTS, CONFIG)
    assert tuple(steps.columns) == metrics.STEP_COLUMNS
    assert steps["prompt"].tolist() == [0, 0, 0, 1, 2, 2]
    assert steps["step"].tolist() == [0, 1, 2, 0, 0, 1]
    assert steps["accept_len"].tolist() == [3, 0, 4, 1, 2, 2]
    assert steps["committed"].tolist() == [4, 1, 5, 2, 3, 3]
    assert steps["distinct_candidates"].tolist() == [5, 2, 8, 1, 6, 4]
    assert steps["tree_size"].tolist() == [15, 15, 12, 15, 15, 14]
    assert steps["position"].tolist() == [41, 45, 46, 41, 41, 44]  # prompt + prefill's token + earlier commits
    assert (steps["policy"] == "vote").all()
    assert steps["oracle_len"].isna().all() and steps[[f"time_{s}_s" for s in metrics.STAGES]].isna().all().all()


def test_live_run_is_stored_summarised_and_collected_like_a_sweep(tmp_path):
    summary = write_live_run(tmp_path / "live" / "c8", REQUESTS, CONFIG, k=8, label="c8")
    assert summary["tau"] == pytest.approx(18 / 6)  # Σ committed / steps, the sweep's τ
    assert summary["tau"] == pytest.approx(1 + sum(summary["reach_per_depth"]))
    assert summary["accept_len_hist"][:5] == [1, 1, 2, 1, 1]
    assert summary["tokens_per_s"] == pytest.approx(20 / 1.25)
    assert summary["verify_steps"] == 7 and summary["tau_server"] == pytest.approx(20 / 7)
    assert math.isnan(summary["tau_oracle"])
    assert store.finished(tmp_path / "live" / "c8", summary["config_hash"])["mode"] == "live"
    steps = metrics.read_steps(tmp_path / "live" / "c8" / store.STEPS)
    assert len(steps) == 6

    table = collect(tmp_path / "live")
    (row,) = table.to_dict("records")
    assert (row["dataset"], row["policy"], row["tree.n"], row["tree.width"], row["mode"]) == ("gsm8k", "vote", 8, 16, "live")
    assert row["tau"] == pytest.approx(3.0)
    assert load_results(tmp_path / "live")["policy"].tolist() == ["vote"]


def test_a_request_without_tree_rows_counts_as_a_prompt_with_no_steps(tmp_path):
    chain_only = response([], completion=5, verify=3)
    steps = live_steps([REQUESTS[0], chain_only], CONFIG)
    assert set(steps["prompt"]) == {0}
    summary = write_live_run(tmp_path / "r", [REQUESTS[0], chain_only], CONFIG, k=8, label="r")
    assert summary["prompts"] == 2 and summary["steps"] == 3
    assert pd.read_parquet(tmp_path / "r" / store.PROMPTS)["steps"].tolist() == [3, 0]


def test_config_may_be_the_live_apps_dataclass(tmp_path):
    @dataclasses.dataclass
    class Tree:
        n: int = 8
        width: int = 16
        policy: str = "vote"

    @dataclasses.dataclass
    class Live:
        tree: Tree = dataclasses.field(default_factory=Tree)
        concurrency: int = 8

    summary = write_live_run(tmp_path / "d", REQUESTS, Live(), k=8, label="d")
    assert {k: summary["params"][k] for k in ("tree.n", "tree.width", "tree.policy", "concurrency")} == {
        "tree.n": 8, "tree.width": 16, "tree.policy": "vote", "concurrency": 8}
    assert summary["config"] == {"tree": {"n": 8, "width": 16, "policy": "vote"}, "concurrency": 8}


def test_an_auto_servers_rows_carry_the_planners_shape_and_a_fixed_servers_leave_it_unknown(tmp_path):
    """plan_choices: a planner's request-steps per shape, its chain's (sglang's verify steps without a tree row)
    among them; {} for a fixed server, whatever its fallbacks."""
    auto = response([[0, 0, 15, 3, 16, 0, 1, 16], [8, 6, 7, 2, 8, 0, 8, 8]], completion=7)
    fixed = response([[8, 6, 15, 2, 16, 0, 0, 0], [8, 4, 14, 2]], completion=6)  # a pre-planner row too
    steps = live_steps([auto, fixed], {**CONFIG, "tree": {"n": "auto"}})
    assert steps["plan_n"].tolist()[:2] == [1, 8] and steps["plan_width"].tolist()[:2] == [16, 8]
    assert steps["plan_n"][2:].isna().all() and steps["plan_width"][2:].isna().all()
    summary = write_live_run(tmp_path / "auto", [auto, auto, fixed], {**CONFIG, "tree": {"n": "auto"}}, k=8, label="a")
    assert summary["plan_choices"] == {"N=1,W=16": 2, "N=8,W=8": 2}
    grown = {**CONFIG, "tree": {"n": "auto", "policy": "best-first"}}
    assert live_tables([auto], grown, k=8)[2]["plan_choices"] == {"best-first,W=16": 1, "best-first,W=8": 1}
    # two more verify steps than tree rows: the chain's, named by the server's window
    chained = response([[8, 6, 7, 2, 8, 0, 8, 8]], completion=9, verify=3)
    planned = {**CONFIG, "tree": {"n": "auto", "width": 16}}
    assert live_tables([chained], planned, k=8)[2]["plan_choices"] == {"chain(W=16)": 2, "N=8,W=8": 1}
    assert live_tables([response([], completion=4, verify=2)], planned, k=8)[2]["plan_choices"] == {"chain(W=16)": 2}
    assert write_live_run(tmp_path / "fixed", [fixed], CONFIG, k=8, label="f")["plan_choices"] == {}
    fallback = response([[8, 6, 15, 2, 16, 0, 0, 0]], completion=5, verify=3)  # a fixed server's chain fallbacks
    assert live_tables([fallback], CONFIG, k=8)[2]["plan_choices"] == {}
