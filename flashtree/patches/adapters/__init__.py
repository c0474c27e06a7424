"""Version adapters, one per supported sglang release, chosen by probing signatures (and checked against the
installed version: signatures that match one release inside another release's wheel are not trusted).

The supported releases are the lines of RELEASES (this folder; scripts/setup_sglang.sh reads the same file); release
X.Y.Z is adapted by the `Adapter` of module `sglang_X_Y_Z` here."""

from __future__ import annotations

import importlib
import importlib.metadata
from pathlib import Path

from ..toggles import ToggleError
from .base import SglangAdapter
from .probe import import_failure

RELEASES = Path(__file__).with_name("RELEASES")


def read_releases(path: Path = RELEASES) -> tuple[str, ...]:
    """The releases listed in `path`: one per line; '#' starts a comment."""
    lines = (line.partition("#")[0].strip() for line in path.read_text().splitlines())
    return tuple(line for line in lines if line)


def adapter_module(release: str) -> str:
    return f"{__name__}.sglang_{release.replace('.', '_')}"


SUPPORTED = read_releases()
ADAPTERS: tuple[type[SglangAdapter], ...] = tuple(importlib.import_module(adapter_module(r)).Adapter for r in SUPPORTED)


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
    if version in SUPPORTED:  # a release flashtree adapts whose modules do not import: that error, not "unsupported"
        failure = import_failure(ADAPTERS[SUPPORTED.index(version)].probes)
        if failure is not None:
            raise ToggleError(
                f"flashtree: FLASHTREE_* toggles are set and sglang {version} is a supported release, but importing "
                f"{failure.module} fails ({type(failure.error).__name__}: {failure.error}); install what it lacks "
                f"(flashtree's test venv: scripts/setup_sglang.sh {version}) or unset the FLASHTREE_* toggles."
            )
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


def dflash_adapter(adapter: SglangAdapter):
    """The DFLASH family of `adapter`'s release (its module's `DFlash`); its `mismatches()` say why it cannot serve."""
    return importlib.import_module(adapter_module(adapter.release)).DFlash()
