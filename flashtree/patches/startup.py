"""What the tree path does at DSparkWorkerV2.init_cuda_graphs, the first point of a server's start at which sglang has
allocated the KV pools (its scheduler builds the workers first, then the pools, then every worker's graphs, with CUDA
graphs or without): the paged-KV commit check that needs the target's pool (before DSPARK captures anything), then,
after DSPARK's graphs, with FLASHTREE_DRAFT_ROWS below gamma the draft graphs at that many rows (draft_rows.py), and
with FLASHTREE_TREE_BUDGET or FLASHTREE_TREE_WIDTH the narrower target-verify graphs (verify_widths.py) and the tree
kernels' warm-up (warmup.py)."""

from __future__ import annotations

import logging

from .toggles import ToggleError

logger = logging.getLogger("flashtree.patches")


def refuse_paged_commit(adapter, worker, page: int) -> None:
    """Stop the server (ToggleError) if the target KV pool cannot take the paged-KV copy commit."""
    missing = adapter.copy_commit_unsupported(worker)
    if missing:
        raise ToggleError(
            f"flashtree: with --page-size {page} the tree path commits by copying the accepted KV, but {missing}; "
            "allowed: start the server with --page-size 1, or unset FLASHTREE_TREE_N"
        )


def make_init_cuda_graphs(original, narrow: bool):
    """DSparkWorkerV2.init_cuda_graphs wrapped; narrow: trees narrower than the window (budget or fixed width)."""

    def init_cuda_graphs(self, *args, **kwargs):
        state = getattr(self, "_flashtree", None)
        if state is not None and state.page_size != 1:
            refuse_paged_commit(state.adapter, self, state.page_size)
        out = original(self, *args, **kwargs)
        if state is not None and state.draft_rows is not None:
            from . import draft_rows

            draft_rows.capture(state, self)
        if state is not None and narrow:
            from . import verify_widths, warmup

            verify_widths.capture(state, self)
            warmed = warmup.warm(state, self, *warmup.limits(state, self))
            logger.info("flashtree: tree kernels compiled for (candidates, tree width, verify width) %s", warmed)
        return out

    return init_cuda_graphs
