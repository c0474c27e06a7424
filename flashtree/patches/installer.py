"""Idempotent, reversible attribute patches on sglang classes.

A `Patch` names one attribute of one class (or module) and the replacement to put there. `install` records the exact
object found in the owner's `__dict__` (so a staticmethod/classmethod or an inherited attribute is restored as it was),
installs the replacement, and tags it so a second install recognises its own work and changes nothing. `uninstall`
puts every original back, and refuses while another plugin's wrapper sits over a replacement. `verify` checks that every patch this process installed is still in place.

flashtree does not go through sglang's HookRegistry: the registry cannot undo a hook (its `reset` forgets hooks but
leaves the patched attributes in place), and installs must be reversible so tests can prove they touch exactly what
they claim.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, Callable

_MISSING = object()
TAG = "__flashtree_patch__"
logger = logging.getLogger("flashtree.patches")


@dataclass(frozen=True)
class Patch:
    owner: Any  # a class or a module
    name: str  # attribute name on owner
    make: Callable[[Any], Any]  # original (the resolved attribute, e.g. a plain function) -> replacement
    key: str  # stable id, e.g. "DSparkWorkerV2._forward_decode"
    wrap_static: bool = False  # re-wrap the replacement in staticmethod (owner's attribute was one)


@dataclass
class _Record:
    patch: Patch
    raw_original: Any  # what owner.__dict__ held (or _MISSING: the attribute was inherited)
    installed: Any  # what flashtree put there


_records: dict[str, _Record] = {}


def _label(patch: Patch) -> str:
    owner = getattr(patch.owner, "__qualname__", None) or getattr(patch.owner, "__name__", repr(patch.owner))
    return f"{getattr(patch.owner, '__module__', '')}.{owner}.{patch.name}".lstrip(".")


def _function(obj: Any) -> Any:
    """The function inside a staticmethod / classmethod wrapper (anything else as it is)."""
    return obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj


def is_flashtree(obj: Any) -> bool:
    return getattr(_function(obj), TAG, None) is not None


def install(patches: list[Patch]) -> list[str]:
    """Install every patch not yet installed. Returns the keys newly installed (empty on a repeat call)."""
    done = []
    for patch in patches:
        rec = _records.get(patch.key)
        if rec is not None and patch.owner.__dict__.get(patch.name) is rec.installed:
            continue  # already in place: installing twice changes nothing
        if rec is not None:
            raise RuntimeError(f"flashtree: {_label(patch)} was replaced by someone else after flashtree patched it")
        raw = patch.owner.__dict__.get(patch.name, _MISSING)
        if raw is not _MISSING and is_flashtree(raw):
            raise RuntimeError(f"flashtree: {_label(patch)} already holds a flashtree patch this process did not record")
        original = getattr(patch.owner, patch.name)
        replacement = patch.make(original)
        fn = replacement
        setattr(fn, TAG, patch.key)
        if callable(original) and not isinstance(original, type):
            functools.update_wrapper(fn, original, updated=())
            setattr(fn, TAG, patch.key)
            fn.__wrapped__ = original
        installed = staticmethod(fn) if patch.wrap_static else fn
        setattr(patch.owner, patch.name, installed)
        _records[patch.key] = _Record(patch=patch, raw_original=raw, installed=installed)
        done.append(patch.key)
    return done


def _wraps_ours(current: Any, installed: Any) -> bool:
    """Whether `current`, found where flashtree installed `installed`, is someone else's wrapper around it: reaches it
    through `__wrapped__` (functools.wraps) or holds it in its closure."""
    ours, seen = _function(installed), _function(current)
    while seen is not None:
        cells = getattr(seen, "__closure__", None) or ()
        if seen is ours or any(_cell(c) is ours or _cell(c) is installed for c in cells):
            return True
        seen = getattr(seen, "__wrapped__", None)
    return False


def _cell(cell) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def uninstall() -> list[str]:
    """Restore every original this process replaced. Returns the keys restored.

    Refuses (RuntimeError, nothing restored) while another plugin's wrapper sits over one of flashtree's replacements:
    restoring under it would leave flashtree's code running inside that wrapper. A replacement someone else swapped
    out without wrapping it is theirs to keep: its record is dropped with a warning, and it is not among the keys."""
    wrapped = [
        _label(rec.patch)
        for rec in _records.values()
        if (current := rec.patch.owner.__dict__.get(rec.patch.name)) is not rec.installed and _wraps_ours(current, rec.installed)
    ]
    if wrapped:
        raise RuntimeError(
            f"flashtree: cannot uninstall: another wrapper sits over flashtree's replacement of {', '.join(wrapped)}, "
            "so flashtree's code would keep running inside it; remove that wrapper first (restore the attribute to "
            "what it wrapped), then call flashtree.patches.uninstall() again"
        )
    restored = []
    for key in reversed(list(_records)):
        rec = _records.pop(key)
        owner, name = rec.patch.owner, rec.patch.name
        if owner.__dict__.get(name) is not rec.installed:
            logger.warning("flashtree: %s was replaced by someone else after flashtree patched it; left as it is", _label(rec.patch))
            continue
        if rec.raw_original is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, rec.raw_original)
        restored.append(key)
    return restored


def verify(expected_keys: list[str]) -> list[str]:
    """Reasons why the expected patches are not all in place (empty list = everything installed)."""
    problems = []
    for key in expected_keys:
        rec = _records.get(key)
        if rec is None:
            problems.append(f"{key}: never installed")
            continue
        current = rec.patch.owner.__dict__.get(rec.patch.name, _MISSING)
        if current is not rec.installed:
            problems.append(f"{_label(rec.patch)}: expected flashtree's replacement, found {current!r}")
    return problems


def installed_keys() -> list[str]:
    return list(_records)


def original_of(key: str) -> Any:
    """The attribute flashtree replaced (resolved: a function, not a staticmethod wrapper)."""
    rec = _records[key]
    raw = rec.raw_original
    if raw is _MISSING:
        return getattr(rec.patch.owner.__mro__[1], rec.patch.name)
    return _function(raw)
