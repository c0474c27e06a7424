"""Client of the live SmolLM2 benchmark (issue 9): greedy identity and tokens per second against running servers.

usage:
  python bench_client.py identity --prompts P.json --out DIR [--n 50] [--wait S] REF=PORT:PID TAG=PORT:PID ...
      greedy outputs (temperature 0, --max-new 128) of every TAG on the first --n prompts, token for token against
      REF (the first server given: no speculation); all servers queried at once, 8 requests in flight each.
  python bench_client.py speed --prompts P.json --out DIR [--conc 1 8 32] TAG=PORT:PID ...
      one server at a time (nothing else running), per concurrency c: 2 warm-up requests (in the first round, for c > 1,
      first a burst of c at once: batch shapes first seen mid-round cost the first round up to half its rate), then a
      bounded loop of max(4c, 8) requests over the same prompts for every server, c in flight; output tokens/s, mean
      time per output token (request latency / its tokens), tau (tokens per verify step, from sglang's spec_verify_ct).
  python bench_client.py sampled --prompts P.json --out DIR REF=PORT:PID TAG=PORT:PID
      temperature 0.7, 600 requests of one prompt, tokens 2..4 of TAG against REF (two-sample chi-square).
Results: DIR/<phase>_results.json; a markdown table on stdout. Standard library only.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import sys
import time

from client import first_divergence, post, tree_stats, two_sample_chi2, wait_ready

GREEDY_NEW = 128
SPEED_NEW = 256
SAMPLED_N, SAMPLED_TOKENS, TEMPERATURE = 600, 4, 0.7


def parse_servers(specs: list[str]) -> dict:
    servers = {}
    for spec in specs:
        tag, _, rest = spec.partition("=")
        port, _, pid = rest.partition(":")
        servers[tag] = (int(port), int(pid or 0))
    return servers


def request(port: int, ids: list, params: dict) -> dict:
    t = time.perf_counter()
    status, js = post(port, "/generate", {"input_ids": ids, "sampling_params": params})
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {str(js)[:300]}")
    js["_latency_s"] = time.perf_counter() - t
    return js


def finish(response: dict) -> str:
    reason = response.get("meta_info", {}).get("finish_reason") or {}
    return str(reason.get("type", reason)) if isinstance(reason, dict) else str(reason)


def identity(servers: dict, prompts: list, n: int) -> dict:
    ref = next(iter(servers))
    params = {"max_new_tokens": GREEDY_NEW, "temperature": 0.0}
    prompts = prompts[:n]

    def run(tag):
        with cf.ThreadPoolExecutor(8) as pool:
            return tag, list(pool.map(lambda ids: request(servers[tag][0], ids, params), prompts))

    outs, resp, errors = {}, {}, {}
    with cf.ThreadPoolExecutor(len(servers)) as pool:
        for fut in cf.as_completed([pool.submit(run, tag) for tag in servers]):
            try:
                tag, rs = fut.result()
                resp[tag], outs[tag] = rs, [r["output_ids"] for r in rs]
            except Exception as err:  # noqa: BLE001 - recorded, the other servers still count
                errors[str(err)[:80]] = f"{type(err).__name__}: {err}"
    result = {"reference": ref, "prompts": len(prompts), "max_new_tokens": GREEDY_NEW, "servers": {}, "errors": errors}
    for tag in servers:
        if tag not in outs or ref not in outs:
            result["servers"][tag] = {"status": "not-run"}
            continue
        bad = [(i, first_divergence(a, b)) for i, (a, b) in enumerate(zip(outs[ref], outs[tag])) if a != b]
        ok = not bad and len(outs[tag]) == len(prompts)
        result["servers"][tag] = {
            "status": "reference" if tag == ref else "pass" if ok else "fail",
            "mismatched": len(bad), "first_mismatches": bad[:5], "tokens": sum(map(len, outs[tag])),
            # what each side output from two tokens before the first difference, and why it stopped
            "mismatch_details": [
                {"prompt": i, "at": at, "reference": outs[ref][i][max(at - 2, 0) : at + 3], "got": outs[tag][i][max(at - 2, 0) : at + 3],
                 "reference_finish": finish(resp[ref][i]), "finish": finish(resp[tag][i])}
                for i, at in bad[:5]
            ],
            **{k: v for k, v in tree_stats(resp[tag]).items() if k != "meta_info_keys"},
        }
    return result


def in_flight(port: int, jobs: list, conc: int, params: dict) -> list:
    with cf.ThreadPoolExecutor(conc) as pool:
        return list(pool.map(lambda ids: request(port, ids, params), jobs))


def speed_one(port: int, prompts: list, conc: int, min_requests: int = 8, burst: bool = False) -> dict:
    params = {"max_new_tokens": SPEED_NEW, "temperature": 0.0}
    if burst and conc > 1:  # the batch sizes up to c (prefill and decode) run once before any timing
        in_flight(port, [prompts[i % len(prompts)] for i in range(conc)], conc, params)
    for ids in prompts[:2]:
        request(port, ids, params)  # warm-up: first-shape compiles stay out of the timing
    jobs = [prompts[i % len(prompts)] for i in range(max(4 * conc, min_requests))]
    t0 = time.perf_counter()
    rs = in_flight(port, jobs, conc, params)
    wall = time.perf_counter() - t0
    tokens = [r["meta_info"]["completion_tokens"] for r in rs]
    verify = [r["meta_info"].get("spec_verify_ct") or 0 for r in rs]
    tpot = [r["_latency_s"] / t for r, t in zip(rs, tokens) if t]
    return {
        "concurrency": conc, "requests": len(rs), "output_tokens": sum(tokens), "wall_s": round(wall, 3),
        "tokens_per_s": round(sum(tokens) / wall, 1),
        "tpot_ms": round(1e3 * sum(tpot) / len(tpot), 3),
        "tau": round(sum(tokens) / sum(verify), 3) if sum(verify) else None,
        "verify_steps": sum(verify),
        **({"tree": {k: v for k, v in tree_stats(rs).items() if k in ("flashtree_steps", "mean_distinct_candidates",
                                                                        "steps_depth_ge_2")}}
           if any(r["meta_info"].get("flashtree") for r in rs) else {}),
    }


def speed(servers: dict, prompts: list, concs: list[int], out: str, min_requests: int = 8, rounds: int = 1) -> dict:
    """Each server alone at each concurrency; with rounds > 1 the whole pass repeats (server order reversed every other
    round, so drift over the run falls on every server alike) and each level reports the mean over rounds."""
    result = {"max_new_tokens": SPEED_NEW, "rounds": rounds, "first_round_burst": True, "servers": {}}
    runs: dict = {tag: {c: [] for c in concs} for tag in servers}
    for rnd in range(rounds):
        order = list(servers.items())[:: -1 if rnd % 2 else 1]
        for tag, (port, _pid) in order:
            for c in concs:
                try:
                    runs[tag][c].append(speed_one(port, prompts, c, min_requests, burst=rnd == 0))
                except Exception as err:  # noqa: BLE001
                    runs[tag][c].append({"concurrency": c, "error": f"{type(err).__name__}: {err}"[:300]})
                print(f"[bench] {tag} c={c} round {rnd}: {json.dumps(runs[tag][c][-1])[:300]}", flush=True)
            result["servers"][tag] = [merge_rounds(runs[tag][c]) for c in concs]
            save(out, "speed", result)  # a call cut by its time limit keeps the servers already measured
    return result


def merge_rounds(rows: list[dict]) -> dict:
    """One level's rounds: tokens/s and TPOT averaged, tau over all their tokens and verify steps."""
    ok = [r for r in rows if "error" not in r]
    if len(ok) < 2:
        return ok[0] if ok else rows[-1]
    merged = dict(ok[0])
    merged["tokens_per_s"] = round(sum(r["tokens_per_s"] for r in ok) / len(ok), 1)
    merged["tpot_ms"] = round(sum(r["tpot_ms"] for r in ok) / len(ok), 3)
    for key in ("requests", "output_tokens", "verify_steps"):
        merged[key] = sum(r[key] for r in ok)
    merged["tau"] = round(merged["output_tokens"] / merged["verify_steps"], 3) if merged["verify_steps"] else None
    merged["tokens_per_s_rounds"] = [r["tokens_per_s"] for r in ok]
    return merged


def save(out: str, phase: str, result: dict) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{phase}_results.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)


def sampled(servers: dict, prompts: list) -> dict:
    ref = next(iter(servers))
    samples = {}
    for tag, (port, _pid) in servers.items():
        params = [{"max_new_tokens": SAMPLED_TOKENS, "temperature": TEMPERATURE, "ignore_eos": True, "sampling_seed": i}
                  for i in range(SAMPLED_N)]
        status, js = post(port, "/generate", {"input_ids": [prompts[0]] * SAMPLED_N, "sampling_params": params},
                          timeout=600)
        if status != 200:
            raise RuntimeError(f"{tag}: HTTP {status}: {str(js)[:300]}")
        samples[tag] = [r["output_ids"] for r in js]
    result = {"reference": ref, "samples": SAMPLED_N, "temperature": TEMPERATURE, "servers": {}}
    for tag in servers:
        if tag == ref:
            continue
        per_pos = []
        for pos in range(1, SAMPLED_TOKENS):
            stat, dof, p, cells = two_sample_chi2([o[pos] for o in samples[ref]], [o[pos] for o in samples[tag]])
            per_pos.append({"position": pos + 1, "chi2": round(stat, 2), "dof": dof, "p": p, "cells": cells})
        ok = all(x["p"] >= 1e-3 for x in per_pos) and all(x["cells"] >= 3 for x in per_pos)
        result["servers"][tag] = {"status": "pass" if ok else "fail", "per_position": per_pos}
    return result


def table(phase: str, result: dict) -> str:
    if phase == "speed":
        lines = ["| server | c | tokens/s | TPOT ms | tau | requests | output tokens |", "|---|---|---|---|---|---|---|"]
        for tag, rows in result["servers"].items():
            for r in rows:
                lines.append(f"| {tag} | {r['concurrency']} | {r.get('tokens_per_s', r.get('error'))} | "
                             f"{r.get('tpot_ms')} | {r.get('tau')} | {r.get('requests')} | {r.get('output_tokens')} |")
        return "\n".join(lines)
    return "\n".join(f"{tag}: {json.dumps(v)[:400]}" for tag, v in result["servers"].items())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("phase", choices=["identity", "speed", "sampled"])
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--conc", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--wait", type=float, default=0)
    ap.add_argument("--min-requests", type=int, default=8, help="speed: requests per level at least (4 x c otherwise)")
    ap.add_argument("--rounds", type=int, default=1, help="speed: passes over all servers, averaged")
    ap.add_argument("servers", nargs="+", help="TAG=PORT:PID (identity/sampled: the first is the reference)")
    args = ap.parse_args(argv)
    servers = parse_servers(args.servers)
    prompts = json.load(open(args.prompts))["prompts"]
    if args.wait:
        ready = wait_ready(servers, args.wait)
        servers = {t: s for t, s in servers.items() if ready[t] == "ready"}
        print(f"[bench] ready: {sorted(servers)}; not: {[t for t in ready if ready[t] != 'ready']}", flush=True)
    if not servers:
        return 1
    result = {"identity": lambda: identity(servers, prompts, args.n),
              "speed": lambda: speed(servers, prompts, args.conc, args.out, args.min_requests, args.rounds),
              "sampled": lambda: sampled(servers, prompts)}[args.phase]()
    save(args.out, args.phase, result)
    print(table(args.phase, result), flush=True)
    statuses = [v.get("status") for v in result["servers"].values() if isinstance(v, dict)]
    return 1 if any(s in ("fail", "not-run") for s in statuses) else 0


if __name__ == "__main__":
    sys.exit(main())
