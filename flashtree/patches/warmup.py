"""The tree step's Triton kernels compiled at server start, for every tree shape a batch can take.

The trie-vote builder, the verify-input encoder and the fused walk are specialised on the candidate count N and the
tree and verify widths (constexprs). With FLASHTREE_TREE_BUDGET these change with the batch size, and each shape
compiled on first use, in the middle of serving: seen live as the budget server's first round at concurrency 32 at
about a quarter of the chain's tokens/s, its later rounds at 0.79-1.26x. With a budget or a fixed
FLASHTREE_TREE_WIDTH, right after the narrower verify graphs are captured (startup.py), one
request's tree step (build, encode, walk with the req_to_token rewrite) runs here on dummy inputs per shape the batch
sizes give, so serving finds them compiled. (A tree of one shape compiles on the first request, as before.) On CPU the
references run: nothing to compile.
"""

from __future__ import annotations

import torch

from flashtree.tree import build_tree, pad_tree, verify_inputs, walk_and_commit
from flashtree.tree.policies.best_first import grow_marginal

from .policy_draws import dummy_scores


def step_shape(run, bs: int, graph_bs: int) -> tuple[int, int, int]:
    """(candidates per request, tree width, verify width) of a tree step over bs requests; graph_bs: the largest batch
    the draft graphs were captured for (their tail's draws serve up to it; larger batches draw eagerly)."""
    tree_w, w = run.widths_for(bs)
    draws = run.graph_draws
    if run.grown is not None:  # best-first draws nothing: its steps carry one placeholder candidate
        n = 1
    elif draws is not None and bs <= graph_bs and draws.covers(bs):
        n = draws.drawn_n(bs)
    else:
        n = run.plan.draws_for(bs)
    return n, tree_w, w


def shapes(run, max_bs: int, graph_bs: int) -> list[tuple[int, int, int]]:
    """The distinct step shapes of batches of 1..max_bs requests, in order of first appearance (FLASHTREE_TREE_N=auto:
    the planner's trees)."""
    seen: list[tuple[int, int, int]] = []
    if run.planner is not None:
        for s in run.planner.trees:
            shape = (s.n, *run.plan.fit_width(s.width, run.verify_runners))
            if shape not in seen:
                seen.append(shape)
        return seen
    for bs in range(1, max_bs + 1):
        shape = step_shape(run, bs, graph_bs)
        if shape not in seen:
            seen.append(shape)
    return seen


def limits(run, worker) -> tuple[int, int]:
    """(largest batch to warm for, largest batch the draft graphs serve): the largest captured graph size; without
    CUDA graphs, every budget width (a batch above budget // 2 gets the narrowest)."""
    runner = getattr(worker.model_runner, "decode_cuda_graph_runner", None)
    graph_bs = max((int(b) for b in getattr(runner, "capture_bs", None) or ()), default=0)
    budget = run.plan.toggles.tree_budget
    return max(graph_bs, budget // 2 + 1 if budget else 1), graph_bs


def warm(run, worker, max_bs: int, graph_bs: int) -> list[tuple[int, int, int]]:
    """Run one request's tree kernels per shape on dummy inputs -> the shapes run."""
    plan = run.plan
    device = torch.device(getattr(worker, "device", "cpu"))
    table = plan.adapter.req_to_token(worker) if plan.page_size == 1 else None
    done = shapes(run, max_bs, graph_bs)
    for n, tree_w, w in done:
        dummy_step(plan, device, table, 1, n, tree_w, w, grown=run.grown, simulated=run.simulate is not None)
    return done


def dummy_step(plan, device, table, bs: int, n: int, tree_w: int, w: int, grown: tuple | None = None,
               simulated: bool = False) -> None:
    """A tree step's kernels (build, encode, walk with the req_to_token rewrite and the step's outputs) over bs
    requests on dummy inputs of the live dtypes (int64 tokens, lengths and KV slots, the target's req_to_token
    dtype); `table`: the live req_to_token (None: paged KV), whose row stride the walk kernel is specialised on (a
    scratch table of its row length is written, never the live one). `grown`: the run's best-first head (() for a
    draft with independent positions, whose step grows its tree in one launch, not by the builder's rounds: the
    planner's probe times this step). `simulated`: the walk capped at drawn lengths (simulate.py)."""
    candidates = torch.zeros((bs, n, plan.depth), dtype=torch.int64, device=device)
    if grown == ():
        top = torch.zeros((bs, plan.depth, tree_w - 1), device=device)
        ids = torch.arange(tree_w - 1, device=device).expand_as(top)  # siblings' tokens distinct, as a top k's are
        tree = grow_marginal(top, ids, tree_w)
    else:
        scores = dummy_scores(bs, n, plan.depth, device)  # what any policy reads, of the live shapes
        tree = build_tree(candidates, tree_w, policy=plan.policy, scores=scores)
    tree = pad_tree(tree, w, n)
    prefix = torch.ones(bs, dtype=torch.int64, device=device)
    rows = torch.arange(bs, dtype=torch.int64, device=device)
    scratch = None if table is None else torch.zeros((bs, table.shape[1]), dtype=table.dtype, device=device)
    inputs = verify_inputs(tree, torch.zeros(bs, dtype=torch.int64, device=device), prefix, bs, candidates)
    targets = torch.zeros((bs, w), dtype=torch.int64, device=device)
    # the window's slots as the step reads them: the first w of DSPARK's window of plan.width
    slots = None if table is None else torch.zeros((bs, plan.width), dtype=torch.int64, device=device)[:, :w]
    walk_and_commit(tree, targets, scratch, rows, prefix, seq_lens=prefix, out_width=plan.width, window_slots=slots,
                    stats=inputs.stats, cap=prefix if simulated else None)
