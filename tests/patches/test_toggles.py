"""The FLASHTREE_* toggles: parsed and validated in one place, with one message per bad value."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import typing
from dataclasses import fields
from pathlib import Path

import pytest

from flashtree.patches import ToggleError, TreeToggles, read_toggles, toggles
from flashtree.patches.toggles import OTHER_VARIABLES, TOGGLES


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
    with pytest.raises(SystemExit, match="FLASHTREE_SEED is set but FLASHTREE_TREE_N is 0"):
        read_toggles({"FLASHTREE_TREE_N": "0", "FLASHTREE_SEED": "0"})
    with pytest.raises(SystemExit, match="unknown toggle FLASHTREE_TREE_MAXBS"):
        read_toggles({"FLASHTREE_TREE_N": "4", "FLASHTREE_TREE_MAXBS": "8"})
    with pytest.raises(SystemExit, match="FLASHTREE_FUSED_SAMPLER=1 only changes"):
        read_toggles({"FLASHTREE_FUSED_SAMPLER": "1"})
    assert read_toggles({"FLASHTREE_FUSED_SAMPLER": "0"}) is None  # its default: nothing to refuse, nothing to do
    with pytest.raises(SystemExit, match="FLASHTREE_SPLITKV_VERIFY=1 and FLASHTREE_EXACT_VERIFY=1 both"):
        read_toggles({"FLASHTREE_SPLITKV_VERIFY": "1", "FLASHTREE_EXACT_VERIFY": "1"})
    chain = read_toggles({"FLASHTREE_SPLITKV_VERIFY": "1"})  # works on DSPARK's chain, without trees
    assert chain.splitkv_verify and not chain.tree_enabled


@pytest.mark.parametrize(
    "name,closest",
    [
        ("FLASHTREE_N", "FLASHTREE_TREE_N"),
        ("FLASHTREE_WIDTH", "FLASHTREE_TREE_WIDTH"),
        ("FLASHTREE_BUDGET", "FLASHTREE_TREE_BUDGET"),
        ("FLASHTREE_MAX_BS", "FLASHTREE_TREE_MAX_BS"),
        ("FLASHTREE_VERIFY_SPLITKV", "FLASHTREE_SPLITKV_VERIFY"),
        ("FLASHTREE_SPLIT_KV_VERIFY", "FLASHTREE_SPLITKV_VERIFY"),
        ("FLASHTREE_TEMPERATURE", "FLASHTREE_DRAFT_TEMPERATURE"),
        ("FLASHTREE_POLICY", "FLASHTREE_TREE_POLICY"),
        ("FLASHTREE_GRAPH_DRAW", "FLASHTREE_GRAPH_DRAWS"),
        ("FLASHTREE_TREE_NN", "FLASHTREE_TREE_N"),
    ],
)
def test_misspelt_names_of_any_shape_are_refused_with_the_closest_toggle(name, closest):
    for env in ({name: "8"}, {"FLASHTREE_TREE_N": "4", name: "8"}, {name: ""}):
        with pytest.raises(ToggleError) as exc:
            read_toggles(env)
        assert str(exc.value).startswith(f"flashtree: unknown toggle {name} (did you mean {closest}?); allowed: ")
        assert "FLASHTREE_TREE_N, FLASHTREE_TREE_WIDTH" in str(exc.value)


def test_flashtree_variables_that_are_not_toggles_are_left_alone():
    others = {name: "x" for name in OTHER_VARIABLES}
    assert read_toggles(others) is None
    assert read_toggles({**others, "FLASHTREE_TREE_N": "4"}).tree_n == 4


def test_every_flashtree_variable_the_repository_reads_is_declared():
    """Every FLASHTREE_* name in flashtree's code, scripts, notebooks and configs is a toggle or one of
    OTHER_VARIABLES (else a server started from those scripts would be refused), and every OTHER_VARIABLES entry is
    still read somewhere."""
    root = Path(__file__).resolve().parents[2]
    found: dict[str, set[str]] = {}
    for folder in ("flashtree", "scripts", "benchmarks", "experiments", "notebooks"):
        for path in (root / folder).rglob("*"):
            if path.suffix in (".py", ".sh", ".ipynb", ".yaml") and path.name != "toggles.py":
                for name in re.findall(r"FLASHTREE_[A-Z][A-Z0-9_]*", path.read_text(errors="replace")):
                    found.setdefault(name, set()).add(str(path.relative_to(root)))
    undeclared = {name: sorted(where) for name, where in found.items() if name not in TOGGLES and name not in OTHER_VARIABLES}
    assert undeclared == {}
    assert set(OTHER_VARIABLES) <= set(found)


@pytest.mark.parametrize(
    "name,value",
    [
        ("FLASHTREE_TREE_N", "8_0"),
        ("FLASHTREE_TREE_N", "+8"),
        ("FLASHTREE_TREE_N", "\u0668"),  # ARABIC-INDIC DIGIT EIGHT: int() reads it as 8
        ("FLASHTREE_TREE_N", "0x8"),
        ("FLASHTREE_TREE_N", "8 0"),
        ("FLASHTREE_TREE_MAX_BS", "1_000"),
        ("FLASHTREE_SEED", "1_2"),
        ("FLASHTREE_DRAFT_TEMPERATURE", "0_7"),
        ("FLASHTREE_DRAFT_TEMPERATURE", "nan"),
        ("FLASHTREE_DRAFT_TEMPERATURE", "inf"),
    ],
)
def test_numbers_are_plain_decimal(name, value):
    env = {"FLASHTREE_TREE_N": "4", name: value}
    with pytest.raises(ToggleError) as exc:
        read_toggles(env)
    assert str(exc.value) == f"flashtree: {name}={value!r} is invalid; allowed: {TOGGLES[name].parse.allowed}"


@pytest.mark.parametrize(
    "env,field,want",
    [
        ({"FLASHTREE_TREE_N": " 8 "}, "tree_n", 8),
        ({"FLASHTREE_TREE_N": "008"}, "tree_n", 8),
        ({"FLASHTREE_TREE_N": "8", "FLASHTREE_TREE_WIDTH": "AUTO"}, "tree_width", 0),
        ({"FLASHTREE_TREE_N": "8", "FLASHTREE_DRAFT_TEMPERATURE": "0.7"}, "draft_temperature", 0.7),
        ({"FLASHTREE_TREE_N": "8", "FLASHTREE_DRAFT_TEMPERATURE": "2"}, "draft_temperature", 2.0),
        ({"FLASHTREE_TREE_N": "8", "FLASHTREE_DRAFT_TEMPERATURE": ".5"}, "draft_temperature", 0.5),
        ({"FLASHTREE_TREE_N": "8", "FLASHTREE_GRAPH_DRAWS": "Off"}, "graph_draws", False),
    ],
)
def test_valid_values_still_parse(env, field, want):
    assert getattr(read_toggles(env), field) == want


def test_every_toggle_is_one_field_and_every_field_one_toggle():
    declared = [f for f in fields(TreeToggles) if "toggle" in f.metadata]
    variables = [f.name for f in fields(TreeToggles) if not f.metadata.get("derived")]
    assert [f.name for f in declared] == variables, "a TreeToggles field no variable sets"
    assert [f.name for f in fields(TreeToggles) if f.metadata.get("derived")] == ["defaulted"]
    assert [t.field for t in TOGGLES.values()] == [f.name for f in declared]
    assert len({t.name for t in TOGGLES.values()}) == len(declared) and all(n.startswith("FLASHTREE_") for n in TOGGLES)
    hints = typing.get_type_hints(TreeToggles)
    for t in TOGGLES.values():
        assert type(t.default) is hints[t.field], t.name
        assert t.parse(t.parse.show(t.default)) == t.default, t.name  # the default, written as the README shows it
        assert t.needs_tree in ("", "set", "on"), t.name
        if t.name not in ("FLASHTREE_TREE_N", *toggles.TREE_DEFAULTS):  # setting a toggle to its default: no change
            assert read_toggles({"FLASHTREE_TREE_N": "4", t.name: t.parse.show(t.default)}) == read_toggles(
                {"FLASHTREE_TREE_N": "4"})
    assert TreeToggles() == TreeToggles(**{t.field: t.default for t in TOGGLES.values()})


def test_tree_policy():
    from flashtree.tree import DEFAULT_POLICY, policy_names

    assert TreeToggles().tree_policy == DEFAULT_POLICY == "vote"
    assert read_toggles({"FLASHTREE_TREE_N": "4"}).tree_policy == DEFAULT_POLICY
    t = read_toggles({"FLASHTREE_TREE_N": "4", "FLASHTREE_TREE_POLICY": "vote"})
    assert t.tree_policy == "vote" and "tree_policy=vote" in t.describe()
    assert {"prob", "best-first"} <= set(policy_names())
    for name in ("prob", "best-first"):  # the policies that read the draft's probabilities serve too
        assert read_toggles({"FLASHTREE_TREE_N": "4", "FLASHTREE_TREE_POLICY": name}).tree_policy == name
    with pytest.raises(ToggleError) as exc:
        read_toggles({"FLASHTREE_TREE_N": "4", "FLASHTREE_TREE_POLICY": "widest"})
    assert str(exc.value) == (
        "flashtree: FLASHTREE_TREE_POLICY='widest' is invalid; allowed: one of the registered tree policies: "
        f"{', '.join(policy_names())}"
    )
    with pytest.raises(ToggleError, match="FLASHTREE_TREE_POLICY is set but FLASHTREE_TREE_N is unset"):
        read_toggles({"FLASHTREE_TREE_POLICY": "vote"})


def test_tree_policy_reads_the_registry(monkeypatch):
    from flashtree.tree import policies

    monkeypatch.setitem(policies.POLICIES, "widest", policies.POLICIES["vote"])
    assert read_toggles({"FLASHTREE_TREE_N": "4", "FLASHTREE_TREE_POLICY": "widest"}).tree_policy == "widest"
    assert "vote, prob, best-first, widest" in toggles.markdown_table()


def test_readme_toggle_table_is_the_declaration():
    readme = toggles.README.read_text()
    assert toggles.readme_table(readme) == toggles.markdown_table(), (
        f"flashtree/patches/README.md's toggle table differs from flashtree/patches/toggles.py; rewrite it with "
        f"{toggles.REWRITE_TABLE}"
    )
    for t in TOGGLES.values():
        assert f"| `{t.name}` |" in toggles.readme_table(readme)


def test_write_readme_table_rewrites_only_the_table(tmp_path):
    stale = toggles.README.read_text().replace("| `FLASHTREE_SEED` |", "| `FLASHTREE_OLD_SEED` |")
    path = tmp_path / "README.md"
    path.write_text(stale)
    assert toggles.write_readme_table(path) is True
    assert path.read_text() == toggles.README.read_text()
    assert toggles.write_readme_table(path) is False


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
    assert ("FLASHTREE_TREE_N='lots' is invalid; allowed: 'auto' (the planner picks each decode batch's tree or "
            "DSPARK's chain) or an integer from 0 to 256") in out.stderr


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


def test_simulate_acc_needs_an_existing_file(tmp_path):
    table = tmp_path / "accept.json"
    table.write_text("{}")
    assert read_toggles({"FLASHTREE_TREE_N": "8", "FLASHTREE_SIMULATE_ACC": str(table)}).simulate_acc == str(table)
    assert read_toggles({"FLASHTREE_TREE_N": "8", "FLASHTREE_SIMULATE_ACC": "none"}).simulate_acc == ""
    with pytest.raises(ToggleError, match=r"FLASHTREE_SIMULATE_ACC='/no/such.json' is invalid; allowed: the path of an "
                                          r"accept table"):
        read_toggles({"FLASHTREE_TREE_N": "8", "FLASHTREE_SIMULATE_ACC": "/no/such.json"})
    chain = read_toggles({"FLASHTREE_SIMULATE_ACC": str(table)})  # a chain server's DSPARK steps draw from it too
    assert chain.simulate_acc == str(table) and not chain.tree_enabled


@pytest.mark.parametrize("plugins", ["", "flashtree", "other", "other, flashtree", " flashtree ,x", ",", "Flashtree"])
def test_excluded_plugin_check_reads_sglang_plugins_as_sglang_does(monkeypatch, plugins):
    """sglang's load_plugins_by_group skips an excluded plugin before importing it, so an excluded flashtree runs no
    code in the server (the limitation the README states); a launcher's check (refuse_excluded_plugin) refuses
    exactly the SGLANG_PLUGINS values under which sglang's own loader leaves flashtree's plugin out."""
    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group

    monkeypatch.setenv("SGLANG_PLUGINS", plugins)
    loaded = toggles.PLUGIN in load_plugins_by_group(GENERAL_PLUGINS_GROUP)
    environ = {"SGLANG_PLUGINS": plugins, "FLASHTREE_TREE_N": "8", "FLASHTREE_TREE_DEPTH": "4"}
    if loaded:
        toggles.refuse_excluded_plugin(environ)
        return
    with pytest.raises(SystemExit) as exc:
        toggles.refuse_excluded_plugin(environ)
    assert str(exc.value) == (
        f"flashtree: FLASHTREE_TREE_N, FLASHTREE_TREE_DEPTH set, but SGLANG_PLUGINS={plugins!r} leaves out the "
        "flashtree plugin, so sglang would never load it and the server would run DSPARK's chain; add flashtree to "
        "SGLANG_PLUGINS, unset SGLANG_PLUGINS, or unset the toggles"
    )
    toggles.refuse_excluded_plugin({"SGLANG_PLUGINS": plugins})  # no toggles: nothing to refuse
    toggles.refuse_excluded_plugin({"SGLANG_PLUGINS": plugins, "FLASHTREE_TREE_N": "0"})  # explicitly off


def test_plugin_name_is_the_entry_point_name():
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    section = text.split('[project.entry-points."sglang.srt.plugins"]', 1)[1].split("\n[", 1)[0]
    assert section.strip() == f'{toggles.PLUGIN} = "flashtree.patches:register"'
