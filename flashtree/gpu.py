"""Small device facts the kernels' launch heuristics read."""

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
