"""Client of the live H200 check (issue 8): talks to already-started sglang servers and checks the tree toggles.

usage: python client.py --prompts PROMPTS_JSON --out OUT_DIR --wait SECONDS TAG=PORT:PID [TAG=PORT:PID ...]

Tags it knows (any may be missing; the checks that need a missing or dead server are reported as not run):
  plain   no speculation, toggles off (--grammar-backend xgrammar)     chain   DSPARK chain, toggles off
  tree    DSPARK + FLASHTREE_TREE_N, split-KV off (--grammar-backend xgrammar)
  splitkv DSPARK + FLASHTREE_TREE_N + FLASHTREE_SPLITKV_VERIFY=1
Checks (each records pass / fail / not-run and its evidence in OUT_DIR/live_results.json):
  greedy_<tag>        greedy outputs on every prompt token-identical to `plain` (float32 servers)
  tree_depth          per-request tree statistics show trees ran, accepted depth >= 2 somewhere
  sampled_<tag>       temperature 0.7: generated tokens 2-4 of one prompt distributed as on `plain`
                      (two-sample chi-square per position, rare tokens pooled, p >= 0.001 each)
  grammar_refused     a regex-constrained request to `tree` gets flashtree's error, and `tree` keeps serving
  grammar_plain       the same request is served by `plain` (toggles off)
  splitkv_same        `splitkv` greedy outputs equal `tree`'s
Standard library only (runs in the bundle's Python next to the servers).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import os
import sys
import time
import urllib.error
import urllib.request

GREEDY = {"max_new_tokens": 32, "temperature": 0.0, "ignore_eos": True}
SAMPLED_N, SAMPLED_TOKENS, TEMPERATURE = 600, 4, 0.7
GRAMMAR = {"max_new_tokens": 8, "temperature": 0.0, "regex": "(ab)+"}


def post(port: int, path: str, body: dict, timeout: float = 300.0):
    """-> (HTTP status, parsed JSON or text)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as err:
        raw, status = err.read().decode(errors="replace"), err.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def wait_ready(servers: dict, wait_s: float) -> dict:
    """tag -> 'ready' or why not, waiting for all servers' /health in parallel."""
    state = {tag: None for tag in servers}
    t0 = time.time()
    while time.time() - t0 < wait_s and any(v is None for v in state.values()):
        for tag, (port, pid) in servers.items():
            if state[tag] is not None:
                continue
            if pid and not alive(pid):
                state[tag] = f"process {pid} exited after {time.time() - t0:.0f} s"
                continue
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        state[tag] = "ready"
                        print(f"[client] {tag} ready after {time.time() - t0:.0f} s", flush=True)
            except Exception:  # noqa: BLE001 - not up yet
                pass
        time.sleep(2)
    return {tag: v or f"/health not ready after {wait_s:.0f} s" for tag, v in state.items()}


def generate_all(port: int, prompts: list, params: dict, workers: int = 8) -> list:
    """One request per prompt, `workers` in flight (mixed batches on the server). -> list of response dicts."""

    def one(ids):
        status, js = post(port, "/generate", {"input_ids": ids, "sampling_params": params})
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {str(js)[:300]}")
        return js

    with cf.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, prompts))


def chi2_sf(x: float, dof: int) -> float:
    """Upper tail of the chi-square distribution (regularised upper incomplete gamma Q(dof/2, x/2))."""
    if x <= 0:
        return 1.0
    a, z = dof / 2.0, x / 2.0
    lg = math.lgamma(a)
    if z < a + 1:  # series for P
        term = total = 1.0 / a
        n = a
        for _ in range(1000):
            n += 1
            term *= z / n
            total += term
            if abs(term) < abs(total) * 1e-14:
                break
        return max(0.0, 1.0 - total * math.exp(-z + a * math.log(z) - lg))
    b, c, d = z + 1 - a, 1e300, 1.0 / (z + 1 - a)  # continued fraction for Q (Lentz)
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-14:
            break
    return math.exp(-z + a * math.log(z) - lg) * h


def two_sample_chi2(xs: list, ys: list, min_count: int = 10):
    """Homogeneity test of two samples of tokens; tokens with fewer than min_count pooled -> (stat, dof, p, cells)."""
    from collections import Counter

    cx, cy = Counter(xs), Counter(ys)
    cells, other = [], [0, 0]
    for tok in set(cx) | set(cy):
        if cx[tok] + cy[tok] >= min_count:
            cells.append((cx[tok], cy[tok]))
        else:
            other[0] += cx[tok]
            other[1] += cy[tok]
    if sum(other) > 0:
        cells.append(tuple(other))
    nx, ny = len(xs), len(ys)
    stat = 0.0
    for a, b in cells:
        tot = a + b
        for obs, n in ((a, nx), (b, ny)):
            exp = tot * n / (nx + ny)
            stat += (obs - exp) ** 2 / exp
    dof = max(len(cells) - 1, 1)
    return stat, dof, chi2_sf(stat, dof), len(cells)


def tree_stats(responses: list) -> dict:
    """Gather flashtree's per-request statistics and sglang's own spec metrics from meta_info."""
    steps, depths, distinct, accept_lens, hist = 0, [], [], [], {}
    for r in responses:
        m = r.get("meta_info", {})
        for row in m.get("flashtree") or []:
            if isinstance(row, (list, tuple)) and len(row) == 4:
                steps += 1
                distinct.append(row[1])
                depths.append(row[3])
        if m.get("spec_accept_length") is not None:
            accept_lens.append(m["spec_accept_length"])
        for k, v in enumerate(m.get("spec_accept_histogram") or []):
            hist[k] = hist.get(k, 0) + v
    return {
        "flashtree_steps": steps,
        "max_accepted_depth": max(depths) if depths else None,
        "steps_depth_ge_2": sum(d >= 2 for d in depths),
        "mean_distinct_candidates": sum(distinct) / len(distinct) if distinct else None,
        "mean_spec_accept_length": sum(accept_lens) / len(accept_lens) if accept_lens else None,
        "spec_accept_histogram": hist,
        "meta_info_keys": sorted(responses[0].get("meta_info", {})) if responses else [],
    }


def first_divergence(a: list, b: list):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--wait", type=float, default=300)
    ap.add_argument("servers", nargs="+", help="TAG=PORT:PID")
    args = ap.parse_args(argv)
    servers = {}
    for spec in args.servers:
        tag, _, rest = spec.partition("=")
        port, _, pid = rest.partition(":")
        servers[tag] = (int(port), int(pid or 0))
    data = json.load(open(args.prompts))
    prompts = data["prompts"]
    results: dict = {"servers": {}, "checks": {}}
    checks = results["checks"]

    def record(name, ok, **evidence):
        checks[name] = {"status": "pass" if ok else "fail", **evidence}
        print(f"[client] {name}: {checks[name]['status']} {json.dumps(evidence)[:600]}", flush=True)

    def not_run(name, why):
        checks[name] = {"status": "not-run", "why": why}
        print(f"[client] {name}: not run ({why})", flush=True)

    ready = wait_ready(servers, args.wait)
    results["servers"] = ready
    up = {t for t, s in ready.items() if s == "ready"}

    # Greedy outputs on every prompt, per server.
    outs, resp = {}, {}
    for tag in sorted(up):
        t = time.time()
        try:
            resp[tag] = generate_all(servers[tag][0], prompts, GREEDY)
            outs[tag] = [r["output_ids"] for r in resp[tag]]
            results.setdefault("greedy_seconds", {})[tag] = round(time.time() - t, 2)
        except Exception as err:  # noqa: BLE001
            results.setdefault("errors", {})[f"greedy_{tag}"] = f"{type(err).__name__}: {err}"
    for tag in ("chain", "tree", "splitkv"):
        if "plain" not in outs or tag not in outs:
            not_run(f"greedy_{tag}", f"needs plain and {tag} outputs")
            continue
        bad = [(i, first_divergence(a, b)) for i, (a, b) in enumerate(zip(outs["plain"], outs[tag])) if a != b]
        record(f"greedy_{tag}", not bad and len(outs[tag]) == len(prompts) >= 50, prompts=len(outs[tag]),
               mismatched=len(bad), first_mismatches=bad[:5])
    if "tree" in resp:
        stats = tree_stats(resp["tree"])
        results["tree_stats"] = stats
        record("tree_depth", stats["flashtree_steps"] > 0 and (stats["max_accepted_depth"] or 0) >= 2, **stats)
    else:
        not_run("tree_depth", "tree server not up")
    for tag in ("chain", "splitkv"):
        if tag in resp:
            results[f"{tag}_stats"] = tree_stats(resp[tag])

    # Sampled requests: tokens 2..SAMPLED_TOKENS of one prompt, tree/splitkv vs plain.
    samples = {}
    for tag in sorted(up & {"plain", "tree", "splitkv"}):
        # One seed per request: under --enable-deterministic-inference sglang seeds every request alike by default,
        # which would make the reference samples one repeated draw.
        params = [{"max_new_tokens": SAMPLED_TOKENS, "temperature": TEMPERATURE, "ignore_eos": True, "sampling_seed": i}
                  for i in range(SAMPLED_N)]
        try:
            status, js = post(servers[tag][0], "/generate", {"input_ids": [prompts[0]] * SAMPLED_N, "sampling_params": params}, timeout=600)
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {str(js)[:300]}")
            samples[tag] = [r["output_ids"] for r in js]
        except Exception as err:  # noqa: BLE001
            results.setdefault("errors", {})[f"sampled_{tag}"] = f"{type(err).__name__}: {err}"
    for tag in ("tree", "splitkv"):
        if "plain" not in samples or tag not in samples:
            not_run(f"sampled_{tag}", f"needs plain and {tag} samples")
            continue
        per_pos = []
        for pos in range(1, SAMPLED_TOKENS):
            stat, dof, p, cells = two_sample_chi2([o[pos] for o in samples["plain"]], [o[pos] for o in samples[tag]])
            per_pos.append({"position": pos + 1, "chi2": round(stat, 2), "dof": dof, "p": p, "cells": cells})
        record(f"sampled_{tag}", all(x["p"] >= 1e-3 for x in per_pos) and all(x["cells"] >= 3 for x in per_pos),
               samples=SAMPLED_N, temperature=TEMPERATURE, per_position=per_pos)
    if "tree" in samples:
        results["tree_sampled_stats"] = "see server log (batch request)"

    # Grammar: refused by flashtree on the tree server (which keeps serving), served with toggles off.
    body = {"input_ids": prompts[1], "sampling_params": GRAMMAR}
    if "tree" in up:
        status, js = post(servers["tree"][0], "/generate", body)
        text = json.dumps(js) if not isinstance(js, str) else js
        s2, js2 = post(servers["tree"][0], "/generate", {"input_ids": prompts[2], "sampling_params": GREEDY})
        still = s2 == 200 and "output_ids" in (js2 if isinstance(js2, dict) else {})
        record("grammar_refused", status != 200 and "flashtree" in text and still, http=status,
               message=text[:400], serving_after=still)
    else:
        not_run("grammar_refused", "tree server not up")
    if "plain" in up:
        status, js = post(servers["plain"][0], "/generate", body)
        record("grammar_plain", status == 200 and isinstance(js, dict) and bool(js.get("output_ids")), http=status,
               text=(js.get("text") if isinstance(js, dict) else str(js))[:200])
    else:
        not_run("grammar_plain", "plain server not up")

    if "tree" in outs and "splitkv" in outs:
        bad = [i for i, (a, b) in enumerate(zip(outs["tree"], outs["splitkv"])) if a != b]
        record("splitkv_same", not bad, prompts=len(outs["tree"]), mismatched=len(bad), first=bad[:5])
    else:
        not_run("splitkv_same", "needs tree and splitkv outputs")

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "live_results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    with open(os.path.join(args.out, "greedy_outputs.json"), "w") as f:
        json.dump(outs, f)
    failed = [n for n, c in checks.items() if c["status"] != "pass"]
    print(f"[client] {len(checks) - len(failed)}/{len(checks)} checks passed; not passed: {failed}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
