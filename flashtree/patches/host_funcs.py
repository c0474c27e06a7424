"""Host work the GPU waits for, without the host waiting for the GPU: Python callables queued in a stream's order
through the CUDA driver's host functions (`cuLaunchHostFunc`, called through ctypes: torch has no binding for it).

A host function runs on the driver's own thread once everything queued before it on its stream has run, and work queued
after it waits for it to return. The tree step's grammar walk needs the step's drafted nodes on the host, which the
draft forward only has on the device; waiting for them stopped the scheduler thread for the draft's device time (1.2-1.5
ms between tree steps at 24-30 requests with 30% constrained, live run 29), so the host lost its lead on the device. Run
as a host function on a side stream, the walk starts when the nodes' copy lands, the target verify runs meanwhile, and
the scheduler thread queues the rest of the step and goes on.

A host function must not call CUDA: what it needs (pinned buffers, copies) is set up by the thread that queues it. Its
exception is kept and raised by the next `launch` or `check`, so a failure stops the server rather than passing
unnoticed (the step it ran for has used whatever its buffers held)."""

from __future__ import annotations

import ctypes
import logging
import sys
from collections import deque
from typing import Callable

import torch

logger = logging.getLogger("flashtree.patches")

HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# A host function is Python: it waits for the GIL, which a thread running Python hands over when it blocks or, at the
# latest, after the switch interval (5 ms by default, longer than the verify the walk hides behind).
SWITCH_INTERVAL_S = 0.0005


def driver_launcher() -> Callable | None:
    """The driver's `cuLaunchHostFunc(stream, fn, user_data) -> CUresult`, or None without a CUDA driver."""
    if not torch.cuda.is_available():
        return None
    try:
        launch = ctypes.CDLL("libcuda.so.1").cuLaunchHostFunc
    except (OSError, AttributeError):
        return None
    launch.argtypes = [ctypes.c_void_p, HOST_FN, ctypes.c_void_p]
    launch.restype = ctypes.c_int
    return launch


class HostFuncs:
    """Callables queued on streams; `launch` the driver's entry point (driver_launcher), which calls the trampoline
    once per queued callable in queue order (one stream, or several in an order the caller fixes)."""

    def __init__(self, launch: Callable):
        self._launch = launch
        self._queued: deque[Callable[[], None]] = deque()
        self._trampoline = HOST_FN(self._run_next)  # kept alive: the driver holds only its address
        self.error: BaseException | None = None

    def _run_next(self, _user_data) -> None:
        fn = self._queued.popleft()
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 (nothing may leave a driver callback; raised on the next launch)
            logger.exception("flashtree: a host function failed")
            self.error = self.error or e

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"flashtree: a host function failed: {self.error!r}") from self.error

    def launch(self, stream, fn: Callable[[], None]) -> None:
        """Queue `fn` on `stream` (a torch stream): it runs after the stream's work so far, and the stream's later
        work waits for it."""
        self.check()
        self._queued.append(fn)
        rc = self._launch(ctypes.c_void_p(stream.cuda_stream), self._trampoline, None)
        if rc != 0:
            self._queued.pop()
            raise RuntimeError(f"flashtree: cuLaunchHostFunc failed (CUresult {rc})")


class SideWork:
    """Host functions on a side stream of one device: `run_after(event, fn)` queues `fn` after `event` there and makes
    the current stream wait for it, so the current stream's work queued in between (the target verify) overlaps it."""

    def __init__(self, funcs: HostFuncs, device: torch.device):
        self.funcs = funcs
        self.stream = torch.cuda.Stream(device=device)
        if sys.getswitchinterval() > SWITCH_INTERVAL_S:
            logger.info("flashtree: Python's thread switch interval %.4f -> %.4f s (host functions wait for the GIL)",
                        sys.getswitchinterval(), SWITCH_INTERVAL_S)
            sys.setswitchinterval(SWITCH_INTERVAL_S)

    def run_after(self, event: torch.cuda.Event, fn: Callable[[], None]) -> None:
        self.stream.wait_event(event)
        self.funcs.launch(self.stream, fn)
        done = torch.cuda.Event()
        done.record(self.stream)
        torch.cuda.current_stream(self.stream.device).wait_event(done)


def side_work(device: torch.device) -> SideWork | None:
    """Host functions on `device`, or None where there is no CUDA driver to run them (the caller waits instead)."""
    launch = driver_launcher() if device.type == "cuda" else None
    return None if launch is None else SideWork(HostFuncs(launch), device)
