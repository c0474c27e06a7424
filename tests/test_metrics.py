"""The intervals of flashtree.metrics: a paired percentile bootstrap over prompts that respects the quantity, and
comparisons with the chain paired prompt by prompt (in summaries and in the collected table)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from flashtree import metrics
from flashtree.results import collect
from flashtree.results.store import write_run

RNG = np.random.default_rng(7)
# Prompts of very different difficulty: τ per prompt from 1.3 to 4.
CHAIN_STEPS = RNG.integers(20, 60, size=12)
CHAIN_COMMITTED = (CHAIN_STEPS * RNG.uniform(1.3, 4.0, size=12)).round()


def test_the_interval_is_scipys_paired_percentile_bootstrap():
    num, den = CHAIN_COMMITTED, CHAIN_STEPS.astype(float)
    point, lo, hi = metrics.ratio_ci(num, den)
    ref = stats.bootstrap((num, den), lambda a, b, axis=-1: a.sum(axis) / b.sum(axis), paired=True, vectorized=True,
                          method="percentile", n_resamples=20000, rng=np.random.default_rng(1)).confidence_interval
    assert point == pytest.approx(num.sum() / den.sum())
    assert lo == pytest.approx(ref.low, abs=0.03) and hi == pytest.approx(ref.high, abs=0.03)


def test_tokens_per_s_at_two_prompts_has_no_negative_bound():
    # The linearised ratio interval gave [-1100, 1300] here (t(0.975, 1) = 12.7).
    point, lo, hi = metrics.ratio_ci(np.array([10.0, 200.0]), np.array([1.0, 1.0]))
    assert 0 < lo <= point <= hi
    assert lo >= 10 and hi <= 200  # a ratio of resampled sums stays within the prompts' own rates


def test_fewer_than_two_prompts_or_no_timing_give_nan_bounds():
    assert np.isnan(metrics.ratio_ci([3.0], [1.0])[1:]).all()
    assert np.isnan(metrics.ratio_ci([3.0, 4.0], [np.nan, np.nan])).all()  # replay: no wall time


def summary_of(committed, steps, prompts=None, wall=None):
    prompts = list(range(len(steps))) if prompts is None else prompts
    return {
        "tau": float(np.sum(committed) / np.sum(steps)),
        "prompt_ids": prompts, "prompt_committed": list(committed), "prompt_steps": list(steps),
        "prompt_new_tokens": list(committed), "prompt_wall_time_s": list(wall if wall is not None else [np.nan] * len(steps)),
    }


def test_the_gain_over_the_chain_is_paired_so_a_steady_gain_is_resolved():
    chain = summary_of(CHAIN_COMMITTED, CHAIN_STEPS)
    tree_steps = (CHAIN_STEPS / 1.1).round()  # every prompt ~10% fewer steps for the same tokens
    tree = summary_of(CHAIN_COMMITTED, tree_steps)
    c = metrics.compare_with_chain(tree, chain)
    assert c["tau_gain"] == pytest.approx(tree["tau"] / chain["tau"] - 1)
    assert 0.05 < c["tau_gain_ci_lo"] < c["tau_gain"] < c["tau_gain_ci_hi"] < 0.15
    # Unpaired, the two τ intervals overlap: prompt difficulty swamps the gain.
    _, _, chain_hi = metrics.ratio_ci(CHAIN_COMMITTED, CHAIN_STEPS)
    _, tree_lo, _ = metrics.ratio_ci(CHAIN_COMMITTED, tree_steps)
    assert tree_lo < chain_hi


def test_the_comparison_pairs_prompts_by_id_not_by_position():
    chain = summary_of(CHAIN_COMMITTED, CHAIN_STEPS)
    order = RNG.permutation(12)[:9]  # the tree ran 9 of the prompts, listed in another order
    tree = summary_of(CHAIN_COMMITTED[order], CHAIN_STEPS[order], prompts=list(order))
    c = metrics.compare_with_chain(tree, chain)
    assert c["tau_gain"] == pytest.approx(0) and c["tau_gain_ci_lo"] == pytest.approx(0)


def test_speedup_is_a_positive_paired_ratio_of_tokens_per_s():
    wall = RNG.uniform(0.5, 3.0, size=12)
    chain = summary_of(CHAIN_COMMITTED, CHAIN_STEPS, wall=wall)
    tree = summary_of(CHAIN_COMMITTED, CHAIN_STEPS, wall=wall / 1.25)
    c = metrics.compare_with_chain(tree, chain)
    assert c["speedup"] == pytest.approx(1.25) and c["speedup_ci_lo"] == pytest.approx(1.25)
    assert np.isnan(metrics.compare_with_chain(summary_of([3, 4], [1, 2]), summary_of([3, 4], [1, 2]))["speedup"])


def run_dir(tmp_path, n: int, width: int, policy: str, steps_per_prompt):
    rows = [{c: 0 for c in metrics.STEP_COLUMNS} | {"prompt": p, "step": i, "committed": 1 if (n, policy) == (1, "vote") else 2}
            for p, count in enumerate(steps_per_prompt) for i in range(count)]
    steps = metrics.steps_frame(rows)
    prompts = pd.DataFrame([{"prompt": p, "prompt_tokens": 4, "new_tokens": 2 * c, "steps": c, "wall_time_s": 1.0}
                            for p, c in enumerate(steps_per_prompt)])
    head = {"label": f"{n}-{width}-{policy}", "mode": "direct", "config_hash": "h", **metrics.summarize(steps, prompts, 4)}
    params = {"dataset.name": "builtin", "tree.policy": policy, "tree.n": n, "tree.width": width}
    write_run(tmp_path / f"{n}-{width}-{policy}", steps, prompts, head, params=params, config={})


def test_the_collected_table_compares_each_row_with_the_vote_chain_at_its_width(tmp_path):
    for policy in ("vote", "best-first"):
        for n in (1, 4):
            for width in (4, 8):
                run_dir(tmp_path, n, width, policy, [3, 5, 8])
    df = collect.collect(tmp_path).set_index(["policy", "tree.n", "tree.width"])
    assert df.loc[("vote", 4, 8), "tau_gain"] == pytest.approx(1.0)  # τ 2 against the chain's 1
    assert df.loc[("vote", 1, 8), "tau_gain"] == pytest.approx(0)
    # best-first grows a tree even at N = 1: it is compared with the vote chain, not with itself
    assert df.loc[("best-first", 1, 4), "tau_gain"] == pytest.approx(1.0)
    text = collect.format_table(collect.collect(tmp_path))
    assert "gain" in text.splitlines()[0].split() and "+100.0% [+100.0, +100.0]" in text and "chain" in text
