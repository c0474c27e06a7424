"""Sampled losslessness: tokens 2.. of one prompt drawn many times from a server and from the reference, compared
per position by a two-sample chi-square test (rare tokens pooled)."""

from __future__ import annotations

import math
from collections import Counter

from flashtree.live.http_json import generate

P_MIN = 1e-3  # every position's p-value at least this
CELLS_MIN = 3  # and at least this many cells (a test of one or two cells says nothing)


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


def compare_samples(ref: list[list[int]], got: list[list[int]], tokens: int) -> dict:
    """Positions 2..tokens (the first token comes from prefill, not from a verify step) of two sets of draws."""
    per_pos = []
    for pos in range(1, tokens):
        stat, dof, p, cells = two_sample_chi2([o[pos] for o in ref], [o[pos] for o in got])
        per_pos.append({"position": pos + 1, "chi2": round(stat, 2), "dof": dof, "p": p, "cells": cells})
    ok = all(x["p"] >= P_MIN and x["cells"] >= CELLS_MIN for x in per_pos)
    return {"status": "pass" if ok else "fail", "per_position": per_pos}


def draws(port: int, prompt: list, samples: int, tokens: int, temperature: float, timeout_s: float) -> list[dict]:
    # One seed per request: under --enable-deterministic-inference sglang seeds every request alike by default,
    # which would make the reference samples one repeated draw.
    params = [{"max_new_tokens": tokens, "temperature": temperature, "ignore_eos": True, "sampling_seed": i}
              for i in range(samples)]
    return generate(port, [prompt] * samples, params, timeout=timeout_s)


def run_sampled(ports: dict[str, int], prompt: list, samples: int, tokens: int, temperature: float,
                timeout_s: float = 300.0):
    """-> (result, responses per server); the first server is the reference."""
    responses, errors = {}, {}
    for name, port in ports.items():
        try:
            responses[name] = draws(port, prompt, samples, tokens, temperature, timeout_s)
        except Exception as err:  # noqa: BLE001 - recorded; the other servers still count
            errors[name] = f"{type(err).__name__}: {err}"
    ref = next(iter(ports))
    outs = {name: [r["output_ids"] for r in rs] for name, rs in responses.items()}
    result = {"reference": ref, "samples": samples, "temperature": temperature, "errors": errors, "servers": {}}
    for name in ports:
        if name != ref:
            result["servers"][name] = (compare_samples(outs[ref], outs[name], tokens)
                                       if name in outs and ref in outs else {"status": "not-run"})
    return result, responses
