"""Host work of the tree step, pinned on CPU (step_ops.py counts it): the torch ops flashtree's own code issues per
decode step stay few, do not grow with the batch (no per-request Python loop), and read no device data on the host
(the tree checks' content reads run on CPU tensors only, by design: flashtree/tree/checks.py)."""

from __future__ import annotations

import pytest
import torch

import sglang_cpu
import step_ops
import test_decode_cpu as harness
import test_dflash_cpu as dflash_harness
from flashtree.patches import decode

# flashtree-owned launches per greedy tree step (the Triton stages as one each; 6 for vote, 5 for best-first when
# pinned: the walk kernel writes the step's outputs; 11 / 10 before; sglang's own ops and the CPU-only checks aside):
# room for a couple, not for a per-request loop
MAX_LAUNCHES = 8
# ... and the tensors those eager ops allocate (the draft's anchor, the target argmax, the path's hidden states; 7
# before the walk wrote the step's outputs); the Triton wrappers' own: tests/kernels/test_workspace.py
MAX_ALLOCS = 3
CPU_ONLY = "tree.checks:"


@pytest.fixture(autouse=True)
def _cpu(monkeypatch):
    sglang_cpu.force_triton_tree_kernels()
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)


def step_counts(bs: int, **kw) -> step_ops.StepOps:
    prompts = [[(3 * b + j) % 29 + 1 for j in range(3 + b % 5)] for b in range(bs)]
    counter = step_ops.StepOps()
    with step_ops.counting_steps(counter, harness, "tree_step"):
        harness.run(steps=4, prompts=prompts, graph_max_bs=8, **kw)
    return counter


def flashtree_per_step(counter: step_ops.StepOps, counts: str = "launches") -> float:
    return sum(n for owner, n in getattr(counter, counts).items()
               if not owner.startswith(("sglang:", CPU_ONLY))) / counter.steps


@pytest.mark.parametrize("kw", [dict(n=8), dict(n=1, policy="best-first")], ids=["vote", "best-first"])
def test_tree_step_host_work_is_small_flat_in_the_batch_and_sync_free(kw):
    one, eight = step_counts(1, **kw), step_counts(8, **kw)
    assert one.steps == eight.steps == 3
    assert flashtree_per_step(one) <= MAX_LAUNCHES, one.table()
    assert flashtree_per_step(one) == flashtree_per_step(eight), (one.table(), eight.table())
    assert flashtree_per_step(one, "allocs") <= MAX_ALLOCS, one.table()
    assert one.ops == eight.ops and one.allocs == eight.allocs
    syncs = [s for s in one.syncs + eight.syncs if not s.startswith(CPU_ONLY)]
    assert syncs == [], eight.table()


# flashtree-owned launches per DFLASH tree step (best-first, draws and grow in the draft graph's tail), 13 when pinned:
# DFLASH's prepare-block kernel (the window and the block), the block's embedding, the verify inputs, the argmax, the
# walk (which also writes the commit and new lengths, output tokens, statistics column and the path's slots), the
# path's hidden states and 7 ops on host tensors (the host lengths DFLASH's own chain step computes too); 18 before
# the walk wrote the step's outputs, 24 before that
HOST_LENS = ("patches.adapters.dflash:draft_host_lens", "patches.adapters.base:add_window_to_host_lens")
MAX_DFLASH_LAUNCHES = 13
MAX_DFLASH_ALLOCS = 6  # the embedding, the argmax, the hidden states and 3 host-length tensors; 10 before


# Python-level host work per step (StepOps.calls): flashtree functions entered and builtins / tensor methods called,
# the most of the three releases (DFLASH 0.5.17 / 0.5.20 / 0.5.23: 61 / 67 / 70 and 39 / 48 / 49; 0.5.17 had 67 and 45
# before the hot path's len(tensor), per-step resolve imports, contextmanagers and repeated views were cut; DSPARK
# vote: 53-54 and 30-33, 59 and 35 before)
MAX_DFLASH_PYTHON_CALLS, MAX_DFLASH_BUILTIN_CALLS = 70, 49
MAX_PYTHON_CALLS, MAX_BUILTIN_CALLS = 54, 33


def dflash_step_counts(family, bs: int, monkeypatch) -> step_ops.StepOps:
    prompts = [[(3 * b + j) % 29 + 1 for j in range(3 + b % 5)] for b in range(bs)]
    counter = step_ops.StepOps()
    with dflash_harness.one_gpu_server(), step_ops.counting_steps(counter, decode, "tree_step"):
        dflash_harness.run(family, n=16, steps=4, prompts=prompts, policy="best-first",
                           graphs=(max(dflash_harness.GRAPH_BS), monkeypatch))
    return counter


def test_dflash_tree_step_host_work_is_small_flat_in_the_batch_and_sync_free(monkeypatch):
    """The DFLASH tree step as live runs serve it (best-first, graph draws): the launches flashtree issues per step
    stay at the pinned count, do not grow with the batch, and read nothing from the device; its only host reads are
    of sglang's host lengths (seq_lens_cpu), which DFLASH's own chain step reads the same way."""
    family = dflash_harness.stand_in_family()  # before the graph capture stands in for the release's draft context
    one = dflash_step_counts(family, 1, monkeypatch)
    four = dflash_step_counts(family, max(dflash_harness.GRAPH_BS), monkeypatch)
    assert one.steps == four.steps == 3
    assert flashtree_per_step(one) <= MAX_DFLASH_LAUNCHES, one.table()
    assert flashtree_per_step(one) == flashtree_per_step(four), (one.table(), four.table())
    assert flashtree_per_step(one, "allocs") <= MAX_DFLASH_ALLOCS, one.table()
    assert one.ops == four.ops and one.allocs == four.allocs
    assert one.launches["kernel:_prepare_dflash_draft_block_unchecked"] == one.steps, one.table()
    syncs = [s for s in one.syncs + four.syncs if not s.startswith(HOST_LENS + (CPU_ONLY,))]
    assert syncs == [], four.table()


def test_dflash_tree_step_python_calls(monkeypatch):
    """flashtree's Python-level host work per DFLASH best-first graph-draw step, by call events (step_ops.StepOps.calls):
    the functions it enters and the builtins and tensor methods it calls stay at the pinned counts (a CPU stand-in of
    its host time: Python, not the device, bounds a small model's tree step) and do not grow with the batch."""
    family = dflash_harness.stand_in_family()
    one = dflash_step_counts(family, 1, monkeypatch)
    four = dflash_step_counts(family, max(dflash_harness.GRAPH_BS), monkeypatch)
    assert one.calls == four.calls, (one.table(), four.table())
    assert one.calls["python"] / one.steps <= MAX_DFLASH_PYTHON_CALLS, one.table()
    assert one.calls["builtin"] / one.steps <= MAX_DFLASH_BUILTIN_CALLS, one.table()


def test_tree_step_python_calls():
    """The same for DSPARK's vote step (N = 8, eager draws)."""
    one, eight = step_counts(1, n=8), step_counts(8, n=8)
    assert one.calls == eight.calls, (one.table(), eight.table())
    assert one.calls["python"] / one.steps <= MAX_PYTHON_CALLS, one.table()
    assert one.calls["builtin"] / one.steps <= MAX_BUILTIN_CALLS, one.table()
