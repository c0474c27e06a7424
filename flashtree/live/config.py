"""Structured config of the live benchmark (`experiments/live.py`): named sglang servers, the model they serve, the
phases that measure them. Hydra composes the YAML presets under `flashtree/configs/live/` on top of these schemas; value checks
run in `__post_init__` (called by `to_live_config`) and name the offending key.

Importing this module needs no hydra (`register` imports it when called).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from flashtree.experiments.config import LoggerConfig, WandbConfig, _check, to_run_config
from flashtree.live.dummy import ARCHITECTURES, DummyShapes

PHASES = ("identity", "stage", "speed", "mixed", "sampled", "grammar", "features")
SPEED_PHASES = ("stage", "speed", "mixed")  # SpeedPhase's, measured by the speed loop
SPEED_BACKENDS = ("bench_serving", "ids")
PROMPT_SOURCES = ("gsm8k", "random", "file")
# The features phase's requests (flashtree/live/features.py builds them)
FEATURE_REQUESTS = ("plain", "json_schema", "tool_required", "regex", "frequency_penalty", "presence_penalty",
                    "repetition_penalty", "logit_bias", "min_p", "logprobs")


@dataclass
class ServerConfig:
    """One named sglang server: whether it speculates and, if so, flashtree's tree toggles on DSPARK.

    Unset fields leave the toggle unset (sglang's or flashtree's default). The precision profile (dtype, batch sizes,
    deterministic inference) comes from the phase that runs the server, the paths and shared flags from the model.
    """

    description: str = ""
    speculative: bool = True  # false: no speculation (the reference server)
    # FLASHTREE_TREE_N: candidate blocks per step, or "auto" (the planner picks each batch's shape or DSPARK's chain;
    # Any for OmegaConf, checked below); null: DSPARK's own chain
    tree_n: Any = None
    window: Optional[int] = None  # --speculative-num-draft-tokens W (the root included); null: the draft block + 1
    depth: Optional[int] = None  # FLASHTREE_TREE_DEPTH: draft positions each candidate keeps
    budget: Optional[int] = None  # FLASHTREE_TREE_BUDGET: batch-wide verify tokens
    draft_rows: Optional[int] = None  # FLASHTREE_DRAFT_ROWS: rows of the window the tree step's draft forward runs
    draft_temperature: Optional[float] = None  # FLASHTREE_DRAFT_TEMPERATURE of draws 1 .. N-1
    max_bs: Optional[int] = None  # FLASHTREE_TREE_MAX_BS: larger decode batches run DSPARK's chain step
    policy: Optional[str] = None  # FLASHTREE_TREE_POLICY: vote, prob or best-first (flashtree/tree/policies/)
    split_kv: Optional[bool] = None  # FLASHTREE_SPLITKV_VERIFY=1/0; null: flashtree's default (on for trees)
    exact_verify: bool = False  # FLASHTREE_EXACT_VERIFY=1
    fused_sampler: bool = False  # FLASHTREE_FUSED_SAMPLER=1
    graph_draws: Optional[bool] = None  # FLASHTREE_GRAPH_DRAWS=1/0 (the N draws inside DSPARK's draft graph)
    page_size: int = 1
    # the target's --attention-backend in place of the model's (e.g. flashinfer); null: the model's
    attention_backend: Optional[str] = None
    env: dict[str, str] = field(default_factory=dict)  # more environment, e.g. SGLANG_SIMULATE_ACC_LEN
    args: list[str] = field(default_factory=list)  # more sglang flags

    def check(self, name: str) -> None:
        key = f"servers.{name}"
        tree_keys = ("depth", "budget", "draft_rows", "draft_temperature", "max_bs", "graph_draws", "policy")
        if not self.speculative:
            set_keys = [k for k in ("tree_n", "window", *tree_keys) if getattr(self, k) is not None]
            _check(not set_keys and not (self.split_kv or self.exact_verify or self.fused_sampler), key, set_keys,
                   "a server without speculation takes no speculation or tree setting")
        if self.tree_n is None:
            set_keys = [k for k in tree_keys if getattr(self, k) is not None] + (["fused_sampler"] * self.fused_sampler)
            _check(not set_keys, f"{key}.tree_n", None, f"{set_keys} need the tree path (set tree_n)")
        else:
            ok = self.tree_n == "auto" or (type(self.tree_n) is int and 1 <= self.tree_n <= 256)
            _check(ok, f"{key}.tree_n", self.tree_n, "must be 'auto' or an integer in 1..256")
        _check(self.window is None or self.window >= 2, f"{key}.window", self.window, "must be >= 2")
        if self.policy is not None:
            from flashtree.tree import policy_names

            _check(self.policy in policy_names(), f"{key}.policy", self.policy,
                   f"must be one of the registered tree policies: {', '.join(policy_names())}")
        _check(not (self.split_kv and self.exact_verify), key, "split_kv+exact_verify",
               "choose one: split-KV verify is already exact on a deterministic server")
        _check(self.page_size >= 1, f"{key}.page_size", self.page_size, "must be >= 1")
        _check(self.attention_backend is None or (isinstance(self.attention_backend, str) and
                                                  self.attention_backend.strip() == self.attention_backend != ""),
               f"{key}.attention_backend", self.attention_backend, "must be a backend name (sglang's "
               "--attention-backend), or null for the model's")


@dataclass
class PrecisionConfig:
    """A serving profile: dtype and the batch shapes captured in CUDA graphs."""

    dtype: str = "bfloat16"
    max_running_requests: int = 32
    cuda_graph_bs: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 24, 32])
    args: list[str] = field(default_factory=list)  # e.g. --enable-deterministic-inference


@dataclass
class ModelConfig:
    name: str = "smollm2-135m"
    target: str = MISSING  # target checkpoint folder (for a dummy model: where its config is written)
    draft: str = MISSING  # DSPARK draft checkpoint folder (likewise)
    draft_block_size: int = 8  # the draft tokens of its block (DSPARK's block_size, DFLASH's block_size - 1)
    algorithm: str = "DSPARK"  # sglang's --speculative-algorithm for this draft: DSPARK | DFLASH (no Markov head)
    mem_fraction_static: float = 0.08
    args: list[str] = field(default_factory=list)  # flags every server of this model gets
    precisions: dict[str, PrecisionConfig] = field(default_factory=dict)  # profile name -> profile
    dummy: Optional[DummyShapes] = None  # set: write configs, load dummy weights, no tokenizer (input ids)
    label: str = ""  # written on every result row of this model's servers

    def check(self) -> None:
        if self.dummy is not None:
            _check(self.dummy.architecture in ARCHITECTURES, "model.dummy.architecture", self.dummy.architecture,
                   f"use one of {', '.join(ARCHITECTURES)}")
        _check(self.draft_block_size >= 1, "model.draft_block_size", self.draft_block_size, "must be >= 1")
        _check(self.algorithm in ("DSPARK", "DFLASH"), "model.algorithm", self.algorithm, "use DSPARK or DFLASH")
        _check(0 < self.mem_fraction_static < 1, "model.mem_fraction_static", self.mem_fraction_static,
               "must be in (0, 1)")
        _check(bool(self.precisions), "model.precisions", {}, "needs at least one precision profile")


@dataclass
class PromptsConfig:
    source: str = "gsm8k"  # gsm8k (held-out split, chat template, token ids) | random (token ids) | file
    path: Optional[str] = None  # file: JSON {"prompts": [[token ids], ...]}
    split: Optional[str] = "second_half"  # gsm8k
    count: int = 200
    input_len: int = 512  # random
    seed: int = 0

    def __post_init__(self) -> None:
        _check(self.source in PROMPT_SOURCES, "prompts.source", self.source, f"use one of {', '.join(PROMPT_SOURCES)}")
        _check(self.count >= 1, "prompts.count", self.count, "must be >= 1")
        _check(self.source != "file" or bool(self.path), "prompts.path", self.path, "source file needs a path")


@dataclass
class Phase:
    """What every phase has: the servers it measures (by name), their precision profile, extra environment."""

    servers: list[str] = field(default_factory=list)
    precision: str = "bf16"
    env: dict[str, str] = field(default_factory=dict)  # added to these servers' (e.g. FLASHTREE_STAGE_TIMES)
    timeout_s: float = 300.0  # bound of the phase's requests


@dataclass
class IdentityPhase(Phase):
    """Greedy outputs of every server token for token against the first (no speculation)."""

    precision: str = "fp32"
    prompts: int = 50
    max_new_tokens: int = 128
    in_flight: int = 8  # requests in flight per server


# The speed phases' grammar: text of any length (so a constrained request runs to max_new_tokens like the others) from
# a vocabulary every model has, which masks most of a tokenizer's tokens at every position.
CONSTRAINED_REGEX = r"[A-Za-z0-9 ,.;:?!()'\n-]*"


@dataclass
class SpeedPhase(Phase):
    """Each server alone at each concurrency: tokens/s, time per output token, tau."""

    concurrencies: list[int] = field(default_factory=lambda: [1, 8, 32])
    rounds: int = 1
    min_requests: int = 16  # requests per level at least (4 x c otherwise)
    max_new_tokens: int = 256
    backend: str = "bench_serving"  # bench_serving (sglang's, needs a tokenizer) | ids (flashtree's input-id client)
    timeout_s: float = 600.0  # the whole phase; levels not reached by then are recorded as errors
    # the fraction of each level's requests that carry `regex` (grammar-constrained output; ids client only)
    constrained: float = 0.0
    regex: str = CONSTRAINED_REGEX
    # with `constrained`: each level also runs all free, back to back on the same server in the same round (the order
    # alternating over rounds), so a server's grammar cost is the ratio of two levels a few seconds apart, not of two
    # phases minutes apart, between which one round's rate can move by half on a shared host
    paired: bool = False

    def __post_init__(self) -> None:
        _check(self.backend in SPEED_BACKENDS, "speed.backend", self.backend, f"use one of {', '.join(SPEED_BACKENDS)}")
        _check(0.0 <= self.constrained <= 1.0, "speed.constrained", self.constrained, "must be a fraction in [0, 1]")
        _check(self.constrained == 0.0 or self.backend == "ids", "speed.backend", self.backend,
               "constrained requests are sent by flashtree's client: use ids (bench_serving sends no grammar)")
        _check(not self.paired or self.constrained > 0.0, "speed.paired", self.paired,
               "pairs free levels with constrained ones: set constrained above 0, or paired=false")
        _check(bool(self.regex), "speed.regex", self.regex, "must be a non-empty regular expression")
        _check(self.rounds >= 1, "speed.rounds", self.rounds, "must be >= 1")
        _check(all(c >= 1 for c in self.concurrencies), "speed.concurrencies", list(self.concurrencies), "must be >= 1")


@dataclass
class SampledPhase(Phase):
    """Temperature sampling: tokens 2.. of one prompt, each server against the first (two-sample chi-square)."""

    samples: int = 600
    tokens: int = 4
    temperature: float = 0.7


@dataclass
class GrammarPhase(Phase):
    """A regex-constrained greedy request to each server: served with the first server's output (and still serving)."""

    precision: str = "fp32"
    regex: str = "(ab)+"
    max_new_tokens: int = 8


@dataclass
class FeaturesPhase(Phase):
    """Greedy chat requests with sampling features (JSON schema, required tool call, regex, penalties, logit_bias,
    min_p, logprobs) through /v1/chat/completions: each server's answers equal to the first's (no speculation)."""

    precision: str = "fp32"
    max_new_tokens: int = 64
    logit_bias: dict[str, float] = field(default_factory=lambda: {"13": -100.0, "11": 5.0})  # token id -> bias
    logprob_tol: float = 1e-3  # largest |logprob difference| allowed against the reference
    # requests a tree server may refuse with a clear message (none by default: every release's DSPARK tree serves them
    # all; `[logprobs]` for a DFLASH tree on sglang 0.5.17, whose DFLASH worker refuses return_logprob)
    may_refuse: list[str] = field(default_factory=list)
    # requests not sent, e.g. [json_schema, tool_required, regex] on a server without xgrammar (the H200 bundle keeps
    # its runtime bindings, libxgrammar_bindings.so; it drops only xgrammar/lib/libxgrammar.a, a static archive for C++
    # builds that neither import nor grammar compilation reads)
    skip: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check(self.max_new_tokens >= 1, "features.max_new_tokens", self.max_new_tokens, "must be >= 1")
        _check(self.logprob_tol >= 0, "features.logprob_tol", self.logprob_tol, "must be >= 0")
        for key in ("may_refuse", "skip"):
            unknown = [x for x in getattr(self, key) if x not in FEATURE_REQUESTS]
            _check(not unknown, f"features.{key}", list(getattr(self, key)),
                   f"use names from {', '.join(FEATURE_REQUESTS)}")


@dataclass
class PhasesConfig:
    identity: IdentityPhase = field(default_factory=IdentityPhase)
    stage: SpeedPhase = field(default_factory=SpeedPhase)  # the speed phase on FLASHTREE_STAGE_TIMES servers
    speed: SpeedPhase = field(default_factory=SpeedPhase)
    # the speed phase with a share of grammar-constrained requests (the grammar's cost, tree against chain)
    mixed: SpeedPhase = field(default_factory=lambda: SpeedPhase(constrained=0.3, backend="ids", paired=True))
    sampled: SampledPhase = field(default_factory=SampledPhase)
    grammar: GrammarPhase = field(default_factory=GrammarPhase)
    features: FeaturesPhase = field(default_factory=FeaturesPhase)


@dataclass
class RunOptions:
    out_dir: str = "outputs/live"  # results: tables, phase JSON, server logs
    work_dir: str = "/tmp/flashtree_live"  # written model configs, prompts, per-server JIT caches
    dry_run: bool = False  # print the servers and commands, start nothing
    # GPU memory the dry run's check of dummy-weight servers counts, GiB free as sglang reports it on an idle card
    # (H200 139; an H100 80GB 79)
    gpu_gib: float = 139.0
    python: Optional[str] = None  # interpreter of `-m sglang.launch_server` / `-m sglang.bench_serving` (default: this one)
    start_timeout_s: float = 300.0  # every server up within this, or the run stops naming the one that is not
    stagger_s: float = 6.0  # between server starts (concurrent starts race sglang's memory check)
    stop_timeout_s: float = 15.0
    # a server that fails to start: false stops the run (naming it); true drops it from every phase, which runs with
    # the others (a phase whose reference or every compared server failed is not run) and the run exits 1
    keep_going: bool = False


@dataclass
class LiveConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    servers: dict[str, ServerConfig] = field(default_factory=dict)  # the catalog the phases pick from, by name
    prompts: PromptsConfig = field(default_factory=PromptsConfig)
    phases: PhasesConfig = field(default_factory=PhasesConfig)
    run: list[str] = field(default_factory=lambda: list(PHASES))  # phases to run, in this order
    live: RunOptions = field(default_factory=RunOptions)
    # W&B as for sweeps (one run per table row); off by default: the GPU machines have no wandb
    logger: LoggerConfig = field(default_factory=lambda: LoggerConfig(wandb=WandbConfig(mode="disabled")))

    def __post_init__(self) -> None:
        self.model.check()
        for name in self.run:
            _check(name in PHASES, "run", list(self.run), f"unknown phase {name!r}; phases: {', '.join(PHASES)}")
        for name, server in self.servers.items():
            server.check(name)
        for phase_name in self.run:
            phase = getattr(self.phases, phase_name)
            key = f"phases.{phase_name}"
            _check(bool(phase.servers), f"{key}.servers", [], "lists no server")
            for s in phase.servers:
                _check(s in self.servers, f"{key}.servers", list(phase.servers),
                       f"no server named {s!r} (defined: {', '.join(sorted(self.servers))})")
            _check(phase.precision in self.model.precisions, f"{key}.precision", phase.precision,
                   f"model {self.model.name} has precisions {', '.join(self.model.precisions)}")
            if phase_name in ("identity", "sampled", "features", "grammar"):
                _check(len(phase.servers) >= 2, f"{key}.servers", list(phase.servers),
                       "needs the reference (first) and at least one server to compare")
        if self.model.dummy is not None:
            _check(self.prompts.source == "random", "prompts.source", self.prompts.source,
                   "a dummy-weight model has no tokenizer: use random token ids")
            _check("features" not in self.run, "run", list(self.run),
                   "the features phase sends chat requests, which a dummy-weight server (no tokenizer) cannot serve")
            for phase_name in SPEED_PHASES:
                if phase_name in self.run:
                    _check(getattr(self.phases, phase_name).backend == "ids", f"phases.{phase_name}.backend",
                           getattr(self.phases, phase_name).backend,
                           "bench_serving needs a tokenizer, which a dummy-weight server has not: use ids")


def register() -> None:
    """Put the schema in Hydra's ConfigStore (flashtree/configs/live/*.yaml extend it)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="live_schema", node=LiveConfig)


def to_live_config(cfg) -> LiveConfig:
    """DictConfig -> validated LiveConfig (raises ConfigError naming the key)."""
    return to_run_config(cfg)
