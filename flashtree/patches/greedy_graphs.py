"""FLASHTREE_TREE_N=auto's chain at the draft's own width: N = 1 tree steps over draft graphs whose tail computes the
greedy block alone.

A planned server reserves DSPARK's widest window (--speculative-num-draft-tokens 64: gamma 63), so DSPARK's own step,
the menu's `chain(W=64)`, drafts 63 rows and verifies 64 tokens per request. The menu's `N=1,W=9,rows=8` (the
draft's greedy block verified at depth + 1, through the tree step) should cost what a chain server's step (gamma 8)
costs, but it replayed the tree steps' draft-row graphs, whose tail draws the batch's full planned count
(`TreePlan.draws_for`: 512 candidate rows per batch at SmolLM2's vocabulary), and so cost what every tree cost: 8.2 ms
at 32 requests in live run 26's start-up table, against 5.3 for chain(W=64). Those draws are about 1.5 ms of it
(flashtree's fused Markov draws of 512 rows x 8 positions over 49152 tokens in a CUDA graph on the H200, Markov rank
32-256), the greedy block of 32 requests 0.13-0.31 ms. Here, after the draft-row graphs
(draft_rows.py), one more set of draft graphs is captured at the same rows whose tail is `GraphDraws.draw(...,
greedy=True)`: candidate 0, the greedy block, alone (bs rows of the Markov head instead of bs x N). An N = 1 step
replays them (`stepping`, around the tree step in decode.make_forward_decode), and StepProbe times N = 1 over them.
Greedy commits are the sequential greedy decode and sampled walks stay lossless: it is the same N = 1 tree step,
whose candidate 0 the full draws made too.

Why not DSPARK's own step at the narrow width (a worker copy with its window attributes swapped): sglang 0.5.17's
`DSparkWorkerV2.__init__` builds every part of `_forward_decode` for gamma and the window (dspark_worker_v2.py: the
position offsets :152, the draft spec info :155, the verify planner :170, the KV injector :192, the proposer :200, the
epilogue :214, the verify executor :250, the observers :263), and its draft graphs' tail, `DsparkDraftSampler`,
reshapes by its gamma (dspark_draft_sampler.py:94). A narrow DSPARK step needs a second instance of each, built
through constructors that differ between releases, and draft graphs with DSPARK's sampler captured at the depth.
The window is not the obstacle: `alloc_verify_window` (dspark_planner.py:843) reads slots the scheduler reserved in
req_to_token, and a step that verifies their first w and reports DSPARK's `speculative_num_draft_tokens` keeps the
scheduler's accounting (the tree step's narrower verify graphs already do: verify_widths.py).

Cost: a second set of draft-row graphs (sglang's capture at every draft graph batch size); its capture time and the
GPU memory it took are logged at start. sglang 0.5.20 / 0.5.23 have no draft-row graphs (draft_rows.py), so there
N = 1 steps replay the tree steps' graphs (DSPARK's own, whose tail draws for every tree) and the start-up table
prices them so (logged once). A failed capture is logged and leaves N = 1 on the tree steps' graphs, priced the same
way: an exact step, only a dearer one.
"""

from __future__ import annotations

import contextlib
import logging
import time

import torch

from .draft_rows import tail_hook

logger = logging.getLogger("flashtree.patches")


def capture(run, worker) -> None:
    """The greedy-only draft graphs (`run.draft_rows.greedy`), after the draft-row graphs; logs where N = 1 steps'
    draft runs either way."""
    from . import graph_draws

    path, sampler = run.draft_rows, graph_draws.sampler_of(worker)
    if path is None or path.runner is None or sampler is None:
        why = ("draft-row graphs need sglang 0.5.17" if path is None and not run.plan.adapter.draft_rows_release
               else "no draft-row graphs" if path is None or path.runner is None
               else "the draws are not in the draft graphs")
        logger.info("flashtree: FLASHTREE_TREE_N=auto: N = 1 steps replay the tree steps' draft graphs, whose tail "
                    "draws the batch's candidates for every tree (%s); the cost table prices them so", why)
        return
    dmr = worker.draft_model_runner
    rows = run.plan.forward_rows
    saved = dmr.capture_tail_hooks
    dmr.capture_tail_hooks = [tail_hook(sampler, rows, greedy=True)]
    device = torch.device(getattr(worker, "device", "cpu"))
    free = graph_draws.free_bytes(device)
    started = time.perf_counter()
    try:
        with worker._draft_context():
            backend = type(dmr.attn_backend)(dmr)
            path.greedy = type(path.runner)(dmr, attn_backend=backend, speculative_num_draft_tokens=rows + 1)
    except Exception as err:  # noqa: BLE001 - any capture failure: N = 1 keeps the tree steps' graphs
        logger.warning("flashtree: FLASHTREE_TREE_N=auto: capturing the N = 1 steps' greedy-only draft graphs failed "
                       "(%s: %s); N = 1 steps replay the tree steps' draft graphs, the cost table prices them so",
                       type(err).__name__, err)
        return
    finally:
        dmr.capture_tail_hooks = saved
    after = graph_draws.free_bytes(device)
    memory = "" if free is None or after is None else f", {(free - after) / 2**30:.3f} GiB of GPU memory"
    logger.info("flashtree: FLASHTREE_TREE_N=auto: N = 1 steps' draft graphs over %d rows, their tail the greedy block "
                "alone, captured at batch sizes %s in %.2f s%s", rows, list(getattr(path.greedy, "capture_bs", ())),
                time.perf_counter() - started, memory)


@contextlib.contextmanager
def stepping(run, shape):
    """Around a planned tree step of `shape`: for N = 1 with greedy-only graphs, the draft forward replays those and
    the step reads candidate 0 alone from the draw buffers."""
    path = run.draft_rows
    if shape.n != 1 or path is None or path.greedy is None:
        yield
        return
    draws = run.graph_draws
    runner, path.runner = path.runner, path.greedy
    draws.greedy_only = True
    try:
        yield
    finally:
        path.runner = runner
        draws.greedy_only = False


def draft_runner(run, greedy: bool):
    """The draft graph runner a tree step replays (greedy: an N = 1 step): the greedy-only one for N = 1 where
    captured, else the tree steps' draft-row runner (None: DSPARK's own)."""
    path = run.draft_rows
    if path is None:
        return None
    return path.greedy if greedy and path.greedy is not None else path.runner
