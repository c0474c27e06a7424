"""The live H200 clients (benchmarks/live/client.py, bench_client.py) against local stand-in servers (fake_server.py):
their checks must pass on agreeing servers and fail on a server whose greedy output differs."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

LIVE = Path(__file__).resolve().parents[1] / "benchmarks" / "live"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def servers():
    procs, ports = [], {}
    for mode in ("plain", "tree", "broken"):
        ports[mode] = free_port()
        procs.append(subprocess.Popen([sys.executable, str(LIVE / "fake_server.py"), str(ports[mode]), mode]))
    yield ports
    for p in procs:
        p.terminate()
        p.wait(timeout=10)


def bench(tmp_path, *args) -> subprocess.CompletedProcess:
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"prompts": [[1, 2, 3], [4, 5], [6, 7, 8, 9], [3, 3]]}))
    return subprocess.run([sys.executable, str(LIVE / "bench_client.py"), args[0], "--prompts", str(prompts),
                           "--out", str(tmp_path), *args[1:]], capture_output=True, text=True, timeout=120, cwd=LIVE)


def served(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as r:
        return json.loads(r.read())["generate"]


def test_identity_passes_agreeing_servers_and_fails_a_divergent_one(servers, tmp_path):
    run = bench(tmp_path, "identity", "--n", "4", "--wait", "20",
                f"plain={servers['plain']}", f"tree={servers['tree']}", f"broken={servers['broken']}")
    res = json.loads((tmp_path / "identity_results.json").read_text())["servers"]
    assert run.returncode == 1, run.stderr
    assert res["plain"]["status"] == "reference"
    assert res["tree"]["status"] == "pass" and res["tree"]["flashtree_steps"] > 0
    assert res["broken"]["status"] == "fail" and res["broken"]["mismatched"] == 4
    assert res["broken"]["first_mismatches"][0] == [0, 3]  # the stand-in's divergence: token 4
    detail = res["broken"]["mismatch_details"][0]
    assert detail["prompt"] == 0 and detail["at"] == 3 and detail["reference"][:2] == detail["got"][:2]
    assert detail["reference"][2] != detail["got"][2]  # the window starts two tokens before the divergence


def test_speed_reports_rate_tpot_and_tau_per_concurrency(servers, tmp_path):
    before = served(servers["plain"])
    run = bench(tmp_path, "speed", "--conc", "1", "3", "--wait", "20", f"plain={servers['plain']}", f"tree={servers['tree']}")
    assert run.returncode == 0, run.stderr
    res = json.loads((tmp_path / "speed_results.json").read_text())["servers"]
    for tag in ("plain", "tree"):
        rows = res[tag]
        assert [r["concurrency"] for r in rows] == [1, 3] and [r["requests"] for r in rows] == [8, 12]
        for r in rows:
            assert r["output_tokens"] == r["requests"] * 256 and r["tokens_per_s"] > 0 and r["tpot_ms"] > 0
            assert r["tau"] == pytest.approx(2.0, rel=0.01)  # the stand-in verifies 2 tokens per step
    assert "tree" in res["tree"][0] and "tree" not in res["plain"][0]
    assert "| tree | 3 |" in run.stdout
    # c = 1: 2 warm-up requests + 8; c = 3: a warm-up burst of 3, 2 warm-up requests + 12
    assert served(servers["plain"]) - before == (2 + 8) + (3 + 2 + 12)


def test_speed_rounds_average_and_pool_tau(servers, tmp_path):
    before = served(servers["tree"])
    run = bench(tmp_path, "speed", "--conc", "2", "--rounds", "2", "--min-requests", "4", "--wait", "20",
                f"plain={servers['plain']}", f"tree={servers['tree']}")
    assert run.returncode == 0, run.stderr
    res = json.loads((tmp_path / "speed_results.json").read_text())
    assert res["rounds"] == 2 and "round 1" in run.stdout
    for rows in res["servers"].values():
        (r,) = rows
        assert len(r["tokens_per_s_rounds"]) == 2 and r["requests"] == 16 and r["output_tokens"] == 16 * 256
        assert r["tokens_per_s"] == pytest.approx(sum(r["tokens_per_s_rounds"]) / 2, abs=0.1)
    assert res["servers"]["tree"][0]["tau"] == pytest.approx(2.0, rel=0.01)
    assert served(servers["tree"]) - before == (2 + 2 + 8) + (2 + 8)  # the burst of c = 2 in the first round only


def test_sampled_chi_square_and_client_checks(servers, tmp_path):
    run = bench(tmp_path, "sampled", f"plain={servers['plain']}", f"tree={servers['tree']}")
    assert run.returncode == 0, run.stderr
    res = json.loads((tmp_path / "sampled_results.json").read_text())["servers"]["tree"]
    assert res["status"] == "pass" and [p["position"] for p in res["per_position"]] == [2, 3, 4]

    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps({"prompts": [[i, i + 1] for i in range(50)]}))
    t = time.time()
    run = subprocess.run([sys.executable, str(LIVE / "client.py"), "--prompts", str(prompts), "--out", str(tmp_path),
                          "--wait", "20", f"plain={servers['plain']}", f"tree={servers['tree']}",
                          f"splitkv={servers['broken']}"], capture_output=True, text=True, timeout=180, cwd=LIVE)
    checks = json.loads((tmp_path / "live_results.json").read_text())["checks"]
    assert checks["greedy_tree"]["status"] == "pass" and checks["grammar_refused"]["status"] == "pass"
    assert checks["greedy_splitkv"]["status"] == "fail" and checks["splitkv_same"]["status"] == "fail"
    assert run.returncode == 1 and time.time() - t < 170


def test_live_figures_from_the_recorded_smollm2_run(tmp_path):
    sys.path.insert(0, str(LIVE))
    try:
        import plot_live
    finally:
        sys.path.remove(str(LIVE))
    results = LIVE.parent / "data" / "live" / "results-2026-11-30-smollm2"
    means = plot_live.stage_means(results / "stage_times.txt")
    assert list(means) == ["1", "2", "3", "4"]  # untagged (run 1): tree4, tree8, tree8b, tree8s in log order
    assert list(means["2"]) == ["draft", "draws", "tree", "verify", "walk", "commit", "output"]
    assert sum(means["2"].values()) == pytest.approx(5.98, abs=0.02)  # tree N = 8 at bs 1, benchmarks/HISTORY.md section 6
    tagged = tmp_path / "stage_times.txt"  # pack_logs' tagged lines (two servers interleaved by server, not time)
    lines = (results / "stage_times.txt").read_text().splitlines()
    tagged.write_text("\n".join(f"[server_b_tree{i}] {line}" for i in (1, 8) for line in lines[:3]) + "\n")
    assert list(plot_live.stage_means(tagged)) == ["b_tree1", "b_tree8"]
    plot_live.main([str(results), "--out", str(tmp_path)])
    assert (tmp_path / "speed.png").stat().st_size > 10_000 and (tmp_path / "stages.png").stat().st_size > 10_000


def test_live_figures_at_32_requests_and_of_a_single_concurrency(tmp_path):
    """Run 18's stage phase ran at concurrency 1 and 32: stages.png gets a panel for the windows of 28-32 requests;
    run 19 measured concurrency 32 alone (one speed panel)."""
    sys.path.insert(0, str(LIVE))
    try:
        import plot_live
    finally:
        sys.path.remove(str(LIVE))
    run18 = LIVE.parent / "data" / "live" / "results-2026-12-01-smollm2-run18"
    at32 = plot_live.stage_means(run18 / "stage_times.txt", 30.0, 2.0)
    assert list(at32) == ["b_tree1gt", "b_tree64w1t", "b_tree64wb512t"]
    assert sum(at32["b_tree64wb512t"].values()) == pytest.approx(5.348, abs=0.01)  # benchmarks/HISTORY.md section 6, run 18
    assert at32["b_tree64wb512t"]["draft"] - at32["b_tree1gt"]["draft"] == pytest.approx(0.95, abs=0.01)
    plot_live.main([str(run18), "--out", str(tmp_path / "18")])
    assert (tmp_path / "18" / "stages.png").stat().st_size > 10_000
    plot_live.main([str(LIVE.parent / "data" / "live" / "results-2026-12-01-smollm2-run19"), "--out", str(tmp_path / "19")])
    assert (tmp_path / "19" / "speed.png").stat().st_size > 10_000 and not (tmp_path / "19" / "stages.png").exists()
