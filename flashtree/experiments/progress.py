"""Progress over a whole sweep: short bar labels (what sets this job apart from the others) and an ETA across every
job of the sweep. The sweep callback starts the clock and counts jobs; jobs launched in the same process (the
local launcher) read it, other launchers' jobs show their own progress only."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

LABEL_CHARS = 40


@dataclass
class SweepClock:
    total: int | None = None  # jobs in the sweep (None: unknown, or not a sweep)
    done: int = 0
    started: float = 0.0
    common: set[str] = field(default_factory=set)  # `key=value` overrides every job shares (left out of labels)


CLOCK = SweepClock()


def start(total: int | None, jobs: list[list[str]] | None = None) -> None:
    """A sweep of `total` jobs (their overrides `jobs`, when known) starts now."""
    common = set.intersection(*(set(j) for j in jobs)) if jobs else set()
    CLOCK.total, CLOCK.done, CLOCK.started, CLOCK.common = total, 0, time.monotonic(), common


def job_done() -> None:
    CLOCK.done += 1


def short_label(label: str) -> str:
    """'tree.n=4,tree.width=8,dataset=gsm8k,...' -> '[3/12] n=4 width=8': the job's place in the sweep and the
    overrides that set it apart from the other jobs, keys shortened to their last part, at most LABEL_CHARS."""
    parts = [p for p in label.split(",") if p not in CLOCK.common]
    text = " ".join(p.split("=", 1)[0].rsplit(".", 1)[-1] + "=" + p.split("=", 1)[1] if "=" in p else p for p in parts)
    if len(text) > LABEL_CHARS:
        text = text[: LABEL_CHARS - 1] + "…"
    where = f"[{CLOCK.done + 1}/{CLOCK.total}] " if CLOCK.total else ""
    return where + (text or "run")


def sweep_eta(job_fraction: float) -> str | None:
    """Time left for the whole sweep ('m:ss') with `job_fraction` of the current job done; None outside a sweep."""
    if not CLOCK.total:
        return None
    finished = CLOCK.done + job_fraction
    if finished <= 0:
        return None
    left = (time.monotonic() - CLOCK.started) / finished * max(CLOCK.total - finished, 0)
    return f"{int(left // 60)}:{int(left % 60):02d}"
