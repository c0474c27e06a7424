"""A stand-in for sglang's HTTP server, to check flashtree.live without a GPU.

usage: python fake_server.py MODE [--start-delay S] [--stop-delay S] [--host H] --port PORT [--nccl-port P]
MODE: plain | tree | broken (greedy outputs differ at token 4) | die (prints a line and exits 3 at once)
Greedy output = a function of the prompt (regex requests too); sampled output = draws from a fixed per-position
distribution; `tree` adds flashtree statistics to meta_info.
/health answers only after --start-delay seconds (a server still starting); a SIGTERM exits after --stop-delay seconds
(a server shutting down); GET /stats counts POST /generate calls, and those with a regex.
POST /v1/chat/completions answers greedy chat requests as a function of the body (a JSON object for a schema, a tool
call for tool_choice required, logprobs when asked); `tree` refuses logprobs with flashtree's message (sglang 0.5.17),
`broken` answers frequency_penalty requests differently (a tree applying the root's penalty state).
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ap = argparse.ArgumentParser()
ap.add_argument("mode")
ap.add_argument("--start-delay", type=float, default=0.0)
ap.add_argument("--stop-delay", type=float, default=0.0)
ap.add_argument("--host", default="127.0.0.1")
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--nccl-port", type=int)
args = ap.parse_args()
MODE, PORT = args.mode, args.port
print(f"fake sglang server {MODE} on {args.host}:{PORT}", flush=True)
if MODE == "die":
    print("RuntimeError: the stand-in was told to die while starting", flush=True)
    sys.exit(3)
if args.nccl_port is not None:  # held while serving, as sglang's rendezvous store holds it (EADDRINUSE if taken)
    RENDEZVOUS = socket.create_server((args.host, args.nccl_port))
T0 = time.monotonic()


def _stop(signum, frame):
    time.sleep(args.stop_delay)
    sys.exit(0)


signal.signal(signal.SIGTERM, _stop)
rng = random.Random(PORT)
served = {"generate": 0, "regex": 0}


def one(ids, sp):
    n = sp.get("max_new_tokens", 16)
    if sp.get("temperature", 0) > 0:
        out = [rng.choices([5, 6, 7, 8], weights=[5, 3, 1, 1])[0] for _ in range(n)]
    else:
        out = [(sum(ids) * 31 + 7 * i) % 32000 for i in range(n)]
        if MODE == "broken":
            out[3] += 1
    meta = {"id": "x", "spec_accept_length": 2.5, "spec_accept_histogram": [1, 2, 3], "completion_tokens": n,
            "spec_verify_ct": (n + 1) // 2, "finish_reason": {"type": "length"}}
    if MODE == "tree":
        meta["flashtree"] = [[8, 3, 7, 2], [8, 2, 7, 0]]
    return {"text": "ab" * (n // 2), "output_ids": out, "meta_info": meta}


class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, code, obj):
        raw = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):
        if self.path == "/health":
            return self._send(200 if time.monotonic() - T0 >= args.start_delay else 503, {})
        if self.path == "/v1/models":
            return self._send(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
        self._send(200, served) if self.path == "/stats" else self._send(404, {})

    def chat(self, body):
        if MODE == "tree" and body.get("logprobs"):
            return self._send(400, {"object": "error", "message": "flashtree: this server runs flashtree tree speculative decoding (FLASHTREE_TREE_N=8), which cannot serve return_logprob on this sglang release (its DSPARK worker refuses it; sglang 0.5.20 and 0.5.23 serve it)."})
        seed = sum(map(ord, json.dumps({k: v for k, v in body.items() if k != "model"}, sort_keys=True)))
        if MODE == "broken" and body.get("frequency_penalty"):
            seed += 1
        message = {"role": "assistant", "content": f"answer {seed % 997}", "tool_calls": None}
        if body.get("response_format"):
            message["content"] = json.dumps({"name": "Ann", "age": seed % 90})
        if body.get("tool_choice") == "required":
            message["content"] = None
            message["tool_calls"] = [{"id": "c0", "type": "function", "function": {
                "name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}]
        logprobs = None
        if body.get("logprobs"):
            logprobs = {"content": [{"token": t, "logprob": -0.5 * i, "top_logprobs": [
                {"token": t, "logprob": -0.5 * i}, {"token": "x", "logprob": -3.0 - i}]} for i, t in enumerate(["an", "swer"])]}
        self._send(200, {"id": "c", "object": "chat.completion", "choices": [
            {"index": 0, "message": message, "finish_reason": "length", "logprobs": logprobs}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v1/chat/completions":
            return self.chat(body)
        served["generate"] += 1
        sp = body.get("sampling_params", {})
        served["regex"] += sum(1 for s in (sp if isinstance(sp, list) else [sp]) if s.get("regex"))
        ids = body["input_ids"]
        if ids and isinstance(ids[0], list):
            sps = sp if isinstance(sp, list) else [sp] * len(ids)
            return self._send(200, [one(i, s) for i, s in zip(ids, sps)])
        return self._send(200, one(ids, sp))


ThreadingHTTPServer((args.host, PORT), H).serve_forever()
