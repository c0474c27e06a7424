"""A collected table never shows two configurations as identical rows, and says when it mixes prompt sets."""

from __future__ import annotations

from flashtree.results import collect
from flashtree.results.store import write_json_atomic

from .test_damaged_runs import finished_run


def table(tmp_path, params: list[dict]):
    for i, p in enumerate(params):
        summary = finished_run(tmp_path / str(i))
        summary["params"] = {"dataset.name": "builtin", "tree.policy": "vote", "tree.n": 4, "tree.width": 8, **p}
        write_json_atomic(tmp_path / str(i) / "summary.json", summary)
    return collect.format_table(collect.collect(tmp_path))


def test_rows_that_differ_only_in_an_unswept_parameter_show_it(tmp_path):
    text = table(tmp_path, [{"engine.max_new_tokens": 8}, {"engine.max_new_tokens": 6}])
    header = text.splitlines()[0].split()
    assert "engine.max_new_tokens" in header and "dataset.name" not in header
    assert "note:" not in text


def test_a_table_of_two_prompt_sets_says_so(tmp_path):
    text = table(tmp_path, [{"dataset.limit": 1}, {"dataset.limit": 2}])
    assert "note: the builtin rows come from different prompt sets (dataset.limit = 1, 2)" in text
