"""The tree step's draft forward over the first D rows of DSPARK's window (FLASHTREE_DRAFT_ROWS=D, D < gamma).

Trees wider than the draft block (FLASHTREE_TREE_DEPTH=K below gamma) take DSPARK's wider window W = gamma + 1, and
DSPARK's draft forward then runs all gamma rows of it per request, of which the tree keeps the first K. At 28-32
requests on the H200 that forward was 2.44 ms of a 5.35 ms tree step against 1.49 ms for an 8-row block
(BENCHMARKS.md, live SmolLM2). With D rows (K <= D <= gamma) a tree step's draft forward runs the window's first D
slots only; the target still verifies up to W tokens. The block attends within itself both ways, so rows < D see
other logits than with gamma rows; lossless either way (the target verifies every token).

How (sglang 0.5.17): `DraftBlockProposer._run_forward` sizes the block (mask-token ids, positions and slots: the
window's first columns) and the draft attention's spec info by `gamma` and `_draft_block_spec_info` alone, so a shallow
copy of the worker's proposer with D in both runs the D-row forward (`adapter.proposer_with_rows`). Its CUDA graphs:
after DSPARK's `init_cuda_graphs`, one more draft decode graph runner of sglang's own class at D tokens per request,
over an attention backend of its own (verify_widths.py does the same for the target). While it captures, the draft
model runner's tail hooks are flashtree's draws over the D rows only (GraphDraws.draw, into the same buffers), since
DSPARK's own tail reshapes by its gamma. A tree step swaps that runner in around its draft forward; DSPARK's own steps
(the tree path's fallbacks) keep the gamma-row proposer and graphs.
"""

from __future__ import annotations

import contextlib
import logging
import types
from dataclasses import dataclass

from .toggles import ToggleError

logger = logging.getLogger("flashtree.patches")


@dataclass
class DraftRows:
    """The run state of FLASHTREE_DRAFT_ROWS (the row count itself is the plan's `forward_rows`)."""

    proposer: object  # DSPARK's proposer, copied, over the plan's forward_rows rows
    runner: object | None = None  # the draft graph runner captured at `rows` tokens per request (None: eager)


def capture(run, worker) -> None:
    """The D-row draft graphs of `run.draft_rows` (after DSPARK's init_cuda_graphs). A server without draft graphs runs
    the D-row forwards eagerly; a failed capture stops the server (ToggleError): without those graphs every tree step's
    draft forward would run eagerly, which the toggle was not set for."""
    path = run.draft_rows
    rows, gamma = run.plan.forward_rows, run.plan.gamma
    dmr = worker.draft_model_runner
    main = getattr(dmr, "decode_cuda_graph_runner", None)
    if not hasattr(main, "capture_bs"):  # no draft graphs (sglang's eager runner, or none)
        logger.info("flashtree: tree steps' draft forward over %d of DSPARK's %d rows (eager: no draft graphs)",
                    rows, gamma)
        return
    from . import graph_draws

    sampler = graph_draws.sampler_of(worker)
    saved = dmr.capture_tail_hooks
    dmr.capture_tail_hooks = [tail_hook(sampler, rows)] if sampler is not None else []
    try:
        with worker._draft_context():
            backend = type(dmr.attn_backend)(dmr)
            # a DSPARK draft runner captures num_draft_tokens - 1 rows per request
            path.runner = type(main)(dmr, attn_backend=backend, speculative_num_draft_tokens=rows + 1)
    except Exception as err:  # noqa: BLE001 - any capture failure: one message naming the toggle
        raise ToggleError(
            f"flashtree: FLASHTREE_DRAFT_ROWS={rows} needs draft CUDA graphs captured at {rows} rows, and capturing "
            f"them failed ({type(err).__name__}: {err}); unset FLASHTREE_DRAFT_ROWS (DSPARK's {gamma} rows and "
            "graphs), or leave the capture more GPU memory (a lower --cuda-graph-max-bs or --mem-fraction-static)"
        ) from None
    finally:
        dmr.capture_tail_hooks = saved
    logger.info("flashtree: tree steps' draft forward over %d of DSPARK's %d rows (graphs captured)", rows, gamma)


def tail_hook(sampler, rows: int):
    """The D-row graphs' tail: flashtree's N draws over the forward's D rows per request (sglang's capture-hook call)."""
    view = types.SimpleNamespace(gamma=rows, model=sampler.model, markov_head=sampler.markov_head)

    def hook(runner, out, forward_batch, num_tokens):
        sampler.flashtree_draws.draw(view, out.hidden_states, forward_batch.input_ids, None)

    return hook


_DSPARK_PROPOSER = contextlib.nullcontext()  # yields None: DSPARK's own proposer (reusable, no per-step object)


def drafting(run, worker):
    """The proposer a tree step's draft forward runs: DSPARK's, or the D-row copy with its graph runner swapped in."""
    path = run.draft_rows
    if path is None:
        return _DSPARK_PROPOSER
    if path.runner is None:  # eager: the gamma-row graphs refuse a D-row batch (width check)
        return contextlib.nullcontext(path.proposer)
    return _with_rows_runner(path, worker)


@contextlib.contextmanager
def _with_rows_runner(path, worker):
    dmr = worker.draft_model_runner
    main = dmr.decode_cuda_graph_runner
    dmr.decode_cuda_graph_runner = path.runner
    try:
        yield path.proposer
    finally:
        dmr.decode_cuda_graph_runner = main
