"""The FLASHTREE_* server toggles: read and validated here, and nowhere else.

`read_toggles(environ)` returns None when no toggle is set (then flashtree leaves sglang alone), a `TreeToggles`
otherwise. Any bad value raises `ToggleError` (a SystemExit: sglang's plugin loader swallows ordinary exceptions, and a
server asked for trees must never come up silently as a chain) with one message naming the variable and what it
accepts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping

PREFIX = "FLASHTREE_"


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


@dataclass(frozen=True)
class TreeToggles:
    tree_n: int = 0  # max candidate blocks per request (0 = tree path off)
    tree_width: int = 0  # W: verify tokens per request, root included (0 = auto: DSPARK's window, gamma + 1)
    tree_depth: int = 0  # D: draft positions per candidate, the tree's max depth (0 = auto: gamma)
    tree_budget: int = 0  # batch-wide verify-token budget; per-request width = clamp(budget // bs, 2, W) (0 = none)
    tree_max_bs: int = 0  # decode batches of more requests run DSPARK's own chain step (0 = no limit)
    draft_temperature: float = 1.0  # temperature of the N independent draft draws
    draft_rows: int = 0  # rows of DSPARK's window the tree step's draft forward runs (0 = auto: all gamma; draft_rows.py)
    splitkv_verify: bool = False  # split-KV tree-verify attention on the target's Triton backend
    exact_verify: bool = False  # verify attention as decode rows: bitwise equal to no speculation (exact_verify.py)
    fused_sampler: bool = False  # flashtree's fused kernels for the N draft draws (Markov draws / row sampler)
    seed: int = 0  # seed of the draft-draw generator (per worker process)
    stage_times: int = 0  # log the tree step's per-stage time every N steps (0 = off)
    graph_draws: bool = True  # the N draft draws in DSPARK's captured draft graph tail (graph_draws.py); eager without graphs
    tree_policy: str = "vote"  # the tree policy (flashtree.tree.build_tree)

    @property
    def tree_enabled(self) -> bool:
        return self.tree_n > 0

    def describe(self) -> str:
        return ", ".join(f"{name}={getattr(self, name)}" for name in self.__dataclass_fields__)


def _int_in(lo: int, hi: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        value = int(raw.strip(), 10)
        if not lo <= value <= hi:
            raise ValueError
        return value

    parse.allowed = f"an integer from {lo} to {hi}"  # type: ignore[attr-defined]
    return parse


def _auto_or_int(lo: int, hi: int, auto: str) -> Callable[[str], int]:
    """'auto' (0: derived from DSPARK's window at worker start) or an integer in [lo, hi]."""
    ints = _int_in(lo, hi)

    def parse(raw: str) -> int:
        return 0 if raw.strip().lower() == "auto" else ints(raw)

    parse.allowed = f"'auto' ({auto}) or {ints.allowed}"  # type: ignore[attr-defined]
    return parse


def _positive_float(raw: str) -> float:
    value = float(raw.strip())
    if not (0.0 < value <= 100.0) or value != value:
        raise ValueError
    return value


_positive_float.allowed = "a number > 0 and <= 100 (e.g. 1.0)"  # type: ignore[attr-defined]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _flag(raw: str) -> bool:
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError


_flag.allowed = "one of 1/0, true/false, yes/no, on/off"  # type: ignore[attr-defined]

# variable -> (field, parser, help). Order is the README's order.
TOGGLES: dict[str, tuple[str, Callable[[str], object], str]] = {
    "FLASHTREE_TREE_N": ("tree_n", _int_in(0, 256), "max candidate blocks drawn per request; 0 or unset = tree path off"),
    "FLASHTREE_TREE_WIDTH": (
        "tree_width",
        _auto_or_int(2, 256, "DSPARK's verify window, gamma + 1"),
        "W, verify tokens per request (root included); must be <= gamma + 1",
    ),
    "FLASHTREE_TREE_DEPTH": (
        "tree_depth",
        _auto_or_int(1, 256, "DSPARK's gamma"),
        "D, draft positions per candidate (the tree's max depth); must be <= gamma. Below gamma, trees are wider "
        "than their depth + 1: start the server with --speculative-num-draft-tokens W --speculative-dspark-block-size "
        "W-1 and set the draft's own block length here",
    ),
    "FLASHTREE_TREE_BUDGET": (
        "tree_budget",
        _int_in(0, 1 << 20),
        "batch-wide verify-token budget: each request gets W_eff = clamp(budget // bs, 2, W) tree nodes and "
        "ceil(N * W_eff / W) candidates; 0 = no budget",
    ),
    "FLASHTREE_TREE_MAX_BS": (
        "tree_max_bs",
        _int_in(0, 1 << 16),
        "decode batches of more running requests than this run DSPARK's own chain step; 0 = no limit",
    ),
    "FLASHTREE_DRAFT_TEMPERATURE": (
        "draft_temperature",
        _positive_float,
        "temperature of the N independent draft draws (greedy draws would all be the same block)",
    ),
    "FLASHTREE_DRAFT_ROWS": (
        "draft_rows",
        _auto_or_int(1, 256, "DSPARK's gamma: the whole window"),
        "rows the tree step's draft forward runs per request, the window's first; from FLASHTREE_TREE_DEPTH to "
        "gamma. Below gamma the forward runs through draft CUDA graphs captured at that many rows (sglang 0.5.17)",
    ),
    "FLASHTREE_SPLITKV_VERIFY": ("splitkv_verify", _flag, "split-KV tree-verify attention on the target's Triton backend"),
    "FLASHTREE_EXACT_VERIFY": (
        "exact_verify",
        _flag,
        "verify attention as one decode row per verify token, so that under --enable-deterministic-inference greedy "
        "outputs equal no speculation bit for bit (slower; a losslessness check, not a speed mode)",
    ),
    "FLASHTREE_FUSED_SAMPLER": ("fused_sampler", _flag, "flashtree's fused kernels for the N draft draws"),
    "FLASHTREE_SEED": ("seed", _int_in(0, (1 << 63) - 1), "seed of the draft-draw generator"),
    "FLASHTREE_STAGE_TIMES": (
        "stage_times",
        _int_in(0, 1 << 20),
        "log the tree step's mean per-stage time every N tree steps (0 = off)",
    ),
    "FLASHTREE_GRAPH_DRAWS": (
        "graph_draws",
        _flag,
        "draw the N candidate blocks in DSPARK's captured draft CUDA graph tail instead of eagerly",
    ),
}

# Variables other parts of flashtree read (not server toggles); never reported as unknown.
_NOT_TOGGLES = {"FLASHTREE_TORCH", "FLASHTREE_SGLANG_REBUILD"}
# Families a typo would come from: FLASHTREE_TREE_NN, FLASHTREE_SPLIT_KV_VERIFY, ...
_TOGGLE_FAMILIES = (
    "FLASHTREE_TREE", "FLASHTREE_SPLIT", "FLASHTREE_FUSED", "FLASHTREE_DRAFT", "FLASHTREE_SEED", "FLASHTREE_STAGE",
    "FLASHTREE_GRAPH", "FLASHTREE_EXACT",
)
# Set without FLASHTREE_TREE_N they would do nothing; refuse rather than ignore them.
_NEED_TREE = ("FLASHTREE_TREE_WIDTH", "FLASHTREE_TREE_DEPTH", "FLASHTREE_TREE_BUDGET", "FLASHTREE_TREE_MAX_BS",
              "FLASHTREE_DRAFT_TEMPERATURE", "FLASHTREE_DRAFT_ROWS", "FLASHTREE_SEED", "FLASHTREE_STAGE_TIMES",
              "FLASHTREE_GRAPH_DRAWS")


def read_toggles(environ: Mapping[str, str] | None = None) -> TreeToggles | None:
    """Parse every FLASHTREE_* server toggle. None = nothing set (leave sglang alone). Raises ToggleError."""
    env = os.environ if environ is None else environ
    present = {k: v for k, v in env.items() if k.startswith(PREFIX) and k not in _NOT_TOGGLES}
    for name in present:
        if name not in TOGGLES and name.startswith(_TOGGLE_FAMILIES):
            raise ToggleError(
                f"flashtree: unknown toggle {name}; the server toggles are {', '.join(TOGGLES)} "
                "(see flashtree/patches/README.md)"
            )
    set_ = {k: v for k, v in present.items() if k in TOGGLES and v.strip() != ""}
    if not set_:
        return None
    values: dict[str, object] = {}
    for name, raw in set_.items():
        field, parse, _help = TOGGLES[name]
        try:
            values[field] = parse(raw)
        except ValueError:
            raise ToggleError(f"flashtree: {name}={raw!r} is invalid; allowed: {parse.allowed}") from None  # type: ignore[attr-defined]
    toggles = TreeToggles(**values)  # type: ignore[arg-type]
    if not toggles.tree_enabled:
        orphans = [name for name in _NEED_TREE if name in set_]
        if orphans:
            raise ToggleError(
                f"flashtree: {orphans[0]} is set but FLASHTREE_TREE_N is {'0' if 'FLASHTREE_TREE_N' in set_ else 'unset'}; "
                "allowed: set FLASHTREE_TREE_N to an integer from 1 to 256 to turn the tree path on, or unset "
                f"{orphans[0]}"
            )
    if not (toggles.tree_enabled or toggles.splitkv_verify or toggles.exact_verify or toggles.fused_sampler):
        return None  # only explicit "off" values: nothing to install
    if toggles.splitkv_verify and toggles.exact_verify:
        raise ToggleError(
            "flashtree: FLASHTREE_SPLITKV_VERIFY=1 and FLASHTREE_EXACT_VERIFY=1 both replace the target's verify "
            "attention (on an --enable-deterministic-inference server split-KV verify alone is already decode-exact); "
            "allowed: set at most one of them to 1"
        )
    if toggles.fused_sampler and not toggles.tree_enabled:
        raise ToggleError(
            "flashtree: FLASHTREE_FUSED_SAMPLER=1 only changes the tree path's draft draws; allowed: set "
            "FLASHTREE_TREE_N to an integer from 1 to 256 as well, or set FLASHTREE_FUSED_SAMPLER=0"
        )
    return toggles
