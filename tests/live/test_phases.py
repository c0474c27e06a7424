"""Identity, sampled and speed phases against stand-in servers and on canned responses; bench_serving's command and
its 0.5.17 output line; the whole app (phases, rounds, tables) with stand-ins in place of sglang."""

from __future__ import annotations

import json
import math
import sys

import pandas as pd
import pytest

from flashtree.live import app, speed
from flashtree.live.features import run_features, schema_errors
from flashtree.live.grammar import run_grammar
from flashtree.live.commands import Instance
from flashtree.live.config import to_live_config
from flashtree.live.identity import compare, first_divergence, run_identity
from flashtree.live.prompts import Prompts
from flashtree.live.sampled import chi2_sf, compare_samples, run_sampled, two_sample_chi2
from flashtree.live.servers import ServerManager
from flashtree.live.tables import request_record, write_tables

from .helpers import ROOT, compose, fake

PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [3, 3]]


@pytest.fixture(scope="module")
def ports(tmp_path_factory):
    with ServerManager(tmp_path_factory.mktemp("logs")) as m:
        for mode in ("plain", "tree", "broken"):
            m.start(fake(mode, mode))
        m.wait_healthy(30)
        yield {mode: m.port(mode) for mode in ("plain", "tree", "broken")}


def served(port: int, what: str = "generate") -> int:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as r:
        return json.loads(r.read())[what]


def test_identity_passes_agreeing_servers_and_fails_a_divergent_one(ports):
    result, responses = run_identity(ports, PROMPTS, max_new_tokens=16)
    res = result["servers"]
    assert res["plain"]["status"] == "reference" and res["tree"]["status"] == "pass"
    assert res["broken"]["status"] == "fail" and res["broken"]["mismatched"] == 4
    assert res["broken"]["first_mismatches"][0] == (0, 3)  # the stand-in's divergence: token 4
    detail = res["broken"]["mismatch_details"][0]
    assert detail["prompt"] == 0 and detail["at"] == 3 and detail["reference"][:2] == detail["got"][:2]
    assert detail["reference"][2] != detail["got"][2]  # the window starts two tokens before the divergence
    assert detail["finish"] == "length" and len(responses["tree"]) == 4


def test_identity_on_canned_responses():
    def resp(ids):
        return {"output_ids": ids, "meta_info": {"finish_reason": {"type": "stop"}}}

    assert first_divergence([1, 2, 3], [1, 2, 3]) is None and first_divergence([1, 2], [1, 2, 3]) == 2
    same = compare([resp([1, 2, 3])], [resp([1, 2, 3])])
    assert same["status"] == "pass" and same["tokens"] == 3
    short = compare([resp([1, 2, 3]), resp([4])], [resp([1, 2])])  # a missing prompt fails too
    assert short["status"] == "fail" and short["first_mismatches"] == [(0, 2)]


def test_chi_square_logic():
    assert chi2_sf(3.841, 1) == pytest.approx(0.05, abs=1e-3) and chi2_sf(18.307, 10) == pytest.approx(0.05, abs=1e-3)
    assert chi2_sf(0.0, 3) == 1.0
    xs = [5] * 50 + [6] * 30 + [7] * 20
    stat, dof, p, cells = two_sample_chi2(xs, list(reversed(xs)))
    assert stat == 0 and p == 1.0 and cells == 3 and dof == 2
    stat, _, p, _ = two_sample_chi2(xs, [5] * 90 + [6] * 10)
    assert p < 1e-3
    draws = [[0, t, t, t] for t in xs]
    ok = compare_samples(draws, draws[::-1], 4)
    assert ok["status"] == "pass" and [x["position"] for x in ok["per_position"]] == [2, 3, 4]
    assert compare_samples(draws, [[0, 5, 5, 5]] * 100, 4)["status"] == "fail"


def test_sampled_against_stand_ins(ports):
    result, _ = run_sampled({"plain": ports["plain"], "tree": ports["tree"]}, PROMPTS[0], 600, 4, 0.7)
    res = result["servers"]["tree"]
    assert res["status"] == "pass" and [p["position"] for p in res["per_position"]] == [2, 3, 4]
    assert result["reference"] == "plain" and "plain" not in result["servers"]
    dead = run_sampled({"plain": ports["plain"], "gone": 9}, PROMPTS[0], 10, 4, 0.7, timeout_s=5)[0]
    assert dead["servers"]["gone"] == {"status": "not-run"} and "gone" in dead["errors"]


def test_grammar_served_with_the_reference_output(ports):
    res = run_grammar(ports, PROMPTS, "(ab)+", 8)["servers"]
    assert res["plain"]["status"] == "pass" and res["plain"]["http"] == 200
    assert res["tree"]["status"] == "pass" and res["tree"]["serving_after"]
    assert res["broken"]["status"] == "fail" and res["broken"]["http"] == 200  # served, but not the reference's output


def test_features_against_stand_ins(ports):
    """Each feature request against the reference: the tree stand-in refuses logprobs with flashtree's message (as on
    sglang 0.5.17: allowed) and equals it elsewhere; `broken` differs on frequency_penalty; the reference's JSON
    answers are valid."""
    tree = {"plain": False, "tree": True, "broken": False}
    res = run_features(ports, tree, {"13": -100.0}, 8, 1e-3, may_refuse=["logprobs"])
    assert res["model"] == "fake-model" and res["reference"] == "plain"
    checks = res["reference_checks"]
    assert all(c["served"] and not c["schema_errors"] for c in checks.values())
    assert checks["frequency_penalty"]["differs_from_plain"] and not checks["plain"]["differs_from_plain"]
    rows = res["servers"]["tree"]["requests"]
    assert res["servers"]["tree"]["status"] == "pass" and rows["serving_after"]["status"] == "pass"
    assert {k for k, r in rows.items() if r["status"] == "refused"} == {"logprobs"}
    assert rows["json_schema"]["equal"] and rows["tool_required"]["equal"] and rows["min_p"]["equal"]
    broken = res["servers"]["broken"]
    assert broken["status"] == "fail" and res["failed"] == ["broken:frequency_penalty"]
    assert broken["requests"]["logprobs"]["max_logprob_gap"] == 0.0
    assert broken["requests"]["frequency_penalty"]["reference"] != broken["requests"]["frequency_penalty"]["got"]
    strict = run_features({"plain": ports["plain"], "tree": ports["tree"]}, {"plain": False, "tree": True}, {}, 8, 1e-3)
    assert strict["failed"] == ["tree:logprobs"]  # a refusal outside may_refuse fails
    lean = run_features(ports, tree, {}, 8, 1e-3, skip=["json_schema", "tool_required", "regex", "logprobs"])
    assert set(lean["requests"]) == {"plain", "frequency_penalty", "presence_penalty", "repetition_penalty",
                                     "logit_bias", "min_p"} and lean["failed"] == ["broken:frequency_penalty"]


def test_features_schema_checks():
    assert schema_errors("json_schema", {"content": '{"name": "Ann", "age": 3}'}) == []
    assert schema_errors("json_schema", {"content": '{"name": "Ann"}'})  # age missing
    assert schema_errors("json_schema", {"content": "not json"})
    assert schema_errors("tool_required", {"tool_calls": []})  # no call at all
    call = {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "kelvin"}'}
    assert schema_errors("tool_required", {"tool_calls": [call]})
    # no --tool-call-parser: sglang answers `required` with the constrained array as the content
    array = '[{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}]'
    assert schema_errors("tool_required", {"tool_calls": [], "content": array}) == []
    assert schema_errors("tool_required", {"tool_calls": [], "content": array.replace("celsius", "kelvin")})
    assert schema_errors("tool_required", {"tool_calls": [], "content": '[{"name": "other", "parameters": {}}]'})
    assert schema_errors("tool_required", {"tool_calls": [], "content": "Paris is sunny."})
    assert schema_errors("plain", {"content": "anything"}) == []


def test_a_refusal_names_flashtree_or_the_refused_field():
    """sglang 0.5.17 refuses logprobs on a DSPARK server itself (live run 27): an HTTP 400 naming flashtree or the
    request's sglang field is a refusal; any other error is a failure."""
    from flashtree.live.features import refused_clearly, verdict

    sglang_own = 'HTTP 400: {"message": "DFLASH speculative decoding does not support return_logprob yet."}'
    assert refused_clearly("logprobs", sglang_own) and refused_clearly("logprobs", "HTTP 400: flashtree: this server")
    assert not refused_clearly("logprobs", "HTTP 500: return_logprob crashed")
    assert not refused_clearly("min_p", 'HTTP 400: {"message": "bad min_p"}')
    got = {"ok": False, "error": sglang_own}
    assert verdict("logprobs", {}, got, True, 1e-3, ["logprobs"])["status"] == "refused"
    assert verdict("logprobs", {}, got, True, 1e-3, [])["status"] == "fail"


def test_the_schema_requests_can_finish_their_json():
    """A JSON answer cut at max_tokens parses as no JSON (live run 28: no tool call at 256 tokens, for no speculation
    too): the schema requests get at least JSON_MAX_TOKENS, and the required tool call is one call, not an array of any
    length."""
    from flashtree.live.features import JSON_MAX_TOKENS, requests

    body = requests({}, 64)
    assert body["tool_required"]["parallel_tool_calls"] is False
    assert body["tool_required"]["max_tokens"] == body["json_schema"]["max_tokens"] == JSON_MAX_TOKENS >= 256
    assert body["plain"]["max_tokens"] == 64 and requests({}, 512)["json_schema"]["max_tokens"] == 512


def test_ids_client_rate_time_and_tau_per_level(ports):
    before = served(ports["tree"])
    row, rs = speed.ids_level(ports["tree"], PROMPTS, conc=1, max_new_tokens=256, min_requests=8, burst=True)
    assert row["requests"] == 8 and row["output_tokens"] == 8 * 256 and row["tokens_per_s"] > 0
    assert row["ms_per_token"] > 0 and row["tau"] == pytest.approx(2.0, rel=0.01)  # 2 tokens per verify step
    assert row["client"] == "ids" and len(rs) == 8 and rs[0]["meta_info"]["flashtree"]
    row, _ = speed.ids_level(ports["tree"], PROMPTS, conc=3, max_new_tokens=16, min_requests=8, burst=True)
    assert row["requests"] == 12
    # c = 1: 2 warm-up requests + 8; c = 3: a warm-up burst of 3, 2 warm-up requests + 12
    assert served(ports["tree"]) - before == (2 + 8) + (3 + 2 + 12)


def test_the_mixed_phase_sends_its_share_of_constrained_requests(ports):
    """30% of a level's requests carry the regex, spread over the level, the same ones every time; the warm-up sends
    it once per warm-up prompt (the grammar's first compile stays out of the timing); merged rounds add them up."""
    assert [i for i, c in enumerate(speed.constrained_jobs(10, 0.3)) if c] == [1, 4, 8]
    assert speed.constrained_jobs(5, 0.0) == [False] * 5 and speed.constrained_jobs(4, 1.0) == [True] * 4
    assert sum(speed.constrained_jobs(128, 0.3)) == 38
    before, regex_before = served(ports["tree"]), served(ports["tree"], "regex")
    row, rs = speed.ids_level(ports["tree"], PROMPTS, conc=2, max_new_tokens=8, min_requests=10, burst=False,
                              constrained=0.3, regex="[a-z]*")
    assert row["requests"] == 10 and row["constrained_requests"] == 3 and len(rs) == 10
    assert served(ports["tree"]) - before == 2 * 2 + 10 and served(ports["tree"], "regex") - regex_before == 2 + 3
    plain_row, _ = speed.ids_level(ports["tree"], PROMPTS, conc=2, max_new_tokens=8, min_requests=10, burst=False)
    assert "constrained_requests" not in plain_row and served(ports["tree"], "regex") - regex_before == 5
    assert speed.merge_rounds([row, row])["constrained_requests"] == 6


def test_a_paired_level_runs_free_and_constrained_back_to_back(ports, tmp_path):
    """Paired: each round sends the level all free and with its constrained share on the same server, free first in
    even rounds and last in odd ones; the row has both rates and their ratio, merged rounds the ratios' median."""
    from types import SimpleNamespace

    from flashtree.live.config import SpeedPhase

    phase = SpeedPhase(constrained=0.3, backend="ids", paired=True, min_requests=10, max_new_tokens=8)
    state = app.Run(SimpleNamespace(phases=SimpleNamespace(mixed=phase)), SimpleNamespace(port=lambda _: ports["tree"]),
                    SimpleNamespace(ids=PROMPTS), tmp_path)
    order = []
    real = speed.ids_level

    def ids_level(*args, constrained, **kw):
        order.append(constrained)
        return real(*args, constrained=constrained, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(speed, "ids_level", ids_level)
        rows = [state.level("mixed", "tree", 2, rnd, 60.0) for rnd in range(3)]
    assert order == [0.0, 0.3, 0.3, 0.0, 0.0, 0.3]
    assert all(r["constrained_requests"] == 3 and r["grammar_ratio"] > 0 for r in rows)
    assert [r["phase"] for r in state.records].count("mixed-free") == 30
    merged = speed.merge_rounds(rows)
    assert merged["grammar_ratio"] == sorted(r["grammar_ratio"] for r in rows)[1]
    assert merged["free_tokens_per_s"] == pytest.approx(sum(r["free_tokens_per_s"] for r in rows) / 3, abs=0.1)
    assert "ratio (rounds)" in speed.table({"servers": {"tree": [merged]}})
    with pytest.raises(Exception, match="speed.paired"):
        SpeedPhase(paired=True)


def test_merge_rounds_averages_rates_and_pools_tau():
    rows = [{"concurrency": 2, "tokens_per_s": 100.0, "ms_per_token": 2.0, "requests": 8, "output_tokens": 800,
             "verify_steps": 400, "tau": 2.0},
            {"concurrency": 2, "tokens_per_s": 200.0, "ms_per_token": 4.0, "requests": 8, "output_tokens": 800,
             "verify_steps": 200, "tau": 4.0}]
    m = speed.merge_rounds(rows + [{"concurrency": 2, "error": "x"}])
    assert m["tokens_per_s"] == 150.0 and m["ms_per_token"] == 3.0 and m["requests"] == 16
    assert m["tau"] == pytest.approx(1600 / 600, abs=1e-3) and m["tokens_per_s_rounds"] == [100.0, 200.0]
    assert speed.merge_rounds([{"concurrency": 1, "error": "x"}]) == {"concurrency": 1, "error": "x"}


# One result line of sglang 0.5.17's `bench_serving --output-file` (the keys of its `result` dict).
BENCH_LINE = json.dumps({
    "tag": None, "backend": "sglang", "dataset_name": "custom", "request_rate": float("inf"), "max_concurrency": 8,
    "sharegpt_output_len": 256, "random_input_len": 1024, "random_output_len": 1024, "random_range_ratio": 0.0,
    "server_info": {"internal_states": [{"avg_spec_accept_length": 3.91}]}, "duration": 2.5312, "completed": 32,
    "total_input_tokens": 3310, "total_input_text_tokens": 3310, "total_input_vision_tokens": 0,
    "total_output_tokens": 8192, "total_output_tokens_retokenized": 8190, "request_throughput": 12.64,
    "input_throughput": 1307.6, "output_throughput": 3236.4, "total_throughput": 4544.0,
    "mean_e2e_latency_ms": 611.2, "median_e2e_latency_ms": 605.0, "std_e2e_latency_ms": 20.1,
    "p90_e2e_latency_ms": 640.0, "p95_e2e_latency_ms": 650.0, "p99_e2e_latency_ms": 660.0, "mean_ttft_ms": 31.5,
    "median_ttft_ms": 30.2, "std_ttft_ms": 3.3, "p90_ttft_ms": 35.0, "p95_ttft_ms": 36.0, "p99_ttft_ms": 38.0,
    "mean_tpot_ms": 2.2734, "median_tpot_ms": 2.2511, "std_tpot_ms": 0.1, "p90_tpot_ms": 2.4, "p95_tpot_ms": 2.5,
    "p99_tpot_ms": 2.6, "mean_itl_ms": 8.9, "median_itl_ms": 8.1, "std_itl_ms": 3.0, "p90_itl_ms": 12.0,
    "p95_itl_ms": 13.0, "p99_itl_ms": 15.0, "concurrency": 7.7, "accept_length": 3.91,
    "max_output_tokens_per_s": 3600.0, "max_concurrent_requests": 8})


def test_bench_serving_command_and_output_line():
    cmd = speed.bench_serving_command("python3", 30021, model="/m", dataset="/o/prompts.jsonl", conc=8,
                                      num_prompts=32, max_new_tokens=256, output_file="/o/b.jsonl")
    assert cmd == ["python3", "-m", "sglang.bench_serving", "--backend", "sglang", "--host", "127.0.0.1", "--port",
                   "30021", "--model", "/m", "--tokenizer", "/m", "--dataset-name", "custom", "--dataset-path",
                   "/o/prompts.jsonl", "--apply-chat-template", "--sharegpt-output-len", "256", "--num-prompts", "32",
                   "--max-concurrency", "8", "--warmup-requests", "8", "--seed", "0", "--output-file", "/o/b.jsonl",
                   "--disable-tqdm"]
    row = speed.parse_bench_serving(BENCH_LINE)
    assert row == {"concurrency": 8, "requests": 32, "output_tokens": 8192, "wall_s": 2.531, "tokens_per_s": 3236.4,
                   "tpot_ms": 2.273, "median_tpot_ms": 2.251, "ttft_ms": 31.5, "tau": 3.91, "client": "bench_serving"}


def test_custom_dataset_file_reads_as_bench_serving_does(tmp_path):
    path = speed.write_custom_dataset(["What is 2 + 2?", "A train leaves at noon."], tmp_path / "p.jsonl")
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["conversations"][0]["content"] for x in lines] == ["What is 2 + 2?", "A train leaves at noon."]
    assert all(len(x["conversations"]) == 2 for x in lines)  # bench_serving drops conversations of < 2 turns


def test_live_requests_land_in_the_sweeps_tables(tmp_path):
    import pandas as pd

    from flashtree.results.collect import load_results

    tree = {"meta_info": {"flashtree": [[8, 3, 7, 2], None, [8, 2, 7, 0]], "completion_tokens": 4,
                          "spec_verify_ct": 2, "prompt_tokens": 10}}
    chain = {"meta_info": {"completion_tokens": 4, "spec_verify_ct": 3, "prompt_tokens": 10}}
    records = [request_record("tree8", "speed", 1, 0, 0, tree), request_record("tree8", "speed", 1, 1, 0, tree),
               request_record("chain", "speed", 1, 0, 0, chain)]
    config = {"servers": {"tree8": {"tree_n": 8}, "chain": {}},
              "model": {"name": "qwen3-8b-dummy", "draft_block_size": 7, "label": "dummy weights, simulated acceptance"}}
    runs, table = write_tables(records, config, tmp_path)
    steps = pd.read_parquet(runs / "speed-tree8-c1" / "steps.parquet")
    assert steps["accept_len"].tolist() == [2, 0, 2, 0] and (steps["committed"] == steps["accept_len"] + 1).all()
    df = load_results(table).set_index("live.server")
    assert df.loc["tree8", "tau"] == pytest.approx(2.0) and df.loc["tree8", "tree.n"] == 8
    assert df.loc["tree8", "tree.width"] == 8 and df.loc["tree8", "tau_server"] == pytest.approx(2.0)
    assert df.loc["chain", "tau_server"] == pytest.approx(4 / 3)
    assert (df["live.label"] == "dummy weights, simulated acceptance").all()
    # a run of the features phase alone records no requests: no tables, and no error after its verdicts
    assert write_tables([], config, tmp_path / "features-only") is None


def with_stand_ins(monkeypatch, modes: dict[str, str]) -> None:
    """The app runs stand-in servers (`modes`: server name -> the stand-in's mode), no model checks, canned prompts."""
    real = app.phase_instances

    def stand_ins(c):
        return {p: [Instance(i.name, i.server, i.precision, fake(i.name, modes[i.server]).argv, i.env, i.label)
                    for i in insts] for p, insts in real(c).items()}

    monkeypatch.setattr(app, "phase_instances", stand_ins)
    monkeypatch.setattr(app, "prepare_models", lambda cfg, out: None)
    monkeypatch.setattr(app, "load", lambda cfg: Prompts(PROMPTS, None, "canned"))


def test_the_app_with_stand_in_servers(tmp_path, monkeypatch):
    """identity + speed (ids client, 2 rounds) + sampled end to end: results, tables, exit status."""
    cfg = to_live_config(compose(
        "run=[identity,speed,sampled]", "phases.identity.servers=[plain,tree8,chain]", "phases.identity.prompts=4",
        "phases.identity.max_new_tokens=16", "phases.speed.servers=[chain,tree8]", "phases.speed.backend=ids",
        "phases.speed.concurrencies=[1,2]", "phases.speed.rounds=2", "phases.speed.min_requests=4",
        "phases.speed.max_new_tokens=32", "phases.sampled.servers=[plain,tree8]", f"live.out_dir={tmp_path}",
        f"live.work_dir={tmp_path / 'work'}", "live.stagger_s=0", "live.start_timeout_s=60"))
    modes = {"plain": "plain", "tree8": "tree", "chain": "broken"}
    with_stand_ins(monkeypatch, modes)
    assert app.run(cfg) == 1  # the chain stand-in diverges
    ident = json.loads((tmp_path / "identity_results.json").read_text())["servers"]
    assert ident["fp32-tree8"]["status"] == "pass" and ident["fp32-chain"]["status"] == "fail"
    res = json.loads((tmp_path / "speed_results.json").read_text())
    assert res["rounds"] == 2 and list(res["servers"]) == ["bf16-chain", "bf16-tree8"] and {"gpu", "sglang"} <= set(res)
    for rows in res["servers"].values():
        assert [r["concurrency"] for r in rows] == [1, 2] and [r["requests"] for r in rows] == [8, 16]
        assert all(len(r["tokens_per_s_rounds"]) == 2 for r in rows)
    assert json.loads((tmp_path / "sampled_results.json").read_text())["servers"]["bf16-tree8"]["status"] == "pass"
    from flashtree.results.collect import load_results

    df = load_results(tmp_path / "runs" / "summary.parquet").set_index(["live.server", "live.concurrency"])
    assert set(df.index.get_level_values(0)) >= {"fp32-tree8", "bf16-tree8"}
    speed_steps = pd.read_parquet(tmp_path / "runs" / "speed-bf16-tree8-c2" / "steps.parquet")
    assert len(speed_steps) == 2 * 2 * 8  # 2 steps per request, 2 rounds, 8 timed requests at concurrency 2
    assert df.loc[("bf16-tree8", 2), "tau"] == pytest.approx(2.0) and df.loc[("bf16-tree8", 2), "tree.n"] == 8
    assert not math.isnan(df.loc[("fp32-tree8", 8), "tau"])
    assert {p.name for p in (tmp_path / "logs").glob("server_*.log")} == {
        "server_fp32-plain.log", "server_fp32-tree8.log", "server_fp32-chain.log", "server_bf16-chain.log",
        "server_bf16-tree8.log", "server_bf16-plain.log"}
    sys.path.insert(0, str(ROOT / "benchmarks" / "live"))
    try:
        import plot_live
    finally:
        sys.path.remove(str(ROOT / "benchmarks" / "live"))
    plot_live.main([str(tmp_path), "--out", str(tmp_path / "fig")])  # the figures read the app's results too
    assert (tmp_path / "fig" / "speed.png").stat().st_size > 10_000


def test_speed_results_name_the_gpu_and_the_servers_sglang(tmp_path, monkeypatch):
    """`machine`: nvidia-smi's first GPU and the release the server interpreter imports; None where either is missing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi, python = bin_dir / "nvidia-smi", tmp_path / "server-python"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3'\necho 'NVIDIA H100 80GB HBM3'\n")
    python.write_text("#!/bin/sh\necho 0.5.17\n")
    for f in (smi, python):
        f.chmod(0o755)
    cfg = to_live_config(compose(f"live.python={python}"))
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    assert app.machine(cfg) == {"gpu": "NVIDIA H100 80GB HBM3", "sglang": "0.5.17"}
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    cfg = to_live_config(compose(f"live.python={tmp_path / 'missing-python'}"))
    assert app.machine(cfg) == {"gpu": None, "sglang": None}


def test_an_interrupted_app_keeps_what_ran(tmp_path, monkeypatch):
    """Ctrl-C (or LIVE_S's SIGINT) in the speed phase: the identity results, the speed rows of the servers already
    measured and the tables of the requests that finished are written, the servers stopped, and the status is 130."""
    cfg = to_live_config(compose(
        "run=[identity,speed]", "phases.identity.servers=[plain,tree8]", "phases.identity.prompts=2",
        "phases.identity.max_new_tokens=8", "phases.speed.servers=[plain,tree8]", "phases.speed.backend=ids",
        "phases.speed.concurrencies=[1]", "phases.speed.min_requests=2", "phases.speed.max_new_tokens=8",
        f"live.out_dir={tmp_path}", f"live.work_dir={tmp_path / 'work'}", "live.stagger_s=0",
        "live.start_timeout_s=60"))
    modes = {"plain": "plain", "tree8": "tree"}
    real_level = app.Run.level

    def level(self, phase, name, conc, rnd, left_s):
        if name == "bf16-tree8":
            raise KeyboardInterrupt
        return real_level(self, phase, name, conc, rnd, left_s)

    with_stand_ins(monkeypatch, modes)
    monkeypatch.setattr(app.Run, "level", level)
    assert app.run(cfg) == 130
    assert json.loads((tmp_path / "identity_results.json").read_text())["servers"]["fp32-tree8"]["status"] == "pass"
    assert list(json.loads((tmp_path / "speed_results.json").read_text())["servers"]) == ["bf16-plain"]
    from flashtree.results.collect import load_results

    df = load_results(tmp_path / "runs" / "summary.parquet")
    assert set(df["live.server"]) == {"fp32-plain", "fp32-tree8", "bf16-plain"}


@pytest.mark.parametrize("keep_going", [True, False])
def test_a_server_that_fails_to_start(tmp_path, monkeypatch, keep_going):
    """live.keep_going: the server that dies is reported and left out, the phases run with the others (identity
    without its reference is not run), and the run exits 1; without it the run stops at start with status 2."""
    cfg = to_live_config(compose(
        "run=[identity,speed,mixed]", "phases.identity.servers=[chain,tree8]", "phases.identity.prompts=2",
        "phases.identity.max_new_tokens=8", "phases.speed.servers=[chain,tree8]", "phases.speed.backend=ids",
        "phases.speed.concurrencies=[1]", "phases.speed.min_requests=2", "phases.speed.max_new_tokens=8",
        "phases.mixed.servers=[tree8]", "phases.mixed.concurrencies=[2]", "phases.mixed.min_requests=10",
        "phases.mixed.max_new_tokens=8", f"live.out_dir={tmp_path}", f"live.work_dir={tmp_path / 'work'}",
        "live.stagger_s=0", "live.start_timeout_s=60", f"live.keep_going={keep_going}"))
    modes = {"chain": "die", "tree8": "tree"}
    with_stand_ins(monkeypatch, modes)
    if not keep_going:
        assert app.run(cfg) == 2 and not (tmp_path / "speed_results.json").exists()
        return
    assert app.run(cfg) == 1
    assert not (tmp_path / "identity_results.json").exists()
    assert list(json.loads((tmp_path / "speed_results.json").read_text())["servers"]) == ["bf16-tree8"]
    mixed = json.loads((tmp_path / "mixed" / "speed_results.json").read_text())["servers"]["bf16-tree8"]
    assert mixed[0]["constrained_requests"] == 3 and mixed[0]["requests"] == 10
    # paired by default: the same level all free on the same server, its rate beside the mix's, their ratio
    assert mixed[0]["grammar_ratio"] == round(mixed[0]["tokens_per_s"] / mixed[0]["free_tokens_per_s"], 3)
    from flashtree.results.collect import load_results

    phases = load_results(tmp_path / "runs" / "summary.parquet").groupby("live.phase")["live.server"].first()
    assert phases.to_dict() == {"speed": "bf16-tree8", "mixed": "bf16-tree8", "mixed-free": "bf16-tree8"}


def test_prepare_models_checks_the_staged_checkpoints(tmp_path):
    from flashtree.dspark.config import DSparkConfig
    from flashtree.experiments.config import ConfigError

    cfg = to_live_config(compose(f"model.target={tmp_path / 't'}", f"model.draft={tmp_path / 'd'}"))
    with pytest.raises(ConfigError, match="^model.target=.*no config.json there"):
        app.prepare_models(cfg, tmp_path)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config.json").write_text("{}")
    DSparkConfig(hidden_size=64, vocab_size=100, num_target_layers=4, target_layer_ids=(1, 2), block_size=15).save(
        tmp_path / "d")
    with pytest.raises(ConfigError, match="^model.draft_block_size=8: the draft .* has block_size 15"):
        app.prepare_models(cfg, tmp_path)
    app.prepare_models(to_live_config(compose(f"model.target={tmp_path / 't'}", f"model.draft={tmp_path / 'd'}",
                                              "model.draft_block_size=15")), tmp_path)
    assert json.loads((tmp_path / "draft_config.json").read_text())["block_size"] == 15


def test_live_runs_log_to_wandb_as_sweep_runs_do(tmp_path):
    from flashtree.results.wandb_log import offline_runs

    tree = {"meta_info": {"flashtree": [[8, 3, 7, 2], [8, 2, 7, 0]], "completion_tokens": 4, "spec_verify_ct": 2,
                          "prompt_tokens": 10}}
    config = {"servers": {"tree8": {"tree_n": 8}}, "model": {"name": "smollm2-135m", "draft_block_size": 8},
              "logger": {"wandb": {"mode": "offline"}}}
    runs, _ = write_tables([request_record("tree8", "speed", 1, 0, 0, tree)], config, tmp_path)
    run_dir = runs / "speed-tree8-c1"
    assert offline_runs(run_dir), "an offline W&B run next to the tables"
    assert json.loads((run_dir / "summary.json").read_text())["wandb"]["mode"] == "offline"


def test_the_app_refuses_tree_servers_sglang_plugins_would_drop(tmp_path, monkeypatch, capsys):
    """SGLANG_PLUGINS leaving flashtree out: the run stops before it prints its plan or starts a server (a dry run too),
    naming the server's toggles and SGLANG_PLUGINS."""
    monkeypatch.setenv("SGLANG_PLUGINS", "someone-else")
    cfg = to_live_config(compose("run=[identity]", "phases.identity.servers=[plain,tree8]", "live.dry_run=true",
                                 f"live.out_dir={tmp_path}"))
    with pytest.raises(SystemExit, match=r"FLASHTREE_TREE_N.* set, but SGLANG_PLUGINS='someone-else' leaves out"):
        app.run(cfg)
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("SGLANG_PLUGINS", "someone-else,flashtree")
    assert app.run(cfg) == 0


def test_host_profiles_are_collected_from_the_server_logs(tmp_path):
    """FLASHTREE_PROFILE_HOST's report (a header log line, then indented rows) lands in host_profile.txt, tagged with
    its server; the rest of the log stays out."""
    from flashtree.patches.host_profile import HostProfile

    profile = HostProfile(steps=1)
    profile.on_decode_step()
    profile.on_decode_step()
    sum(range(1000))
    profile.profile.disable()
    report = profile.report()
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "server_bf16-tree8.log").write_text(f"[2026-12-02 10:00:00] loading\n[2026-12-02 10:00:01] {report}\n"
                                                "[2026-12-02 10:00:02] Decode batch, #running-req: 1\n  not a row\n")
    (logs / "server_bf16-plain.log").write_text("[2026-12-02 10:00:00] serving\n")
    app.host_profiles(logs, tmp_path / "host_profile.txt")
    got = (tmp_path / "host_profile.txt").read_text().splitlines()
    assert got[0].startswith("[server_bf16-tree8] [2026-12-02 10:00:01] flashtree host profile over decode steps 2-2")
    assert len(got) == len(report.splitlines()) and "Decode batch" not in "\n".join(got)
    assert sum(line.startswith("[server_bf16-tree8] ") for line in got) == 3  # the header and the two rankings' titles
