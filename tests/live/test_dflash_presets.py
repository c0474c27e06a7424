"""The DFLASH live presets: SmolLM2's DFLASH drafter and the 8B-shaped dummy DFLASH draft compose into DFLASH server
commands (no DSPARK block flag, wider windows through --speculative-num-draft-tokens alone), the prob policy reaches
the environment, and the dummy writer's draft config is DFlashDraftModel's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashtree.dspark.dflash_format import load_dflash_config
from flashtree.live.commands import phase_instances
from flashtree.live.config import to_live_config
from flashtree.live.dummy import write
from flashtree.planner.accept_table import load as load_table

from .helpers import compose


def spec_args(argv: tuple) -> dict:
    i = argv.index("--speculative-algorithm")
    return {"algorithm": argv[i + 1], "window": argv[argv.index("--speculative-num-draft-tokens") + 1],
            "dspark_block": "--speculative-dspark-block-size" in argv,
            "draft": argv[argv.index("--speculative-draft-model-path") + 1]}


def test_dflash_smollm2_preset_chain_against_trees():
    cfg = to_live_config(compose("+preset=dflash-smollm2"))
    plan = phase_instances(cfg)
    assert list(plan) == ["identity", "speed"] and cfg.phases.speed.concurrencies == [1, 8, 32]
    speed = {i.server: i for i in plan["speed"]}
    assert list(speed) == ["plain", "chain", "tree16-w16-bestfirst", "tree32-w32-bestfirst", "auto-bestfirst"]
    assert "--speculative-algorithm" not in speed.pop("plain").argv
    for inst in speed.values():
        assert spec_args(inst.argv)["algorithm"] == "DFLASH" and not spec_args(inst.argv)["dspark_block"]
        assert spec_args(inst.argv)["draft"] == "/tmp/ft-dflash-draft"
    assert spec_args(speed["chain"].argv)["window"] == "9" and "FLASHTREE_TREE_N" not in speed["chain"].env
    assert spec_args(speed["tree32-w32-bestfirst"].argv)["window"] == "32"
    assert speed["tree32-w32-bestfirst"].env["FLASHTREE_TREE_POLICY"] == "best-first"
    assert spec_args(speed["tree16-w16-bestfirst"].argv)["window"] == "16"
    assert speed["tree32-w32-bestfirst"].env["FLASHTREE_TREE_DEPTH"] == "8"
    # the planner: one toggle and the policy; its window bounds the widths it may choose
    auto = speed["auto-bestfirst"]
    assert auto.env["FLASHTREE_TREE_N"] == "auto" and auto.env["FLASHTREE_TREE_POLICY"] == "best-first"
    assert spec_args(auto.argv)["window"] == "32" and "FLASHTREE_TREE_DEPTH" not in auto.env
    assert [i.server for i in plan["identity"]] == ["plain", "chain-exact", "tree32-w32-exact",
                                                    "tree32-w32-bestfirst-exact"]
    assert plan["identity"][3].env["FLASHTREE_EXACT_VERIFY"] == "1"
    assert "--speculative-algorithm" not in plan["identity"][0].argv
    prob8 = phase_instances(to_live_config(compose("+preset=dflash-smollm2", "run=[speed]",
                                                   "phases.speed.servers=[tree8-prob]")))["speed"][0]
    assert prob8.env["FLASHTREE_TREE_POLICY"] == "prob" and spec_args(prob8.argv)["window"] == "9"


def test_qwen3_8b_dummy_dflash_preset_writes_a_dflash_draft(tmp_path):
    cfg = to_live_config(compose("+preset=qwen3-8b-dummy-dflash", f"live.work_dir={tmp_path}"))
    speed = phase_instances(cfg)["speed"]
    assert [i.server for i in speed] == ["chain-dflashtab", "tree16-w16-dflashtab", "tree16-w16-bestfirst-dflashtab"]
    assert [spec_args(i.argv)["window"] for i in speed] == ["16", "16", "16"]
    assert all(spec_args(i.argv)["algorithm"] == "DFLASH" for i in speed)
    envs = {i.server: i.env for i in speed}
    # each at the acceptance of flashtree's DFLASH draft, best-first at its own policy's table
    assert envs["chain-dflashtab"]["FLASHTREE_SIMULATE_ACC"].endswith("smollm2-dflash-gsm8k.json")
    assert envs["tree16-w16-dflashtab"]["FLASHTREE_SIMULATE_ACC"].endswith("smollm2-dflash-gsm8k.json")
    best = envs["tree16-w16-bestfirst-dflashtab"]
    assert best["FLASHTREE_SIMULATE_ACC"].endswith("smollm2-dflash-gsm8k-bestfirst.json")
    assert best["FLASHTREE_TREE_POLICY"] == "best-first"
    tables = {name: load_table(Path(env["FLASHTREE_SIMULATE_ACC"])) for name, env in envs.items()}
    chain = tables["chain-dflashtab"]
    assert chain.tau(1, chain.chain_width(16)) == pytest.approx(2.439, abs=1e-3)  # DFLASH's chain in both tables
    assert tables["tree16-w16-bestfirst-dflashtab"].tau(1, 9) == chain.tau(1, 9)
    assert tables["tree16-w16-bestfirst-dflashtab"].tau(16, 16) > tables["tree16-w16-dflashtab"].tau(16, 16)
    assert "FLASHTREE_TREE_N" not in envs["chain-dflashtab"] and envs["tree16-w16-dflashtab"]["FLASHTREE_TREE_N"] == "16"
    # the trees verify through flashtree's split-KV kernel, DFLASH's chain through its own causal verify
    assert "FLASHTREE_SPLITKV_VERIFY" not in envs["chain-dflashtab"]
    assert envs["tree16-w16-dflashtab"]["FLASHTREE_SPLITKV_VERIFY"] == best["FLASHTREE_SPLITKV_VERIFY"] == "1"
    simtab = phase_instances(to_live_config(compose(
        "+preset=qwen3-8b-dummy-dflash", "phases.speed.servers=[chain-simtab,tree8-simtab,tree16-w16-simtab]")))
    assert all(i.env["FLASHTREE_SIMULATE_ACC"].endswith("smollm2-dspark-gsm8k.json") for i in simtab["speed"])
    acc1 = phase_instances(to_live_config(compose(
        "+preset=qwen3-8b-dummy-dflash", "phases.speed.servers=[chain-sim-acc1,tree8-sim-acc1,tree32-w32-sim-acc1]")))
    assert [spec_args(i.argv)["window"] for i in acc1["speed"]] == ["16", "16", "32"]
    _target, draft = write(cfg.model.dummy, cfg.model.target, cfg.model.draft, cfg.model.draft_block_size,
                           cfg.model.algorithm)
    raw = json.loads(draft.read_text())
    assert raw["architectures"] == ["DFlashDraftModel"] and "markov_rank" not in raw
    assert raw["block_size"] == raw["dflash_config"]["block_size"] == 16 and raw["num_hidden_layers"] == 5
    assert load_dflash_config(draft.parent).block_size == cfg.model.draft_block_size == 15


def test_the_dflash_planners_run_beside_the_chain_and_the_fixed_best_first_tree():
    """auto-bestfirst-dflashtab (and auto-dflashtab, votes) on the 8B dummy DFLASH preset: FLASHTREE_TREE_N=auto in
    the draft's block (window 16, from the model), its policy and its policy's table in the environment."""
    servers = "[chain-dflashtab,tree16-w16-bestfirst-dflashtab,auto-bestfirst-dflashtab,auto-dflashtab]"
    cfg = to_live_config(compose("+preset=qwen3-8b-dummy-dflash", f"phases.speed.servers={servers}"))
    speed = {i.server: i for i in phase_instances(cfg)["speed"]}
    assert list(speed) == servers[1:-1].split(",")
    best, votes = speed["auto-bestfirst-dflashtab"], speed["auto-dflashtab"]
    for inst in (best, votes):
        assert spec_args(inst.argv)["window"] == "16" and spec_args(inst.argv)["algorithm"] == "DFLASH"
        assert inst.env["FLASHTREE_TREE_N"] == "auto" and inst.env["SGLANG_SIMULATE_ACC_LEN"] == "1"
    assert best.env["FLASHTREE_TREE_POLICY"] == "best-first" and "FLASHTREE_TREE_POLICY" not in votes.env
    assert best.env["FLASHTREE_SIMULATE_ACC"].endswith("smollm2-dflash-gsm8k-bestfirst.json")
    assert votes.env["FLASHTREE_SIMULATE_ACC"].endswith("smollm2-dflash-gsm8k.json")
