"""What the tree path does at DSparkWorkerV2.init_cuda_graphs, the first point of a server's start at which sglang has
allocated the KV pools (its scheduler builds the workers first, then the pools, then every worker's graphs, with CUDA
graphs or without): the checks that need the pools (translated KV ids, the paged-KV commit; before DSPARK captures
anything), then, after DSPARK's graphs, with FLASHTREE_DRAFT_ROWS below gamma the draft graphs at that many rows
(draft_rows.py), and with FLASHTREE_TREE_BUDGET, FLASHTREE_TREE_WIDTH or FLASHTREE_TREE_N=auto the narrower
target-verify graphs (verify_widths.py) and the tree kernels' warm-up (warmup.py), and under auto the planner's cost
table (planning.py)."""

from __future__ import annotations

import logging

from . import checks

logger = logging.getLogger("flashtree.patches")


def make_init_cuda_graphs(original, narrow: bool):
    """DSparkWorkerV2.init_cuda_graphs wrapped; narrow: trees narrower than the window (budget, fixed width, auto)."""

    def init_cuda_graphs(self, *args, **kwargs):
        run = getattr(self, "_flashtree", None)
        if run is not None:
            checks.at_init_cuda_graphs(run.plan.adapter, self, run.plan.page_size)
        out = original(self, *args, **kwargs)
        if run is not None and run.draft_rows is not None:
            from . import draft_rows

            draft_rows.capture(run, self)
        if run is not None and narrow:
            from . import verify_widths, warmup

            verify_widths.capture(run, self)
            warmed = warmup.warm(run, self, *warmup.limits(run, self))
            logger.info("flashtree: tree kernels compiled for (candidates, tree width, verify width) %s", warmed)
            if run.planner is not None:
                from . import planning

                planning.measure(run, self)
        return out

    return init_cuda_graphs
