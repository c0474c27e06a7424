"""Requests with sampling features through sglang's OpenAI-compatible endpoint (POST /v1/chat/completions with the
OpenAI wire format the `openai` client sends; plain HTTP, so the phase needs no client package): each server's answers
against the first server's (no speculation), request by request.

Every request is greedy, so on float32 deterministic servers the texts, tool calls and logprob tokens must be equal
(logprob values within `logprob_tol`); JSON answers are validated against their schema. A request named in
`may_refuse` that a tree server refuses with flashtree's message counts as refused, not failed, as long as the server
keeps serving (logprobs on a DFLASH tree server on sglang 0.5.17, whose DFLASH worker refuses them); every other
refusal or difference fails the phase.
"""

from __future__ import annotations

import json

from flashtree.live.config import FEATURE_REQUESTS
from flashtree.live.http_json import get, post

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}


# A JSON answer cut at max_tokens is no JSON (sglang then returns no tool call at all), and a small model's
# grammar-constrained JSON can run long on whitespace: the schema requests get at least this many tokens.
JSON_MAX_TOKENS = 256


def requests(logit_bias: dict[str, float], max_tokens: int, skip=()) -> dict[str, dict]:
    """name (config.FEATURE_REQUESTS) -> /v1/chat/completions body without the model (sglang's own sampling fields at
    the top level, where the openai client puts `extra_body`)."""
    ask = lambda text: [{"role": "user", "content": text}]  # noqa: E731
    story = ask("Write a short story about a lighthouse keeper and the sea.")
    base = {"temperature": 0.0, "max_tokens": max_tokens}
    json_base = {**base, "max_tokens": max(max_tokens, JSON_MAX_TOKENS)}
    every = {
        "plain": {**base, "messages": story},
        "json_schema": {**json_base, "messages": ask("Invent a person. Answer in JSON with a name and an age."),
                        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}},
        "tool_required": {**json_base, "messages": ask("What is the weather in Paris?"), "tool_choice": "required",
                          # one call: sglang's constraint for `required` is a JSON array of calls, without this
                          # unbounded, so a small model's answer can run past max_tokens and parse as no call
                          "parallel_tool_calls": False,
                          "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]},
        "regex": {**base, "messages": ask("Is the sea salty? Answer yes or no and why."),
                  "regex": r"(yes|no), because [a-z ]{5,40}\."},
        "frequency_penalty": {**base, "messages": story, "frequency_penalty": 0.8},
        "presence_penalty": {**base, "messages": story, "presence_penalty": 0.6},
        "repetition_penalty": {**base, "messages": story, "repetition_penalty": 1.3},
        "logit_bias": {**base, "messages": story, "logit_bias": logit_bias},
        "min_p": {**base, "messages": story, "min_p": 0.2},
        "logprobs": {**base, "messages": story, "logprobs": True, "top_logprobs": 3},
    }
    assert tuple(every) == FEATURE_REQUESTS
    return {k: v for k, v in every.items() if k == "plain" or k not in skip}  # plain: every check's baseline


def answer(port: int, model: str, body: dict, timeout_s: float) -> dict:
    """One request -> {"ok", "content", "tool_calls", "finish", "logprobs"} or {"ok": False, "error"}."""
    try:
        status, js = post(port, "/v1/chat/completions", {"model": model, **body}, timeout=timeout_s)
    except OSError as err:
        return {"ok": False, "error": f"{type(err).__name__}: {err}"[:400]}
    if status != 200 or not isinstance(js, dict) or not js.get("choices"):
        return {"ok": False, "error": f"HTTP {status}: {json.dumps(js) if isinstance(js, dict) else js}"[:400]}
    choice = js["choices"][0]
    message = choice.get("message") or {}
    calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
             for c in message.get("tool_calls") or []]
    content = (choice.get("logprobs") or {}).get("content")
    lps = None if content is None else [
        {"token": t["token"], "logprob": t["logprob"], "top": [(x["token"], x["logprob"]) for x in t.get("top_logprobs") or []]}
        for t in content]
    return {"ok": True, "content": message.get("content"), "tool_calls": calls, "finish": choice.get("finish_reason"),
            "logprobs": lps}


def content_calls(content: str | None) -> list[tuple[str, dict]]:
    """A server without `--tool-call-parser` answers `tool_choice: required` with the constrained JSON array itself as
    the content ([{"name", "parameters"}], sglang's `required` constraint), not as tool calls: its calls' arguments,
    each against its tool's schema ([("", WEATHER)] when it is no such array, which then fails as no JSON)."""
    try:
        calls = json.loads(content or "")
    except ValueError:
        return [("", WEATHER)]
    if not isinstance(calls, list) or not calls or not all(
            isinstance(c, dict) and c.get("name") == "get_weather" and "parameters" in c for c in calls):
        return [("", WEATHER)]
    return [(json.dumps(c["parameters"]), WEATHER) for c in calls]


def schema_errors(name: str, got: dict) -> list[str]:
    """Why a JSON answer does not satisfy its schema (empty: it does, or the request has no schema)."""
    import jsonschema

    docs = []
    if name == "json_schema":
        docs = [(got.get("content") or "", PERSON)]
    elif name == "tool_required":
        docs = [(c["arguments"], WEATHER) for c in got.get("tool_calls", [])] or content_calls(got.get("content"))
    errors = []
    for text, schema in docs:
        try:
            jsonschema.validate(json.loads(text), schema)
        except (ValueError, jsonschema.ValidationError) as err:
            errors.append(f"{type(err).__name__}: {str(err)[:200]}")
    return errors


def logprob_gap(ref: list | None, got: list | None) -> float | None:
    """Largest |logprob difference| over the chosen and top tokens; None when the token lists differ."""
    if ref is None or got is None or [t["token"] for t in ref] != [t["token"] for t in got]:
        return None
    gaps = [abs(a["logprob"] - b["logprob"]) for a, b in zip(ref, got)]
    for a, b in zip(ref, got):
        if [x[0] for x in a["top"]] != [x[0] for x in b["top"]]:
            return None
        gaps += [abs(x[1] - y[1]) for x, y in zip(a["top"], b["top"])]
    return max(gaps, default=0.0)


# The sglang field a refusal names when sglang itself refuses the request before flashtree sees it (0.5.17 answered a
# DSPARK tree server's logprobs requests "DFLASH speculative decoding does not support return_logprob yet" before
# flashtree let them through, live runs 27-29).
REFUSED_FIELD = {"logprobs": "return_logprob"}


def refused_clearly(name: str, error: str) -> bool:
    """An HTTP 400 that names flashtree or the request's own sglang field: a refusal, not a failure."""
    return error.startswith("HTTP 400") and ("flashtree" in error or REFUSED_FIELD.get(name, "\0") in error)


def verdict(name: str, ref: dict, got: dict, tree: bool, tol: float, may_refuse=()) -> dict:
    if not got["ok"]:
        refused = tree and name in may_refuse and refused_clearly(name, got["error"])
        return {"status": "refused" if refused else "fail", "error": got["error"]}
    same = all(ref.get(k) == got.get(k) for k in ("content", "tool_calls", "finish"))
    row = {"status": "pass" if same else "fail", "equal": same, "schema_errors": schema_errors(name, got)}
    if row["schema_errors"]:
        row["status"] = "fail"
    if name == "logprobs":
        row["max_logprob_gap"] = gap = logprob_gap(ref.get("logprobs"), got.get("logprobs"))
        if gap is None or gap > tol:
            row["status"] = "fail"
    if not same:
        row["reference"], row["got"] = str(ref.get("content") or ref.get("tool_calls"))[:300], str(
            got.get("content") or got.get("tool_calls"))[:300]
    return row


def reference_check(name: str, got: dict, plain: dict) -> dict:
    """The reference's own answer: served, valid against its schema (with the text when it is not), and whether the
    feature changed it from the plain request's."""
    errors = schema_errors(name, got) if got["ok"] else []
    check = {"served": got["ok"], "schema_errors": errors, "differs_from_plain": got.get("content") != plain.get("content")}
    if errors:
        check["got"] = str(got.get("tool_calls") or got.get("content"))[:300]
    return check


def run_features(ports: dict[str, int], tree: dict[str, bool], logit_bias: dict[str, float], max_tokens: int,
                 logprob_tol: float, may_refuse=(), timeout_s: float = 300.0, skip=()) -> dict:
    """The first server is the reference; -> per server and request a verdict, and the reference's own checks (its
    JSON answers against their schemas; which features changed its answer from the plain request's)."""
    names = list(ports)
    _status, models = get(ports[names[0]], "/v1/models", timeout=timeout_s)
    model = models["data"][0]["id"]
    reqs = requests(logit_bias, max_tokens, skip)
    answers = {n: {k: answer(p, model, body, timeout_s) for k, body in reqs.items()} for n, p in ports.items()}
    ref = answers[names[0]]
    result = {"reference": names[0], "model": model,
              "requests": {k: {kk: v for kk, v in body.items() if kk != "messages"} for k, body in reqs.items()},
              "reference_checks": {k: reference_check(k, a, ref["plain"]) for k, a in ref.items()},
              "servers": {}}
    failed = [f"{names[0]}:{k}" for k, c in result["reference_checks"].items() if not c["served"] or c["schema_errors"]]
    for n in names[1:]:
        rows = {k: verdict(k, ref[k], answers[n][k], tree[n], logprob_tol, may_refuse) if ref[k]["ok"] else
                {"status": "fail", "error": "the reference did not serve it"} for k in reqs}
        still = answer(ports[n], model, reqs["plain"], timeout_s)
        rows["serving_after"] = {"status": "pass" if still["ok"] else "fail"}
        bad = [k for k, r in rows.items() if r["status"] == "fail"]
        result["servers"][n] = {"status": "fail" if bad else "pass", "requests": rows}
        failed += [f"{n}:{k}" for k in bad]
    result["failed"] = failed
    return result
