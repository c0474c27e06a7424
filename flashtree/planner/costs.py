"""Step time per shape and batch size: measured once, looked up per batch without a device read."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from .shapes import Shape


@dataclass
class CostTable:
    """seconds[(shape, bs)] for the captured batch sizes; a batch of bs takes the time of the smallest measured size
    >= bs (the graph sglang pads it to), or of the largest one when bs is above them all."""

    seconds: dict[tuple[Shape, int], float] = field(default_factory=dict)

    def add(self, shape: Shape, bs: int, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"step time of {shape.label()} at bs {bs} must be > 0 s, got {seconds}")
        self.seconds[(shape, int(bs))] = float(seconds)

    def sizes(self, shape: Shape) -> list[int]:
        return sorted(bs for s, bs in self.seconds if s == shape)

    def size_for(self, shape: Shape, bs: int) -> int | None:
        """The measured size whose time a batch of bs takes (None: the shape has none)."""
        sizes = self.sizes(shape)
        if not sizes:
            return None
        return sizes[min(bisect.bisect_left(sizes, bs), len(sizes) - 1)]

    def time(self, shape: Shape, bs: int) -> float | None:
        size = self.size_for(shape, bs)
        return None if size is None else self.seconds[(shape, size)]

    def rows(self) -> list[dict]:
        """The table as rows (shape, bs, ms): what the server logs at start and BENCHMARKS.md quotes."""
        return [{"shape": s.label(), "bs": bs, "ms": round(t * 1e3, 3)} for (s, bs), t in sorted(self.seconds.items())]
