"""A device tensor copied to pinned host memory without a host wait: the tree step never stalls the scheduler's
CPU/GPU overlap for what it reports (statistics rows, the planner's credits).

The pinned buffers and their CUDA events are reused (`PinnedPool`) rather than allocated every step: a buffer goes
back when its HostCopy is gone (nothing can read it any more: sglang drops a step's rows once it has collected them)
and is handed out again only once its last copy has completed, so a copy still in flight is never overwritten."""

from __future__ import annotations

from typing import Callable

import torch


def _pinned_slot(key: tuple) -> tuple[torch.Tensor, torch.cuda.Event]:
    shape, dtype, _device = key
    return torch.empty(shape, dtype=dtype, pin_memory=True), torch.cuda.Event()


class PinnedPool:
    """(pinned host buffer, event) pairs per (shape, dtype, device), at most `keep` idle ones of each."""

    def __init__(self, new: Callable[[tuple], tuple] = _pinned_slot, keep: int = 4):
        self.new, self.keep = new, keep
        self.idle: dict[tuple, list] = {}

    def take(self, key: tuple) -> tuple:
        """An idle pair whose event has completed (its last copy landed), else a new one."""
        idle = self.idle.get(key)
        if idle:
            for i, slot in enumerate(idle):
                if slot[1].query():
                    return idle.pop(i)
        return self.new(key)

    def give(self, key: tuple, slot: tuple) -> None:
        idle = self.idle.setdefault(key, [])
        if len(idle) < self.keep:
            idle.append(slot)


POOL = PinnedPool()


class HostCopy:
    """`host` (and what `wait` returns) is valid while this object lives: its buffer is reused after."""

    def __init__(self, tensor: torch.Tensor):
        self.event = self._slot = None
        if tensor.is_cuda:
            key = (tensor.shape, tensor.dtype, tensor.device)
            slot = POOL.take(key)
            host, self.event = slot
            host.copy_(tensor, non_blocking=True)
            self.event.record()
            self._slot = (key, slot)
            tensor = host
        self.host = tensor

    def __del__(self):
        if self._slot is not None:
            POOL.give(*self._slot)

    def ready(self) -> bool:
        """Whether the copy is done; asks the event, never waits."""
        return self.event is None or self.event.query()

    def wait(self) -> torch.Tensor:
        if self.event is not None:
            self.event.synchronize()
        return self.host
