"""The speed phase: each server alone at each concurrency c, tokens/s, time per output token and tau.

Two clients measure it:
- sglang's own `python -m sglang.bench_serving` (backend `bench_serving`): the held-out prompts as its `custom`
  dataset, c in flight, a warm-up burst of c requests first; TPOT excludes each request's first token. Its tau is
  sglang's server-wide `avg_spec_accept_length`, and it keeps no per-request meta_info (no tree statistics).
- flashtree's input-id client (backend `ids`): for servers started with `--skip-tokenizer-init` (dummy weights have no
  tokenizer, and bench_serving needs one to build and count its requests), and wherever the per-request tree
  statistics are wanted. Non-streaming, so its time per token is the request's latency over its tokens
  (`ms_per_token`, the first token included); tau = output tokens / verify steps (meta_info `spec_verify_ct`).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import statistics
import subprocess
import time
from pathlib import Path

from flashtree.live.commands import HOST
from flashtree.live.http_json import generate


def requests_per_level(conc: int, min_requests: int) -> int:
    return max(4 * conc, min_requests)


# ---- sglang's bench_serving ------------------------------------------------------------------------------------

def bench_serving_command(python: str, port: int, *, model: str, dataset: str, conc: int, num_prompts: int,
                          max_new_tokens: int, output_file: str, seed: int = 0) -> list[str]:
    return [python, "-m", "sglang.bench_serving", "--backend", "sglang", "--host", HOST, "--port", str(port),
            "--model", model, "--tokenizer", model, "--dataset-name", "custom", "--dataset-path", dataset,
            "--apply-chat-template", "--sharegpt-output-len", str(max_new_tokens), "--num-prompts", str(num_prompts),
            "--max-concurrency", str(conc), "--warmup-requests", str(max(conc, 2)), "--seed", str(seed),
            "--output-file", output_file, "--disable-tqdm"]


def parse_bench_serving(line: str) -> dict:
    """One result line of bench_serving's --output-file -> a speed row."""
    r = json.loads(line)
    return {
        "concurrency": r["max_concurrency"], "requests": r["completed"], "output_tokens": r["total_output_tokens"],
        "wall_s": round(r["duration"], 3), "tokens_per_s": round(r["output_throughput"], 1),
        "tpot_ms": round(r["mean_tpot_ms"], 3), "median_tpot_ms": round(r["median_tpot_ms"], 3),
        "ttft_ms": round(r["mean_ttft_ms"], 3),
        "tau": round(r["accept_length"], 3) if r.get("accept_length") else None,
        "client": "bench_serving",
    }


def write_custom_dataset(texts: list[str], path) -> Path:
    """Prompts as bench_serving's `custom` dataset (one conversation per line; the reply is not used: the output
    length is fixed by --sharegpt-output-len)."""
    path = Path(path)
    path.write_text("".join(json.dumps({"conversations": [{"content": t}, {"content": "-"}]}) + "\n" for t in texts))
    return path


def bench_serving_level(cmd: list[str], output_file: Path, log: Path, timeout_s: float) -> dict:
    output_file.unlink(missing_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s)
    if proc.returncode != 0 or not output_file.is_file():
        raise RuntimeError(f"bench_serving exited with {proc.returncode}; see {log}")
    return parse_bench_serving(output_file.read_text().strip().splitlines()[-1])


# ---- flashtree's input-id client -------------------------------------------------------------------------------

def in_flight(port: int, jobs: list, conc: int) -> list[dict]:
    """`jobs` (prompt ids, sampling params) with `conc` in flight; their responses in order."""
    with cf.ThreadPoolExecutor(conc) as pool:
        return list(pool.map(lambda job: generate(port, *job), jobs))


def constrained_jobs(n: int, fraction: float) -> list[bool]:
    """Which of n requests carry the grammar: spread evenly, round(n x fraction) of them (the same ones on every
    server)."""
    return [int((i + 1) * fraction + 0.5) > int(i * fraction + 0.5) for i in range(n)]


def ids_level(port: int, prompts: list, conc: int, max_new_tokens: int, min_requests: int, burst: bool,
              constrained: float = 0.0, regex: str = ""):
    """-> (speed row, the timed responses); `constrained`: the fraction of the requests sent with `regex`."""
    params = {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}
    if burst and conc > 1:  # the batch sizes up to c (prefill and decode) run once before any timing
        in_flight(port, [(prompts[i % len(prompts)], params) for i in range(conc)], conc)
    for ids in prompts[:2]:
        generate(port, ids, params)  # warm-up: first-shape compiles stay out of the timing
        if constrained:
            generate(port, ids, {**params, "regex": regex})  # the grammar backend's first compile too
    count = requests_per_level(conc, min_requests)
    jobs = [(prompts[i % len(prompts)], {**params, "regex": regex} if c else params)
            for i, c in enumerate(constrained_jobs(count, constrained))]
    t0 = time.perf_counter()
    rs = in_flight(port, jobs, conc)
    wall = time.perf_counter() - t0
    tokens = [r["meta_info"]["completion_tokens"] for r in rs]
    verify = sum(r["meta_info"].get("spec_verify_ct") or 0 for r in rs)
    per_token = [r["_latency_s"] / t for r, t in zip(rs, tokens) if t]
    row = {
        "concurrency": conc, "requests": len(rs), "output_tokens": sum(tokens), "wall_s": round(wall, 3),
        "tokens_per_s": round(sum(tokens) / wall, 1), "ms_per_token": round(1e3 * sum(per_token) / len(per_token), 3),
        "tau": round(sum(tokens) / verify, 3) if verify else None, "verify_steps": verify, "client": "ids",
    }
    if constrained:
        row["constrained_requests"] = sum(1 for _, p in jobs if "regex" in p)
    return row, rs


def paired_row(constrained: dict, free: dict) -> dict:
    """A paired level's row: the constrained level's, with the free level's rate and the ratio of the rates (the
    grammar's cost on this server: 1 - ratio)."""
    return {**constrained, "free_tokens_per_s": free["tokens_per_s"],
            "grammar_ratio": round(constrained["tokens_per_s"] / free["tokens_per_s"], 3)}


def merge_rounds(rows: list[dict]) -> dict:
    """One level's rounds: rates and times averaged, tau over all their tokens and verify steps where counted."""
    ok = [r for r in rows if "error" not in r]
    if len(ok) < 2:
        return ok[0] if ok else rows[-1]
    merged = dict(ok[0])
    for key in ("tokens_per_s", "free_tokens_per_s", "tpot_ms", "median_tpot_ms", "ttft_ms", "ms_per_token"):
        if key in merged:
            merged[key] = round(sum(r[key] for r in ok) / len(ok), 3 if "tokens_per_s" not in key else 1)
    for key in ("requests", "output_tokens", "verify_steps", "constrained_requests"):
        if key in merged:
            merged[key] = sum(r[key] for r in ok)
    if merged.get("verify_steps"):
        merged["tau"] = round(merged["output_tokens"] / merged["verify_steps"], 3)
    elif merged.get("tau") is not None:
        merged["tau"] = round(sum(r["tau"] or 0 for r in ok) / len(ok), 3)
    merged["tokens_per_s_rounds"] = [r["tokens_per_s"] for r in ok]
    if "grammar_ratio" in merged:  # each round's own pair: the median, which one disturbed round does not move
        merged["grammar_ratio_rounds"] = [r["grammar_ratio"] for r in ok]
        merged["grammar_ratio"] = statistics.median(merged["grammar_ratio_rounds"])
    return merged


def table(result: dict) -> str:
    """Markdown: one line per server and concurrency; a paired phase's adds the free rate and the ratio."""
    paired = any("grammar_ratio" in r for rows in result["servers"].values() for r in rows)
    lines = ["| server | c | tokens/s | TPOT ms | ms/token | tau | requests | output tokens |"
             + (" all free, tokens/s | ratio (rounds) |" if paired else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|---|" if paired else "")]
    for name, rows in result["servers"].items():
        for r in rows:
            line = (f"| {name} | {r['concurrency']} | {r.get('tokens_per_s', r.get('error'))} | "
                    f"{r.get('tpot_ms', '')} | {r.get('ms_per_token', '')} | {r.get('tau')} | "
                    f"{r.get('requests')} | {r.get('output_tokens')} |")
            if paired:
                rounds = r.get("grammar_ratio_rounds")
                line += (f" {r.get('free_tokens_per_s', '')} | {r.get('grammar_ratio', '')}"
                         f"{' (' + ', '.join(map(str, rounds)) + ')' if rounds else ''} |")
            lines.append(line)
    return "\n".join(lines)
