"""Version adapters, one per supported sglang release, chosen by probing signatures (and checked against the
installed version: signatures that match one release inside another release's wheel are not trusted)."""

from __future__ import annotations

import importlib.metadata

from ..toggles import ToggleError
from .base import SglangAdapter
from .sglang_0_5_17 import Adapter as Adapter0517
from .sglang_0_5_20 import Adapter as Adapter0520
from .sglang_0_5_23 import Adapter as Adapter0523

ADAPTERS: tuple[type[SglangAdapter], ...] = (Adapter0517, Adapter0520, Adapter0523)
SUPPORTED = tuple(a.release for a in ADAPTERS)


class UnsupportedRelease(ToggleError):
    """SystemExit: the installed sglang is not one flashtree can patch."""


def installed_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def select_adapter() -> SglangAdapter:
    """The adapter whose probes all pass on the installed sglang. Raises UnsupportedRelease (a SystemExit)."""
    version = installed_version()
    head = (
        "flashtree: FLASHTREE_* toggles are set but "
        + ("sglang is not installed" if version is None else f"sglang {version} is not a supported release")
        + f"; supported releases: {', '.join(SUPPORTED)}. Install one (pip install sglang==<release>) or unset the "
        "FLASHTREE_* toggles."
    )
    if version is None:
        raise UnsupportedRelease(head)
    report = {}
    for cls in ADAPTERS:
        adapter = cls()
        problems = adapter.mismatches()
        if not problems and version == adapter.release:
            return adapter
        if not problems:
            problems = [f"signatures match {adapter.release} but the installed version is {version}"]
        report[adapter.release] = problems
    closest = min(report, key=lambda r: len(report[r]))
    detail = "; ".join(report[closest][:4])
    raise UnsupportedRelease(f"{head} (closest: {closest}, which differs in: {detail})")
