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


# The toggles the patches in place were made for (their replacements close over them); None = nothing installed.
_installed_for: TreeToggles | None = None


def install(toggles: TreeToggles | None = None, environ: Mapping[str, str] | None = None) -> list[str]:
    """Install what `toggles` (or the environment) asks for. Returns the patch keys in place.

    Installing the same toggles again changes nothing; other toggles than those installed reinstall (uninstall, then
    install, logged), since the replacements in place were made for the first ones."""
    global _installed_for
    if toggles is None:
        toggles = read_toggles(environ)
        if toggles is None:
            return []
    from . import installer, plan
    from .adapters import select_adapter

    if installer.installed_keys() and toggles != _installed_for:
        logger.info("flashtree: reinstalling for %s (installed for %s)", toggles.describe(),
                    _installed_for.describe() if _installed_for else "toggles this module did not record")
        uninstall()
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
        uninstall()
        raise SystemExit(f"flashtree: installing the tree patches on sglang {adapter.release} failed: {err}") from None
    problems = installer.verify(keys)
    if problems:
        uninstall()
        raise SystemExit(f"flashtree: tree patches not in place after install on sglang {adapter.release}: {'; '.join(problems)}")
    _installed_for = toggles
    logger.info("flashtree: installed %s on sglang %s (%s)", ", ".join(keys), adapter.release, toggles.describe())
    return keys


def uninstall() -> list[str]:
    """Restore every sglang attribute flashtree replaced in this process. Raises RuntimeError, restoring nothing,
    while another plugin's wrapper sits over one of flashtree's replacements (installer.uninstall)."""
    global _installed_for
    from . import installer

    restored = installer.uninstall()
    _installed_for = None
    return restored


def installed() -> list[str]:
    from . import installer

    return installer.installed_keys()
