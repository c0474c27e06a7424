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

    def time(self, shape: Shape, bs: int) -> float | None:
        sizes = self.sizes(shape)
        if not sizes:
            return None
        at = bisect.bisect_left(sizes, bs)
        return self.seconds[(shape, sizes[min(at, len(sizes) - 1)])]

    def rows(self) -> list[dict]:
        """The table as rows (shape, bs, ms): what the server logs at start and BENCHMARKS.md quotes."""
        return [{"shape": s.label(), "bs": bs, "ms": round(t * 1e3, 3)} for (s, bs), t in sorted(self.seconds.items())]
