"""A stream that waits for the host: a pinned 32-bit counter and the driver's `cuStreamWaitValue32` (called through
ctypes: torch has no binding for it).

The tree step's grammar walk needs the step's drafted nodes on the host, which only the draft forward's end brings
there. Walking where the masks are applied stopped the scheduler thread for the draft's device time, then had it queue
the rest of the step (mask copy, walk, commit, output) after the walk, while the device had only the target verify
left: 1.2-1.5 ms between tree steps at 24-30 requests with 30% constrained (live run 29). With a flag, the thread
queues a wait for the next ticket where the masks are copied, queues the rest of the step behind it, and only then
waits for the nodes, walks, writes the masks into pinned memory and releases the ticket: the device runs the verify
meanwhile and reaches the wait later, if at all. The walk stays on the scheduler thread, so nothing waits for the GIL
(the CUDA host functions tried before, live run 53, did).

The holder must release every ticket it waits for, on every path, and must not wait for the device in between: the
stream would never get past the wait. Nor may a kernel be loaded in between: loading one can synchronise the context
(CUDA's lazy loading, on by default since 12.2), which waits for the held stream. The first GPU run (live run 54, an
H100, 2026-12-07) hung that way at the first `add` launched behind the wait. So a flag exists only where the driver
loads modules eagerly (`CUDA_MODULE_LOADING=EAGER`), and the tree step defers only at batch shapes it has already
stepped without the wait (decode.grammar_flag). sglang 0.5.17's launcher sets `CUDA_MODULE_LOADING=AUTO` (lazy) for
the processes it spawns, whatever the user's environment says, so the toggle sets the variable itself in the
launching process: when its plugin installs there and again after sglang's setup (`eager_after_setup`), before the
scheduler processes start. The plugin loads before the launcher imports sglang's engine, so installing imports it
(plan._eager_loading; live run 59 ran without that and every overlap server warned)."""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from typing import Callable

import torch

logger = logging.getLogger("flashtree.patches")

WAIT_GEQ = 0x0  # CU_STREAM_WAIT_VALUE_GEQ: (int32)(*addr - value) >= 0, so the counter may wrap
EAGER_LOADING = 0x1  # CU_MODULE_EAGER_LOADING, from cuModuleGetLoadingMode
LOADING_ENV = "CUDA_MODULE_LOADING"
LAZY_WARNING = ("flashtree: FLASHTREE_GRAMMAR_OVERLAP needs eager CUDA module loading (a kernel loaded lazily while the "
                f"stream waits for the host deadlocks), and CUDA started in this process without it (flashtree sets "
                f"{LOADING_ENV}=EAGER for the processes a launcher starts after sglang's setup; this one did not get "
                "it); grammar walks wait for the draft")


def eager_after_setup(orig):
    """sglang's `_set_envs_and_config`, then eager module loading for the processes it goes on to spawn. Installing
    it also asks for eager loading in this process (a plugin loaded after that setup, before CUDA starts)."""
    os.environ[LOADING_ENV] = "EAGER"

    @functools.wraps(orig)
    def set_envs_and_config(*args, **kwargs):
        out = orig(*args, **kwargs)
        os.environ[LOADING_ENV] = "EAGER"
        return out

    return set_envs_and_config


def driver_wait() -> tuple[Callable, Callable, Callable] | None:
    """The driver's `cuStreamWaitValue32(stream, addr, value, flags)`, `cuMemHostGetDevicePointer(&dptr, p, 0)` and a
    function returning its module loading mode (eager where the driver predates lazy loading), or None without a CUDA
    driver that has the first two."""
    if not torch.cuda.is_available():
        return None
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        wait = getattr(cuda, "cuStreamWaitValue32_v2", None) or cuda.cuStreamWaitValue32
        device_ptr = getattr(cuda, "cuMemHostGetDevicePointer_v2", None) or cuda.cuMemHostGetDevicePointer
    except (OSError, AttributeError):
        return None
    wait.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
    wait.restype = ctypes.c_int
    device_ptr.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint]
    device_ptr.restype = ctypes.c_int
    get_mode = getattr(cuda, "cuModuleGetLoadingMode", None)

    def loading_mode() -> int:
        mode = ctypes.c_int(EAGER_LOADING)
        if get_mode is not None and get_mode(ctypes.byref(mode)) != 0:
            return 0  # unknown: treated as lazy
        return mode.value

    return wait, device_ptr, loading_mode


class HostFlag:
    """Tickets a stream waits for until the host releases them. `wait` is the driver's entry point; `word` the pinned
    counter and `address` its device address."""

    def __init__(self, wait: Callable, word: torch.Tensor, address: int):
        self._wait, self.word, self.address = wait, word, address
        self._host = word.numpy()  # stores through numpy: no torch op, nothing queued
        self.ticket = int(self._host[0])

    def wait(self, device: torch.device) -> int:
        """Work queued on `device`'s current stream after this runs once the returned ticket is released."""
        ticket = (self.ticket + 1) & 0xFFFFFFFF
        stream = torch.cuda.current_stream(device)
        rc = self._wait(ctypes.c_void_p(stream.cuda_stream), self.address, ticket, WAIT_GEQ)
        if rc != 0:
            raise RuntimeError(f"flashtree: cuStreamWaitValue32 failed (CUresult {rc})")
        self.ticket = ticket
        return ticket

    def release(self, ticket: int) -> None:
        self._host[0] = ticket - (1 << 32) if ticket >= 1 << 31 else ticket  # the same 32 bits, as int32


def host_flag(device: torch.device) -> HostFlag | None:
    """A flag for streams of `device`, or None where the driver cannot wait on host memory or loads modules lazily
    (the caller waits instead)."""
    entry = driver_wait() if device.type == "cuda" else None
    if entry is None:
        return None
    wait, device_ptr, loading_mode = entry
    if loading_mode() != EAGER_LOADING:
        logger.warning(LAZY_WARNING)
        return None
    word = torch.zeros(1, dtype=torch.int32, pin_memory=torch.cuda.is_available())
    address = ctypes.c_uint64()
    rc = device_ptr(ctypes.byref(address), ctypes.c_void_p(word.data_ptr()), 0)
    if rc != 0:
        logger.warning("flashtree: no device address for a pinned flag (CUresult %d); grammar walks wait for the draft",
                       rc)
        return None
    return HostFlag(wait, word, address.value)
