"""Where a tree server's host time goes (FLASHTREE_PROFILE_HOST=N): Python's profiler over N decode steps.

On a small target the tree step is bound by the host, not the GPU (SmolLM2-135M on the H200: 3-5 ms of host time per
step against 3.5-5.5 ms of device time, and 1-3 ms of device idle between steps under the planner or a grammar mix,
live runs 29 / 30, BENCHMARKS.md 4.0 / 4.0b), so the stage timer's device times cannot say where the time goes. This
turns cProfile on in the scheduler's thread at the start of decode step N + 1 (after N steps of warm-up: Triton
compiles, CUDA graph captures and the planner's first choices are behind it) and off at the start of step 2N + 1, so
it covers whole steps and the scheduler's work between them (scheduling, result processing, grammar advances), then
logs the functions with the most own time and the most cumulative time, one line each. The profiler's own overhead inflates what it
measures (several µs per Python call): read the ranking and the shares, not the absolute times.
"""

from __future__ import annotations

import cProfile
import io
import logging
import pstats

logger = logging.getLogger("flashtree.patches")

TOP = 30  # functions logged per ranking


class HostProfile:
    def __init__(self, steps: int):
        self.steps = steps
        self.seen = 0
        self.profile: cProfile.Profile | None = None

    def on_decode_step(self) -> None:
        """Called at the start of every decode step the worker runs (tree or DSPARK's own)."""
        self.seen += 1
        if self.seen == self.steps + 1:
            self.profile = cProfile.Profile()
            self.profile.enable()
        elif self.seen == 2 * self.steps + 1 and self.profile is not None:
            self.profile.disable()
            logger.info("%s", self.report())
            self.profile = None

    def report(self) -> str:
        stats = pstats.Stats(self.profile, stream=io.StringIO())
        total = stats.total_tt
        lines = [f"flashtree host profile over decode steps {self.steps + 1}-{2 * self.steps} (cProfile, scheduler "
                 f"thread): {total * 1e3:.1f} ms in all, {total / self.steps * 1e3:.3f} ms per step"]
        for key, title in (("tottime", "own time"), ("cumulative", "cumulative time")):
            lines.append(f"flashtree host profile, top {TOP} by {title} (ms per step, calls per step, function):")
            rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2 if key == "tottime" else 3], reverse=True)
            for (path, line, name), (_cc, calls, own, cum, _callers) in rows[:TOP]:
                spent = own if key == "tottime" else cum
                lines.append(f"  {spent / self.steps * 1e3:8.3f} {calls / self.steps:7.1f}  {_short(path)}:{line}({name})")
        return "\n".join(lines)


def _short(path: str) -> str:
    """The path from its package on (sglang/..., flashtree/..., torch/...)."""
    for package in ("sglang/", "flashtree/", "torch/", "triton/", "xgrammar/"):
        at = path.rfind(package)
        if at >= 0:
            return path[at:]
    return path
