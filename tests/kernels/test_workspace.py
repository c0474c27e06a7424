"""The tree kernels' wrappers with a workspace (flashtree/tree/workspace.py): what a step reads within itself comes
from buffers reused every other call, so the wrappers allocate only the outputs that outlive the step; the results
equal the fresh-output ones, and a call's buffers survive the next call."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from flashtree.tree import triton_mask, triton_walk
from flashtree.tree.build import build_vote_tree
from flashtree.tree.triton_mask import verify_inputs_triton
from flashtree.tree.triton_walk import walk_and_commit_triton
from flashtree.tree.workspace import Workspace

from .common import DEV

# allocations per call once the workspace holds both sets: the walk's bonus, commit lengths, new lengths and output
# tokens (sglang keeps them past the step); nothing for the verify inputs. Without one: 13 and 4.
WALK_ALLOCS, WALK_ALLOCS_FRESH = 4, 13
INPUTS_ALLOCS, INPUTS_ALLOCS_FRESH = 0, 4


class Allocations(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        schema = func._schema
        name = schema.name.split("::")[-1]
        if not schema.is_mutable and name not in VIEWS and any("Tensor" in str(r.type) for r in schema.returns):
            self.count += 1
        return func(*args, **(kwargs or {}))


VIEWS = {"view", "slice", "select", "alias", "as_strided", "expand", "unsqueeze", "squeeze", "t", "transpose", "permute",
         "detach", "_reshape_alias"}


class NoLaunch:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def step_case(bs=3, n=4, k=3, w=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    tree = build_vote_tree(torch.randint(0, 3, (bs, n, k), generator=g), w)
    tree = type(tree)(**{f: getattr(tree, f).to(DEV) if torch.is_tensor(getattr(tree, f)) else getattr(tree, f)
                         for f in tree.__dataclass_fields__})
    seq = torch.randint(1, 30, (bs,), generator=g).to(DEV)
    walk = dict(out_width=w, window_slots=torch.randint(0, 999, (bs, w + 2), generator=g)[:, :w].to(DEV),
                stats=torch.zeros(bs, 4, dtype=torch.int32, device=DEV))
    return tree, torch.randint(0, 3, (bs, w), generator=g).to(DEV), seq, walk


def allocations(fn) -> int:
    with Allocations() as counted:
        fn()
    return counted.count


def test_a_warm_workspace_leaves_only_the_outputs_that_outlive_the_step(monkeypatch):
    monkeypatch.setattr(triton_walk, "_walk_commit_kernel", NoLaunch())
    monkeypatch.setattr(triton_mask, "_verify_inputs_kernel", NoLaunch())
    tree, targets, seq, walk = step_case()
    cands = torch.zeros(3, 4, 3, dtype=torch.long, device=DEV)
    anchor = targets[:, 0].contiguous()
    ws = Workspace()
    for _ in range(2):  # both sets
        walk_and_commit_triton(tree, targets, seq, **walk, workspace=ws)
        verify_inputs_triton(tree, anchor, seq, 100, cands, ws)
    assert allocations(lambda: walk_and_commit_triton(tree, targets, seq, **walk, workspace=ws)) == WALK_ALLOCS
    assert allocations(lambda: walk_and_commit_triton(tree, targets, seq, **walk)) == WALK_ALLOCS_FRESH
    assert allocations(lambda: verify_inputs_triton(tree, anchor, seq, 90, cands, ws)) == INPUTS_ALLOCS
    assert allocations(lambda: verify_inputs_triton(tree, anchor, seq, 90, cands)) == INPUTS_ALLOCS_FRESH


def test_sets_alternate_and_the_mask_grows():
    ws = Workspace()
    made = []
    a, b, c = (ws.take("k", lambda: made.append(1) or (torch.empty(2),)) for _ in range(3))
    assert len(made) == 2 and a is not b and c is a
    m1 = ws.flat("mask", 10, torch.bool, "cpu")
    m2 = ws.flat("mask", 10, torch.bool, "cpu")
    assert m1.data_ptr() != m2.data_ptr() and ws.flat("mask", 12, torch.bool, "cpu").data_ptr() == m1.data_ptr()
    assert ws.flat("mask", 40, torch.bool, "cpu").numel() == 40


@pytest.mark.parametrize("seed", [0, 1])
def test_workspace_outputs_equal_fresh_ones_and_survive_the_next_call(seed):
    ws = Workspace()
    kept = []
    for i in range(4):
        tree, targets, seq, walk = step_case(seed=seed * 10 + i)
        cands = torch.randint(0, 3, (3, 4, 3), device=DEV)
        r2t = torch.arange(3 * 40, device=DEV).view(3, 40)
        rows, starts = torch.arange(3, device=DEV), torch.full((3,), 5, device=DEV)
        fresh_stats = walk["stats"].clone()
        fresh = walk_and_commit_triton(tree, targets, seq, r2t.clone(), rows, starts, **{**walk, "stats": fresh_stats})
        inputs = verify_inputs_triton(tree, targets[:, 0], seq, int(seq.sum()), cands, ws)
        got = walk_and_commit_triton(tree, targets, seq, r2t, rows, starts, **{**walk, "stats": inputs.stats},
                                     workspace=ws)
        want = verify_inputs_triton(tree, targets[:, 0], seq, int(seq.sum()), cands)
        assert torch.equal(inputs.mask, want.mask) and torch.equal(inputs.ids, want.ids)
        assert torch.equal(inputs.stats[:, 3], fresh_stats[:, 3])
        snapshot = [t.clone() for t in tensors(got) + [inputs.ids, inputs.positions, inputs.mask]]
        for a, b in zip(tensors(got), tensors(fresh)):
            assert torch.equal(a, b)
        kept.append((got, inputs, snapshot))
        if i >= 1:  # the previous call's buffers, untouched by this call
            prev, prev_inputs, prev_snapshot = kept[i - 1]
            for a, b in zip(tensors(prev) + [prev_inputs.ids, prev_inputs.positions, prev_inputs.mask], prev_snapshot):
                assert torch.equal(a, b)


def tensors(out) -> list:
    res, plan, step = out
    return [res.path, res.accept_len, res.bonus, res.tokens, plan.permutation, plan.copy_src, plan.copy_mask,
            plan.kv_len, step.commit_len, step.seq_lens, step.out_tokens, step.slots]
