"""Structured config of `experiments/train_drafter.py` (Hydra composes flashtree/configs/train/*.yaml over it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

WANDB_MODES = ("online", "offline", "disabled")


class TrainConfigError(ValueError):
    """A bad training config value; the message starts with the offending key."""


def _check(ok: bool, key: str, value: Any, why: str) -> None:
    if not ok:
        raise TrainConfigError(f"{key}={value!r}: {why}")


def _source(key: str, name: str) -> str:
    from .data import canonical_source

    try:
        return canonical_source(name)
    except ValueError as err:
        raise TrainConfigError(f"{key}: {err}") from None


@dataclass
class TrainTargetConfig:
    name: str = "smollm2-135m"  # flashtree.models.load_target name (smollm2-135m, tiny-llama, ...) or a folder
    device: str = "cuda"
    cache_dir: Optional[str] = None
    seed: int = 0  # weights of the tiny random targets only

    def __post_init__(self) -> None:
        from flashtree.strict_config import check_device

        check_device("target.device", self.device, TrainConfigError)


@dataclass
class TrainDataConfig:
    # prompt sources -> how many prompts (null = all that fit). gsm8k is only allowed as gsm8k-first-half.
    # (empty in the schema: a YAML dict would merge into a default one, never replace it)
    sources: dict[str, Optional[int]] = field(default_factory=dict)
    prompts_file: Optional[str] = None  # pre-selected prompts (select_prompts output), for machines without the sets
    max_prompt_tokens: int = 384
    max_new_tokens: int = 256  # response length cap of the target's responses
    # source -> sampled responses per prompt, on top of the greedy one (empty in the schema, like `sources`)
    extra_samples: dict[str, int] = field(default_factory=dict)
    sample_temperature: float = 0.8
    gen_batch_size: int = 512
    gen_time_limit_s: Optional[float] = None  # stop generating after this long and train on what exists
    gen_max_batches: Optional[int] = None  # generate only the first N batches (the sampled ones run first)

    def __post_init__(self) -> None:
        listed = [_source("data.sources", name) for name in self.sources]
        for name, count in self.extra_samples.items():
            key = f"data.extra_samples.{name}"
            _check(_source(key, name) in listed, key, count,
                   f"not a source of data.sources: use one of {', '.join(listed) or '(none listed)'}")
            _check(isinstance(count, int) and not isinstance(count, bool) and count >= 0, key, count,
                   "must be an int >= 0 (sampled responses per prompt)")
        _check(self.sample_temperature > 0 or not any(self.extra_samples.values()), "data.sample_temperature",
               self.sample_temperature, "must be > 0 when data.extra_samples asks for samples")
        _check(self.max_prompt_tokens >= 1, "data.max_prompt_tokens", self.max_prompt_tokens, "must be >= 1")
        _check(self.max_new_tokens >= 1, "data.max_new_tokens", self.max_new_tokens, "must be >= 1")
        _check(self.gen_batch_size >= 1, "data.gen_batch_size", self.gen_batch_size, "must be >= 1")


@dataclass
class TrainModelConfig:
    num_hidden_layers: int = 3
    intermediate_size: int = 1536
    num_attention_heads: Optional[int] = None  # default: the target's
    num_key_value_heads: Optional[int] = None
    head_dim: Optional[int] = None
    block_size: int = 8
    target_layer_ids: Optional[list[int]] = None  # default: 5 layers spread over 1 .. num_layers - 2
    mask_token_id: Optional[int] = None  # default: the target's pad/eos-free choice (see train.default_mask_token)
    markov_rank: int = 32
    rope_theta: Optional[float] = None  # default: the target's

    def __post_init__(self) -> None:
        _check(self.num_hidden_layers >= 1, "model.num_hidden_layers", self.num_hidden_layers, "must be >= 1")
        _check(self.block_size >= 1, "model.block_size", self.block_size, "must be >= 1")
        _check(self.markov_rank >= 1, "model.markov_rank", self.markov_rank, "sglang's DSPARK needs a rank >= 1")


@dataclass
class TrainOptimConfig:
    steps: int = 3000
    batch_size: int = 32  # sequences per step
    anchors: int = 32  # blocks per sequence per step
    max_seq_len: int = 640  # longer sequences are cut (anchors come from the kept part)
    lr: float = 6e-4
    warmup: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    loss_decay: Optional[float] = 4.0  # block row j weighs exp(-j / loss_decay); null = uniform
    bf16: bool = True  # autocast (CUDA only)
    # Training time over all runs of one out_dir (resumes included): the cosine schedule ends here, or at `steps`.
    time_limit_s: Optional[float] = None
    # Stop this run after this long (checkpoint + export); a resume continues the same schedule. Lets one training
    # span several device calls of bounded length.
    stop_after_s: Optional[float] = None

    def __post_init__(self) -> None:
        for key in ("steps", "batch_size", "anchors"):
            _check(getattr(self, key) >= 1, f"optim.{key}", getattr(self, key), "must be >= 1")
        _check(self.lr > 0, "optim.lr", self.lr, "must be > 0")
        _check(self.max_seq_len >= 4, "optim.max_seq_len", self.max_seq_len, "must be >= 4")
        for key in ("time_limit_s", "stop_after_s"):
            value = getattr(self, key)
            _check(value is None or value > 0, f"optim.{key}", value, "must be > 0 seconds, or null")


@dataclass
class TrainWandbConfig:
    mode: str = "offline"
    project: str = "flashtree"
    entity: Optional[str] = None
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check(self.mode in WANDB_MODES, "logger.wandb.mode", self.mode, f"use one of {', '.join(WANDB_MODES)}")


@dataclass
class TrainLoggerConfig:
    wandb: TrainWandbConfig = field(default_factory=TrainWandbConfig)
    progress: bool = True
    every: int = 25  # steps between log lines / W&B points


@dataclass
class TrainConfig:
    target: TrainTargetConfig = field(default_factory=TrainTargetConfig)
    data: TrainDataConfig = field(default_factory=TrainDataConfig)
    model: TrainModelConfig = field(default_factory=TrainModelConfig)
    optim: TrainOptimConfig = field(default_factory=TrainOptimConfig)
    logger: TrainLoggerConfig = field(default_factory=TrainLoggerConfig)
    out_dir: str = "results/dspark-smollm2"  # data.pt, state.pt (resume), train_log.jsonl, draft/ (sglang format)
    seed: int = 0
    checkpoint_every: int = 500  # steps between resumable checkpoints (state.pt)
    export_dtype: str = "bfloat16"  # dtype of the exported draft/ weights
    # dspark: sglang DSPARK's draft (Markov head, row j proposes a + 1 + j); dflash: sglang DFLASH's (no head, block
    # [anchor, mask x block_size], row j >= 1 proposes its own position; draft/ in DFlashDraftModel's layout)
    format: str = "dspark"
    max_shard_mb: Optional[float] = 15.0  # shard the exported weights (files come back from the GPU <= 16 MiB)
    resume: bool = True  # continue from out_dir/state.pt (and reuse out_dir/data.pt) when present
    prepare_only: bool = False  # select the prompts, write out_dir/prompts.json.gz and stop (no target forward)

    def __post_init__(self) -> None:
        d = self.data
        _check(bool(d.sources) or d.prompts_file is not None, "data.sources", dict(d.sources),
               "names no prompt source: list at least one (e.g. 'data.sources={builtin: 8}') or set data.prompts_file")
        _check(self.export_dtype in ("bfloat16", "float16", "float32"), "export_dtype", self.export_dtype,
               "use bfloat16, float16 or float32")
        _check(self.format in ("dspark", "dflash"), "format", self.format, "use dspark or dflash")
        _check(self.checkpoint_every >= 1, "checkpoint_every", self.checkpoint_every, "must be >= 1")


def register() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="train_schema", node=TrainConfig)


def to_train_config(cfg, overrides=()) -> TrainConfig:
    """DictConfig -> validated TrainConfig (raises TrainConfigError naming the key; `overrides`: the task overrides,
    whose dicts replace the preset's: `data.sources={gsm8k-first-half: 100}` trains on that source alone)."""
    from flashtree.strict_config import to_checked_object

    return to_checked_object(cfg, TrainConfigError, overrides)
