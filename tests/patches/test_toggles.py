"""The FLASHTREE_* toggles: parsed and validated in one place, with one message per bad value."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from flashtree.patches import ToggleError, read_toggles


def test_unset_means_off():
    assert read_toggles({}) is None
    assert read_toggles({"FLASHTREE_TREE_N": "0"}) is None
    assert read_toggles({"FLASHTREE_TREE_N": ""}) is None
    assert read_toggles({"FLASHTREE_TORCH": "skip", "PATH": "/bin"}) is None


def test_values_parse():
    t = read_toggles(
        {
            "FLASHTREE_TREE_N": "8",
            "FLASHTREE_TREE_WIDTH": "6",
            "FLASHTREE_TREE_DEPTH": "4",
            "FLASHTREE_TREE_BUDGET": "64",
            "FLASHTREE_DRAFT_TEMPERATURE": "0.7",
            "FLASHTREE_DRAFT_ROWS": "5",
            "FLASHTREE_SPLITKV_VERIFY": "off",
            "FLASHTREE_FUSED_SAMPLER": "yes",
            "FLASHTREE_SEED": "3",
            "FLASHTREE_STAGE_TIMES": "100",
        }
    )
    assert (t.tree_n, t.tree_width, t.tree_depth, t.tree_budget, t.draft_temperature) == (8, 6, 4, 64, 0.7)
    assert t.draft_rows == 5 and read_toggles({"FLASHTREE_TREE_N": "4", "FLASHTREE_DRAFT_ROWS": "auto"}).draft_rows == 0
    assert (t.splitkv_verify, t.fused_sampler, t.seed, t.stage_times) == (False, True, 3, 100)
    assert read_toggles({"FLASHTREE_TREE_N": "4", "FLASHTREE_TREE_WIDTH": "auto"}).tree_width == 0
    assert read_toggles({"FLASHTREE_TREE_N": "4", "FLASHTREE_TREE_DEPTH": "auto"}).tree_depth == 0


@pytest.mark.parametrize(
    "name,value,allowed",
    [
        ("FLASHTREE_TREE_N", "eight", "an integer from 0 to 256"),
        ("FLASHTREE_TREE_N", "-1", "an integer from 0 to 256"),
        ("FLASHTREE_TREE_N", "1000", "an integer from 0 to 256"),
        ("FLASHTREE_TREE_WIDTH", "1", "'auto'"),
        ("FLASHTREE_TREE_DEPTH", "0", "'auto' (DSPARK's gamma) or an integer from 1 to 256"),
        ("FLASHTREE_DRAFT_TEMPERATURE", "0", "a number > 0"),
        ("FLASHTREE_DRAFT_ROWS", "0", "'auto' (DSPARK's gamma: the whole window) or an integer from 1 to 256"),
        ("FLASHTREE_SPLITKV_VERIFY", "maybe", "one of 1/0"),
        ("FLASHTREE_STAGE_TIMES", "often", "an integer from 0 to"),
        ("FLASHTREE_TREE_MAX_BS", "-1", "an integer from 0 to 65536"),
        ("FLASHTREE_TREE_MAX_BS", "65537", "an integer from 0 to 65536"),
        ("FLASHTREE_TREE_MAX_BS", "16.5", "an integer from 0 to 65536"),
        ("FLASHTREE_TREE_MAX_BS", "all", "an integer from 0 to 65536"),
    ],
)
def test_bad_value_names_variable_and_allowed(name, value, allowed):
    env = {"FLASHTREE_TREE_N": "4", name: value}
    with pytest.raises(SystemExit) as exc:
        read_toggles(env)
    msg = str(exc.value)
    assert isinstance(exc.value, ToggleError)
    assert name in msg and repr(value) in msg and allowed in msg


@pytest.mark.parametrize("value,want", [("0", 0), ("1", 1), (" 24 ", 24), ("65536", 65536)])
def test_tree_max_bs_parses(value, want):
    t = read_toggles({"FLASHTREE_TREE_N": "8", "FLASHTREE_TREE_MAX_BS": value})
    assert t.tree_max_bs == want and f"tree_max_bs={want}" in t.describe()
    assert read_toggles({"FLASHTREE_TREE_N": "8"}).tree_max_bs == 0  # default: no limit


def test_bad_tree_max_bs_message_is_one_line():
    with pytest.raises(SystemExit) as exc:
        read_toggles({"FLASHTREE_TREE_N": "8", "FLASHTREE_TREE_MAX_BS": "big"})
    assert str(exc.value) == "flashtree: FLASHTREE_TREE_MAX_BS='big' is invalid; allowed: an integer from 0 to 65536"


def test_typo_and_orphans_are_refused():
    with pytest.raises(SystemExit, match="unknown toggle FLASHTREE_TREE_NN"):
        read_toggles({"FLASHTREE_TREE_NN": "4"})
    with pytest.raises(SystemExit, match="FLASHTREE_TREE_WIDTH is set but FLASHTREE_TREE_N is unset"):
        read_toggles({"FLASHTREE_TREE_WIDTH": "4"})
    with pytest.raises(SystemExit, match="FLASHTREE_TREE_MAX_BS is set but FLASHTREE_TREE_N is unset"):
        read_toggles({"FLASHTREE_TREE_MAX_BS": "8"})
    with pytest.raises(SystemExit, match="unknown toggle FLASHTREE_TREE_MAXBS"):
        read_toggles({"FLASHTREE_TREE_N": "4", "FLASHTREE_TREE_MAXBS": "8"})
    with pytest.raises(SystemExit, match="FLASHTREE_FUSED_SAMPLER=1 only changes"):
        read_toggles({"FLASHTREE_FUSED_SAMPLER": "1"})


def _run(code: str, **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("FLASHTREE_")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)


def test_register_without_toggles_never_imports_sglang():
    code = (
        "import sys, flashtree.patches as p; p.register(); "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('sglang', 'hydra', 'wandb', 'pandas')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = _run(code)
    assert out.returncode == 0, out.stdout + out.stderr


def test_bad_toggle_stops_sglang_plugin_loader():
    """sglang's own load_plugins() swallows Exceptions; flashtree's SystemExit must get through it."""
    code = "from sglang.srt.plugins import load_plugins; load_plugins(); print('SERVER CAME UP')"
    prep = f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import sglang_cpu; sglang_cpu.prepare(); "
    out = _run(prep + code, FLASHTREE_TREE_N="lots", SGLANG_PLUGINS="flashtree")
    assert out.returncode != 0
    assert "SERVER CAME UP" not in out.stdout
    assert "FLASHTREE_TREE_N='lots' is invalid; allowed: an integer from 0 to 256" in out.stderr


def test_sglang_plugin_loader_installs_tree_path():
    code = (
        "from sglang.srt.plugins import load_plugins; load_plugins(); "
        "from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2 as W; "
        "from sglang.srt.managers.scheduler import Scheduler as S; "
        "print(W._forward_decode.__flashtree_patch__, S._add_request_to_queue.__flashtree_patch__)"
    )
    prep = f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import sglang_cpu; sglang_cpu.prepare(); "
    out = _run(prep + code, FLASHTREE_TREE_N="4", SGLANG_PLUGINS="flashtree")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "DSparkWorkerV2._forward_decode Scheduler._add_request_to_queue" in out.stdout
