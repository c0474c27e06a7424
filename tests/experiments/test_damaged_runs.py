"""Resume and collect trust no file unchecked: a damaged summary, or steps that do not back it, means the run is
redone (with a message naming the file); an empty or missing results table is one clear message."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from flashtree import metrics
from flashtree.results import collect, plots, store


def finished_run(run_dir, steps: int = 3):
    rows = [{c: 0 for c in metrics.STEP_COLUMNS} | {"prompt": 0, "step": i} for i in range(steps)]
    prompts = pd.DataFrame([{"prompt": 0, "prompt_tokens": 4, "new_tokens": steps, "steps": steps, "wall_time_s": 1.0}])
    head = {"label": "x", "mode": "direct", "config_hash": "h", "steps": steps, "tau": 1.0}
    return store.write_run(run_dir, metrics.steps_frame(rows), prompts, head, params={"tree.n": 1}, config={})


def test_a_healthy_finished_run_is_trusted(tmp_path):
    finished_run(tmp_path)
    assert store.finished(tmp_path, "h")["tau"] == 1.0


def test_a_damaged_summary_is_set_aside_and_the_run_redone(tmp_path, capsys):
    finished_run(tmp_path)
    (tmp_path / "summary.json").write_text('{"status":')
    assert store.finished(tmp_path, "h") is None
    out = capsys.readouterr().out
    assert f"{tmp_path / 'summary.json'} is damaged" in out and "the run is redone" in out
    assert (tmp_path / "summary.json.damaged").is_file() and not (tmp_path / "summary.json").exists()


@pytest.mark.parametrize("damage, why", [
    (lambda d: (d / "steps.parquet").unlink(), "steps.parquet is missing"),
    (lambda d: (d / "steps.parquet").write_bytes((d / "steps.parquet").read_bytes()[:100]), "steps.parquet is damaged"),
    (lambda d: finished_run(d / "other", steps=1) and (d / "other" / "steps.parquet").replace(d / "steps.parquet"),
     "holds 1 steps, the summary 3"),
])
def test_steps_that_do_not_back_the_summary_mean_the_run_is_redone(tmp_path, capsys, damage, why):
    finished_run(tmp_path)
    damage(tmp_path)
    assert store.finished(tmp_path, "h") is None
    out = capsys.readouterr().out
    assert why in out and "the run is redone" in out


def test_another_steps_schema_version_means_the_run_is_redone(tmp_path, capsys):
    finished_run(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    (tmp_path / "summary.json").write_text(json.dumps({**summary, "steps_schema_version": 1}))
    assert store.finished(tmp_path, "h") is None
    assert "steps schema version 1" in capsys.readouterr().out


def test_collect_names_a_damaged_summary_and_leaves_it_out(tmp_path, capsys):
    finished_run(tmp_path / "a")
    finished_run(tmp_path / "b")
    (tmp_path / "b" / "summary.json").write_text('{"status":')
    assert len(collect.collect(tmp_path)) == 1
    assert f"{tmp_path / 'b' / 'summary.json'} is damaged" in capsys.readouterr().out


def test_collect_refuses_a_missing_sweep_directory_and_creates_nothing(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        collect.main([str(tmp_path / "typo")])
    assert exit_.value.code == 2
    assert f"{tmp_path / 'typo'}: no such sweep directory" in capsys.readouterr().err
    assert not (tmp_path / "typo").exists()


def test_plots_and_the_notebook_loader_on_an_empty_or_missing_table_say_so(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    collect.collect(tmp_path / "empty")
    with pytest.raises(collect.EmptyResults, match="no finished runs"):
        collect.load_results(tmp_path / "empty")
    for where, what in ((tmp_path / "empty", "no finished runs"), (tmp_path / "missing", "no summary.parquet")):
        with pytest.raises(SystemExit) as exit_:
            plots.main([str(where)])
        assert exit_.value.code == 1
        assert what in capsys.readouterr().err
