"""Accept tables: written from an exact replay of the shipped recording, read back with every problem named."""

import json

import pytest

from flashtree.engine.accept_table import accept_table, main, parse_shapes
from flashtree.engine.replay import Recording, replay
from flashtree.files import load_torch
from flashtree.planner.accept_table import AcceptTable, BadAcceptTable, load

RECORDING = "benchmarks/recordings/smollm2-dspark-gsm8k.pt"
SHIPPED = "benchmarks/data/simulate/smollm2-dspark-gsm8k.json"


@pytest.fixture(scope="module")
def recordings():
    return [Recording(**r) for r in load_torch(RECORDING, "recording")["recordings"][:4]]


def test_counts_are_the_replay_s_accept_lengths_and_tau_matches(recordings):
    table = accept_table(recordings, [(1, 8), (8, 16)])
    for n, w in [(1, 8), (8, 16)]:
        steps = [s.accept_len for rec in recordings for s in replay(rec, n, w)]
        assert sum(table.counts[(n, w)]) == len(steps)
        assert table.tau(n, w) == pytest.approx(1 + sum(steps) / len(steps))
    assert table.tau(8, 16) > table.tau(1, 8)  # trees accept more than the chain on the real drafter


def test_the_shipped_table_loads_and_nearest_shapes_never_overstate():
    """A shape the table lacks stands on a recorded one it contains (no more candidates, no wider tree), the same
    width first: N = 1 in a 32-token tree is the chain, not the 16-candidate tree of that width."""
    table = load(SHIPPED)
    assert table.nearest(8, 16) == (8, 16)
    assert table.nearest(64, 16) == (32, 16)  # same width first
    assert table.nearest(8, 12) == (8, 8)  # the narrower tree, not W = 16
    assert table.nearest(1, 32) == (1, 8) and table.nearest(4, 32) == (4, 8) and table.nearest(8, 32) == (8, 16)
    assert table.nearest(64, 128) == (32, 64)
    assert table.tau(1, 8) < table.tau(8, 8) < table.tau(32, 32)
    assert AcceptTable({(8, 16): (1, 1)}).nearest(4, 8) == (8, 16)  # nothing it contains: the nearest of all


def test_save_load_round_trip(tmp_path):
    t = AcceptTable({(4, 8): (1, 2, 3)}, source="x")
    t.save(tmp_path / "a.json")
    assert load(tmp_path / "a.json") == t


@pytest.mark.parametrize("text, message", [
    ("{", "not JSON"),
    ('{"format": "other", "version": 1}', "not a flashtree-accept-table file"),
    ('{"format": "flashtree-accept-table", "version": 1, "shapes": []}', "no shapes"),
    ('{"format": "flashtree-accept-table", "version": 1, "shapes": [{"n": 4}]}', r"shapes\[0\] needs integer"),
    ('{"format": "flashtree-accept-table", "version": 1, "shapes": [{"n": 4, "width": 8, "counts": [0, 0]}]}',
     "not all 0"),
])
def test_bad_tables_name_the_file_and_the_problem(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(BadAcceptTable, match=message) as err:
        load(path)
    assert str(path) in str(err.value)
    with pytest.raises(BadAcceptTable, match="cannot read it"):
        load(tmp_path / "missing.json")


def test_the_command_writes_a_table(tmp_path, capsys):
    from flashtree import cli

    out = tmp_path / "t.json"
    cli.main(["accept-table", RECORDING, "--shapes", "1x8,4x8", "--out", str(out)])
    assert sorted(load(out).counts) == [(1, 8), (4, 8)]
    assert "wrote" in capsys.readouterr().out
    assert json.loads(out.read_text())["format"] == "flashtree-accept-table"
    for bad in ("8", "0x8", "8x1"):
        with pytest.raises(ValueError, match="NxW"):
            parse_shapes(bad)
    with pytest.raises(SystemExit):
        main([RECORDING, "--shapes", "64x64", "--out", str(out)])  # the recording holds 32 candidates


def test_dspark_chain_in_a_wide_window_takes_the_recorded_chain():
    """DSPARK's chain in a 32-token window draws the recorded chain's lengths (the table's own width when it records
    no chain), not those of a 32-token tree."""
    table = AcceptTable({(1, 8): (1, 3), (8, 32): (0, 0, 1)})
    assert table.nearest(1, 32) == (1, 8)
    assert table.chain_width(32) == 8 and table.tau(1, table.chain_width(32)) == 1.75
    assert AcceptTable({(8, 32): (0, 1)}).chain_width(16) == 16


def test_best_first_trees_take_the_tree_row_of_their_width_whatever_n():
    """A best-first table records N = 1 for the chain and best-first trees of W tokens (N unused): a best-first tree
    takes the tree row of its width (no wider first), never the chain row, whatever N it carries."""
    table = load("benchmarks/data/simulate/smollm2-dflash-gsm8k-bestfirst.json")
    assert table.policy == "best-first"
    assert table.nearest(1, 16, grown=True) == (16, 16) and table.nearest(64, 8, grown=True) == (8, 8)
    assert table.nearest(1, 12, grown=True) == (8, 8) and table.nearest(1, 128, grown=True) == (32, 64)
    assert table.nearest(1, 16) == (1, 9)  # without grown, N = 1 is the chain (the negative control)
    assert table.tau(1, 16, grown=True) == table.tau(16, 16) > table.tau(1, 9) + 0.5
