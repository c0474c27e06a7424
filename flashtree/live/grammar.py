"""Grammar-constrained requests: every server serves a regex request, greedy, with the first server's (no
speculation) output token for token, and keeps serving after it."""

from __future__ import annotations

import json

from flashtree.live.http_json import generate, post


def answer(port: int, prompt: list, regex: str, max_new_tokens: int, timeout_s: float) -> dict:
    status, js = post(port, "/generate", {"input_ids": prompt, "sampling_params":
                                          {"max_new_tokens": max_new_tokens, "temperature": 0.0, "regex": regex}},
                      timeout=timeout_s)
    ids = js.get("output_ids") if status == 200 and isinstance(js, dict) else None
    return {"http": status, "output_ids": ids, "response": (js if isinstance(js, str) else json.dumps(js))[:300]}


def run_grammar(ports: dict[str, int], prompts: list, regex: str, max_new_tokens: int, timeout_s: float = 300.0) -> dict:
    names = list(ports)
    got = {n: answer(p, prompts[0], regex, max_new_tokens, timeout_s) for n, p in ports.items()}
    ref = got[names[0]]["output_ids"]
    servers = {}
    for n, a in got.items():
        after = generate(ports[n], prompts[1 % len(prompts)], {"max_new_tokens": max_new_tokens, "temperature": 0.0},
                         timeout=timeout_s)
        ok = bool(a["output_ids"]) and a["output_ids"] == ref and bool(after.get("output_ids"))
        servers[n] = {"status": "pass" if ok else "fail", "expected": f"served, as {names[0]}", **a,
                      "serving_after": bool(after.get("output_ids"))}
    return {"regex": regex, "reference": names[0], "servers": servers}
