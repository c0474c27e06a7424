"""Start, health-check and stop sglang servers: one subprocess per instance, a free port on 127.0.0.1 each, one log
file each, bounded waits. A server that dies or does not answer /health in time stops the run with an error naming
it and quoting its log's tail (or, with `keep_going`, is stopped and reported while the others go on); every server
started is stopped on exit, error or Ctrl-C (use it as a context manager).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from flashtree.live.commands import HOST, Instance
from flashtree.live.http_json import healthy
from flashtree.patches.toggles import refuse_excluded_plugin

LOG_TAIL_LINES = 30


class ServerStartError(RuntimeError):
    """A server died while starting or was not healthy in time; the message names it and quotes its log."""


def launch_environ(inst: Instance) -> dict[str, str]:
    """The environment `inst`'s server starts with: this process's without any FLASHTREE_* toggle, plus the instance's
    own. ToggleError where its toggles could not take effect (SGLANG_PLUGINS leaving flashtree out)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHTREE_")}
    env.update(inst.env)
    refuse_excluded_plugin(env)
    return env


def free_port(taken: set[int] | None = None) -> int:
    """A loopback port free now and not in `taken` (then added to it)."""
    while True:
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if taken is None or port not in taken:
            if taken is not None:
                taken.add(port)
            return port


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


@dataclass
class Running:
    instance: Instance
    port: int
    process: subprocess.Popen
    log: Path
    started: float
    nccl_port: int | None = None


class ServerManager:
    """`with ServerManager(log_dir) as m: m.start(inst); m.wait_healthy(timeout_s)`; stops all on leaving."""

    def __init__(self, log_dir, *, work_dir=None, stagger_s: float = 0.0, stop_timeout_s: float = 15.0,
                 poll_s: float = 1.0):
        self.log_dir = Path(log_dir)
        self.work_dir = Path(work_dir) if work_dir else self.log_dir
        self.stagger_s, self.stop_timeout_s, self.poll_s = stagger_s, stop_timeout_s, poll_s
        self.running: dict[str, Running] = {}
        # every port handed to a server of this run: sglang otherwise picks its rendezvous port itself, free when
        # probed but bound seconds later, by when a server started beside it may hold it (EADDRINUSE, live run 45)
        self.ports: set[int] = set()
        self._old_sigterm = None

    def __enter__(self) -> "ServerManager":
        # a SIGTERM (e.g. `timeout`) unwinds like Ctrl-C, so the servers still stop
        self._old_sigterm = signal.signal(signal.SIGTERM, _raise_interrupt)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.stop_all()
        finally:
            signal.signal(signal.SIGTERM, self._old_sigterm or signal.SIG_DFL)

    def environment(self, inst: Instance) -> dict[str, str]:
        """This process's environment without any FLASHTREE_* toggle, plus the instance's own."""
        env = launch_environ(inst)
        cache = self.work_dir / "tvmffi" / inst.name  # one JIT cache per server: concurrent starts race on a shared one
        cache.mkdir(parents=True, exist_ok=True)
        env.update(TVM_FFI_CACHE_DIR=str(cache), FT_PROFILE_TAG=inst.name)
        return env

    def start(self, inst: Instance) -> Running:
        if inst.name in self.running:
            return self.running[inst.name]
        if self.running and self.stagger_s:
            time.sleep(self.stagger_s)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        port, nccl_port = free_port(self.ports), free_port(self.ports)
        log = self.log_dir / f"server_{inst.name}.log"
        with open(log, "ab") as out:
            # own process group: stopping it reaches sglang's scheduler and detokenizer children too
            proc = subprocess.Popen(inst.command(port, nccl_port), env=self.environment(inst), stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.running[inst.name] = Running(inst, port, proc, log, time.monotonic(), nccl_port)
        print(f"[live] started {inst.name} (pid {proc.pid}, port {port}, log {log})", flush=True)
        return self.running[inst.name]

    def wait_healthy(self, timeout_s: float, names=None, keep_going: bool = False) -> dict[str, str]:
        """Until every named server (default: all) answers /health; ServerStartError on the first that dies, or on
        the timeout (naming those not up). With `keep_going` a server that dies or is not up in time is stopped
        instead, and the return value says why, by name ({}: all up)."""
        waiting = set(names or self.running)
        deadline = time.monotonic() + timeout_s
        failed: dict[str, str] = {}
        while waiting:
            for name in sorted(waiting):
                r = self.running[name]
                code = r.process.poll()
                if code is not None:
                    why = self._why(r, f"exited with status {code} while starting")
                    if not keep_going:
                        raise ServerStartError(why)
                    print(f"[live] {why}", flush=True)
                    failed[name] = f"exited with status {code} while starting (log: {r.log})"
                    waiting.discard(name)
                    self.stop(name)
                    continue
                if healthy(r.port):
                    waiting.discard(name)
                    print(f"[live] {name} healthy after {time.monotonic() - r.started:.0f} s", flush=True)
            if not waiting:
                return failed
            if time.monotonic() > deadline:
                if keep_going:
                    for name in sorted(waiting):
                        print(f"[live] {self._why(self.running[name], f'not healthy after {timeout_s:.0f} s')}",
                              flush=True)
                        failed[name] = f"not healthy after {timeout_s:.0f} s (log: {self.running[name].log})"
                        self.stop(name)
                    return failed
                name = sorted(waiting)[0]
                raise ServerStartError(self._why(self.running[name], f"not healthy after {timeout_s:.0f} s"
                                                 + (f" (also not up: {', '.join(sorted(waiting - {name}))})"
                                                    if len(waiting) > 1 else "")))
            time.sleep(self.poll_s)
        return failed

    @staticmethod
    def _why(r: Running, what: str) -> str:
        return (f"server {r.instance.name} {what}; command: {' '.join(r.instance.command(r.port, r.nccl_port))}\n"
                f"--- last lines of {r.log}:\n{log_tail(r.log)}")

    def port(self, name: str) -> int:
        return self.running[name].port

    def stop(self, name: str) -> None:
        r = self.running.pop(name, None)
        if r is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):  # then whatever of the server's process group is left
            try:
                os.killpg(r.process.pid, sig)  # the group this manager created for the server
            except ProcessLookupError:
                break
            try:
                r.process.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                pass
        print(f"[live] stopped {name}", flush=True)

    def stop_all(self) -> None:
        """Every server told to stop at once (each takes seconds to shut down), then each waited for in turn."""
        for r in self.running.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(r.process.pid, signal.SIGTERM)
        for name in list(self.running):
            self.stop(name)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")
