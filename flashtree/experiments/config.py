"""Structured configs for the experiment apps: one dataclass per Hydra group, validated when instantiated.

Hydra composes YAML files under `flashtree/configs/` on top of these schemas (registered in the ConfigStore by `register()`),
so a typo'd key or a wrongly typed value fails at composition; value checks (W >= 2, N >= 1, a known prompt set...)
run in `__post_init__`, which `OmegaConf.to_object` calls, and name the offending key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import MISSING

from flashtree.planner import AUTO, check_policy
from flashtree.strict_config import check_device
from flashtree.tree import DEFAULT_POLICY, UnknownPolicy, get_policy

WANDB_MODES = ("online", "offline", "disabled")
DTYPES = ("float32", "bfloat16", "float16")
# tau is deterministic (greedy); tokens_per_s_ci_lo is the lower end of tokens/s's interval across prompts: a noisy
# configuration's wide interval lowers it, so a lucky draw of machine load does not win a search.
OBJECTIVE_METRICS = ("tau", "tokens_per_s_ci_lo", "tokens_per_s", "tau_oracle")


class ConfigError(ValueError):
    """A bad configuration value; the message starts with the offending key."""


def _check(ok: bool, key: str, value: Any, why: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r}: {why}")


def canonical_dataset(name: str) -> str:
    """The prompt-set name `flashtree.datasets.load_prompts` uses for `name` (it accepts the same aliases)."""
    from flashtree.datasets import NAMES, canonical_name

    try:
        return canonical_name(name)
    except ValueError:
        raise ConfigError(f"dataset.name={name!r}: unknown prompt set; use one of {', '.join(NAMES)} (e.g. dataset=gsm8k)") from None


@dataclass
class TargetConfig:
    name: str = "smollm2-135m"  # registry name (smollm2-135m, tiny-llama, tiny-qwen3), hub id or local folder
    dtype: str = "float32"  # float32, bfloat16, float16
    device: str = "cpu"  # cpu, cuda, cuda:1, ...
    cache_dir: Optional[str] = None  # flashtree's model cache (default $FLASHTREE_CACHE or ~/.cache/flashtree)
    seed: int = 0  # weights of the tiny random models

    def __post_init__(self) -> None:
        _check(bool(self.name), "target.name", self.name, "must name a model")
        from flashtree.models import target_kind

        try:
            target_kind(self.name)
        except (FileNotFoundError, ValueError) as exc:
            raise ConfigError(f"target.name={self.name!r}: {exc}") from None
        _check(self.dtype in DTYPES, "target.dtype", self.dtype, f"use one of {', '.join(DTYPES)}")
        check_device("target.device", self.device, ConfigError)


@dataclass
class DrafterConfig:
    name: str = "default"  # default (prompt lookup), prompt-lookup, flashmap, dspark, dflash, oracle
    options: dict[str, Any] = field(default_factory=dict)  # keyword options of `load_drafter`

    def __post_init__(self) -> None:
        from flashtree.drafters import NAMES

        _check(self.name in NAMES, "drafter.name", self.name, f"unknown drafter; use one of {', '.join(NAMES)}")


@dataclass
class TreeConfig:
    # N: candidate blocks drawn per step (1 = chain speculative decoding), or "auto": per step the planner's shape,
    # trees of up to `width` tokens (experiments/README.md, "tree.n=auto")
    n: Any = 4  # Any for OmegaConf (an int or "auto"), checked in __post_init__ with one message
    width: int = 8  # W: verify tokens per step, the root included (with n=auto: the widest tree it may choose)
    policy: str = DEFAULT_POLICY  # the tree policy that keeps W - 1 nodes (flashtree.tree.policies; vote = trie vote)
    # n=auto only: ms per step by verify width, {9: 3.1, 64: 3.6}; empty = measured (sweeps) or modelled (replay)
    costs: dict[int, float] = field(default_factory=dict)

    @property
    def auto(self) -> bool:
        return self.n == AUTO

    def __post_init__(self) -> None:
        count = isinstance(self.n, int) and not isinstance(self.n, bool) and self.n >= 1
        _check(count or self.auto, "tree.n", self.n,
               f"use an int >= 1 (the candidate count N; 1 = the chain) or {AUTO!r} (the planner chooses per step)")
        _check(self.width >= 2, "tree.width", self.width, "the verify width W must be >= 2 (the root plus >= 1 node)")
        try:
            get_policy(self.policy)
        except UnknownPolicy as exc:
            raise ConfigError(f"tree.policy={self.policy!r}: {exc}") from None
        if self.auto:
            try:
                check_policy(self.policy)
            except ValueError as exc:
                raise ConfigError(f"tree.policy={self.policy!r} with tree.n={AUTO}: {exc}") from None
        for w, ms in self.costs.items():
            _check(w >= 2 and ms > 0, "tree.costs", dict(self.costs), "each entry is width (>= 2): ms per step (> 0)")
        _check(self.auto or not self.costs, "tree.costs", dict(self.costs), f"prices the planner's shapes: tree.n={AUTO} only")


@dataclass
class DatasetConfig:
    name: str = "builtin"  # builtin, mt-bench, humaneval, gsm8k, sharegpt
    limit: Optional[int] = None  # first `limit` prompts
    split: Optional[str] = None  # gsm8k only: first_half / second_half
    chat: bool = True  # apply the model's chat template

    def __post_init__(self) -> None:
        self.name = canonical_dataset(self.name)
        _check(self.limit is None or self.limit >= 1, "dataset.limit", self.limit, "must be >= 1 (or null for all)")
        _check(self.split is None or self.name == "gsm8k", "dataset.split", self.split, "only gsm8k has splits")
        from flashtree.datasets import GSM8K_SPLITS

        _check(self.split in (None, *GSM8K_SPLITS), "dataset.split", self.split,
               f"use one of {', '.join(GSM8K_SPLITS)} (or null for all of gsm8k)")


@dataclass
class EngineConfig:
    max_new_tokens: int = 64  # new tokens per prompt (fewer when it stops at the end of its answer)
    temperature: float = 0.0  # 0 = greedy; > 0 samples (the tree walk stays exact)
    top_k: Optional[int] = None  # sample from the k most likely tokens only (null: all)
    top_p: Optional[float] = None  # nucleus sampling mass (null: off)
    stop_at_eos: bool = True  # stop a prompt at the tokenizer's end-of-sequence token
    warmup: bool = True  # one short untimed generation first, so tokens/s does not pay for first-call setup
    threads: Optional[int] = None  # torch CPU threads for the run (null: the process's count); recorded either way

    def __post_init__(self) -> None:
        _check(self.threads is None or self.threads >= 1, "engine.threads", self.threads, "must be >= 1 or null")
        _check(self.max_new_tokens >= 1, "engine.max_new_tokens", self.max_new_tokens, "must be >= 1")
        _check(self.temperature >= 0, "engine.temperature", self.temperature, "must be >= 0 (0 = greedy)")
        _check(self.top_k is None or self.top_k >= 1, "engine.top_k", self.top_k, "must be >= 1 or null")
        _check(self.top_p is None or 0 < self.top_p <= 1, "engine.top_p", self.top_p, "must be in (0, 1] or null")


@dataclass
class WandbConfig:
    mode: str = "offline"  # offline (sync later with `wandb sync`), online, disabled
    project: str = "flashtree"  # W&B project
    entity: Optional[str] = None  # W&B team or user (null: your default)
    group: Optional[str] = None  # default: the sweep name
    tags: list[str] = field(default_factory=list)  # W&B run tags

    def __post_init__(self) -> None:
        _check(self.mode in WANDB_MODES, "logger.wandb.mode", self.mode, f"use one of {', '.join(WANDB_MODES)}")


@dataclass
class LoggerConfig:
    wandb: WandbConfig = field(default_factory=WandbConfig)
    progress: bool = True  # tqdm bar over prompts


@dataclass
class ObjectiveConfig:
    """What a sweep returns to an optimising sweeper (Optuna): `metric`, or 0 when a constraint is violated."""

    metric: str = "tau"  # tau, tokens_per_s_ci_lo (noise-robust speed), tokens_per_s, tau_oracle
    min_tau: Optional[float] = None  # constraint: tau >= min_tau
    max_budget: Optional[int] = None  # constraint: verify budget W <= max_budget

    def __post_init__(self) -> None:
        _check(self.metric in OBJECTIVE_METRICS, "objective.metric", self.metric, f"use one of {', '.join(OBJECTIVE_METRICS)}")
        _check(self.max_budget is None or self.max_budget >= 2, "objective.max_budget", self.max_budget, "must be >= 2")


@dataclass
class RunConfig:
    target: TargetConfig = MISSING
    drafter: DrafterConfig = MISSING
    tree: TreeConfig = MISSING
    dataset: DatasetConfig = MISSING
    engine: EngineConfig = MISSING
    logger: LoggerConfig = MISSING
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    name: str = "default"  # sweep name: results go to multirun/<name> (single runs: outputs/<name>/<time>)
    seed: int = 0  # base of every generator seed (per prompt: seed, prompt index)
    resume: bool = True  # skip a configuration whose run directory already holds its finished summary


@dataclass
class ReplayConfig:
    """The grid `experiments/replay.py` walks over one recording (N_max candidates at every position)."""

    n_max: int = 16  # candidate blocks recorded at every position (every replayed N <= n_max)
    recording: Optional[str] = None  # replay this recording.pt (an earlier replay's, or the shipped one) instead
    ns: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])  # the N of the replayed grid
    widths: list[int] = field(default_factory=lambda: [4, 8, 16, 32])  # the W of the replayed grid

    def __post_init__(self) -> None:
        _check(self.n_max >= 1, "replay.n_max", self.n_max, "must be >= 1")
        for n in self.ns:
            _check(1 <= n <= self.n_max, "replay.ns", list(self.ns), f"every N must be in 1..replay.n_max={self.n_max}")
        for w in self.widths:
            _check(w >= 2, "replay.widths", list(self.widths), "every W must be >= 2")


@dataclass
class ReplayRunConfig(RunConfig):
    replay: ReplayConfig = field(default_factory=ReplayConfig)

    def __post_init__(self) -> None:
        _check(self.engine.temperature == 0, "engine.temperature", self.engine.temperature,
               "replay reproduces greedy (temperature 0) runs only; sample with experiments/sweep.py")
        _check(self.replay.recording is None or Path(self.replay.recording).is_file(), "replay.recording",
               self.replay.recording, "must be a recording file (recording.pt of an earlier replay)")
        _check(self.drafter.name != "oracle", "drafter.name", self.drafter.name,
               "the oracle's corruption follows the step count, not the position; replay needs a drafter whose "
               "candidates depend only on the context (default, prompt-lookup, flashmap)")


# Keys that change where results live or how they are shown, not what is measured: left out of the config hash.
NOT_MEASURED = ("logger", "objective", "name", "resume")


def register() -> None:
    """Put the schemas in Hydra's ConfigStore (the YAML files under flashtree/configs/ extend them)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    cs.store(name="replay_schema", node=ReplayRunConfig)
    for group, node in (
        ("target", TargetConfig),
        ("drafter", DrafterConfig),
        ("tree", TreeConfig),
        ("dataset", DatasetConfig),
        ("engine", EngineConfig),
        ("logger", LoggerConfig),
    ):
        cs.store(group=group, name="schema", node=node)


def to_run_config(cfg, overrides=()) -> RunConfig:
    """DictConfig -> validated RunConfig (raises ConfigError naming the key; `overrides`: the job's task overrides,
    whose dict values replace the composed dict of their key)."""
    from flashtree.strict_config import to_checked_object

    return to_checked_object(cfg, ConfigError, overrides)
