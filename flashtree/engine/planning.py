"""`tree.n=auto` offline: the planner's menu and cost table for the engine and the replay, and what a run reports.

The engine and the replay drive a `flashtree.planner.Planner`: per step `choose` picks the shape, the step runs it,
and `observe` credits every shape with what it would have committed on the same candidates. Each step therefore
draws the menu's largest N (a narrower shape builds its tree from the first N of them), so the draft costs every
shape the same and the cost table only needs what differs between shapes: the verify forward over W tokens. With
tree.policy=best-first the menu is widths only: each step grows the widest tree and verifies the chosen width's
first nodes (`step_tree`), which the credit reads for every width.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from .. import metrics
from ..planner import AcceptanceModel, CostTable, Planner, Shape, default_shapes
from ..tree.policies.best_first import first_nodes
from ..tree.types import VoteTree
from .target import keep_in_cache, prefill, verify_forward

# The replay's step time without `tree.costs`: a fixed cost plus one per verify token, fitted to SmolLM2-135M on one
# H200 at batch size 1 (BENCHMARKS.md 4.2, live run 22: DSPARK's 9-token chain step 3.15 ms, the 64-token tree's
# 3.60 ms). Small targets are launch-bound, so width is nearly free there; pass measured `tree.costs` for others.
STEP_MS = 3.08
TOKEN_MS = 0.0082


def menu(window: int, depth: int, max_n: int = 64, policy: str = "vote") -> list[Shape]:
    """The shapes a run may choose: trees of up to `window` tokens (tree.width) from up to `max_n` candidates, or
    with policy best-first its widths up to `window` (as the server's menu). The engine has no separate chain step
    (N = 1 is the chain), so the planner's DSPARK chain is left out."""
    return [s for s in default_shapes(window, depth, max_n, policy) if not s.is_chain]


def modelled_costs(shapes: list[Shape], ms: dict[int, float] | None = None) -> CostTable:
    """Step time per shape from `ms` (width -> ms per step: shapes of a width it leaves out are not chosen) or, when
    it is empty, STEP_MS + TOKEN_MS per verify token. Batch size 1: replay and engine verify one request a forward."""
    table = CostTable()
    for s in shapes:
        t = ms.get(s.width) if ms else STEP_MS + TOKEN_MS * s.width
        if t is not None:
            table.add(s, 1, t / 1e3)
    if not table.seconds:
        raise ValueError(f"tree.costs={ms}: prices none of the menu's widths {sorted({s.width for s in shapes})}")
    return table


@torch.no_grad()
def measure_costs(target, shapes: list[Shape], prompt: torch.Tensor, repeats: int = 3) -> CostTable:
    """Step time per shape on `target`: per distinct width, the fastest of `repeats` verify forwards of W tokens
    after `prompt`, in rounds over the widths after an untimed one (so first-call setup and drift hit none of them
    alone). The engine verifies one request per forward, so the table is for batch size 1; a batch of b costs every
    shape b times as much and ranks them alike."""
    device = next(target.parameters()).device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    prompt = prompt.to(device).view(1, -1)
    cache, _ = prefill(target, prompt, ())
    prefix = cache.get_seq_length()
    nothing = torch.zeros(0, dtype=torch.long, device=device)
    widths = sorted({s.width for s in shapes})
    best = dict.fromkeys(widths, float("inf"))
    for timed in [False] + [True] * repeats:
        for w in widths:
            ids = prompt[:, -1:].expand(1, w)
            pos = torch.arange(prefix, prefix + w, device=device).view(1, -1)
            mask = torch.ones(w, w, dtype=torch.bool, device=device).tril().view(1, w, w)  # its pattern costs nothing
            sync()
            t0 = time.perf_counter()
            verify_forward(target, cache, ids, pos, mask, ())
            sync()
            if timed:
                best[w] = min(best[w], time.perf_counter() - t0)
            keep_in_cache(cache, prefix, nothing)  # back to the prompt for the next forward
    table = CostTable()
    for s in shapes:
        table.add(s, 1, best[s.width])
    return table


def make_planner(shapes: list[Shape], costs: CostTable) -> Planner:
    return Planner(costs, AcceptanceModel(shapes))


def step_tree(planner: Planner, shape: Shape,
              build: Callable[[int, int], VoteTree]) -> tuple[VoteTree, VoteTree | None]:
    """The tree a planned step verifies, `build(n, width)` building the run's policy's tree from the first n
    candidates, and the tree its credit reads (`Planner.observe`'s `grown`): a best-first step grows the menu's
    widest tree and verifies its first W - 1 nodes (as the server's step), else None."""
    if not shape.grown:
        return build(shape.n, shape.width), None
    grown = build(shape.n, planner.widest_grown())
    return first_nodes(grown, shape.width), grown


def draws(planner: Planner) -> int:
    """Candidates each planned step draws: the menu's largest N, so every shape can be credited."""
    return max(s.n for s in planner.acceptance.shapes)


def report(planner: Planner, steps) -> dict:
    """What summary.json says of a planned run: steps per chosen shape (from the steps table, so a warm-up is left
    out), the cost table (ms per step) and the final estimates of committed tokens per step, per shape."""
    shapes = {(s.n, s.width): s for s in planner.acceptance.shapes}
    return {
        "plan_choices": metrics.plan_choices(steps, lambda n, w: shapes[(n, w)].label()),
        "plan_costs_ms": {r["shape"]: r["ms"] for r in planner.costs.rows()},
        "plan_tau": {s.label(): round(planner.acceptance.tau(s), 4) for s in planner.acceptance.shapes},
    }
