"""FLASHTREE_TREE_N=auto on the server: `flashtree.planner` (the planner the engine and the replay run) fed by the
server, choosing per decode batch between trees and DSPARK's own chain step.

- Worker start (`resolve_toggles`, `from_plan`): the tree depth is the draft checkpoint's block size (capped at
  DSPARK's gamma; FLASHTREE_TREE_DEPTH overrides it); on sglang 0.5.17 the tree steps' draft forward runs that many
  rows (as FLASHTREE_DRAFT_ROWS=depth; set it to choose another). The menu: DSPARK's chain over its window W
  (--speculative-num-draft-tokens) and trees of N in {1, 4, 8, 16, 32, 64} (N <= width) at widths {depth + 1, 16,
  32, 64} up to that window, and the window itself (FLASHTREE_TREE_WIDTH lowers the largest), each N only at the
  widths its N x depth + 1 nodes can fill (`default_shapes`; N = 1, the draft's greedy block, is DSPARK's chain
  verified at depth + 1 tokens, cheaper than DSPARK's own step over a wider window). A tree step draws
  the menu's largest N up to `draw_cap` candidates per batch (`TreePlan.draws_for`; PLANNED_DRAW_LOGITS over the
  vocabulary, but at least DRAW_FLOOR per request) and a batch is offered only the shapes of that many; a narrower
  shape's tree is built from the first N of them, so one step can credit every shape of no more candidates
  (`flashtree.planner.acceptance`). With FLASHTREE_TREE_POLICY=best-first (DFLASH only: its greedy block, which
  credits the chain, is each position's top 1, read with the top k the tree grows from) the trees are widths only
  (`best-first,W=16`; `default_shapes`): every step grows the widest and verifies its first W - 1 nodes, the
  best-first tree of W, so one step credits every width.
- init_cuda_graphs (startup.py), after the verify graphs at every menu width (verify_widths.py) and the kernels'
  warm-up: `measure` fills the cost table, each shape's step time at each captured batch size, and logs it once.
  On a GPU `StepProbe` times the parts of a step that differ between shapes, back to back, with CUDA events: the
  draft graph (the tree steps' or DSPARK's), the tree kernels at (bs, N, W) and the target verify graph at W;
  the parts every step shares (sglang's scheduling, the window, the draft-context injection) are left out.
- Per decode batch `choose(bs)`: host numbers only (the batch size, the table, the estimates). Every `time_every`-th
  decision also times its whole step (CUDA events, read when done); after `retime_after` timed steps of a shape at
  a table size their mean replaces the start-up entry, and every other shape's entry there moves by the served
  shapes' mean excess (`CostTable.serve`): what the probe leaves out (host work, long contexts) reaches the whole
  table, so serving a shape never makes the ones not yet served look cheaper (else the planner walks the menu,
  serving each shape until its own steps are timed).
- Every `credit_every["tree"]`-th tree step the credits of every shape (each shape's committed tokens on the step's
  candidates; under simulated acceptance the step's own drawn lengths and, for every other shape, lengths drawn from
  its own table row) and every `credit_every["chain"]`-th chain step its committed lengths (simulated: with every
  tree's drawn ones) are copied to the host without a wait; a later decision applies them once the copy is done (an
  event query, never a synchronisation).
- Every `log_every` decisions a summary: steps per batch size and shape, and the current estimates.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import replace
from typing import Callable

import torch

from flashtree.planner import AcceptanceModel, CostTable, Planner, Shape, counterfactual_commits, default_shapes
from flashtree.planner.acceptance import prior_tau
from flashtree.tree.policies.best_first import first_nodes
from flashtree.tree.types import VoteTree

from . import policy_draws
from .host_copy import HostCopy
from .toggles import ToggleError, TreeToggles

logger = logging.getLogger("flashtree.patches")

# Tree / chain steps per credited step: a tree step's credit is about 90 torch ops whatever the menu
# (`counterfactual_commits`), a chain step's a few.
CREDIT_EVERY = {"tree": 64, "chain": 8}
# Decisions per exploring step: the menu's widest tree the batch draws, credited. A step's commit says what a tree
# it does not contain would have committed only up to that commit's end (a lower bound), so credits from narrower
# trees alone would pin the wider shapes' estimates below their rate and the planner would stay narrow (live run 40,
# SmolLM2 DFLASH at 32 requests); the widest tree's commit is exact for every best-first width (and the chain).
EXPLORE_EVERY = 32
TIME_EVERY = 8  # decisions per timed step (never a credited one: its credit would be in its time)
RETIME_AFTER = 4  # timed steps of a (shape, batch size) whose mean replaces the start-up estimate
LOG_EVERY = 500  # decisions per summary line
REPEATS = 5  # timed runs per (shape, batch size) at start, after an untimed one; the fastest counts
# A planned tree step draws one N for every shape of the menu, and a draw costs in proportion to the vocabulary (each
# candidate row samples all of it at every depth): at Qwen3-8B shapes (151936 tokens) the start-up table priced a
# 64-request N = 8, W = 8 step drawing 64 per request at 54.1 ms (live 8B run 9) and, capped to 2, the N = 1 step at
# 19.8 (run 10; the uncapped N = 1 step 54.3). So a batch draws at most PLANNED_DRAW_LOGITS / vocabulary candidates
# (512 at SmolLM2's 49152, 165 at Qwen3's: 64 per request up to 2 requests, 16 at 8, 4 at 32), and is offered only the
# shapes whose N it draws (`TreePlan.draws_for`).
PLANNED_DRAW_LOGITS = 512 * 49152
# ... but never fewer than 8 per request: N = 8 in the draft's window is the best fixed tree at 32 and 64 requests at
# Qwen3-8B shapes (1.43x / 1.45x the chain, run 9), which a cap of 165 (4 and 2 per request there) took off the menu.
DRAW_FLOOR = 8


def draw_cap(worker) -> int:
    """Candidates a planned step draws per batch at most (PLANNED_DRAW_LOGITS over the target's vocabulary); 0, no
    cap, where the worker's model config has no vocabulary size."""
    vocab = getattr(getattr(getattr(worker, "model_runner", None), "model_config", None), "vocab_size", None)
    return max(1, PLANNED_DRAW_LOGITS // int(vocab)) if vocab else 0


def resolve_toggles(adapter, toggles: TreeToggles, worker, gamma: int) -> TreeToggles:
    """The toggles a planned worker runs with: depth from the draft's block size, the draft rows (0.5.17: the depth),
    N = the menu's largest (what a tree step draws, up to `draw_cap` per batch)."""
    if policy_draws.grows(toggles.tree_policy) and not adapter.independent_positions:
        raise ToggleError(
            f"flashtree: FLASHTREE_TREE_N=auto with FLASHTREE_TREE_POLICY={toggles.tree_policy} plans DFLASH servers "
            f"only: a best-first step on {adapter.algorithm} grows its tree from the Markov head and draws no greedy "
            f"block, so nothing would credit {adapter.algorithm}'s chain; allowed: FLASHTREE_TREE_POLICY=vote (or "
            f"unset) with auto, an integer FLASHTREE_TREE_N with {toggles.tree_policy}, or a DFLASH server"
        )
    block = adapter.draft_block_size(worker)
    depth = toggles.tree_depth or min(block or gamma, gamma)
    rows = toggles.draft_rows
    if not rows and adapter.draft_rows_release and depth < gamma:
        adapter.check_draft_rows(depth)
        rows = depth
    # best-first draws none: this N then only keeps sampled batches off DSPARK's chain (decode.skip_reason's N = 1)
    n = max(s.n for s in _trees(toggles.tree_width or gamma + 1, depth, 0))
    logger.info("flashtree: FLASHTREE_TREE_N=auto: tree depth %d (%s), draft rows %d of gamma %d, %s per tree step",
                depth, "FLASHTREE_TREE_DEPTH" if toggles.tree_depth else
                f"the draft proposes {block} tokens a block" if block else "no block size in the draft config: gamma",
                rows or gamma, gamma, "no draws (best-first)" if policy_draws.grows(toggles.tree_policy) else
                f"{n} draws")
    return replace(toggles, tree_n=n, tree_depth=depth, draft_rows=rows)


def _trees(max_width: int, depth: int, rows: int, policy: str = "vote") -> list[Shape]:
    return [replace(s, rows=rows) for s in default_shapes(max_width, depth, policy=policy) if not s.is_chain]


def menu(plan) -> list[Shape]:
    """DSPARK's chain over its window, then the trees (module docstring)."""
    rows = plan.forward_rows if plan.forward_rows < plan.gamma else 0
    return [Shape(0, plan.width)] + _trees(plan.tree_width, plan.depth, rows, plan.policy)


def from_plan(plan, simulate, device, seed: int = 0) -> "ServerPlanner":
    """The worker's planner; with FLASHTREE_SIMULATE_ACC its prior is the table's τ per shape (what the steps will
    draw: a best-first tree's from the table's tree row of its width), else flashtree.planner's PRIOR_TAU. Under
    simulated acceptance a credited step credits every other shape with lengths drawn for it (its own generator,
    seeded from `seed`, so the steps' own draws are those of a fixed server)."""
    table = getattr(simulate, "table", None)
    prior = prior_tau
    if table is not None:
        def prior(shape: Shape) -> float:
            if shape.is_chain:
                return table.tau(1, table.chain_width(shape.width))
            return table.tau(shape.n, shape.width, shape.grown)
    drawn = None
    if simulate is not None:
        generator = torch.Generator(device=device)
        generator.manual_seed(seed + 1)

        def drawn(shape: Shape, bs: int) -> torch.Tensor:
            return simulate.commits(shape, bs, generator, plan.depth)
    planner = ServerPlanner(menu(plan), prior=prior, simulated=drawn, policy=plan.policy,
                            cuda=torch.device(device).type == "cuda", max_n=plan.draws_for)
    logger.info("flashtree: FLASHTREE_TREE_N=auto: menu %s; prior tokens per step %s", planner.labels(),
                {s.label(): round(prior(s), 3) for s in planner.shapes})
    return planner


_UNTIMED = contextlib.nullcontext()  # reusable: an untimed step makes no object


class _Credits(HostCopy):
    """(shapes, credits (S, bs)) copied to host memory without a wait (applied once `ready()`)."""

    def __init__(self, shapes: list[Shape], credits: torch.Tensor):
        super().__init__(credits)
        self.shapes = shapes


class _StepTime:
    """One step's time: CUDA events around it (read once `ready()`, never waited for), or the wall clock; as a context,
    stopped and queued into `done` when the step returns."""

    def __init__(self, key: tuple[Shape, int], cuda: bool, done: list | None = None):
        self.key, self.cuda, self.done = key, cuda, done
        if cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.start, self.end = time.perf_counter(), None

    def stop(self) -> None:
        if self.cuda:
            self.end.record()
        else:
            self.end = time.perf_counter() - self.start

    def ready(self) -> bool:
        return not self.cuda or self.end.query()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.stop()
            self.done.append(self)

    def seconds(self) -> float:
        return self.start.elapsed_time(self.end) / 1e3 if self.cuda else self.end


class ServerPlanner:
    """flashtree.planner's Planner with the server's feeds: the cost table filled at start, credits from the steps."""

    def __init__(self, shapes: list[Shape], *, prior: Callable[[Shape], float] = prior_tau,
                 simulated: Callable[[Shape, int], torch.Tensor] | None = None,
                 policy: str = "vote", credit_every: dict | None = None, time_every: int = TIME_EVERY,
                 log_every: int = LOG_EVERY, retime_after: int = RETIME_AFTER, cuda: bool = False,
                 max_n: Callable[[int], int] | None = None, explore_every: int | None = None):
        self.planner = Planner(CostTable(), AcceptanceModel(shapes, prior=prior), max_n=max_n)
        self.simulated, self.policy, self.log_every = simulated, policy, log_every
        self.credit_every, self.time_every = dict(credit_every or CREDIT_EVERY), time_every
        self._credit_now = False  # whether the step in `timing` is a credited one
        self._exploring = False  # whether the step just chosen is an exploring one (the widest tree, credited)
        # simulated (acceptance drawn, not verified): (shape, bs) -> a step's committed lengths drawn for that shape
        self.explore_every = 0 if simulated else EXPLORE_EVERY if explore_every is None else explore_every
        self.explored = 0
        self.decisions = 0
        self.credited = 0  # steps whose credits were applied
        self._steps = {"tree": 0, "chain": 0}
        self._pending: list[_Credits] = []
        self._best: dict[int, tuple] = {}  # bs -> (the choice under the current estimates, its `chosen` key)
        self.retime_after, self.cuda = retime_after, cuda
        self._times: list[_StepTime] = []  # timed steps not yet read
        self._timed: dict[tuple[Shape, int], list] = {}  # (shape, size) -> [seconds, steps] of the timed steps

    @property
    def shapes(self) -> list[Shape]:
        return self.planner.acceptance.shapes

    @property
    def trees(self) -> list[Shape]:
        return [s for s in self.shapes if not s.is_chain]

    @property
    def chain(self) -> Shape:
        return next(s for s in self.shapes if s.is_chain)

    def labels(self) -> list[str]:
        return [s.label() for s in self.shapes]

    def widths(self) -> list[int]:
        return sorted({s.width for s in self.trees})

    # ---- the choice ------------------------------------------------------------------------------------------
    def choose(self, bs: int) -> Shape:
        """The shape for a batch of bs requests: recomputed only after new credits (the step stays cheap on the host)."""
        self._apply_ready()
        self.decisions += 1
        if self.log_every and self.decisions % self.log_every == 0:
            self.log_summary()
        self._exploring = bool(self.explore_every) and self.decisions % self.explore_every == 0
        if self._exploring:
            widest = self._widest_tree(bs)
            if widest is not None:
                self.explored += 1
                return widest
            self._exploring = False
        best = self._best.get(bs)
        if best is None:
            shape = self.planner.choose(bs).shape
            best = self._best[bs] = shape, (bs, shape.label())
        else:
            self.planner.chosen[best[1]] += 1
        return best[0]

    def _widest_tree(self, bs: int) -> Shape | None:
        """The menu's widest tree (then the most candidates) a batch of bs draws and the table prices."""
        trees = [s for s in self.trees if self.planner.drawable(s, bs) and self.planner.costs.size_for(s, bs)]
        return max(trees, key=lambda s: (s.width, s.n), default=None)

    def timing(self, shape: Shape, bs: int):
        """Around a planned step: whether it is credited (`after_tree_step` / `after_chain_step`), and, every
        `time_every`-th decision unless credited, its time (the whole decode step: what the start-up table leaves out
        is in it); once `retime_after` steps of a (shape, table size) are timed, their mean replaces the table's
        entry and shifts the others at that size (CostTable.serve; 0: never)."""
        if self._exploring:
            self._credit_now = True
            return _UNTIMED
        kind = "chain" if shape.is_chain else "tree"
        self._steps[kind] += 1
        self._credit_now = self._steps[kind] % self.credit_every[kind] == 0
        size = self.planner.costs.size_for(shape, bs)
        if self._credit_now or not self.retime_after or self.decisions % self.time_every or size is None:
            return _UNTIMED
        return _StepTime((shape, size), self.cuda, self._times)

    # ---- the feeds -------------------------------------------------------------------------------------------
    def after_tree_step(self, shape: Shape, candidates: torch.Tensor, tokens: torch.Tensor,
                        commit_len: torch.Tensor, grown: VoteTree | None = None) -> None:
        """A tree step of `shape` over `candidates` (bs, N_drawn, K) committed `tokens` (bs, K + 1; -1 past each
        row's end), `commit_len` (bs,) of them; `grown`: a best-first step's widest tree (candidate 0: the greedy
        block)."""
        if not self._credit_now:
            return
        if self.simulated:
            self._defer(self._drawn(shape, commit_len))
            return
        if grown is not None:  # the best-first widths the verified tree holds: exact credits (EXPLORE_EVERY)
            if shape.width - 1 < grown.tokens.shape[1]:
                grown = first_nodes(grown, shape.width)
            shapes = [s for s in self.shapes if s.is_chain or s.width <= grown.tokens.shape[1] + 1]
        else:  # the shapes of no more candidates than this step drew
            shapes = [s for s in self.shapes if s.is_chain or s.n <= candidates.shape[1]]
        self._defer(counterfactual_commits(candidates, tokens, shapes, self.policy, grown))

    def after_chain_step(self, commit_lens: torch.Tensor) -> None:
        """DSPARK's chain step committed `commit_lens` (bs,) tokens per request (its accept_lens)."""
        if self._credit_now:
            self._defer(self._drawn(self.chain, commit_lens) if self.simulated else {self.chain: commit_lens})

    def _drawn(self, ran: Shape, commits: torch.Tensor) -> dict[Shape, torch.Tensor]:
        """A simulated step's credits: its own drawn lengths, and lengths drawn for every other shape. A drawn length
        says nothing of another shape, so the table speaks for it, as a verified step's candidates do (crediting only
        the shape that ran left a shape behind after a few unlucky draws: live run 49's N = 8 in W = 8 at 2.56
        against its table's 2.79)."""
        return {s: commits if s == ran else self.simulated(s, commits.numel()) for s in self.shapes}

    def _defer(self, credits: dict[Shape, torch.Tensor]) -> None:
        shapes = list(credits)
        self._pending.append(_Credits(shapes, torch.stack([credits[s].to(torch.long) for s in shapes])))

    def _apply_ready(self) -> None:
        while self._pending and self._pending[0].ready():
            done = self._pending.pop(0)
            self.planner.acceptance.update(dict(zip(done.shapes, done.host)))
            self.credited += 1
            self._best.clear()
        while self._times and self._times[0].ready():
            done = self._times.pop(0)
            acc = self._timed.setdefault(done.key, [0.0, 0])
            acc[0] += done.seconds()
            acc[1] += 1
            if acc[1] >= self.retime_after:
                self.planner.costs.serve(*done.key, acc[0] / acc[1])
                self._best.clear()

    # ---- the cost table --------------------------------------------------------------------------------------
    def measure(self, sizes, time_step: Callable[[Shape, int], float | None]) -> CostTable:
        """Fill the cost table: `time_step(shape, bs)` seconds (None: that shape cannot be timed at bs) for every
        shape at every size; logged once."""
        costs = self.planner.costs
        for bs in sorted({int(b) for b in sizes}):
            for shape in self.shapes:
                if not self.planner.drawable(shape, bs):
                    continue  # a batch of bs never draws its N
                seconds = time_step(shape, bs)
                if seconds is not None:
                    costs.add(shape, bs, seconds)
        self._best.clear()
        if not costs.seconds:
            raise ToggleError(
                "flashtree: FLASHTREE_TREE_N=auto could not time any step shape at server start (it replays the "
                "captured draft and verify CUDA graphs: none were captured, e.g. --disable-cuda-graph); allowed: an "
                "integer FLASHTREE_TREE_N from 1 to 256, or a server with CUDA graphs"
            )
        by_bs: dict[int, list[str]] = {}
        for row in costs.rows():
            by_bs.setdefault(row["bs"], []).append(f"{row['shape']} {row['ms']:.3f}")
        logger.info("flashtree: FLASHTREE_TREE_N=auto cost table (ms per step at each captured batch size): %s",
                    "; ".join(f"bs {bs}: {', '.join(r)}" for bs, r in sorted(by_bs.items())))
        return costs

    def log_summary(self) -> None:
        chosen = ", ".join(f"bs {r['bs']} {r['shape']} x{r['steps']}" for r in self.planner.summary())
        taus = ", ".join(f"{s.label()} {self.planner.acceptance.tau(s):.2f}" for s in self.shapes)
        timed = ", ".join(f"{s.label()} at bs {size} {acc[0] / acc[1] * 1e3:.3f}"
                          for (s, size), acc in sorted(self._timed.items()) if acc[1] >= self.retime_after)
        logger.info("flashtree planner: %d decode batches (%d credited steps, %d exploring); chosen: %s; tokens per "
                    "step now: %s; ms per step as served: %s", self.decisions, self.credited, self.explored, chosen,
                    taus, timed or "none yet")


# ---- timing at server start --------------------------------------------------------------------------------------
class StepProbe:
    """`time_step(shape, bs)` on a server with CUDA graphs: the shape's draft graph replay (the tree steps' draft rows,
    or DSPARK's own for the chain), for trees the tree kernels at (bs, N, W) on dummy inputs (warmup.dummy_step), and
    the target's verify graph replay at the shape's verify width, run back to back; the fastest of `repeats` after an
    untimed run, CUDA events (wall clock on CPU). Graphs replay with the inputs they were captured with, at server
    start, before any request: their KV writes land in the slots capture staged."""

    def __init__(self, run, worker, repeats: int = REPEATS):
        from .warmup import dummy_step

        self.run, self.repeats, self.dummy_step = run, repeats, dummy_step
        adapter, plan = run.plan.adapter, run.plan
        target = getattr(worker.model_runner, "decode_cuda_graph_runner", None)
        self.verify = {plan.width: adapter.graph_replays(target)}
        self.verify.update({w: adapter.graph_replays(r) for w, r in run.verify_runners.items()})
        dmr = getattr(worker, "draft_model_runner", None)
        self.dspark_draft = adapter.graph_replays(getattr(dmr, "decode_cuda_graph_runner", None))
        rows = run.draft_rows
        self.tree_draft = self.dspark_draft if rows is None else adapter.graph_replays(rows.runner)
        self.device = torch.device(getattr(worker, "device", "cpu"))
        self.table = adapter.req_to_token(worker) if plan.page_size == 1 else None

    def parts(self, shape: Shape, bs: int) -> list[Callable[[], object]] | None:
        """What a step of `shape` over bs requests runs that its timing covers (None: a graph it needs is missing)."""
        plan = self.run.plan
        if shape.is_chain:
            parts = [self.dspark_draft.get(bs), self.verify[plan.width].get(bs)]
        else:
            tree_w, w = plan.fit_width(shape.width, self.run.verify_runners)
            step = (lambda: self.dummy_step(plan, self.device, self.table, bs, shape.n, tree_w, w,
                                                grown=self.run.grown))
            parts = [self.tree_draft.get(bs), step, self.verify.get(w, {}).get(bs)]
        return None if any(p is None for p in parts) else parts

    def __call__(self, shape: Shape, bs: int) -> float | None:
        parts = self.parts(shape, bs)
        if parts is None:
            return None
        best = float("inf")
        for timed in [False] + [True] * self.repeats:
            seconds = _elapsed(parts, self.device)
            if timed:
                best = min(best, seconds)
        return best


def _elapsed(parts, device: torch.device) -> float:
    if device.type != "cuda":
        t0 = time.perf_counter()
        for part in parts:
            part()
        return time.perf_counter() - t0
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for part in parts:
        part()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def measure(run, worker, time_step: Callable[[Shape, int], float | None] | None = None, sizes=None) -> CostTable:
    """The cost table at server start: every menu shape at every captured batch size (the target's verify graphs')."""
    if sizes is None:
        runner = getattr(worker.model_runner, "decode_cuda_graph_runner", None)
        sizes = getattr(runner, "capture_bs", None) or ()
    return run.planner.measure(sizes, time_step or StepProbe(run, worker))
