"""A device tensor copied to pinned host memory without a host wait: the tree step never stalls the scheduler's
CPU/GPU overlap for what it reports (statistics rows, the planner's credits)."""

from __future__ import annotations

import torch


class HostCopy:
    def __init__(self, tensor: torch.Tensor):
        self.event = None
        if tensor.is_cuda:
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            host.copy_(tensor, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
            tensor = host
        self.host = tensor

    def ready(self) -> bool:
        """Whether the copy is done; asks the event, never waits."""
        return self.event is None or self.event.query()

    def wait(self) -> torch.Tensor:
        if self.event is not None:
            self.event.synchronize()
        return self.host
