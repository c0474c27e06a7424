"""Target-verify CUDA graphs at the narrower widths FLASHTREE_TREE_BUDGET and FLASHTREE_TREE_WIDTH ask for.

DSPARK captures the target's verify graphs once, at its window W = gamma + 1 tokens per request. A batch-wide budget
B gives a batch of bs requests trees of W_eff = clamp(B // bs, 2, W) tokens, and a fixed FLASHTREE_TREE_WIDTH below W
trees of that width; either saves verify time only if verify runs at that width, not at W with padding. After
DSPARK's `init_cuda_graphs` (the target's verify graphs exist by then; startup.py calls it), this module captures one more decode graph
runner of sglang's own class per such width (for the budget: per width it gives at a captured batch size), each over
an attention backend of its own:

    type(runner)(model_runner, attn_backend=type(model_runner.attn_backend)(model_runner),
                 speculative_num_draft_tokens=w)

(sglang's `DecodeCudaGraphRunner.__init__` takes both in 0.5.17, 0.5.20 and 0.5.23; its input buffers go through
sglang's process-wide pool, which is shared between runners by design.) A tree step whose batch has a runner at a
width >= W_eff builds its tree at that width (the graph costs the same whatever the tree fills), verifies the first
w slots of DSPARK's window, and swaps `model_runner.decode_cuda_graph_runner` for that runner for the verify call
only; batches the runner cannot take (more requests than it captured) run eagerly at width w, as sglang does for any
verify its graphs do not cover.
"""

from __future__ import annotations

import contextlib
import logging

from .adapters import base
from .toggles import ToggleError

logger = logging.getLogger("flashtree.patches")


def require(adapter, toggles) -> None:
    """Refuse, before anything is patched, toggles whose narrower trees need verify runners this release's
    DecodeCudaGraphRunner cannot build (DSPARK's and DFLASH's servers alike)."""
    if toggles.planned:  # verify graphs at every width of the planner's menu
        adapter.require(base.NARROW_VERIFY_PROBES, "FLASHTREE_TREE_N=auto", "an integer from 1 to 256")
    elif toggles.narrows:  # verify graphs at their width
        adapter.require(base.NARROW_VERIFY_PROBES, "FLASHTREE_TREE_BUDGET / FLASHTREE_TREE_WIDTH", "0 / auto")


def capture(run, worker) -> None:
    """Capture a verify runner on the target's model runner (run.verify_runners) for each width below DSPARK's
    window that the trees take at a captured batch size (`TreePlan.width_for`: the budget's or the fixed width; under
    FLASHTREE_TREE_N=auto every tree width of the planner's menu).
    A failed capture stops the server (ToggleError): those widths exist only because a toggle asked for them, and
    without their graphs its narrower trees would verify padded to the window, saving nothing."""
    plan = run.plan
    main = getattr(worker.model_runner, "decode_cuda_graph_runner", None)
    if main is None:
        return  # no target verify graphs (--disable-cuda-graph): narrower trees are padded to the window as before
    model_runner = worker.model_runner
    if run.planner is not None:  # FLASHTREE_TREE_N=auto: every width on the planner's menu
        widths = set(run.planner.widths())
    else:
        widths = {plan.width_for(int(bs)) for bs in main.capture_bs}
    for w in sorted(widths - {plan.width}):
        try:
            backend = type(model_runner.attn_backend)(model_runner)
            run.verify_runners[w] = type(main)(model_runner, attn_backend=backend, speculative_num_draft_tokens=w)
        except Exception as err:  # noqa: BLE001 - any capture failure: one message naming the toggles
            toggles = {"FLASHTREE_TREE_N": "auto"} if run.planner is not None else asked(plan.toggles)
            settings = " with ".join(f"{k}={v}" for k, v in toggles.items())
            raise ToggleError(
                f"flashtree: {settings} needs target verify CUDA graphs at width {w}, and capturing them failed "
                f"({type(err).__name__}: {err}); unset {' and '.join(toggles)} (trees at DSPARK's window "
                f"W={plan.width}), or leave the capture more GPU memory (a lower --cuda-graph-max-bs or "
                "--mem-fraction-static)"
            ) from None
    logger.info("flashtree: target verify graphs at widths %s besides W=%d (batch sizes %s; tree width %d, budget %d)",
                sorted(run.verify_runners) or "none", plan.width, list(main.capture_bs), plan.tree_width,
                plan.toggles.tree_budget)


def asked(toggles) -> dict[str, int]:
    """The toggles set that ask for narrower verify widths -> their values."""
    values = {"FLASHTREE_TREE_WIDTH": toggles.tree_width, "FLASHTREE_TREE_BUDGET": toggles.tree_budget}
    return {k: v for k, v in values.items() if v}


_AS_IS = contextlib.nullcontext()  # reusable: no per-step object when there is nothing to swap


def verifying_with(worker, runner):
    """The target's decode graph runner is `runner` inside the block (None: leave it as it is)."""
    return _AS_IS if runner is None else _swapped(worker, runner)


@contextlib.contextmanager
def _swapped(worker, runner):
    model_runner = worker.model_runner
    main = model_runner.decode_cuda_graph_runner
    model_runner.decode_cuda_graph_runner = runner
    try:
        yield
    finally:
        model_runner.decode_cuda_graph_runner = main
