"""Write an accept table (`flashtree.planner.accept_table`) from a replay recording: per tree shape (N, W), how many
steps of an exact greedy replay accepted each length. What `FLASHTREE_SIMULATE_ACC` draws from.

    flashtree accept-table benchmarks/recordings/smollm2-dspark-gsm8k.pt \\
        --shapes 8x8,16x16,32x32 --out benchmarks/data/simulate/smollm2-dspark-gsm8k.json

(or `python -m flashtree.engine.accept_table ...`).

A shape is NxW; W = K + 1 with N = 1 is the chain of candidate 0 (DSPARK's greedy block).
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from ..files import load_torch
from ..planner.accept_table import AcceptTable
from ..tree import DEFAULT_POLICY
from .replay import Recording, replay_all


def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        n, sep, w = part.lower().partition("x")
        if not (sep and n.isdigit() and w.isdigit() and int(n) >= 1 and int(w) >= 2):
            raise ValueError(f"--shapes: {part!r} is not NxW with N >= 1 and W >= 2 (e.g. 8x16)")
        shapes.append((int(n), int(w)))
    if not shapes:
        raise ValueError("--shapes: give at least one NxW")
    return shapes


def accept_table(recordings: list[Recording], shapes: list[tuple[int, int]], policy: str = DEFAULT_POLICY,
                 source: str = "") -> AcceptTable:
    counts = {}
    for n, w in shapes:
        hist = Counter(s.accept_len for steps in replay_all(recordings, n, w, policy) for s in steps)
        counts[(n, w)] = tuple(hist.get(i, 0) for i in range(max(hist) + 1))
    return AcceptTable(counts, source=source, policy=policy)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="flashtree accept-table", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recording", type=Path, help="a replay recording (.pt; replay.recording of a replay sweep)")
    parser.add_argument("--shapes", default="1x8,8x8,16x16,32x32", help="comma-separated NxW (default %(default)s)")
    parser.add_argument("--policy", default=DEFAULT_POLICY, help="tree policy (default %(default)s)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON table to write")
    args = parser.parse_args(argv)
    try:
        shapes = parse_shapes(args.shapes)
    except ValueError as err:
        parser.error(str(err))
    saved = load_torch(args.recording, "the replay recording")
    recordings = [Recording(**r) for r in saved["recordings"]]
    too_many = [f"{n}x{w}" for n, w in shapes if n > recordings[0].n_max]
    if too_many:
        parser.error(f"--shapes {','.join(too_many)}: the recording holds N_max = {recordings[0].n_max} candidates")
    table = accept_table(recordings, shapes, args.policy, source=f"{args.recording.name}, {len(recordings)} prompts")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.save(args.out)
    for n, w in shapes:
        print(f"N={n:<3} W={w:<3} tau {table.tau(n, w):.3f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
