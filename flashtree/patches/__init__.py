"""flashtree's sglang plugin: FLASHTREE_* toggles on a live sglang server swap DSPARK's decode for the tree path.

sglang runs `register()` in every server process (entry point group `sglang.srt.plugins`, declared in pyproject.toml).
With no FLASHTREE_* toggle set it returns at once and sglang is never imported or touched. Otherwise it validates the
toggles, picks the adapter for the installed sglang release by probing signatures, installs the patches, and checks
they are in place; every failure is a SystemExit with one message (sglang's plugin loader swallows ordinary
exceptions, and a server asked for trees must never come up as a chain).

Importing this package needs only the standard library and torch: the adapters (which import sglang) load lazily.
"""

from __future__ import annotations

import logging
from typing import Mapping

from .toggles import ToggleError, TreeToggles, read_toggles

logger = logging.getLogger("flashtree.patches")

__all__ = ["register", "install", "uninstall", "installed", "read_toggles", "ToggleError", "TreeToggles"]


def register() -> None:
    """sglang plugin entry point (`flashtree.patches:register`)."""
    toggles = read_toggles()
    if toggles is None:
        return
    install(toggles)


def install(toggles: TreeToggles | None = None, environ: Mapping[str, str] | None = None) -> list[str]:
    """Install what `toggles` (or the environment) asks for; idempotent. Returns the patch keys in place."""
    if toggles is None:
        toggles = read_toggles(environ)
        if toggles is None:
            return []
    from . import installer, plan
    from .adapters import select_adapter

    adapter = select_adapter()  # UnsupportedRelease (SystemExit) before anything is touched
    try:
        patches = plan.patches(adapter, toggles)
    except ToggleError:
        raise
    except Exception as err:  # noqa: BLE001
        raise SystemExit(f"flashtree: cannot prepare patches for sglang {adapter.release}: {type(err).__name__}: {err}") from None
    keys = [p.key for p in patches]
    try:
        installer.install(patches)
    except Exception as err:  # noqa: BLE001
        installer.uninstall()
        raise SystemExit(f"flashtree: installing the tree patches on sglang {adapter.release} failed: {err}") from None
    problems = installer.verify(keys)
    if problems:
        installer.uninstall()
        raise SystemExit(f"flashtree: tree patches not in place after install on sglang {adapter.release}: {'; '.join(problems)}")
    logger.info("flashtree: installed %s on sglang %s (%s)", ", ".join(keys), adapter.release, toggles.describe())
    return keys


def uninstall() -> list[str]:
    """Restore every sglang attribute flashtree replaced in this process."""
    from . import installer

    return installer.uninstall()


def installed() -> list[str]:
    from . import installer

    return installer.installed_keys()
