"""Step time per shape and batch size: measured once, looked up per batch without a device read."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from .shapes import Shape


@dataclass
class CostTable:
    """seconds[(shape, bs)] for the captured batch sizes; a batch of bs takes the time of the smallest measured size
    >= bs (the graph sglang pads it to), or of the largest one when bs is above them all.

    served[(shape, size)]: the mean time of served steps, where timed (`serve`), replaces the entry. What the first
    measurement leaves out (the host's share of a step, longer contexts) is common to the shapes, so every other entry
    at that size moves by the served entries' mean excess there (those of its own kind, the chain's or the trees',
    else all): a shape not yet timed is not made to look cheap beside a timed one."""

    seconds: dict[tuple[Shape, int], float] = field(default_factory=dict)
    served: dict[tuple[Shape, int], float] = field(default_factory=dict)
    _excess: dict[tuple[bool | None, int], float] = field(default_factory=dict)  # (is_chain or None: all, size)
    _sizes: dict[Shape, list[int]] = field(default_factory=dict, repr=False, compare=False)  # `sizes` until `add`

    def add(self, shape: Shape, bs: int, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"step time of {shape.label()} at bs {bs} must be > 0 s, got {seconds}")
        self.seconds[(shape, int(bs))] = float(seconds)
        self._sizes.clear()

    def sizes(self, shape: Shape) -> list[int]:
        sizes = self._sizes.get(shape)
        if sizes is None:
            sizes = self._sizes[shape] = sorted(bs for s, bs in self.seconds if s == shape)
        return sizes

    def size_for(self, shape: Shape, bs: int) -> int | None:
        """The measured size whose time a batch of bs takes (None: the shape has none)."""
        sizes = self.sizes(shape)
        if not sizes:
            return None
        return sizes[min(bisect.bisect_left(sizes, bs), len(sizes) - 1)]

    def serve(self, shape: Shape, size: int, seconds: float) -> None:
        """Served steps of `shape` at table size `size` took `seconds` on average."""
        if (shape, size) not in self.seconds:
            raise ValueError(f"{shape.label()} has no entry at bs {size} to replace")
        self.served[(shape, size)] = float(seconds)
        for kind in (shape.is_chain, None):
            excess = [t - self.seconds[k] for k, t in self.served.items()
                      if k[1] == size and (kind is None or k[0].is_chain == kind)]
            self._excess[(kind, size)] = sum(excess) / len(excess)

    def time(self, shape: Shape, bs: int) -> float | None:
        size = self.size_for(shape, bs)
        if size is None:
            return None
        if (shape, size) in self.served:
            return self.served[(shape, size)]
        excess = self._excess.get((shape.is_chain, size), self._excess.get((None, size), 0.0))
        return max(self.seconds[(shape, size)] + excess, 1e-9)

    def rows(self) -> list[dict]:
        """The table as rows (shape, bs, ms): what the server logs at start and BENCHMARKS.md quotes."""
        return [{"shape": s.label(), "bs": bs, "ms": round(t * 1e3, 3)} for (s, bs), t in sorted(self.seconds.items())]
