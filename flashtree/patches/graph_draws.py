"""The tree step's N draft draws folded into DSPARK's (or DFLASH's) captured draft CUDA graph (FLASHTREE_GRAPH_DRAWS=1).

DSPARK (sglang 0.5.17 / 0.5.20 / 0.5.23) folds its own block proposal into the draft model's CUDA graph: at
`DSparkWorkerV2.init_cuda_graphs` it builds a `DsparkDraftSampler` (`_maybe_build_draft_sampler`), appends
`make_draft_sampler_capture_hook(sampler)` to the draft runner's `capture_tail_hooks` and attaches the sampler to the
proposer. sglang's decode graph runner calls every tail hook at the end of each warm-up and captured forward, so
`sampler(hidden_states, input_ids)` runs inside the graph; an eager forward (a batch above the captured sizes, or a
server without CUDA graphs) never runs it, and `_run_forward(..., draft_sampler=...)` only stages the sampler's
sampling parameters before a replay and reports `can_run_graph`.

flashtree wraps the worker's `_maybe_build_draft_sampler` (at `DSparkWorkerV2.__init__`, before the scheduler calls
`init_cuda_graphs`) so that the sampler DSPARK builds is re-classed into a subclass of its own class whose `__call__`:
  1. runs DSPARK's `__call__` unchanged (its `out`, folded-sampling buffers, step logits, confidence: DSPARK's own
     decode, which still serves idle / DP / N = 1 sampled batches, reads them), with the model's
     `compute_base_logits` tapped so its base logits are reused instead of recomputed;
  2. draws the tree step's N candidate blocks per request through the Markov head, on bs*N request-major rows:
     candidate 0 the greedy block, candidates 1..N-1 Gumbel-max draws at FLASHTREE_DRAFT_TEMPERATURE, with noise from
     torch's default generator filled in-graph (`exponential_()` on a persistent buffer, as DSPARK's folded sampler
     does; each replay redraws) -> the persistent `(max_bs, N, K)` int64 buffer `GraphDraws.out`. With
     FLASHTREE_FUSED_SAMPLER=1 and a vanilla Markov head (bias = w2 @ w1[prev]) the draws are
     `flashtree.sampler.markov_draws` instead: K Triton launches with in-kernel Philox noise whose (seed, calls)
     state each replay advances, in place of about ten torch ops per step.
With FLASHTREE_TREE_POLICY=prob the tail also keeps each drawn token's log q (`GraphDraws.logp`); with best-first it
draws nothing and grows the policy's tree from the vanilla head instead (`GraphDraws.tree`; policy_draws.py).
The tree step's draft forward passes that sampler to `_run_forward`; when the graph ran it reads the candidates from
the buffer and computes no base logits; otherwise (eager forward) it keeps the eager path (base logits + N draws
through flashtree's row sampler with FLASHTREE_SEED's generator).

Lean tails (N > 1): the graphs of at most `lean_bs` requests are replayed by tree steps only (every graph without
FLASHTREE_TREE_MAX_BS, those of at most L requests with L: chain steps are batches above L, which replay larger
graphs), so their tail leaves out step 1, DSPARK's own block proposal (gamma Markov steps, e.g. 31 with a 32-token
window: seen live as 155 kernel launches and 338 µs per step), and computes base logits for the K kept
positions only. Steps of at most `lean_bs` requests that still reach DSPARK's own decode (`decode.make_forward_decode`'s
fallbacks other than the batch-size one) run with the sampler detached, so DSPARK proposes its block eagerly from the
replayed graph's hidden states (its path without a folded sampler) and never reads the buffers a lean tail left
stale. With N = 1 no tail is lean: sampled batches take DSPARK's chain there.

FLASHTREE_TREE_MAX_BS=L (> 0): batches of more than L requests run DSPARK's own chain step, which reads none of the
draws, so the buffers hold `rows` = min(max graph bs, B) requests, B the configured graph size a batch of L requests
is padded to (L itself when the configured sizes are unknown), and a tail that runs for more than `rows` requests
skips the draws (those graphs are captured with DSPARK's tail only). A tree step reads the buffer only when the graph
its batch replays (the smallest captured size >= bs, as recorded by the tail runs) drew; otherwise it draws eagerly.

DFLASH (sglang 0.5.17 / 0.5.20 / 0.5.23) folds its greedy head into its draft graph the same way: at
`DFlashWorkerV2.init_cuda_graphs`, `_maybe_build_draft_sampler` builds a `_DflashDraftSampler` (the block's logits
through the target's LM head, their argmax into `out`, which DFLASH's own decode reads after a replay) and appends it
as the tail hook. flashtree wraps that builder too and re-classes the sampler with `MarginalSamplerMixin`: the block's
logits once, DFLASH's `out` from them, then the N draws per position by the eager draws' own code
(`block_draws.draw_candidates`: candidate 0 the argmax, the row sampler or FLASHTREE_FUSED_SAMPLER's `candidate_draws`) on
torch's default generator, which CUDA graphs replay with fresh noise; `prob` also keeps the tokens' log q under their
marginals, `best-first` grows its tree from each position's top W - 1 instead. Lean tails compute the K kept
positions' logits only and leave `out` stale; DFLASH's own steps over those sizes run with the sampler detached, so
DFLASH takes its greedy block eagerly from the replayed graph's hidden states.

Memory (the fused draws need none of this): the noise buffer `(max_bs * N, V)` float32 is persistent; the draws' intermediates live in the graph's memory
pool (the release's Markov draw: 0.5.17 / 0.5.20 repeat the block's base logits to `(bs * N, K, V)`, 0.5.17 also
keeps the corrected logits; 0.5.23 steps on `(bs * N, V)` rows). If the estimate does not fit the free GPU memory
(with DSPARK's 1 GB capture headroom) the worker keeps DSPARK's own sampler and the eager draws, and logs why.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Callable

import torch

from flashtree.sampler import candidate_rows, gumbel_pick
from flashtree.sampler.markov import markov_draws, new_state
from flashtree.tree.types import VoteTree

from . import policy_draws

logger = logging.getLogger("flashtree.patches")

# The free-memory floor DSPARK's init_cuda_graphs / folded sampling keep before capture.
CAPTURE_HEADROOM_BYTES = 1 << 30


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class _TapModel:
    """Stands in for the draft model inside DSPARK's `__call__`: records the base logits it computes."""

    def __init__(self, model):
        self._model = model
        self.base_logits = None

    def compute_base_logits(self, hidden):
        out = self._model.compute_base_logits(hidden)
        if self.base_logits is None:
            self.base_logits = out[0]
        return out

    def __getattr__(self, name):
        return getattr(self._model, name)


class GraphDraws:
    """The N candidate blocks per request, drawn in DSPARK's draft graph tail into persistent buffers."""

    def __init__(self, *, adapter, n: int, depth: int, max_bs: int, vocab: int, temperature: float, device,
                 limit: int = 0, fused: tuple | None = None, seed: int = 0, n_for: Callable[[int], int] | None = None,
                 lean_bs: int = 0, dspark_tail_only: bool = False, policy: str = "vote",
                 grown: tuple | None = None, tree_width: int = 0, draw_blocks: Callable | None = None,
                 simulated: bool = False):
        # depth: the block positions each candidate keeps (FLASHTREE_TREE_DEPTH, <= DSPARK's gamma)
        # max_bs: the requests the buffers hold. limit (FLASHTREE_TREE_MAX_BS, 0 = none): with a limit, a tail run
        # for more than max_bs requests (a graph only chain steps replay) skips the draws instead of failing.
        # fused: a vanilla Markov head's (w1, w2): the draws run as flashtree's fused Markov draws (K launches,
        # in-kernel noise from a (seed, calls) state each replay advances) instead of the head's torch steps.
        # n_for: candidates drawn for a batch of bs requests (<= n; FLASHTREE_TREE_BUDGET scales them with the tree).
        # lean_bs: tails for at most this many requests run the draws only, without DSPARK's block proposal (module
        # docstring); 0: none. dspark_tail_only: DSPARK's own graphs' tails run DSPARK's part only
        # (FLASHTREE_TREE_N=auto with draft-row graphs: tree steps replay those, DSPARK's serve its chain steps alone)
        # policy (FLASHTREE_TREE_POLICY): `prob` keeps the draws' log q too; `best-first` draws nothing and grows
        # its tree of tree_width tokens from the vanilla head's `grown` = (w1, w2) instead (policy_draws.py)
        # draw_blocks: independent positions (DFLASH): (base logits (bs, K, V), anchor, n) -> (bs, n, K), the eager
        # draws' own code on torch's default generator (graph-safe: each replay redraws); no noise buffers
        # simulated (FLASHTREE_SIMULATE_ACC / SGLANG_SIMULATE_ACC_LEN): a grown tree's tail also writes the argmax
        # block as candidate 0, which a simulated step verifies in N copies instead (decode.policy_draws_of); a
        # headless draft's (DFLASH) always does, its positions' top 1 (the planner credits DFLASH's chain by it)
        self.adapter, self.n, self.k, self.max_bs = adapter, int(n), int(depth), int(max_bs)
        self.lean_bs = int(lean_bs)
        self.draw_blocks = draw_blocks
        self.simulated = bool(simulated)
        self.dspark_tail_only = bool(dspark_tail_only)
        self.n_for = n_for or (lambda bs: self.n)
        self.limit = int(limit)
        self.fused = fused
        rows = self.max_bs * self.n
        # What the tree step reads: (max_bs, N, K), request-major; the captured graphs rewrite rows [:bs] per replay.
        self.out = torch.zeros((self.max_bs, self.n, self.k), dtype=torch.int64, device=device)
        # Per-row constants: candidate 0 of each request greedy, the others at the draft temperature.
        self.inv_temperature, self.greedy = candidate_rows(self.max_bs, self.n, temperature, device)
        # The same per-row constants for every smaller candidate count a batch size draws (made here, not in capture).
        self.rows = {self.n: (self.inv_temperature, self.greedy)}
        for m in {self.n_for(bs) for bs in range(1, self.max_bs + 1)} - {self.n}:
            self.rows[m] = candidate_rows(self.max_bs, m, temperature, device)
        self.logp = (torch.zeros((self.max_bs, self.n, self.k), dtype=torch.float32, device=device)
                     if policy_draws.needs_logp(policy) else None)
        self.grown, self.tree_width = grown, int(tree_width)
        if grown is not None:  # the tree per request, as the step reads it (votes 0, first candidate 1: no draws)
            m = (self.max_bs, self.tree_width - 1)
            self.tree = VoteTree(tokens=torch.zeros(m, dtype=torch.int64, device=device),
                                 parents=torch.zeros(m, dtype=torch.int64, device=device),
                                 depth=torch.ones(m, dtype=torch.int64, device=device),
                                 votes=torch.zeros(m, dtype=torch.int64, device=device),
                                 valid=torch.zeros(m, dtype=torch.bool, device=device),
                                 first_candidate=torch.ones(m, dtype=torch.int64, device=device), k=self.k)
        elif fused is not None:
            self.noise_state = new_state(seed, device)
        elif draw_blocks is None:
            self.noise = torch.empty((rows, int(vocab)), dtype=torch.float32, device=device)
        self.calls = 0  # tail runs (warm-up, capture and eager tails; not replays)
        self.skips = 0  # tail runs above max_bs with a limit: DSPARK's tail only, no draws
        self.drawn_sizes: dict[int, int] = {}  # batch sizes the tail drew for -> the candidates it drew per request
        self.skipped_sizes: set[int] = set()  # batch sizes the tail ran for without the draws
        # what a step over bs requests reads (views of the persistent buffers), per bs: `drawn` until the sizes above
        # change, `read_tree` for good
        self._drawn: dict[int, torch.Tensor | None] = {}
        self._trees: dict[int, VoteTree] = {}

    # ---- the step sampler ---------------------------------------------------------------------------------------
    def step_sampler(self, n: int) -> Callable[[torch.Tensor], torch.Tensor]:
        inv_temperature, greedy = self.rows[n]

        def sample(step_logits: torch.Tensor) -> torch.Tensor:
            rows, vocab = step_logits.shape
            if vocab != self.noise.shape[1]:
                if _capturing():
                    raise RuntimeError(
                        f"flashtree: graph draws see {vocab}-wide step logits, their noise buffer is "
                        f"{self.noise.shape[1]} wide"
                    )
                self.noise = self.noise.new_empty((self.noise.shape[0], vocab))  # before capture (warm-up)
            return gumbel_pick(step_logits, self.noise[:rows].exponential_(), inv_temperature[:rows], greedy[:rows])

        return sample

    # ---- the tail ------------------------------------------------------------------------------------------------
    def draw(self, sampler, hidden_states: torch.Tensor, input_ids: torch.Tensor, base_logits) -> None:
        bs, model_hidden, draft_hidden, anchor = self.adapter.tail_inputs(sampler, hidden_states, input_ids)
        if bs > self.max_bs:
            if self.limit:  # only chain steps (bs > FLASHTREE_TREE_MAX_BS) replay this graph: DSPARK's tail only
                if bs not in self.skipped_sizes:
                    self.skipped_sizes.add(bs)
                    self._drawn.clear()
                self.skips += 1
                return
            raise RuntimeError(f"flashtree: the draft tail ran for {bs} requests, above its {self.max_bs}-row buffer")
        n = self.n_for(bs)
        if self.drawn_sizes.get(bs) != n:
            self.drawn_sizes[bs] = n
            self._drawn.clear()
        if base_logits is None:  # DSPARK's tail computed none (lean tail, 0.5.23's megakernel step): the K kept rows
            kept = model_hidden.view(bs, int(sampler.gamma), -1)[:, : self.k].reshape(bs * self.k, -1)
            base_logits, _ = sampler.model.compute_base_logits(kept)
        base_logits = base_logits.view(bs, -1, base_logits.shape[-1])[:, : self.k]
        draft_hidden = draft_hidden[:, : self.k]
        self.calls += 1
        if self.grown is not None:
            headless = not self.grown  # DFLASH: the greedy block comes with the top k, as candidate 0
            tree = policy_draws.grow(base_logits, anchor, *self.grown, width=self.tree_width,
                                     greedy=self.out[:bs, 0] if headless else None)
            for buf, part in ((self.tree.tokens, tree.tokens), (self.tree.parents, tree.parents),
                              (self.tree.depth, tree.depth), (self.tree.valid, tree.valid)):
                buf[:bs].copy_(part)
            if self.simulated and not headless:
                self.out[:bs, 0].copy_(base_logits.argmax(dim=-1))
            return
        logp = None
        if self.draw_blocks is not None:
            tokens = self.draw_blocks(base_logits, anchor, n)
            if self.logp is not None:
                logp = self.adapter.candidate_logp(base_logits, tokens)
        elif self.fused is not None:
            inv_temperature, greedy = self.rows[n]
            tokens = markov_draws(base_logits, anchor, *self.fused, n, inv_temperature[: bs * n], greedy[: bs * n],
                                  self.noise_state, return_logp=self.logp is not None)
            if self.logp is not None:
                tokens, logp = tokens
        else:
            step = self.step_sampler(n)
            if self.logp is not None:
                step, taken = policy_draws.recording_logp(step)
            tokens = self.adapter.markov_draws(sampler.markov_head, base_logits, anchor, draft_hidden, n, step)
            if self.logp is not None:
                logp = taken(bs, n)
        self.out[:bs, :n].copy_(tokens.view(bs, n, self.k))
        if logp is not None:
            self.logp[:bs, :n].copy_(logp)

    def covers(self, bs: int) -> bool:
        """Whether the graph a batch of `bs` requests replays drew the candidates. Without a limit every captured
        graph did. With one, the replayed graph is the smallest size >= bs the tail ran for (sglang pads a batch to
        its next captured size; every captured size ran the tail at capture): it drew iff that size <= max_bs."""
        if not self.limit:
            return True
        if bs > self.max_bs:
            return False
        sizes = [s for s in self.drawn_sizes.keys() | self.skipped_sizes if s >= bs]
        return bool(sizes) and min(sizes) in self.drawn_sizes

    def drawn_n(self, bs: int) -> int:
        """Candidates per request a batch of bs reads: what the replayed graph (the smallest drawn size >= bs) drew;
        all N when no tail has run (CPU stand-ins)."""
        sizes = [s for s in self.drawn_sizes if s >= bs]
        return self.drawn_sizes[min(sizes)] if sizes else self.n

    def drawn(self, bs: int) -> torch.Tensor | None:
        """What a tree step over bs requests reads after a graph replay: the candidates, or None where the graph its
        batch replays was captured without the draws (above FLASHTREE_TREE_MAX_BS)."""
        if bs not in self._drawn:
            self._drawn[bs] = self.read(bs) if self.covers(bs) else None
        return self._drawn[bs]

    def read_tree(self, bs: int) -> VoteTree:
        """best-first: the (bs, tree width - 1) tree the last graph replay grew, as views."""
        tree = self._trees.get(bs)
        if tree is None:
            t = self.tree
            tree = self._trees[bs] = VoteTree(tokens=t.tokens[:bs], parents=t.parents[:bs], depth=t.depth[:bs],
                                              votes=t.votes[:bs], valid=t.valid[:bs],
                                              first_candidate=t.first_candidate[:bs], k=t.k)
        return tree

    def read(self, bs: int) -> torch.Tensor:
        """The (bs, n, K) candidates the last graph replay drew, as a view: the tree step's build and verify inputs
        read them on the forward stream before the next replay can rewrite them, so no copy is needed."""
        return self.out[:bs, : self.drawn_n(bs)]


class TailSampler:
    """A worker's draft-graph tail sampler re-classed by flashtree (its `flashtree_draws` fill the tree's buffers)."""

    flashtree_draws: GraphDraws


class FlashtreeSamplerMixin(TailSampler):
    """Mixed in front of the release's DsparkDraftSampler: DSPARK's tail, then flashtree's N draws."""

    def __call__(self, hidden_states, input_ids):
        draws = self.flashtree_draws
        if draws.dspark_tail_only:
            return super().__call__(hidden_states, input_ids)
        if draws.adapter.tail_batch_size(self, hidden_states) <= draws.lean_bs:
            draws.draw(self, hidden_states, input_ids, None)
            return
        model = self.model
        tap = _TapModel(model)
        self.model = tap
        try:
            result = super().__call__(hidden_states, input_ids)
        finally:
            self.model = model
        self.flashtree_draws.draw(self, hidden_states, input_ids, tap.base_logits)
        return result


class MarginalSamplerMixin(TailSampler):
    """Mixed in front of DFLASH's `_DflashDraftSampler` (one rank): the block's logits through the target's LM head,
    computed once for DFLASH's greedy block and flashtree's N draws per position."""

    def __call__(self, hidden_states, input_ids):
        draws = self.flashtree_draws
        bs, positions, _hidden, _anchor = draws.adapter.tail_inputs(self, hidden_states, input_ids)
        lean = bs <= draws.lean_bs  # only tree steps replay this graph: the kept positions, no DFLASH block
        rows = draws.k if lean else positions.shape[1]
        hs = positions[:, :rows].reshape(bs * rows, -1)
        logits = torch.matmul(hs.to(self.weight.dtype), self.weight[: self.num_org].T)  # as DFLASH's own tail
        if not lean:
            self.out[: bs * rows].copy_(logits.argmax(dim=-1))  # DFLASH's own steps read it after a replay
        draws.draw(self, hidden_states, input_ids, logits)


_CLASSES: dict[tuple, type] = {}


def wrap(stock, draws: GraphDraws, mixin: type = FlashtreeSamplerMixin):
    """The worker's sampler `stock`, re-classed as a flashtree sampler (same state, same buffers; sglang's own
    methods): DSPARK's with FlashtreeSamplerMixin, DFLASH's with MarginalSamplerMixin."""
    base = type(stock)
    cls = _CLASSES.get((mixin, base))
    if cls is None:
        cls = _CLASSES[(mixin, base)] = type(f"Flashtree{base.__name__}", (mixin, base), {})
    obj = cls.__new__(cls)
    obj.__dict__.update(stock.__dict__)
    obj.flashtree_draws = draws
    return obj


def sampler_of(worker):
    """The worker's flashtree draft sampler (None: sglang's own sampler, or none)."""
    sampler = getattr(worker, "_draft_sampler", None)
    return sampler if isinstance(sampler, TailSampler) else None


def note_eager(run, draws: GraphDraws, bs: int) -> None:
    """A tree step with graph draws on drew its candidates eagerly: logged once per reason (run.draw_paths counts
    the steps; FLASHTREE_STAGE_TIMES lines show them)."""
    kind = "eager forward" if draws.covers(bs) else "graph without draws"
    if kind in run.eager_draws_logged:
        return
    run.eager_draws_logged.add(kind)
    if kind == "eager forward":
        reason = (f"a batch of {bs} requests ran its draft forward eagerly (no captured draft graph took it: above "
                  "--cuda-graph-max-bs, or a batch sglang's graphs do not run)")
    else:
        reason = (f"the draft graph a batch of {bs} requests replays was captured without the draws (its size is "
                  f"above the {draws.max_bs} requests FLASHTREE_TREE_MAX_BS sized the draw buffers to)")
    logger.warning("flashtree: FLASHTREE_GRAPH_DRAWS=1, but %s, so its N candidates were drawn eagerly (logged once)",
                   reason)


@contextlib.contextmanager
def dspark_proposes_eagerly(worker, bs: int):
    """Around a step of DSPARK's (or DFLASH's) own decode over bs requests: where its graph may be a lean one
    (bs <= lean_bs) the worker's sampler is detached (from the worker and DSPARK's proposer), so it samples its block
    eagerly from the replayed draft graph's hidden states instead of reading the buffers a lean tail does not fill."""
    sampler = sampler_of(worker)
    if sampler is None or bs > sampler.flashtree_draws.lean_bs:
        yield
        return
    holders = sampler.flashtree_draws.adapter.draft_sampler_holders(worker)
    for holder in holders:
        holder._draft_sampler = None
    try:
        yield
    finally:
        for holder in holders:
            holder._draft_sampler = sampler


# ---- building (init_cuda_graphs) --------------------------------------------------------------------------------
def need_bytes(adapter, *, n: int, depth: int, max_bs: int, vocab: int, logits_bytes: int, fused: bool = False,
               grown: bool = False) -> int:
    rows = max_bs * n
    persistent = max_bs * n * depth * 12 + rows * 8  # tokens and log q
    # rows of logits one draw step reads per candidate: DFLASH's independent positions are drawn all at once
    units = max_bs * depth if adapter.independent_positions else max_bs
    if grown:  # best-first: a round's (bs, V) step logits, bias, log-probabilities and top-k temporaries
        return persistent + 4 * units * vocab * 4
    if fused:  # per-tile maxima (float32 + int32) per row, tiles of >= 128 tokens; nothing rows x V
        return persistent + units * n * (vocab // 128 + 1) * 8
    if adapter.independent_positions:  # the rows repeated N times and the row sampler's float32 temporaries
        return persistent + units * n * vocab * (logits_bytes + 16)
    return persistent + rows * vocab * 4 + adapter.graph_draw_bytes(
        rows=rows, depth=depth, vocab=vocab, logits_bytes=logits_bytes)


def draw_rows(max_bs: int, limit: int, sizes) -> int:
    """Requests the draw buffers hold: all `max_bs` without a limit; with FLASHTREE_TREE_MAX_BS = limit, the graph
    size a batch of `limit` requests is padded to (the smallest configured size >= limit; `limit` when unknown),
    at most `max_bs`."""
    if not limit or limit >= max_bs:
        return max_bs
    above = [int(s) for s in sizes or () if int(s) >= limit]
    return min(min(above) if above else limit, max_bs)


def free_bytes(device) -> int | None:
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None  # unknown (CPU tests): assume it fits
    free, _total = torch.cuda.mem_get_info(device)
    return int(free)


def build(run, worker, stock, *, free: Callable = free_bytes, graph_sizes: Callable | None = None):
    """Called with the sampler DSPARK built (or None). Returns the sampler the worker keeps: flashtree's, or DSPARK's
    own (reason logged and kept in `run.graph_draws_off`). graph_sizes: the configured decode graph sizes
    (default: the adapter's)."""
    from . import flashmap_draft

    plan = run.plan
    adapter, toggles = plan.adapter, plan.toggles
    graph_sizes = graph_sizes or adapter.decode_graph_sizes

    def keep(reason):
        run.graph_draws_off = reason
        logger.warning("flashtree: FLASHTREE_GRAPH_DRAWS=1 but the N draft draws stay eager: %s", reason)
        return stock

    if stock is None:
        return keep(f"{adapter.algorithm} built no graph-folded draft sampler (no draft CUDA graph, or sglang kept "
                    "its draft head eager: its log says why)")
    if isinstance(getattr(adapter.draft_model(worker), "_draft_tree", None), flashmap_draft.NoiseDraws):
        return keep("the draft is a FlashMap draft; its noise draws give the candidates")
    refuse = adapter.graph_draws_unsupported(worker, stock)
    if refuse:
        return keep(refuse)
    graph_bs, vocab, weight = adapter.draft_tail(stock)
    limit = toggles.tree_max_bs
    max_bs = draw_rows(graph_bs, limit, graph_sizes() if limit else None)
    logits_bytes = weight.element_size() if weight.is_floating_point() else 2
    marginal = adapter.independent_positions  # DFLASH: the eager draws' own code in the tail (MarginalSamplerMixin)
    draw_blocks = fused = None
    if marginal:
        from .block_draws import draw_candidates

        def draw_blocks(base_logits, anchor, n):
            return draw_candidates(run, worker, base_logits, anchor, None, n, default_generator=True)
    elif toggles.fused_sampler:  # with a vanilla Markov head: the fused Markov draws
        fused = adapter.vanilla_markov_weights(stock.markov_head)
    fast = toggles.fused_sampler if marginal else fused is not None
    grown = run.grown  # FLASHTREE_TREE_POLICY=best-first: no draws, the tail grows the tree (policy_draws.py)
    n = 1 if grown is not None else toggles.tree_n
    need = need_bytes(adapter, n=n, depth=plan.depth, max_bs=max_bs, vocab=vocab, logits_bytes=logits_bytes,
                      fused=fast, grown=grown is not None)
    have = free(worker.device)
    if have is not None and have - need < CAPTURE_HEADROOM_BYTES:
        return keep(
            f"its buffers and graph intermediates need {need / 2**30:.2f} GiB for {max_bs} requests x "
            f"N={toggles.tree_n} x vocab {vocab}, but only {have / 2**30:.2f} GiB GPU memory is free (1 GiB kept for "
            "capture); lower --cuda-graph-max-bs / FLASHTREE_TREE_N or raise free memory (--mem-fraction-static)"
        )
    limit = limit if max_bs < graph_bs else 0
    # Lean tails where only tree steps replay: none with N = 1 (sampled batches take DSPARK's chain), every graph
    # without a limit, those of at most FLASHTREE_TREE_MAX_BS requests with one.
    # FLASHTREE_TREE_N=auto: the planner hands batches of any size to DSPARK's chain, whose replays read its tail.
    lean_bs = 0 if toggles.tree_n == 1 or run.planner is not None else min(toggles.tree_max_bs or max_bs, max_bs)
    draws = GraphDraws(
        adapter=adapter, n=n, depth=plan.depth, max_bs=max_bs, vocab=vocab,
        temperature=toggles.draft_temperature, device=stock.out.device, limit=limit, fused=fused, seed=toggles.seed,
        n_for=(lambda bs: 1) if grown is not None else plan.draws_for, lean_bs=lean_bs, policy=plan.policy,
        grown=grown, tree_width=plan.tree_width, draw_blocks=draw_blocks, simulated=run.simulate is not None,
        dspark_tail_only=run.planner is not None and plan.forward_rows < plan.gamma,
    )
    run.graph_draws = draws
    run.graph_draws_off = None
    logger.info(
        "flashtree: the N=%d draft draws run in %s's draft CUDA graph tail (%s, up to %d requests, ~%.2f GiB%s)%s",
        toggles.tree_n, adapter.algorithm, _describe(plan, marginal, fast, grown is not None), max_bs,
        need / 2**30, f"; lean up to {lean_bs} requests: without {adapter.algorithm}'s own block proposal"
        if lean_bs else "",
        f"; graphs above {max_bs} requests (FLASHTREE_TREE_MAX_BS={limit}: chain steps) are captured without them"
        if max_bs < graph_bs else "",
    )
    return wrap(stock, draws, MarginalSamplerMixin if marginal else FlashtreeSamplerMixin)


def _describe(plan, marginal: bool, fast: bool, grown: bool) -> str:
    """How the tail draws (the start log's words)."""
    if grown:
        how = "each position's top W - 1 in one launch" if marginal else f"{plan.tree_width - 1} rounds of the head"
        return f"policy {plan.policy}: the best-first tree from {how}"
    if marginal:
        return ("the block's logits once, N draws per position from one read (candidate_draws)" if fast
                else "the block's logits once, the row sampler over them repeated N times")
    return "fused Markov draws" if fast else "the Markov head's torch steps"


def install(run, worker) -> None:
    """At the worker's __init__ (DSparkWorkerV2, DFlashWorkerV2): route its `_maybe_build_draft_sampler` through
    `build`."""
    original = getattr(worker, "_maybe_build_draft_sampler", None)
    if not callable(original):
        run.graph_draws_off = f"this {run.plan.adapter.worker_name} has no _maybe_build_draft_sampler"
        logger.warning("flashtree: FLASHTREE_GRAPH_DRAWS=1 but the N draft draws stay eager: %s", run.graph_draws_off)
        return
    run.graph_draws_off = "init_cuda_graphs has not built the draft sampler yet"

    def _maybe_build_draft_sampler(*args, **kwargs):  # 0.5.20 passes available_memory_gb
        return build(run, worker, original(*args, **kwargs))

    worker._maybe_build_draft_sampler = _maybe_build_draft_sampler
