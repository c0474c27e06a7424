"""Grammar-constrained requests: a server on flashtree's tree path refuses them with flashtree's message and keeps
serving; a server without it (no speculation, DSPARK's chain) serves them."""

from __future__ import annotations

import json

from flashtree.live.http_json import generate, post


def check(port: int, tree: bool, prompts: list, regex: str, max_new_tokens: int, timeout_s: float = 300.0) -> dict:
    status, js = post(port, "/generate", {"input_ids": prompts[0], "sampling_params":
                                          {"max_new_tokens": max_new_tokens, "temperature": 0.0, "regex": regex}},
                      timeout=timeout_s)
    text = js if isinstance(js, str) else json.dumps(js)
    if not tree:
        ok = status == 200 and isinstance(js, dict) and bool(js.get("output_ids"))
        return {"status": "pass" if ok else "fail", "expected": "served", "http": status, "response": text[:300]}
    after = generate(port, prompts[1 % len(prompts)], {"max_new_tokens": max_new_tokens, "temperature": 0.0},
                     timeout=timeout_s)
    ok = status != 200 and "flashtree" in text and bool(after.get("output_ids"))
    return {"status": "pass" if ok else "fail", "expected": "refused by flashtree, still serving", "http": status,
            "response": text[:300], "serving_after": bool(after.get("output_ids"))}


def run_grammar(ports: dict[str, int], tree: dict[str, bool], prompts: list, regex: str, max_new_tokens: int,
                timeout_s: float = 300.0) -> dict:
    return {"regex": regex, "servers": {name: check(port, tree[name], prompts, regex, max_new_tokens, timeout_s)
                                        for name, port in ports.items()}}
