"""`--help` of the Hydra apps: their config groups (the options shipped in flashtree/configs/) and every key with its
default and the one-line comment it carries in its schema dataclass, so the help is the schema and cannot drift.

The apps' configs set `hydra.help.template: ${flashtree_help:<app>}`; `register_resolver()` makes that resolve.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

FIELD_LINE = re.compile(r"^\s+(\w+): [^=]+=.*?(?:#\s*(.*))?$")


def field_comments(cls) -> dict[str, str]:
    """{field: its trailing comment} of a dataclass's source (comments on base classes' fields included)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        for line in source.splitlines():
            m = FIELD_LINE.match(line)
            if m and m.group(2):
                out[m.group(1)] = m.group(2).strip()
    return out


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "???"


def key_lines(cls, prefix: str = "") -> list[str]:
    """'key = default   comment' for every leaf key of schema `cls` (nested dataclasses as `group.key`)."""
    comments = field_comments(cls)
    lines = []
    hints = {f.name: f.type for f in dataclasses.fields(cls)}
    for f in dataclasses.fields(cls):
        nested = _dataclass_of(cls, f.name, hints[f.name])
        if nested is not None:
            lines += key_lines(nested, f"{prefix}{f.name}.")
            continue
        default = _default(f)
        shown = "null" if default is None else str(default).lower() if isinstance(default, bool) else default
        lines.append(f"  {prefix}{f.name} = {shown}".ljust(42) + f"  {comments.get(f.name, '')}".rstrip())
    return lines


def _dataclass_of(cls, name: str, hint):
    import typing

    hint = typing.get_type_hints(cls).get(name, hint)
    return hint if dataclasses.is_dataclass(hint) else None


def group_lines(config_dir: Path, groups: list[str]) -> list[str]:
    """'group: option, option' for each group, the options being the YAML files shipped for it."""
    return [f"  {g}: {', '.join(sorted(p.stem for p in (config_dir / g).glob('*.yaml')))}" for g in groups]


APPS = {
    # app: (title, usage, schema "module:class", groups)
    "sweep": ("τ, per-depth acceptance and tokens/s per configuration, to parquet + W&B",
              "flashtree sweep [--multirun] [group=option] [key=value ...]",
              "flashtree.experiments.config:RunConfig",
              ["target", "drafter", "tree", "dataset", "engine", "logger", "sweeper", "launcher"]),
    "replay": ("record once per prompt, replay the (N, W) grid of `replay` at temperature 0",
               "flashtree replay [group=option] [key=value ...]",
               "flashtree.experiments.config:ReplayRunConfig",
               ["target", "drafter", "tree", "dataset", "engine", "logger"]),
}


def help_text(app: str) -> str:
    """The help template of `app`: Hydra substitutes $CONFIG (the composed config) and $FLAGS_HELP in it."""
    import importlib

    from flashtree.cli import CONFIGS

    title, usage, schema, groups = APPS[app]
    module, name = schema.split(":")
    cls = getattr(importlib.import_module(module), name)
    body = "\n".join([
        f"flashtree {app}: {title}", "", f"usage: {usage}", "",
        "== Config groups (group=option; each option is flashtree/configs/<group>/<option>.yaml) ==",
        *group_lines(CONFIGS, groups), "",
        "== Keys (key=value; shown with their defaults) ==",
        *key_lines(cls), "",
        "Metrics and tables: flashtree/metrics.py; every key and preset: experiments/README.md.",
    ])
    body = body.replace("$", "$$")  # Hydra fills the template with string.Template: a literal $ is $$
    return f"{body}\n\n== Composed config (with this command line's overrides) ==\n$CONFIG\n== Hydra flags ==\n$FLAGS_HELP\n"


def register_resolver() -> None:
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("flashtree_help", help_text, replace=True)
