"""Greedy identity: every server's outputs token for token against the reference's (no speculation, float32)."""

from __future__ import annotations

import concurrent.futures as cf

from flashtree.live.http_json import generate


def first_divergence(a: list, b: list):
    """Index of the first differing token (or where the shorter ends), None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def finish(response: dict) -> str:
    reason = response.get("meta_info", {}).get("finish_reason") or {}
    return str(reason.get("type", reason)) if isinstance(reason, dict) else str(reason)


def compare(ref: list[dict], got: list[dict]) -> dict:
    """Responses of one server against the reference's, prompt by prompt -> pass/fail and the first mismatches."""
    outs_ref, outs = [r["output_ids"] for r in ref], [r["output_ids"] for r in got]
    bad = [(i, first_divergence(a, b)) for i, (a, b) in enumerate(zip(outs_ref, outs)) if a != b]
    return {
        "status": "pass" if not bad and len(outs) == len(outs_ref) else "fail",
        "prompts": len(outs), "mismatched": len(bad), "first_mismatches": bad[:5], "tokens": sum(map(len, outs)),
        # what each side output from two tokens before the first difference, and why it stopped
        "mismatch_details": [
            {"prompt": i, "at": at, "reference": outs_ref[i][max(at - 2, 0): at + 3],
             "got": outs[i][max(at - 2, 0): at + 3], "reference_finish": finish(ref[i]), "finish": finish(got[i])}
            for i, at in bad[:5]
        ],
    }


def greedy_outputs(port: int, prompts: list, max_new_tokens: int, in_flight: int, timeout_s: float) -> list[dict]:
    params = {"max_new_tokens": max_new_tokens, "temperature": 0.0}
    with cf.ThreadPoolExecutor(in_flight) as pool:
        return list(pool.map(lambda ids: generate(port, ids, params, timeout=timeout_s), prompts))


def run_identity(ports: dict[str, int], prompts: list, max_new_tokens: int, in_flight: int = 8,
                 timeout_s: float = 300.0):
    """All servers at once (the first is the reference) -> (result, responses per server)."""
    names = list(ports)
    responses, errors = {}, {}
    with cf.ThreadPoolExecutor(len(names)) as pool:
        futures = {pool.submit(greedy_outputs, ports[n], prompts, max_new_tokens, in_flight, timeout_s): n for n in names}
        for fut in cf.as_completed(futures):
            try:
                responses[futures[fut]] = fut.result()
            except Exception as err:  # noqa: BLE001 - recorded; the other servers still count
                errors[futures[fut]] = f"{type(err).__name__}: {err}"
    ref = names[0]
    result = {"reference": ref, "prompts": len(prompts), "max_new_tokens": max_new_tokens, "errors": errors,
              "servers": {}}
    for name in names:
        if name not in responses or ref not in responses:
            result["servers"][name] = {"status": "not-run"}
        elif name == ref:
            result["servers"][name] = {"status": "reference", "tokens": sum(len(r["output_ids"]) for r in responses[ref])}
        else:
            result["servers"][name] = compare(responses[ref], responses[name])
    return result, responses
