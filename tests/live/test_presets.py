"""The live presets compose into the exact sglang command lines and environments, and the dry run prints them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flashtree.experiments.config import ConfigError
from flashtree.live import app, commands
from flashtree.live.commands import all_instances, instance, phase_instances
from flashtree.live.config import to_live_config

from .helpers import ROOT, compose

PY = sys.executable
SMOLLM2 = "/cache/models/smollm2-135m"
BASE = [PY, "-m", "sglang.launch_server", "--model-path", SMOLLM2, "--attention-backend", "triton",
        "--sampling-backend", "pytorch", "--max-total-tokens", "65536", "--context-length", "2048",
        "--cuda-graph-backend-prefill", "disabled", "--log-level", "info", "--sleep-on-idle", "--page-size", "1",
        "--mem-fraction-static", "0.08"]
BF16 = ["--dtype", "bfloat16", "--max-running-requests", "32", "--cuda-graph-bs-decode", "1", "2", "4", "8", "16",
        "24", "32"]
FP32 = ["--dtype", "float32", "--max-running-requests", "8", "--cuda-graph-bs-decode", "1", "2", "4", "8",
        "--enable-deterministic-inference"]
DSPARK = ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", "/drafts/smollm2"]


@pytest.fixture(scope="module")
def best():
    return to_live_config(compose("+preset=best", f"model.target={SMOLLM2}", "model.draft=/drafts/smollm2"))


def test_the_best_measured_server_command_and_env(best):
    inst = instance(best, "tree64-w64-budget512-rows8", "bf16", "speed", {})
    assert inst.name == "bf16-tree64-w64-budget512-rows8"
    assert inst.command(30044) == [
        *BASE, *BF16, *DSPARK, "--speculative-num-draft-tokens", "64", "--speculative-draft-attention-backend",
        "triton", "--speculative-dspark-block-size", "63", "--host", "127.0.0.1", "--port", "30044"]
    assert inst.env == {"FLASHTREE_TREE_N": "64", "FLASHTREE_TREE_DEPTH": "8", "FLASHTREE_TREE_BUDGET": "512",
                        "FLASHTREE_DRAFT_ROWS": "8", "FLASHTREE_DRAFT_TEMPERATURE": "0.7",
                        "FLASHTREE_FUSED_SAMPLER": "1", "FLASHTREE_GRAPH_DRAWS": "1"}


def test_the_policy_servers_set_the_policy_toggle(best):
    for server, policy in (("tree16-w16-prob", "prob"), ("tree16-w16-bestfirst", "best-first")):
        env = instance(best, server, "bf16", "speed", {}).env
        assert env["FLASHTREE_TREE_POLICY"] == policy and env["FLASHTREE_TREE_N"] == "16"
    assert "FLASHTREE_TREE_POLICY" not in instance(best, "tree16-w16", "bf16", "speed", {}).env


def test_chain_plain_and_exact_identity_servers(best):
    chain = instance(best, "chain", "bf16", "speed", {})
    assert chain.command(1) == [*BASE, *BF16, *DSPARK, "--speculative-num-draft-tokens", "9",
                                "--speculative-draft-attention-backend", "triton", "--host", "127.0.0.1", "--port", "1"]
    assert chain.env == {}  # DSPARK's own chain: no toggle at all
    plain = instance(best, "plain", "fp32", "identity", {})
    assert plain.command(2) == [*BASE, *FP32, "--host", "127.0.0.1", "--port", "2"] and plain.env == {}
    exact = instance(best, "tree64-w64-exact-rows8", "fp32", "identity", {})
    assert exact.argv[len(BASE):len(BASE) + len(FP32)] == tuple(FP32)
    assert exact.env["FLASHTREE_EXACT_VERIFY"] == "1" and "FLASHTREE_TREE_BUDGET" not in exact.env


def test_the_best_preset_runs_identity_then_speed(best):
    plan = phase_instances(best)
    assert list(plan) == ["identity", "speed"]
    assert [i.name for i in plan["identity"]] == ["fp32-plain", "fp32-chain-splitkv", "fp32-tree64-w64-exact-rows8",
                                                  "fp32-tree64-w64-splitkv-rows8"]
    assert [i.name for i in plan["speed"]] == ["bf16-chain", "bf16-tree64-w64-budget512-rows8",
                                               "bf16-tree64-w64-budget512-splitkv-rows8"]
    assert best.phases.speed.rounds == 6 and best.phases.speed.concurrencies == [1, 8, 32]
    assert best.phases.speed.backend == "ids"


def test_every_named_server_composes_in_both_precisions():
    cfg = to_live_config(compose())
    assert len(cfg.servers) >= 39  # every configuration of the runs in BENCHMARKS.md (benchmarks/live/README.md)
    for name in cfg.servers:
        for precision in ("fp32", "bf16"):
            inst = instance(cfg, name, precision, "speed", {})
            assert inst.argv[:3] == (PY, "-m", "sglang.launch_server")
    paged = instance(cfg, "tree64-w64-budget512-page16", "bf16", "speed", {})
    assert paged.argv[paged.argv.index("--page-size") + 1] == "16"
    # the default run: stage servers carry the phase's env and are their own processes
    plan = phase_instances(cfg)
    stage = {i.name: i for i in plan["stage"]}
    assert stage["bf16-tree8-stage"].env["FLASHTREE_STAGE_TIMES"] == "100"
    names = [i.name for i in all_instances(plan)]
    assert len(names) == len(set(names)) and "bf16-plain" in names and "bf16-tree8" in names


def test_qwen3_8b_dummy_preset():
    cfg = to_live_config(compose("+preset=qwen3-8b-dummy", "live.work_dir=/w"))
    plan = phase_instances(cfg)
    assert list(plan) == ["speed"] and cfg.phases.speed.concurrencies == [1, 8, 32, 64]
    assert cfg.phases.speed.backend == "ids" and cfg.phases.speed.max_new_tokens == 192
    assert cfg.prompts.source == "random" and cfg.prompts.input_len == 512
    plain, chain, tree = plan["speed"]
    target, draft = "/w/models/qwen3-8b-dummy/target", "/w/models/qwen3-8b-dummy/draft"
    common = [PY, "-m", "sglang.launch_server", "--model-path", target, "--attention-backend", "triton",
              "--sampling-backend", "pytorch", "--context-length", "8192", "--cuda-graph-backend-prefill", "disabled",
              "--log-level", "info", "--sleep-on-idle", "--page-size", "1", "--mem-fraction-static", "0.6",
              "--dtype", "bfloat16", "--max-running-requests", "64", "--cuda-graph-bs-decode", "1", "2", "4", "8",
              "16", "24", "32", "48", "64", "--max-total-tokens", "49152", "--load-format", "dummy",
              "--skip-tokenizer-init"]
    spec = ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", draft,
            "--speculative-num-draft-tokens", "8", "--speculative-draft-attention-backend", "triton",
            "--speculative-draft-load-format", "dummy"]
    assert plain.command(5) == [*common, "--host", "127.0.0.1", "--port", "5"]
    assert chain.command(6) == [*common, *spec, "--host", "127.0.0.1", "--port", "6"]
    assert chain.env == {"SGLANG_SIMULATE_ACC_LEN": "1.0"}
    assert tree.command(7) == [*common, *spec, "--host", "127.0.0.1", "--port", "7"]
    assert tree.env == {"FLASHTREE_TREE_N": "8", "FLASHTREE_FUSED_SAMPLER": "1", "FLASHTREE_GRAPH_DRAWS": "1"}
    assert {i.label for i in plan["speed"]} == {"dummy weights, simulated acceptance"}


def test_llama_and_4k_variants():
    llama = to_live_config(compose("+preset=llama31-8b-dummy"))
    assert llama.model.name == "llama31-8b-dummy" and llama.model.dummy.architecture == "llama"
    assert (llama.model.dummy.vocab_size, llama.model.dummy.num_hidden_layers, llama.model.dummy.intermediate_size) \
        == (128256, 32, 14336)
    assert llama.model.dummy.hidden_size == 4096 and llama.model.dummy.num_key_value_heads == 8
    assert llama.phases.speed.servers == ["plain", "chain-sim-acc1", "tree8"]
    long = to_live_config(compose("+preset=qwen3-8b-dummy-4k"))
    assert long.prompts.input_len == 4096 and long.model.name == "qwen3-8b-dummy"
    assert "prompts: random, 256 x 4096 tokens" in app.describe(long, phase_instances(long))


SIMTAB = {"SGLANG_SIMULATE_ACC_LEN": "1", "FLASHTREE_SIMULATE_ACC": "benchmarks/data/simulate/smollm2-dspark-gsm8k.json"}


def flag(inst, name: str) -> list[str]:
    """The values after `name` in `inst`'s command, up to the next flag."""
    rest = inst.argv[inst.argv.index(name) + 1:]
    return list(rest[: next((k for k, a in enumerate(rest) if a.startswith("--")), len(rest))])


@pytest.mark.parametrize("preset, model, input_len, concurrencies, slots, fraction", [
    ("llama31-8b-simtab", "llama31-8b-dummy", 512, [1, 8, 32, 64], "49152", "0.6"),
    ("qwen3-8b-4k-simtab", "qwen3-8b-dummy", 4096, [1, 8, 32], "139264", "0.84"),
])
def test_8b_simtab_variants(preset, model, input_len, concurrencies, slots, fraction):
    cfg = to_live_config(compose(f"+preset={preset}", "live.work_dir=/w"))
    assert cfg.model.name == model and cfg.model.label == "dummy weights, simulated acceptance"
    assert (cfg.prompts.source, cfg.prompts.input_len, cfg.phases.speed.max_new_tokens) == ("random", input_len, 192)
    assert cfg.phases.speed.concurrencies == concurrencies and cfg.phases.speed.backend == "ids"
    plain, chain, tree = plan = phase_instances(cfg)["speed"]
    assert [i.server for i in plan] == ["plain", "chain-simtab", "tree8-simtab"]
    for inst in plan:
        assert flag(inst, "--model-path") == [f"/w/models/{model}/target"]
        assert flag(inst, "--max-total-tokens") == [slots] and flag(inst, "--mem-fraction-static") == [fraction]
        assert flag(inst, "--max-running-requests") == [str(max(concurrencies))]
        assert flag(inst, "--cuda-graph-bs-decode")[-1] == str(max(concurrencies))
        assert "--load-format" in inst.argv and "--skip-tokenizer-init" in inst.argv
        # the context holds the prompt, the new tokens and the verify window
        assert int(flag(inst, "--context-length")[0]) >= input_len + 192 + 8
    assert "--speculative-algorithm" not in plain.argv and plain.env == {}
    for inst in (chain, tree):
        assert flag(inst, "--speculative-draft-model-path") == [f"/w/models/{model}/draft"]
        assert flag(inst, "--speculative-num-draft-tokens") == ["8"]  # the draft's block 7 + 1
        assert flag(inst, "--speculative-draft-load-format") == ["dummy"]
    assert chain.env == SIMTAB
    assert tree.env == {"FLASHTREE_TREE_N": "8", "FLASHTREE_SPLITKV_VERIFY": "1", "FLASHTREE_FUSED_SAMPLER": "1",
                        "FLASHTREE_GRAPH_DRAWS": "1", **SIMTAB, "FLASHTREE_STAGE_TIMES": "200"}
    assert (ROOT / SIMTAB["FLASHTREE_SIMULATE_ACC"]).is_file()  # the shipped SmolLM2 accept table
    text = app.describe(cfg, phase_instances(cfg))
    assert f"prompts: random, 256 x {input_len} tokens" in text and "WARNING" not in text


def test_chain_with_split_kv_verify_at_the_tables_lengths():
    """chain-splitkv-simtab: DSPARK's chain (no tree toggle) verifying through flashtree's split-KV kernel, its steps at
    the table's chain lengths: the chain the 4K trees are compared with beyond the attention."""
    cfg = to_live_config(compose("+preset=qwen3-8b-4k-simtab",
                                 "phases.speed.servers=[chain-simtab,chain-splitkv-simtab,tree8-simtab]"))
    chain, split, _tree = phase_instances(cfg)["speed"]
    assert split.env == {"FLASHTREE_SPLITKV_VERIFY": "1", **SIMTAB} and chain.env == SIMTAB
    assert "FLASHTREE_TREE_N" not in split.env and split.argv == chain.argv


RUN49_H100 = ["phases.speed.servers=[plain,chain-simtab,auto-simtab]", "servers.auto-simtab.window=64",
              "phases.speed.concurrencies=[1,8,32]", "model.precisions.bf16.args=[--max-total-tokens,24576]",
              "model.precisions.bf16.cuda_graph_bs=[1,2,4,8,16,24,32]", "model.precisions.bf16.max_running_requests=32",
              "live.gpu_gib=79"]
C64_4K = ["phases.speed.servers=[chain-simtab,tree8-simtab]", "phases.speed.concurrencies=[64]",
          "model.precisions.bf16.max_running_requests=64", "model.precisions.bf16.cuda_graph_bs=[1,2,4,8,16,24,32,48,64]",
          "model.precisions.bf16.args=[--max-total-tokens,278528]", "model.mem_fraction_static=0.85"]


@pytest.mark.parametrize("overrides, ok", [
    (["+preset=qwen3-8b-simtab"], True),
    (["+preset=qwen3-8b-simtab", "phases.speed.servers=[chain-simtab,tree16-w16-simtab,tree32-w32-budget512-simtab]"],
     True),
    (["+preset=llama31-8b-simtab"], True),
    (["+preset=qwen3-8b-4k-simtab"], True),
    (["+preset=qwen3-8b-4k-simtab", *C64_4K], True),  # 4K at c = 64: two servers (the preset's comment)
    (["+preset=qwen3-8b-4k-simtab", "phases.speed.servers=[chain-simtab,tree16-w16-simtab,tree32-w32-budget512-simtab]"],
     True),
    (["+preset=qwen3-8b-4k-simtab", "phases.speed.concurrencies=[64]"], False),  # pools below what 64 need
    (["+preset=qwen3-8b-4k-simtab", *C64_4K[1:]], False),  # three servers of 64 x 4K: 176 GiB
    (["+preset=qwen3-8b-4k-simtab", "model.mem_fraction_static=0.22"], False),  # the last one started gets no pool
    (["+preset=auto-qwen3-8b-simtab"], True),  # four servers
    (["+preset=auto-qwen3-8b-simtab", "model.mem_fraction_static=0.2"], False),
    # live run 49's three servers on an H100: they fit, and its fraction of 0.6 gave every pool only because its
    # starts were staggered (the check assumes the worst overlap: 0.81 needed)
    (["+preset=llama31-8b-simtab", *RUN49_H100, "model.mem_fraction_static=0.81"], True),
    (["+preset=llama31-8b-simtab", *RUN49_H100, "model.mem_fraction_static=0.6"], False),
    (["+preset=auto-qwen3-8b-simtab", "live.gpu_gib=79"], False),  # four 8B servers do not fit an H100
])
def test_8b_presets_fit_the_gpu(overrides, ok):
    from flashtree.live import memory

    cfg = to_live_config(compose(*overrides))
    servers = [memory.server_memory(cfg, i) for i in all_instances(phase_instances(cfg))]
    assert memory.fits(servers, cfg.model.mem_fraction_static, cfg.live.gpu_gib) is ok
    assert ("WARNING" in app.describe(cfg, phase_instances(cfg))) is not ok


def test_dummy_memory_against_published_sizes():
    from flashtree.live import memory

    qwen = to_live_config(compose("+preset=qwen3-8b-simtab")).model.dummy
    llama = to_live_config(compose("+preset=llama31-8b-simtab")).model.dummy
    # parameters without the norms: Qwen3-8B 8.19B, Llama-3.1-8B 8.03B (8,030,261,248 with them)
    assert abs(memory.weight_bytes(qwen, False) / 2 - 8.19e9) < 0.01e9
    assert 0 < 8_030_261_248 - memory.weight_bytes(llama, False) / 2 < 300_000
    assert memory.kv_bytes_per_token(qwen, False) == 36 * 2 * 8 * 128 * 2  # 144 KiB
    assert memory.kv_bytes_per_token(qwen, True) == 37 * 2 * 8 * 128 * 2  # + the draft's layer


def test_the_default_speed_phase_runs_bench_serving():
    lines = app.describe(cfg := to_live_config(compose()), phase_instances(cfg)).splitlines()
    bench = [x for x in lines if "-m sglang.bench_serving" in x]
    assert len(bench) == 2  # stage and speed
    assert "--dataset-name custom --dataset-path OUT/prompts.jsonl --apply-chat-template --sharegpt-output-len 256" \
        in bench[1] and "--port PORT" in bench[1]


def test_tiny_presets():
    check = to_live_config(compose("+preset=tiny-check", "live.work_dir=/w"))
    plan = phase_instances(check)
    assert list(plan) == ["identity", "sampled", "grammar"] and check.prompts.path == "/w/models/prompts.json"
    assert {i.name for i in all_instances(plan)} == {"fp32-plain", "fp32-chain", "fp32-tree8", "fp32-tree8-nosplitkv"}
    tree, sglang_attention = plan["identity"][2:]
    assert "FLASHTREE_SPLITKV_VERIFY" not in tree.env  # the tree's default: split-KV verify
    assert sglang_attention.env["FLASHTREE_SPLITKV_VERIFY"] == "0"
    assert tree.argv[tree.argv.index("--model-path") + 1] == "/w/models/target"
    assert tree.argv[tree.argv.index("--speculative-num-draft-tokens") + 1] == "8"  # the tiny draft's block 7 + 1
    fi = phase_instances(to_live_config(compose("+preset=flashinfer-exact", "live.work_dir=/w")))["identity"]
    assert [i.name for i in fi] == ["bf16-det-plain-flashinfer", "bf16-det-chain-flashinfer",
                                    "bf16-det-chain-flashinfer-exact", "bf16-det-tree8-w16-flashinfer-exact"]
    assert all("--enable-deterministic-inference" in i.argv and i.argv[i.argv.index("--attention-backend") + 1]
               == "flashinfer" for i in fi)
    assert [i.env.get("FLASHTREE_EXACT_VERIFY") for i in fi] == [None, None, "1", "1"]
    profile = phase_instances(to_live_config(compose("+preset=tiny-profile", "live.out_dir=/o")))["speed"]
    assert [i.name for i in profile] == ["bf16-chain-speed", "bf16-tree1-speed", "bf16-tree8-speed"]
    assert profile[0].env == {"FT_PROFILE_STEPS": "100:400", "FT_PROFILE_OUT": "/o/logs"}


@pytest.mark.parametrize("override, key", [
    ("phases.speed.servers=[chain,nope]", "phases.speed.servers"),
    ("phases.identity.precision=fp16", "phases.identity.precision"),
    ("servers.chain.fused_sampler=true", "servers.chain.tree_n"),
    ("servers.tree16-w16.policy=widest", "servers.tree16-w16.policy"),
    ("run=[identity,warp]", "run"),
])
def test_bad_values_name_their_key(override, key):
    with pytest.raises(ConfigError, match=f"^{key}="):
        to_live_config(compose(override))


def test_a_dummy_model_refuses_bench_serving():
    with pytest.raises(ConfigError, match="^phases.speed.backend=.*tokenizer"):
        to_live_config(compose("+preset=qwen3-8b-dummy", "phases.speed.backend=bench_serving"))


def test_dry_run_prints_servers_and_commands_and_starts_nothing(tmp_path):
    run = subprocess.run([PY, str(ROOT / "experiments" / "live.py"), "+preset=best", "live.dry_run=true",
                          f"live.out_dir={tmp_path / 'out'}", f"hydra.run.dir={tmp_path / 'hydra'}",
                          "model.draft=/drafts/smollm2"],
                         capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "bf16-tree64-w64-budget512-rows8: the best measured" in out
    assert ("FLASHTREE_TREE_N=64 FLASHTREE_TREE_DEPTH=8 FLASHTREE_TREE_BUDGET=512 FLASHTREE_DRAFT_ROWS=8 "
            "FLASHTREE_DRAFT_TEMPERATURE=0.7 FLASHTREE_FUSED_SAMPLER=1 FLASHTREE_GRAPH_DRAWS=1 ") in out
    assert "--speculative-num-draft-tokens 64" in out and "--port PORT" in out
    assert "identity: fp32-plain, fp32-chain-splitkv" in out and "client ids" in out
    assert not (tmp_path / "out").exists()  # nothing written, nothing started


def test_the_auto_presets_put_the_planner_beside_the_chain_and_the_fixed_trees():
    """FLASHTREE_TREE_N=auto alone on the server (its window from the server's DSPARK flags), beside DSPARK's chain and
    the best fixed configurations in one run: SmolLM2 at 1 / 8 / 32, the 8B simulated preset at 1 / 8 / 32 / 64."""
    cfg = to_live_config(compose("+preset=auto-smollm2", f"model.target={SMOLLM2}", "model.draft=/drafts/smollm2"))
    auto = instance(cfg, "auto", "bf16", "speed", {})
    assert auto.env == {"FLASHTREE_TREE_N": "auto"}
    assert auto.command(1) == [*BASE, *BF16, *DSPARK, "--speculative-num-draft-tokens", "64",
                               "--speculative-draft-attention-backend", "triton", "--speculative-dspark-block-size",
                               "63", "--host", "127.0.0.1", "--port", "1"]
    plan = phase_instances(cfg)
    assert [i.server for i in plan["speed"]] == ["plain", "chain", "tree8-w16", "tree64-w64-budget512-rows8", "auto",
                                                 "auto-w16"]
    narrow = instance(cfg, "auto-w16", "bf16", "speed", {})
    assert narrow.env == {"FLASHTREE_TREE_N": "auto"} and "--speculative-num-draft-tokens 16" in " ".join(narrow.command(1))
    assert [i.server for i in plan["identity"]] == ["plain", "chain-exact", "auto-exact"]
    assert cfg.phases.speed.concurrencies == [1, 8, 32]
    big = to_live_config(compose("+preset=auto-qwen3-8b-simtab"))
    plan = phase_instances(big)
    assert [i.server for i in plan["speed"]] == ["chain-simtab", "tree8-simtab", "tree32-w32-budget512-simtab",
                                                 "auto-simtab"]
    assert big.phases.speed.concurrencies == [1, 8, 32, 64]
    env = instance(big, "auto-simtab", "bf16", "speed", {}).env
    assert env["FLASHTREE_TREE_N"] == "auto" and env["FLASHTREE_SIMULATE_ACC"].endswith("smollm2-dspark-gsm8k.json")
    # a planner's description names the window it runs in, an overridden one too
    assert "up to 32 tokens" in big.servers["auto-simtab"].description
    wide = to_live_config(compose("+preset=auto-qwen3-8b-simtab", "servers.auto-simtab.window=64"))
    assert "up to 64 tokens" in wide.servers["auto-simtab"].description


def test_the_serving_preset_puts_flashinfer_beside_triton():
    """Features on the exact-verify tree, FlashInfer's identity, then the chain and the best tree on both backends,
    and the mixed phase's 30% constrained requests: a FlashInfer server's command replaces the model's backend
    (one --attention-backend, the draft's stays Triton)."""
    cfg = to_live_config(compose("+preset=serving", f"model.target={SMOLLM2}", "model.draft=/drafts/smollm2"))
    plan = phase_instances(cfg)
    assert list(plan) == ["features", "identity", "speed", "mixed"] and cfg.live.keep_going
    assert [i.name for i in plan["identity"]] == ["bf16-det-plain-flashinfer", "bf16-det-chain-flashinfer",
                                                   "bf16-det-chain-flashinfer-exact",
                                                   "bf16-det-tree8-w16-flashinfer-exact"]
    exact = {i.name: i for i in plan["identity"]}["bf16-det-tree8-w16-flashinfer-exact"]
    assert exact.env["FLASHTREE_EXACT_VERIFY"] == "1" and "--enable-deterministic-inference" in exact.argv
    assert cfg.phases.mixed.constrained == 0.3 and cfg.phases.mixed.backend == "ids"
    fi = instance(cfg, "tree64-w64-budget512-rows8-flashinfer", "bf16", "speed", {})
    argv = list(fi.argv)
    assert argv.count("--attention-backend") == 1 and argv[argv.index("--attention-backend") + 1] == "flashinfer"
    assert argv[argv.index("--speculative-draft-attention-backend") + 1] == "triton"
    triton = list(instance(cfg, "tree64-w64-budget512-rows8", "bf16", "speed", {}).argv)
    at = triton.index("--attention-backend") + 1
    assert argv == triton[:at] + ["flashinfer"] + triton[at + 1:]  # the same server otherwise
    assert fi.env == instance(cfg, "tree64-w64-budget512-rows8", "bf16", "speed", {}).env
    assert "30% of the requests constrained" in app.describe(cfg, plan)
    with pytest.raises(ConfigError, match="^speed.backend=.*constrained"):
        to_live_config(compose("phases.speed.constrained=0.5"))  # bench_serving sends no grammar
    with pytest.raises(ConfigError, match="^speed.constrained="):
        to_live_config(compose("phases.mixed.constrained=1.5"))
    assert commands.with_flag(["--a", "1", "--b", "2"], "--a", "x") == ["--a", "x", "--b", "2"]
    assert commands.with_flag(["--a", "1"], "--c", 3) == ["--a", "1", "--c", "3"]
    assert commands.with_flag(["--a", "1"], "--a", None) == ["--a", "1"]


def test_features_preset_and_its_keys():
    from flashtree.experiments.config import ConfigError

    cfg = to_live_config(compose("+preset=features", "phases.features.skip=[regex]"))
    plan = phase_instances(cfg)
    assert list(plan) == ["features"] and [i.name for i in plan["features"]] == [
        "fp32-plain", "fp32-tree8-w16", "fp32-tree8-w16-exact"]
    assert "9 feature requests x 64 tokens" in app.describe(cfg, plan)  # the regex one skipped
    with pytest.raises(ConfigError, match="features.may_refuse"):
        to_live_config(compose("+preset=features", "phases.features.may_refuse=[grammar]"))
