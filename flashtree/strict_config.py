"""Hydra config -> validated dataclass for the apps, with nothing dropped silently.

Hydra's `+group.key=value` (what it suggests for a misspelt key) adds a key the schema lacks, and `OmegaConf.to_object`
then drops it; a command-line dict (`data.sources={}`) merges into the preset's dict instead of replacing it. Both
are handled here: an unknown key is refused naming the closest valid one, a dict override replaces.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing


def to_checked_object(cfg, error: type[ValueError], overrides=()):
    """`cfg` (a structured config) as an instance of its dataclass; `error` (naming the key) for an unknown key or a
    bad value, raised from the schema's `__post_init__` checks. `overrides`: the command line's task overrides, whose
    dict values replace the composed dict of their key."""
    from omegaconf import OmegaConf, open_dict

    schema = OmegaConf.get_type(cfg)
    problem = _unknown_key(cfg, schema, "")
    if problem:
        raise error(problem)
    for key, value in _dict_overrides(overrides, schema):
        with open_dict(cfg):
            OmegaConf.update(cfg, key, value, merge=False)
    try:
        return OmegaConf.to_object(cfg)
    except error:
        raise
    except Exception as exc:  # OmegaConf wraps errors raised in __post_init__; unwrap ours
        cause = exc.__cause__ or exc.__context__
        while cause is not None and not isinstance(cause, error):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            raise cause from None
        raise


def check_device(key: str, device: str, error: type[ValueError]) -> None:
    """`error` naming `key` unless `device` is a torch device string (a dtype there is the usual slip)."""
    import torch

    try:
        torch.device(device)
    except (RuntimeError, TypeError):
        hint = " (that is a dtype, not a device)" if isinstance(getattr(torch, str(device), None), torch.dtype) else ""
        raise error(f"{key}={device!r}: not a torch device{hint}; use cpu, cuda, cuda:1 or mps") from None


def _unknown_key(node, schema: type, prefix: str) -> str | None:
    from omegaconf import DictConfig

    hints = typing.get_type_hints(schema)
    fields = [f.name for f in dataclasses.fields(schema)]
    for key in node.keys():
        name = f"{prefix}{key}"
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f"did you mean {prefix}{close[0]}?" if close else "it is not in the schema"
            return f"{name}: unknown key ({hint} valid keys here: {', '.join(fields)})"
        sub = hints[key]
        child = node._get_node(key)
        if dataclasses.is_dataclass(sub) and isinstance(child, DictConfig) and not child._is_missing():
            problem = _unknown_key(child, sub, f"{name}.")
            if problem:
                return problem
    return None


def _dict_overrides(overrides, schema: type) -> list[tuple[str, dict]]:
    """(key, dict) of every `key=<dict>` task override (not `+`/`~`/`++`) of a dict-typed key of `schema`, in order."""
    if not overrides:
        return []
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out = []
    for o in OverridesParser.create().parse_overrides(list(overrides)):
        if o.is_sweep_override() or o.is_delete() or o.is_add() or o.is_force_add() or not isinstance(o.value(), dict):
            continue
        if _is_dict_field(schema, o.key_or_group.split(".")):
            out.append((o.key_or_group, o.value()))
    return out


def _is_dict_field(schema: type, path: list[str]) -> bool:
    for part in path[:-1]:
        schema = typing.get_type_hints(schema).get(part) if dataclasses.is_dataclass(schema) else None
    if not dataclasses.is_dataclass(schema):
        return False
    hint = typing.get_type_hints(schema).get(path[-1])
    return typing.get_origin(hint) is dict or hint is dict
