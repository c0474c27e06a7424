"""Signature probes: what an adapter requires of the installed sglang before it patches anything."""

from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import dataclass
from typing import Any


class ImportFailure(LookupError):
    """Importing a probed module raised: another release's layout, or, inside a supported release, a dependency that
    is missing or broken (adapters.select_adapter tells the two apart by the installed version)."""

    def __init__(self, module: str, error: BaseException):
        super().__init__(f"cannot import {module}: {type(error).__name__}: {error}")
        self.module, self.error = module, error


def resolve(path: str) -> Any:
    """'pkg.module:Attr.sub' -> the object. Raises LookupError with the reason (ImportFailure: the import raised)."""
    module_name, _, attr_path = path.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - any import failure: reported as the release's or as this one
        raise ImportFailure(module_name, err) from None
    for part in filter(None, attr_path.split(".")):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise LookupError(f"{path}: no attribute {part!r}") from None
    return obj


@functools.cache
def resolve_once(path: str) -> Any:
    """`resolve` looked up once, for the tree step's hot path: modules and classes only, which sglang never rebinds
    after import (functions stay `resolve`d per call, so a patched one is seen)."""
    return resolve(path)


@functools.cache
def _module_and_attrs(path: str) -> tuple[str, tuple[str, ...]]:
    module_name, _, attr_path = path.partition(":")
    return module_name, tuple(filter(None, attr_path.split(".")))


def resolve_attr(path: str) -> Any:
    """`resolve` for the tree step's hot path: the module once (`resolve_once`), its attributes afresh per call (a
    patched function is seen) without an import lookup per step. The probes checked the path at worker start."""
    module_name, attrs = _module_and_attrs(path)
    obj = resolve_once(module_name)
    for attr in attrs:
        obj = getattr(obj, attr)
    return obj


def param_names(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


@dataclass(frozen=True)
class Sig:
    """`path` is callable and its parameter names equal `params` (exact) or start with them (prefix=True)."""

    path: str
    params: tuple[str, ...]
    prefix: bool = False

    def check(self) -> str | None:
        try:
            got = param_names(resolve(self.path))
        except LookupError as err:
            return str(err)
        except (TypeError, ValueError) as err:
            return f"{self.path}: no signature ({err})"
        want = list(self.params)
        ok = got[: len(want)] == want if self.prefix else got == want
        if ok:
            return None
        return f"{self.path}{'(...)' if self.prefix else ''}: parameters {got}, expected {'a prefix ' if self.prefix else ''}{want}"


@dataclass(frozen=True)
class Has:
    """`path` resolves; when `params` is given, those names are among its parameters."""

    path: str
    params: tuple[str, ...] = ()

    def check(self) -> str | None:
        try:
            obj = resolve(self.path)
        except LookupError as err:
            return str(err)
        if self.params:
            got = param_names(obj)
            missing = [p for p in self.params if p not in got]
            if missing:
                return f"{self.path}: lacks parameters {missing} (has {got})"
        return None


@dataclass(frozen=True)
class Lacks:
    """`path` does not resolve (or, with `params`, lacks every one of those parameters)."""

    path: str
    params: tuple[str, ...] = ()

    def check(self) -> str | None:
        try:
            obj = resolve(self.path)
        except LookupError:
            return None
        if self.params:
            present = [p for p in self.params if p in param_names(obj)]
            return f"{self.path}: has parameters {present}, which this release does not" if present else None
        return f"{self.path} exists, which this release does not have"


def import_failure(probes) -> ImportFailure | None:
    """The first module a probe needs (Sig, Has: not Lacks, whose module may rightly be absent) whose import raises."""
    for probe in probes:
        if isinstance(probe, Lacks):
            continue
        try:
            resolve(probe.path.partition(":")[0])
        except ImportFailure as failure:
            return failure
    return None
