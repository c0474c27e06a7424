"""A worker's tree state, split as flashinfer splits plan from run: `TreePlan`, fixed at DSparkWorkerV2 construction
(sizes, policy, sampler, draft rows; pure functions of the batch size), and `TreeRun`, what the steps change or
fill in later (counters, caches, captured graphs, the graph draws, the timer, the generator and noise state)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

from flashtree.tree.workspace import Workspace

from .grammar_masks import MaskBuffer
from .node_logits import CommittedCounts
from .toggles import TreeToggles
from .tp_sync import TpSync


@dataclass(frozen=True)
class TreePlan:
    adapter: object  # the release adapter
    toggles: TreeToggles
    gamma: int  # draft tokens per DSPARK block
    depth: int  # K: draft tokens each candidate keeps (<= gamma), the tree's max depth
    width: int  # W: verify tokens per request (root included) = DSPARK's window gamma + 1
    page_size: int  # 1: commit by permuting req_to_token; > 1: commit by copying the accepted KV
    tree_width: int  # the tree's own width (<= width); narrower trees are padded to `width`
    policy: str  # the tree policy (flashtree.tree.build_tree), FLASHTREE_TREE_POLICY
    sampler: Callable  # the eager draws' row sampler (logits, temperatures, generator) -> tokens
    forward_rows: int  # rows of DSPARK's window the tree step's draft forward runs (gamma: DSPARK's own proposer)
    draw_cap: int = 0  # FLASHTREE_TREE_N=auto: candidates drawn per batch at most (planning.draw_cap; 0: none)
    draw_floor: int = 0  # ... but at least this many per request (planning.DRAW_FLOOR), whatever the cap
    # whether this server's decode without speculation counts penalties one token late, from the prompt's last token
    # (sglang's overlap scheduler: node_logits.lagged_counts); False: each position counts the tokens before it
    penalty_lag: bool = False

    def width_for(self, bs: int) -> int:
        w = self.tree_width
        if self.toggles.tree_budget > 0:
            w = max(2, min(w, self.toggles.tree_budget // max(bs, 1)))
        return w

    def draws_for(self, bs: int) -> int:
        """Candidates drawn per request in a batch of bs: N, scaled with the tree under a budget (N * w / W, at least
        1), so draws at large batches cost in proportion to the verify tokens they feed; under the planner at most
        `draw_cap` per batch, or `draw_floor` per request where that is more."""
        n = self.toggles.tree_n
        if self.toggles.tree_budget > 0:
            n = max(1, -(-n * self.width_for(bs) // self.tree_width))
        if self.draw_cap > 0:  # the power of two at most cap / bs: the planner's menu N are powers of two
            n = min(n, max(self.draw_floor, 1 << max(0, (self.draw_cap // max(bs, 1)).bit_length() - 1)))
        return n

    def widths_for(self, bs: int, verify_widths: Iterable[int] = ()) -> tuple[int, int]:
        """(tree width, verify width) of a batch of bs requests. With a verify graph at a width >= the tree's (budget or
        fixed width; `verify_widths`: those captured), the tree fills that width and verify runs there; otherwise the
        tree is padded to DSPARK's window."""
        return self.fit_width(self.width_for(bs), verify_widths)

    def fit_width(self, w: int, verify_widths: Iterable[int] = ()) -> tuple[int, int]:
        """(tree width, verify width) of a tree of w tokens (widths_for's rule)."""
        fits = [v for v in verify_widths if v >= w]
        if fits:
            return min(fits), min(fits)
        return w, self.width


@dataclass
class TreeRun:
    """What a worker's tree steps change: `plan` is fixed, every other field is run state."""

    plan: TreePlan
    generator: torch.Generator  # the eager draws' and the sampled walk's (FLASHTREE_SEED)
    noise: torch.Tensor | None = None  # FLASHTREE_FUSED_SAMPLER: the fused Markov draws' (seed, calls) state
    timer: object | None = None  # FLASHTREE_STAGE_TIMES: a StageTimer
    host_profile: object | None = None  # FLASHTREE_PROFILE_HOST: a HostProfile
    steps: int = 0
    fallbacks: dict = field(default_factory=dict)
    # FLASHTREE_GRAPH_DRAWS: the draws DSPARK's draft graph tail fills (graph_draws.py), or why there are none.
    graph_draws: object | None = None
    graph_draws_off: str | None = "FLASHTREE_GRAPH_DRAWS=0"
    draw_paths: dict = field(default_factory=dict)  # steps whose N draws came from the graph tail / ran eagerly
    eager_draws_logged: set = field(default_factory=set)  # why graph-draw steps drew eagerly, as logged (note_eager)
    chain_trees: dict = field(default_factory=dict)  # bs -> (chain VoteTree, zero anchors) for stage_chain_mask
    # Trees narrower than the window (budget, fixed width): width -> target verify graph runner (verify_widths.py).
    verify_runners: dict = field(default_factory=dict)
    draft_rows: object | None = None  # FLASHTREE_DRAFT_ROWS below gamma: the D-row forward (draft_rows.DraftRows)
    simulate: object | None = None  # simulated acceptance's length source (simulate.py), None on a verified server
    tp: TpSync = field(default_factory=lambda: TpSync(None))  # rank 0's draws for every TP rank (TP 1: nothing)
    planner: object | None = None  # FLASHTREE_TREE_N=auto: the per-batch choice (planning.ServerPlanner)
    grown: tuple | None = None  # FLASHTREE_TREE_POLICY=best-first: the vanilla head's (w1, w2), () for a headless draft
    counts: CommittedCounts = field(default_factory=CommittedCounts)  # penalties' committed tokens (node_logits.py)
    grammar_rows: MaskBuffer = field(default_factory=MaskBuffer)  # grammar requests' node masks (grammar_masks.py)
    grammar_flag: object | None = None  # FLASHTREE_GRAMMAR_OVERLAP: the flag deferred walks release (host_flag.HostFlag)
    grammar_shapes: set = field(default_factory=set)  # (logits rows, constrained) stepped once without the flag
    workspace: Workspace = field(default_factory=Workspace)  # the verify-input and walk kernels' step-local outputs

    def widths_for(self, bs: int) -> tuple[int, int]:
        return self.plan.widths_for(bs, self.verify_runners)
