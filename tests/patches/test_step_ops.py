"""Host work of the tree step, pinned on CPU (step_ops.py counts it): the torch ops flashtree's own code issues per
decode step stay few, do not grow with the batch (no per-request Python loop), and read no device data on the host
(the tree checks' content reads run on CPU tensors only, by design: flashtree/tree/checks.py)."""

from __future__ import annotations

import pytest
import torch

import sglang_cpu
import step_ops
import test_decode_cpu as harness

# flashtree-owned launches per greedy tree step (the Triton stages as one each; 12 for vote, 17 for best-first when
# pinned, sglang's own ops and the CPU-only checks aside): room for a few, not for a per-request loop
MAX_LAUNCHES = 20
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


def flashtree_launches(counter: step_ops.StepOps) -> float:
    return sum(n for owner, n in counter.launches.items()
               if not owner.startswith(("sglang:", CPU_ONLY))) / counter.steps


@pytest.mark.parametrize("kw", [dict(n=8), dict(n=1, policy="best-first")], ids=["vote", "best-first"])
def test_tree_step_host_work_is_small_flat_in_the_batch_and_sync_free(kw):
    one, eight = step_counts(1, **kw), step_counts(8, **kw)
    assert one.steps == eight.steps == 3
    assert flashtree_launches(one) <= MAX_LAUNCHES, one.table()
    assert flashtree_launches(one) == flashtree_launches(eight), (one.table(), eight.table())
    assert one.ops == eight.ops
    syncs = [s for s in one.syncs + eight.syncs if not s.startswith(CPU_ONLY)]
    assert syncs == [], eight.table()
