"""Per-stage time of the tree decode step (FLASHTREE_STAGE_TIMES=N): where a step's time goes, logged every N steps.

CUDA: events recorded between stages and read only when the log line is due (one synchronisation per N steps, not per
step), so the timed server runs as it would untimed. CPU: wall clock. Stages are named by the tree step's marks, in
the engine's vocabulary (`STAGES`).
Each line also gives the host's time per step (Python and launches: when it matches the device time, the step is bound
by the host, not the GPU) and the device time between one step's end and the next one's start (sglang's work between
steps: scheduling, output processing, prefills, and idle time) as median / mean / longest: a median alone hides the
few long gaps that periodic host work leaves.
"""

from __future__ import annotations

import logging
import time

import torch

logger = logging.getLogger("flashtree.patches")

# The tree step's stages in order, named as the engine names them.
STAGES = ("draft", "draws", "build", "verify", "walk", "commit", "output")


class NoTimer:
    """The tree step's timer when FLASHTREE_STAGE_TIMES is off: marks cost nothing."""

    def start(self) -> None:
        pass

    def mark(self, stage: str) -> None:
        pass

    def end_step(self, batch_size: int, draw_path: str | None = None) -> None:
        pass


NO_TIMER = NoTimer()


class StageTimer:
    def __init__(self, every: int, device: torch.device):
        self.every = every
        self.cuda = device.type == "cuda"
        self.steps = 0
        self.batch_rows = 0
        self._flushed_rows = 0
        self.totals_ms: dict[str, float] = {}
        self._marks: list[tuple[str, object]] = []
        self._pending: list[list[tuple[str, object]]] = []
        self._host_ms: list[float] = []  # per pending step: host wall time from start() to end_step()
        self._host_t0 = 0.0
        self._paths: dict[str, int] = {}  # where the window's N draws ran (graph tail / eager), FLASHTREE_GRAPH_DRAWS

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        self._host_t0 = time.perf_counter()
        self._marks = [("start", self._now())]

    def mark(self, stage: str) -> None:
        """The stage that just ended."""
        self._marks.append((stage, self._now()))

    def end_step(self, batch_size: int, draw_path: str | None = None) -> None:
        if draw_path is not None:
            self._paths[draw_path] = self._paths.get(draw_path, 0) + 1
        self._pending.append(self._marks)
        self._host_ms.append((time.perf_counter() - self._host_t0) * 1e3)
        self._marks = []
        self.steps += 1
        self.batch_rows += batch_size
        if self.steps % self.every == 0:
            self.flush()

    def flush(self) -> None:
        """Log the mean per-stage time of the steps since the last line (the first lines include Triton's compiles)."""
        if not self._pending:
            return
        if self.cuda:
            self._pending[-1][-1][1].synchronize()
        window: dict[str, float] = {}
        gaps = [
            (a[-1][1].elapsed_time(b[0][1]) if self.cuda else (b[0][1] - a[-1][1]) * 1e3)
            for a, b in zip(self._pending, self._pending[1:])
        ]
        for marks in self._pending:
            for (_, t0), (stage, t1) in zip(marks, marks[1:]):
                ms = t0.elapsed_time(t1) if self.cuda else (t1 - t0) * 1e3
                window[stage] = window.get(stage, 0.0) + ms
                self.totals_ms[stage] = self.totals_ms.get(stage, 0.0) + ms
        steps = len(self._pending)
        rows = self.batch_rows - self._flushed_rows
        self._flushed_rows = self.batch_rows
        self._pending = []
        host = sum(self._host_ms) / steps
        self._host_ms = []
        gaps.sort()
        gap = (f"{gaps[len(gaps) // 2]:.3f} / {sum(gaps) / len(gaps):.3f} / {gaps[-1]:.3f}" if gaps
               else "nan / nan / nan")
        parts = ", ".join(f"{k} {v / steps:.3f}" for k, v in window.items())
        paths = ", ".join(f"{k} {v}" for k, v in sorted(self._paths.items()))
        self._paths = {}
        logger.info(
            "flashtree stage times (ms per tree step, mean over steps %d-%d; mean bs %.1f): %s; total %.3f; "
            "host %.3f; between steps (median / mean / max) %s%s",
            self.steps - steps + 1, self.steps, rows / steps, parts, sum(window.values()) / steps, host, gap,
            f"; draws ran: {paths}" if paths else "",
        )
