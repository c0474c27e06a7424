"""The FLASHTREE_* server toggles: declared, read and validated here, and nowhere else.

Each toggle is one field of `TreeToggles`, declared with `toggle(...)`: its variable, its parser (which also says what
it allows and how a value is written), its default, what it needs, and one doc line. The parser of `read_toggles`, the
list of toggles that need FLASHTREE_TREE_N and the README's toggle table (`markdown_table()`, written into the README
by `write_readme_table()`) all come from those fields.

`read_toggles(environ)` returns None when no toggle is set (then flashtree leaves sglang alone), a `TreeToggles`
otherwise. Any bad value, and any FLASHTREE_* variable that is neither a toggle nor one of `OTHER_VARIABLES`, raises
`ToggleError` (a SystemExit: sglang's plugin loader swallows ordinary exceptions, and a server asked for trees must
never come up silently as a chain) with one message naming the variable and what it accepts.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Callable, Mapping

PREFIX = "FLASHTREE_"

# FLASHTREE_* variables that flashtree reads outside the server toggles: never refused as misspelt toggles.
OTHER_VARIABLES = {
    "FLASHTREE_CACHE": "flashtree's model cache (flashtree/models.py, scripts/*_h200.sh)",
    "FLASHTREE_TORCH": "scripts/setup.sh: skip = keep the venv's torch",
    "FLASHTREE_SGLANG_REBUILD": "scripts/setup_sglang.sh: 1 = rebuild the release's venv",
}

README = Path(__file__).with_name("README.md")
REWRITE_TABLE = "python -c 'from flashtree.patches.toggles import write_readme_table; write_readme_table()'"
TABLE_BEGIN = f"<!-- toggle table: generated from flashtree/patches/toggles.py; rewrite it with {REWRITE_TABLE} -->"
TABLE_END = "<!-- end of toggle table -->"


class ToggleError(SystemExit):
    """A FLASHTREE_* variable holds a value flashtree cannot use. Stops the server (SystemExit) with `message`."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def load_for_toggle(path: str, toggle: str, off_means: str):
    """The object at "module:attr" that `toggle`=1 needs, or a ToggleError saying what is missing and what 0 does."""
    import importlib

    module_name, _, attr = path.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ToggleError(
            f"flashtree: {toggle}=1 needs {path}, which this flashtree build cannot import "
            f"({type(err).__name__}: {err}); allowed: 0 ({off_means})"
        ) from None


# ---- parsers: text -> value (ValueError when invalid); `allowed` for messages and the README; `show` a value as text


_DIGITS = re.compile(r"[0-9]+")  # plain ASCII decimal digits: int() would also take "8_0", "+8" and other scripts' digits
_DECIMAL = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+")


@dataclass(frozen=True)
class Ints:
    """An integer in [lo, hi] in plain decimal digits; with `auto`, also the word 'auto' (read as `auto_value`), whose
    meaning (derived at worker start) `auto` says."""

    lo: int
    hi: int
    auto: str = ""
    auto_value: int = 0  # outside [lo, hi] where 0 is a value of its own (FLASHTREE_TREE_N: 0 = off)

    @property
    def allowed(self) -> str:
        ints = f"an integer from {self.lo} to {self.hi}"
        return f"'auto' ({self.auto}) or {ints}" if self.auto else ints

    def __call__(self, raw: str) -> int:
        text = raw.strip()
        if self.auto and text.lower() == "auto":
            return self.auto_value
        if not _DIGITS.fullmatch(text) or not self.lo <= int(text) <= self.hi:
            raise ValueError
        return int(text)

    def show(self, value: int) -> str:
        return "auto" if self.auto and value == self.auto_value else str(value)


@dataclass(frozen=True)
class Number:
    """A decimal number in (0, hi]."""

    hi: float

    @property
    def allowed(self) -> str:
        return f"a number > 0 and <= {self.hi:g} in decimal digits (e.g. 0.7)"

    def __call__(self, raw: str) -> float:
        text = raw.strip()
        if not _DECIMAL.fullmatch(text) or not 0.0 < float(text) <= self.hi:
            raise ValueError
        return float(text)

    def show(self, value: float) -> str:
        return str(value)


@dataclass(frozen=True)
class Flag:
    words = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
    allowed = "one of 1/0, true/false, yes/no, on/off"

    def __call__(self, raw: str) -> bool:
        try:
            return self.words[raw.strip().lower()]
        except KeyError:
            raise ValueError from None

    def show(self, value: bool) -> str:
        return "1" if value else "0"


@dataclass(frozen=True)
class Name:
    """One of the names `names()` returns (read when a value is checked, so the registry behind it loads lazily)."""

    names: Callable[[], tuple[str, ...]]
    what: str

    @property
    def allowed(self) -> str:
        return f"one of the {self.what}: {', '.join(self.names())}"

    def __call__(self, raw: str) -> str:
        if raw.strip() not in self.names():
            raise ValueError
        return raw.strip()

    def show(self, value: str) -> str:
        return value


@dataclass(frozen=True)
class File:
    """The path of an existing file (what is in it is checked where it is read), or 'none'."""

    what: str

    @property
    def allowed(self) -> str:
        return f"the path of {self.what}, or 'none'"

    def __call__(self, raw: str) -> str:
        text = raw.strip()
        if text.lower() == "none":
            return ""
        if not Path(text).is_file():
            raise ValueError
        return text

    def show(self, value: str) -> str:
        return value or "none"


def _policy_names() -> tuple[str, ...]:
    """The registered tree policies (flashtree/patches/policy_draws.py feeds each what it reads of the draft)."""
    from flashtree.tree import policy_names

    return policy_names()


# ---- the declaration


@dataclass(frozen=True)
class Toggle:
    name: str  # the variable
    parse: Ints | Number | Flag | Name | File
    doc: str  # one line: what it does (the README table's last column)
    # "set": refused without FLASHTREE_TREE_N whatever its value; "on": refused without it when not the default
    needs_tree: str = ""
    field: str = ""  # the TreeToggles field (filled in from the dataclass)
    default: object = None  # ditto

    @property
    def needs(self) -> str:
        if not self.needs_tree:
            return ""
        return f"`{TREE_N}`" if self.needs_tree == "set" else f"`{TREE_N}` unless {self.parse.show(self.default)}"


TREE_N = "FLASHTREE_TREE_N"
AUTO_N = -1  # FLASHTREE_TREE_N=auto: the planner chooses each decode batch's shape (planning.py)
# What turning the tree path on changes of other toggles' defaults, for those left unset: flashtree's split-KV verify
# attention, except where exact verify replaces the verify attention (DEFAULT_UNLESS). sglang's custom-mask extend
# attention cost the N = 8 tree 1.04x / 1.11x / 1.15x / 1.20x DSPARK's chain step at 1 / 8 / 32 / 64 requests (Llama
# shapes, live run 51), the split-KV tree 1.07x / 0.79x / 0.72x / 0.70x (Qwen3 shapes, run 8), and at 4K prompts 18.0 ms
# a step at one request against 9.1 (runs 15 / 16). Defaulted (not set), it stays off where it would stop the server
# (a deterministic server with pages: plan.py).
TREE_DEFAULTS = {"FLASHTREE_SPLITKV_VERIFY": True}
# What FLASHTREE_TREE_N=auto changes besides: the draws the fastest measured servers ran.
AUTO_DEFAULTS = {"FLASHTREE_DRAFT_TEMPERATURE": 0.7, "FLASHTREE_FUSED_SAMPLER": True}
DEFAULT_UNLESS = {"FLASHTREE_SPLITKV_VERIFY": "exact_verify"}  # not defaulted when this field is on
# The policies auto plans: their narrower trees are credited from each step's own (best-first: on DFLASH only,
# planning.resolve_toggles; flashtree/patches/README.md, "Planner").
PLANNED_POLICIES = ("vote", "best-first")


def toggle(name: str, parse, default, doc: str, needs_tree: str = ""):
    """A TreeToggles field read from the variable `name`."""
    return field(default=default, metadata={"toggle": Toggle(name, parse, doc, needs_tree)})


@dataclass(frozen=True)
class TreeToggles:
    tree_n: int = toggle(
        TREE_N, Ints(0, 256, "the planner picks each decode batch's tree or DSPARK's chain", AUTO_N), 0,
        "candidate blocks drawn per request; 0 or unset = tree path off; auto: per decode batch the shape (N, W) or "
        "DSPARK's chain step with the most expected tokens/s, and unset `FLASHTREE_DRAFT_TEMPERATURE` / "
        "`FLASHTREE_FUSED_SAMPLER` default to 0.7 / 1; see \"Planner\" below")
    tree_width: int = toggle(
        "FLASHTREE_TREE_WIDTH", Ints(2, 256, "DSPARK's verify window, gamma + 1"), 0,
        "tree width W (root included), at most gamma + 1; a narrower tree is verified by a target graph captured at "
        "its width (see \"Verify-token budget\")", "set")
    tree_depth: int = toggle(
        "FLASHTREE_TREE_DEPTH", Ints(1, 256, "DSPARK's gamma"), 0,
        "draft positions each candidate keeps, the tree's max depth, at most gamma; below gamma the tree is wider "
        "than its depth + 1: see \"Trees wider than the draft block\" below", "set")
    tree_policy: str = toggle(
        "FLASHTREE_TREE_POLICY", Name(_policy_names, "registered tree policies"), "vote",
        "the tree policy that picks the W - 1 verified nodes (flashtree/tree/policies/): `vote` the nodes most "
        "candidates pass through, `prob` the candidates' trie by the draft's path probability, `best-first` grown "
        "from the draft's Markov head without sampling; see \"Tree policies\" below", "set")
    tree_budget: int = toggle(
        "FLASHTREE_TREE_BUDGET", Ints(0, 1 << 20), 0,
        "batch-wide verify-token budget (0 = none): each request's tree gets `W_eff = clamp(budget // bs, 2, W)` "
        "tokens from `ceil(N · W_eff / W)` candidates, verified by target graphs captured at those widths; see "
        "\"Verify-token budget\" below", "set")
    tree_max_bs: int = toggle(
        "FLASHTREE_TREE_MAX_BS", Ints(0, 1 << 16), 0,
        "decode batches of more running requests than this run DSPARK's own chain step unchanged, smaller ones the "
        "tree step (0 = no limit); see \"Batch-size limit\" below", "set")
    draft_rows: int = toggle(
        "FLASHTREE_DRAFT_ROWS", Ints(1, 256, "DSPARK's gamma: the whole window"), 0,
        "rows of DSPARK's window the tree step's draft forward runs, the first ones, from the tree depth to gamma; "
        "below gamma through draft graphs captured at that many rows (sglang 0.5.17 only): see \"Draft rows\" below",
        "set")
    draft_temperature: float = toggle(
        "FLASHTREE_DRAFT_TEMPERATURE", Number(100.0), 1.0,
        "temperature of draws 1 … N−1 (candidate 0 is always the draft's greedy block, i.e. DSPARK's chain block)",
        "set")
    seed: int = toggle(
        "FLASHTREE_SEED", Ints(0, (1 << 63) - 1), 0,
        "seed of the draft-draw / sampled-walk generator (per worker process)", "set")
    splitkv_verify: bool = toggle(
        "FLASHTREE_SPLITKV_VERIFY", Flag(), False,
        "flashtree's split-KV verify attention on the target's Triton backend; under "
        "`--enable-deterministic-inference` its decode-order kernel, bit-equal to decode (see \"Split-KV verify "
        "attention\"); unset, on wherever the tree path is (`FLASHTREE_TREE_N`) unless `FLASHTREE_EXACT_VERIFY=1`")
    exact_verify: bool = toggle(
        "FLASHTREE_EXACT_VERIFY", Flag(), False,
        "verify attention as one decode row per verify token through the backend's own decode kernel (Triton or "
        "FlashInfer): under `--enable-deterministic-inference` greedy outputs equal no speculation bit for bit (chain "
        "or tree); see \"Exact verify\" below; not with `FLASHTREE_SPLITKV_VERIFY` (which is already exact there)")
    fused_sampler: bool = toggle(
        "FLASHTREE_FUSED_SAMPLER", Flag(), False,
        "flashtree's fused kernels for the N draft draws: with sglang's vanilla Markov head, "
        "`flashtree.sampler.markov_draws` (all K steps in K Triton launches, in the draft graph and eagerly; 2.9–5x "
        "faster than the head's torch steps on the H200, BENCHMARKS.md, kernels); other heads: the fused row sampler "
        "per step", "on")
    stage_times: int = toggle(
        "FLASHTREE_STAGE_TIMES", Ints(0, 1 << 20), 0,
        "every N tree steps (0 = off), log the mean time per stage of those steps (draft, draws, build, verify, walk, "
        "commit, output; CUDA events read once per N steps) and where the draws ran (graph / eager)", "set")
    profile_host: int = toggle(
        "FLASHTREE_PROFILE_HOST", Ints(0, 1 << 20), 0,
        "profiling: Python's profiler over decode steps N + 1 to 2N of the scheduler's thread (0 = off), then one log "
        "of the functions with the most host time (host_profile.py)", "set")
    graph_draws: bool = toggle(
        "FLASHTREE_GRAPH_DRAWS", Flag(), True,
        "draw the N candidate blocks inside the captured draft CUDA graph (DSPARK's or DFLASH's draft-sampler tail "
        "hook) instead of eagerly; batches the graphs do not cover draw eagerly; see \"Graph draws\" below", "set")
    grammar_overlap: bool = toggle(
        "FLASHTREE_GRAMMAR_OVERLAP", Flag(), False,
        "queue the step's walk and commit behind a device-side wait on a host flag, then walk grammar-constrained "
        "requests' trees while the target verifies, instead of the scheduler thread walking first (GPU; sets "
        "`CUDA_MODULE_LOADING=EAGER` for the server's processes; exact in a live server but slower there than the "
        "default walk; see \"Sampling features\" below)", "on")

    tp: bool = toggle(
        "FLASHTREE_TP", Flag(), False,
        "serve the tree path at `--tp-size` > 1: the tree path's tensor-parallel sync (rank 0's draws and sampled-walk "
        "draws broadcast, an agreement check every 64 steps), not yet proven on GPUs; without it `--tp-size` > 1 is "
        "refused at worker start; see \"Tensor parallelism\" below", "set")

    simulate_acc: str = toggle(
        "FLASHTREE_SIMULATE_ACC", File("an accept table (JSON, `python -m flashtree.engine.accept_table`)"), "",
        "profiling only (with `SGLANG_SIMULATE_ACC_LEN=1`): every step, DSPARK's chain steps (N = 1) and tree steps, "
        "commits a length drawn from the table's recorded acceptance for its shape instead of the verified one "
        "(without it tree steps honour `SGLANG_SIMULATE_ACC_LEN` as DSPARK does); see \"Simulated acceptance\" below")

    # derived, not a variable: the toggles above that took a tree default (TREE_DEFAULTS, AUTO_DEFAULTS), not a value
    defaulted: frozenset = field(default=frozenset(), metadata={"derived": True})

    @property
    def tree_enabled(self) -> bool:
        return self.tree_n != 0

    @property
    def planned(self) -> bool:
        return self.tree_n == AUTO_N

    @property
    def narrows(self) -> bool:
        """Trees narrower than the window: a budget, a fixed width or the planner's menu, each verified through
        target graphs captured at its width (verify_widths.py, at init_cuda_graphs: startup.py)."""
        return bool(self.tree_budget or self.tree_width or self.planned)

    def describe(self) -> str:
        return ", ".join(f"{name}={getattr(self, name)}" for name in self.__dataclass_fields__)


# variable -> its declaration, in TreeToggles' order (the README's order)
TOGGLES: dict[str, Toggle] = {
    t.name: replace(t, field=f.name, default=f.default)
    for f in fields(TreeToggles) if not f.metadata.get("derived")
    for t in [f.metadata["toggle"]]
}


def _closest(name: str) -> str:
    """The declared toggle nearest to `name`, comparing the words after FLASHTREE_ in order and as a set (so
    FLASHTREE_VERIFY_SPLITKV finds FLASHTREE_SPLITKV_VERIFY)."""
    words = name[len(PREFIX):].split("_")

    def score(candidate: str) -> float:
        theirs = candidate[len(PREFIX):].split("_")
        in_order = difflib.SequenceMatcher(None, "_".join(words), "_".join(theirs)).ratio()
        as_set = difflib.SequenceMatcher(None, "_".join(sorted(words)), "_".join(sorted(theirs))).ratio()
        return max(in_order, as_set)

    return max(TOGGLES, key=score)


def _refuse_unknown(env: Mapping[str, str]) -> None:
    for name in env:
        if name.startswith(PREFIX) and name not in TOGGLES and name not in OTHER_VARIABLES:
            raise ToggleError(
                f"flashtree: unknown toggle {name} (did you mean {_closest(name)}?); allowed: the server toggles "
                f"{', '.join(TOGGLES)} (flashtree/patches/README.md), or unset {name}"
            )


def _refuse_orphan(name: str, raw: str, tree_n_set: bool) -> None:
    """`name` needs FLASHTREE_TREE_N, which is unset or 0."""
    t, hi = TOGGLES[name], TOGGLES[TREE_N].parse.hi
    turn_on = f"set {TREE_N} to 'auto' or an integer from 1 to {hi}"
    if t.needs_tree == "set":
        raise ToggleError(
            f"flashtree: {name} is set but {TREE_N} is {'0' if tree_n_set else 'unset'}; allowed: {turn_on} to turn "
            f"the tree path on, or unset {name}"
        )
    raise ToggleError(
        f"flashtree: {name}={raw} only changes the tree path; allowed: {turn_on} as well, or set "
        f"{name}={t.parse.show(t.default)}"
    )


def read_toggles(environ: Mapping[str, str] | None = None) -> TreeToggles | None:
    """Parse every FLASHTREE_* server toggle. None = nothing set (leave sglang alone). Raises ToggleError."""
    env = os.environ if environ is None else environ
    _refuse_unknown(env)
    set_ = {name: env[name] for name in TOGGLES if env.get(name, "").strip() != ""}
    if not set_:
        return None
    values: dict[str, object] = {}
    for name, raw in set_.items():
        t = TOGGLES[name]
        try:
            values[t.field] = t.parse(raw)
        except ValueError:
            raise ToggleError(f"flashtree: {name}={raw!r} is invalid; allowed: {t.parse.allowed}") from None
    defaults = {**TREE_DEFAULTS, **AUTO_DEFAULTS} if values.get("tree_n") == AUTO_N else (
        TREE_DEFAULTS if values.get("tree_n") else {})
    defaulted = set()
    for name, value in defaults.items():
        field_ = TOGGLES[name].field
        if not values.get(DEFAULT_UNLESS.get(name, "")) and field_ not in values:
            values[field_] = value
            defaulted.add(name)
    values["defaulted"] = frozenset(defaulted)
    toggles = TreeToggles(**values)  # type: ignore[arg-type]
    if not toggles.tree_enabled:
        for name, raw in set_.items():
            t = TOGGLES[name]
            if t.needs_tree == "set" or (t.needs_tree == "on" and values[t.field] != t.default):
                _refuse_orphan(name, raw, TREE_N in set_)
    if all(getattr(toggles, t.field) == t.default for t in TOGGLES.values() if not t.needs_tree):
        return None  # only explicit "off" values: nothing to install
    if toggles.planned and toggles.tree_budget:
        raise ToggleError(
            f"flashtree: {TREE_N}=auto chooses each batch's tree width itself, and FLASHTREE_TREE_BUDGET="
            f"{toggles.tree_budget} would fix it by the batch size; allowed: unset FLASHTREE_TREE_BUDGET (auto), or "
            f"an integer {TREE_N} with the budget"
        )
    if toggles.planned and toggles.tp:
        raise ToggleError(
            f"flashtree: {TREE_N}=auto with FLASHTREE_TP=1: each tensor-parallel rank would time its own steps and could "
            f"choose another shape than the others; allowed: an integer {TREE_N} with FLASHTREE_TP=1, or unset "
            "FLASHTREE_TP"
        )
    if toggles.planned and toggles.tree_policy not in PLANNED_POLICIES:
        raise ToggleError(
            f"flashtree: {TREE_N}=auto credits every shape from each step's own tree (trie-vote trees from the same "
            f"candidates, best-first trees as the first nodes of the widest), which FLASHTREE_TREE_POLICY="
            f"{toggles.tree_policy} trees are not; allowed: FLASHTREE_TREE_POLICY={' or '.join(PLANNED_POLICIES)} "
            f"(unset: vote) with auto, or an integer {TREE_N} with {toggles.tree_policy}"
        )
    if toggles.splitkv_verify and toggles.exact_verify:
        raise ToggleError(
            "flashtree: FLASHTREE_SPLITKV_VERIFY=1 and FLASHTREE_EXACT_VERIFY=1 both replace the target's verify "
            "attention (on an --enable-deterministic-inference server split-KV verify alone is already decode-exact); "
            "allowed: set at most one of them to 1"
        )
    return toggles


PLUGIN = "flashtree"  # the plugin's name in sglang's entry-point group sglang.srt.plugins (pyproject.toml)


def refuse_excluded_plugin(environ: Mapping[str, str]) -> None:
    """For a launcher, before it starts a server with `environ`: FLASHTREE_* toggles set while SGLANG_PLUGINS (sglang's
    allow-list of plugin names, read as sglang's load_plugins reads it) leaves flashtree out raise ToggleError. sglang
    then never imports the plugin, so no flashtree code runs in that server to refuse (README, "Server command")."""
    plugins = environ.get("SGLANG_PLUGINS", "")
    if not plugins or PLUGIN in {name.strip() for name in plugins.split(",")}:
        return
    if read_toggles(environ) is None:
        return
    named = ", ".join(name for name in TOGGLES if environ.get(name, "").strip())
    raise ToggleError(
        f"flashtree: {named} set, but SGLANG_PLUGINS={plugins!r} leaves out the {PLUGIN} plugin, so sglang would "
        f"never load it and the server would run DSPARK's chain; add {PLUGIN} to SGLANG_PLUGINS, unset SGLANG_PLUGINS, "
        "or unset the toggles"
    )


# ---- the README's toggle table


def markdown_table() -> str:
    """The README's toggle table, from the declaration."""
    rows = ["| variable | values | default | needs | what it does |", "| --- | --- | --- | --- | --- |"]
    for t in TOGGLES.values():
        rows.append(f"| `{t.name}` | {t.parse.allowed} | `{t.parse.show(t.default)}` | {t.needs or '–'} | {t.doc} |")
    return "\n".join(rows)


def _table_span(text: str) -> tuple[int, int]:
    """Where the generated table lies in the README's text: between the two markers."""
    return text.index(TABLE_BEGIN) + len(TABLE_BEGIN), text.index(TABLE_END)


def readme_table(text: str) -> str:
    begin, end = _table_span(text)
    return text[begin:end].strip("\n")


def write_readme_table(path: Path = README) -> bool:
    """Rewrite the table in `path` from the declaration. Returns whether it changed."""
    text = path.read_text()
    begin, end = _table_span(text)
    new = f"{text[:begin]}\n{markdown_table()}\n{text[end:]}"
    if new != text:
        path.write_text(new)
    return new != text

