"""`--help` of the Hydra apps: their config groups (the options shipped in flashtree/configs/) and every key with its
default and the one-line comment it carries in its schema dataclass, so the help is the schema and cannot drift.

The apps' configs set `hydra.help.template: ${flashtree_help:<app>}` (<app> as in flashtree.apps.APPS);
`register_resolver()`, which `flashtree.cli.run_app` calls, makes that resolve.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from pathlib import Path

FIELD_LINE = re.compile(r"^\s+(\w+): [^=]+=.*?(?:#\s*(.*))?$")


def field_comments(cls) -> dict[str, str]:
    """{field: its comment} of a dataclass's source: the trailing one, else the comment lines just above the field
    (comments on base classes' fields included)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        above: list[str] = []
        for line in source.splitlines():
            m = FIELD_LINE.match(line)
            if m and (m.group(2) or above):
                out[m.group(1)] = (m.group(2) or " ".join(above)).strip()
            above = above + [line.strip()[1:].strip()] if line.strip().startswith("#") else []
    return out


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "???"


def key_lines(cls, prefix: str = "", instance=None) -> list[str]:
    """'key = default   comment' for every leaf key of schema `cls`: nested dataclasses as `group.key`, those of a
    dict's values as `group.<name>.key` (live's named servers), an optional one as if set. Defaults come from
    `instance` where given: a field's default_factory may set its nested keys (live's logger: W&B disabled)."""
    comments = field_comments(cls)
    hints = typing.get_type_hints(cls)
    lines = []
    for f in dataclasses.fields(cls):
        default = getattr(instance, f.name) if instance is not None else _default(f)
        nested, name = _nested(hints[f.name])
        if nested is not None:
            lines += key_lines(nested, f"{prefix}{f.name}.{name}", default if isinstance(default, nested) else None)
            continue
        shown = "null" if default is None else str(default).lower() if isinstance(default, bool) else default
        lines.append(f"  {prefix}{f.name} = {shown}".ljust(42) + f"  {comments.get(f.name, '')}".rstrip())
    return lines


def _nested(hint) -> tuple[type | None, str]:
    """(the dataclass whose keys sit under a field of type `hint`, the key part before them) or (None, "")."""
    if dataclasses.is_dataclass(hint):
        return hint, ""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is dict and len(args) == 2 and dataclasses.is_dataclass(args[1]):
        return args[1], "<name>."
    if typing.get_origin(hint) is typing.Union and len(args) == 2 and type(None) in args:
        inner = next(a for a in args if a is not type(None))
        if dataclasses.is_dataclass(inner):
            return inner, ""
    return None, ""


def group_lines(config_dir: Path, groups: list[str]) -> list[str]:
    """'group: option, option' for each group, the options being the YAML files shipped for it."""
    return [f"  {g}: {', '.join(sorted(p.stem for p in (config_dir / g).glob('*.yaml')))}" for g in groups]


@dataclasses.dataclass(frozen=True)
class Help:
    title: str
    usage: str
    schema: str  # "module:class" of the app's structured config
    groups: list[str]
    footer: str
    config_names: bool = False  # list the app's top-level configs (--config-name NAME), when it has several


EXPERIMENTS = "Metrics and tables: flashtree/metrics.py; every key and preset: experiments/README.md."

# Keyed like flashtree.apps.APPS, whose config_dir says where the groups' options are.
APPS = {
    "sweep": Help("τ, per-depth acceptance and tokens/s per configuration, to parquet + W&B",
                  "flashtree sweep [--multirun] [group=option] [key=value ...]",
                  "flashtree.experiments.config:RunConfig",
                  ["target", "drafter", "tree", "dataset", "engine", "logger", "sweeper", "launcher"],
                  EXPERIMENTS),
    "replay": Help("record once per prompt, replay the (N, W) grid of `replay` at temperature 0",
                   "flashtree replay [group=option] [key=value ...]",
                   "flashtree.experiments.config:ReplayRunConfig",
                   ["target", "drafter", "tree", "dataset", "engine", "logger"],
                   EXPERIMENTS),
    "train-drafter": Help("train a DSPARK block drafter, exported in sglang's DSPARK layout to out_dir/draft",
                          "flashtree train-drafter [--config-name NAME] [key=value ...]",
                          "flashtree.dspark.train_config:TrainConfig", [],
                          "Reruns resume from out_dir/state.pt unless resume=false; usage: experiments/train_drafter.py.",
                          config_names=True),
    "live": Help("sglang servers from named presets: greedy identity, tokens/s, stage times, sampled chi-square",
                 "flashtree live [+preset=NAME] [model=NAME] [servers=[NAME,...]] [key=value ...]",
                 "flashtree.live.config:LiveConfig", ["model", "servers", "preset"],
                 "live.dry_run=true prints every server's command and starts nothing; benchmarks/live/README.md."),
}


def help_text(app: str) -> str:
    """The help template of `app`: Hydra substitutes $CONFIG (the composed config) and $FLAGS_HELP in it."""
    import importlib

    from flashtree.apps import APPS as CLI_APPS
    from flashtree.apps import CONFIGS

    spec, config_dir = APPS[app], CLI_APPS[app].config_dir
    shown_dir = Path("flashtree/configs") / config_dir.relative_to(CONFIGS)
    module, name = spec.schema.split(":")
    cls = getattr(importlib.import_module(module), name)
    lines = [f"flashtree {app}: {spec.title}", "", f"usage: {spec.usage}", ""]
    if spec.config_names:
        lines += [f"== Configs (--config-name NAME; each is {shown_dir}/NAME.yaml) ==",
                  f"  {', '.join(sorted(p.stem for p in config_dir.glob('*.yaml')))}", ""]
    if spec.groups:
        lines += [f"== Config groups (group=option; each option is {shown_dir}/<group>/<option>.yaml) ==",
                  *group_lines(config_dir, spec.groups), ""]
    lines += ["== Keys (key=value; shown with their defaults) ==", *key_lines(cls), "", spec.footer]
    body = "\n".join(lines).replace("$", "$$")  # Hydra fills the template with string.Template: a literal $ is $$
    return f"{body}\n\n== Composed config (with this command line's overrides) ==\n$CONFIG\n== Hydra flags ==\n$FLAGS_HELP\n"


def register_resolver() -> None:
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("flashtree_help", help_text, replace=True)
