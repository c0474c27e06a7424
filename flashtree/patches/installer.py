"""Idempotent, reversible attribute patches on sglang classes.

A `Patch` names one attribute of one class (or module) and the replacement to put there. `install` records the exact
object found in the owner's `__dict__` (so a staticmethod/classmethod or an inherited attribute is restored as it was),
installs the replacement, and tags it so a second install recognises its own work and changes nothing. `uninstall`
puts every original back. `verify` checks that every patch this process installed is still in place.

flashtree does not go through sglang's HookRegistry: the registry cannot undo a hook (its `reset` forgets hooks but
leaves the patched attributes in place), and installs must be reversible so tests can prove they touch exactly what
they claim.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

_MISSING = object()
TAG = "__flashtree_patch__"


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


def is_flashtree(obj: Any) -> bool:
    fn = obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj
    return getattr(fn, TAG, None) is not None


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


def uninstall() -> list[str]:
    """Restore every original this process replaced. Returns the keys restored."""
    restored = []
    for key in reversed(list(_records)):
        rec = _records.pop(key)
        owner, name = rec.patch.owner, rec.patch.name
        if owner.__dict__.get(name) is not rec.installed:
            continue  # someone else replaced it since; leave theirs
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
    return raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
