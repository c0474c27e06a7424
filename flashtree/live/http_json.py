"""JSON over HTTP to a server on 127.0.0.1 (standard library only)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from flashtree.live.commands import HOST


def post(port: int, path: str, body: dict, timeout: float = 300.0):
    """-> (HTTP status, parsed JSON or text)."""
    return _call(urllib.request.Request(f"http://{HOST}:{port}{path}", data=json.dumps(body).encode(),
                                        headers={"Content-Type": "application/json"}), timeout)


def get(port: int, path: str, timeout: float = 300.0):
    """-> (HTTP status, parsed JSON or text)."""
    return _call(urllib.request.Request(f"http://{HOST}:{port}{path}"), timeout)


def _call(req: urllib.request.Request, timeout: float):
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw, status = r.read().decode(), r.status
    except urllib.error.HTTPError as err:
        raw, status = err.read().decode(errors="replace"), err.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def healthy(port: int, timeout: float = 3.0) -> bool:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=timeout) as r:
            return r.status == 200
    except (OSError, ValueError):
        return False


def generate(port: int, ids: list, params, timeout: float = 600.0):
    """One /generate call (a list of prompts gives a list of responses); `_latency_s` added to each response dict."""
    t = time.perf_counter()
    status, js = post(port, "/generate", {"input_ids": ids, "sampling_params": params}, timeout=timeout)
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {str(js)[:300]}")
    latency = time.perf_counter() - t
    for r in js if isinstance(js, list) else [js]:
        r["_latency_s"] = latency
    return js
