"""Recorded acceptance per tree shape: how often a step of (N, W) accepted 0, 1, ..., K draft tokens on a real model.

A server profiled with random weights accepts almost nothing; `FLASHTREE_SIMULATE_ACC=<table>` makes its tree steps
commit a length drawn from this table for their shape instead, so a chain and a tree compare at the τ each really
reaches (`python -m flashtree.engine.accept_table` writes one from a replay recording). The file is JSON:

    {"format": "flashtree-accept-table", "version": 1, "source": "...", "policy": "vote",
     "shapes": [{"n": 8, "width": 8, "counts": [c0, c1, ..., cK]}, ...]}

counts[i]: steps that accepted i draft tokens (i + 1 committed). A shape the table lacks takes the nearest recorded
one it contains (no more candidates, no wider tree: their acceptance bounds its own from below; the same width first,
then the nearest width, the nearest N there), else the nearest of all; the server says which at start. A best-first
tree draws no candidates (`grown`): it takes the tree row (N > 1; N = 1 is the chain) of the nearest width, no wider
first, whatever its N (a best-first table records N = 1 for the chain and best-first trees of W tokens).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

FORMAT = "flashtree-accept-table"
VERSION = 1


class BadAcceptTable(ValueError):
    """The table file cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class AcceptTable:
    counts: dict[tuple[int, int], tuple[int, ...]]  # (n, width) -> steps per accepted length
    source: str = ""
    policy: str = "vote"

    def nearest(self, n: int, width: int, grown: bool = False) -> tuple[int, int]:
        """The recorded shape that stands for (n, width), or a best-first tree of `width` (module docstring)."""
        if grown:
            trees = [s for s in self.counts if s[0] > 1] or list(self.counts)
            return min(trees, key=lambda s: (s[1] > width, abs(s[1] - width), s))
        return min(self.counts, key=lambda s: (s[0] > n or s[1] > width, s[1] != width, abs(s[1] - width),
                                               abs(s[0] - n), s))

    def chain_width(self, width: int) -> int:
        """The width of the recorded chain (N = 1) nearest to `width`: DSPARK's chain in a wider window than any
        recorded chain takes the recorded chain's lengths, not those of a wider tree (`nearest` prefers the width),
        or `width` when the table records no chain."""
        chains = [w for n, w in self.counts if n == 1]
        return min(chains, key=lambda w: (abs(w - width), w)) if chains else width

    def probs(self, n: int, width: int, grown: bool = False) -> list[float]:
        counts = self.counts[self.nearest(n, width, grown)]
        total = sum(counts)
        return [c / total for c in counts]

    def tau(self, n: int, width: int, grown: bool = False) -> float:
        """Mean committed tokens per step (accepted + the bonus) of the shape standing for (n, width)."""
        return 1.0 + sum(i * p for i, p in enumerate(self.probs(n, width, grown)))

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "source": self.source, "policy": self.policy,
                "shapes": [{"n": n, "width": w, "counts": list(c)} for (n, w), c in sorted(self.counts.items())]}

    def save(self, path: Path) -> None:
        data = self.to_json()
        shapes = ",\n  ".join(json.dumps(s) for s in data.pop("shapes"))  # a shape per line
        Path(path).write_text(json.dumps(data)[:-1] + f', "shapes": [\n  {shapes}\n]}}\n')


def load(path) -> AcceptTable:
    """Read and check a table; BadAcceptTable names the file and the problem."""
    path = Path(path)
    what = f"accept table {path}"
    try:
        data = json.loads(path.read_text())
    except OSError as err:
        raise BadAcceptTable(f"{what}: cannot read it ({err.strerror or err})") from None
    except json.JSONDecodeError as err:
        raise BadAcceptTable(f"{what}: not JSON ({err.msg} at line {err.lineno}); write it again with "
                             "python -m flashtree.engine.accept_table") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        raise BadAcceptTable(f"{what}: not a {FORMAT} file of version {VERSION}")
    counts: dict[tuple[int, int], tuple[int, ...]] = {}
    for i, shape in enumerate(data.get("shapes") or []):
        try:
            n, width, c = int(shape["n"]), int(shape["width"]), tuple(int(x) for x in shape["counts"])
        except (KeyError, TypeError, ValueError):
            raise BadAcceptTable(f"{what}: shapes[{i}] needs integer n, width and a list of integer counts") from None
        if n < 1 or width < 2 or not c or min(c) < 0 or sum(c) == 0 or len(c) > width:
            raise BadAcceptTable(f"{what}: shapes[{i}] (n={n}, width={width}) needs n >= 1, width >= 2 and 1..width "
                                 "non-negative counts that are not all 0")
        counts[(n, width)] = c
    if not counts:
        raise BadAcceptTable(f"{what}: no shapes")
    return AcceptTable(counts, source=str(data.get("source", "")), policy=str(data.get("policy", "vote")))
