"""Small device facts the kernels' launch heuristics read, and the persistent counter buffers their last-program
merges count in."""

from __future__ import annotations

import functools

import torch


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device, cpu_default: int) -> int:
    """Streaming multiprocessors of a CUDA device; `cpu_default` under the Triton interpreter (small, so CPU tests
    still exercise the split paths)."""
    if device.type != "cuda":
        return cpu_default
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _cuda_capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def has_pdl(device: torch.device) -> bool:
    """Whether kernels on `device` can take a programmatic dependent launch (griddepcontrol: sm_90 and newer)."""
    if device.type != "cuda":
        return False
    return _cuda_capability(device.index if device.index is not None else torch.cuda.current_device())[0] >= 9


COUNTERS = 1 << 16  # entries of the first counter buffer of a (kernel family, device)
_counters: dict[tuple[str, torch.device], torch.Tensor] = {}
_retired: list[torch.Tensor] = []  # outgrown buffers: captured CUDA graphs may still point at them


def zeroed_counters(family: str, n: int, device: torch.device) -> torch.Tensor:
    """At least n int32 zeros, persistent per (kernel family, device): a launch's programs count on them and its last
    one zeroes them again, so no per-call memset launch (CUDA-graph safe; calls must not overlap on two streams)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:  # "cuda" and "cuda:0" name one buffer
        device = torch.device("cuda", torch.cuda.current_device())
    buf = _counters.get((family, device))
    if buf is None or buf.numel() < n:
        if buf is not None:
            _retired.append(buf)
        buf = _counters[(family, device)] = torch.zeros(max(n, COUNTERS), dtype=torch.int32, device=device)
    return buf
