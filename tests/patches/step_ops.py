"""Host work of one decode step on CPU: the torch ops each flashtree function issues and its host syncs.

`StepOps` counts every aten op dispatched in a counted step (a TorchDispatchMode) and charges it to the innermost
flashtree (or sglang) function on the Python stack; the harness's own ops and whatever runs under its stand-ins
(`STAND_INS`: the models, a draft graph replay's tail, the window allocator and KV writers) are not counted. The tree
stages that are one Triton launch on CUDA (`KERNELS`) run their torch references on CPU, sglang's Triton kernels
(`SGLANG_KERNELS`) the Triton interpreter; each call counts as one op (and no allocation: the Triton wrappers'
allocations are counted in tests/kernels/test_workspace.py).
`calls` counts the step's Python-level host work by call events (sys.setprofile, deterministic, not timed):
"python", the calls of flashtree functions, and "builtin", the builtins and tensor methods flashtree code calls
(getattr, len, .view, ...), neither under a stand-in nor inside a `KERNELS` reference.
Host syncs are the reads of tensor data on the host (`.item()`, `int(t)`, `bool(t)`, `.tolist()`, `.cpu()`, and ops
whose output size depends on the data: nonzero, masked_select, unique, boolean-mask indexing).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

FLASHTREE = os.sep + "flashtree" + os.sep
TESTS = os.sep + "tests" + os.sep
SGLANG = os.sep + "sglang" + os.sep
# aten ops that only make views or metadata: host time, no kernel launch
VIEWS = {"view", "_unsafe_view", "slice", "select", "expand", "as_strided", "unsqueeze", "squeeze", "permute", "t",
         "transpose", "alias", "detach", "_reshape_alias", "unbind", "split", "narrow", "lift_fresh", "diagonal"}
# aten ops that wait for the device (their output depends on device data the host must read)
SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive",
            "item", "index_put_bool", "repeat_interleave_sync", "equal", "is_nonzero"}
SYNC_METHODS = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy"}
# flashtree functions that are one kernel launch on CUDA and a torch reference on CPU (module, attribute)
KERNELS = (
    ("flashtree.tree.dispatch", "build_vote_tree"),
    ("flashtree.tree.dispatch", "build_prob_tree"),
    ("flashtree.tree.dispatch", "verify_inputs"),
    ("flashtree.tree.dispatch", "walk_and_commit"),
    ("flashtree.tree.policies.best_first", "grow_marginal"),
    ("flashtree.sampler", "row_topk_logprobs"),
)
# sglang's Triton kernels the tree step calls through `resolve` (module, attribute), patched in sglang's module
SGLANG_KERNELS = (
    ("sglang.srt.speculative.dflash_worker_v2", "_prepare_dflash_draft_block_unchecked"),
)


# The harnesses' stand-ins for the models, sglang's window allocator and KV writers (tests/patches/test_*_cpu.py): what
# runs under them is not the step's host work (a graph replay's tail included).
STAND_INS = {"StandInProposer._run_forward", "StandInDraftGraphRunner.replay_tail", "StandInAdapter.target_verify",
             "StandInAdapter.alloc_window", "StandInAdapter.inject_committed", "standin_base_logits", "draft_forward",
             "target_forward", "DraftPool.set_kv_buffer_prefix_valid", "StandIns.move_kv_cache", "ChainStep.__call__"}


def _under_stand_in(frame) -> bool:
    """Whether `frame` runs under a stand-in (`STAND_INS`) of the counted step."""
    while frame is not None:
        code = frame.f_code
        if TESTS in code.co_filename:
            if code.co_name == "counted":
                return False
            if code.co_qualname in STAND_INS:
                return True
        frame = frame.f_back
    return False


def _owner() -> str | None:
    """'module:function' of the innermost flashtree or sglang frame of the counted step; None for the harness's
    own ops and for anything under a stand-in (`STAND_INS`)."""
    frame, owner = sys._getframe(3), None
    while frame is not None:
        path, code = frame.f_code.co_filename, frame.f_code
        if code.co_name == "counted" and path.endswith(".py") and TESTS in path:  # the counted step's caller
            return owner
        if TESTS in path:
            if code.co_qualname in STAND_INS:
                return None
            if owner is None and path != __file__:
                owner = "harness"
        elif owner is None and FLASHTREE in path:
            owner = path.split(FLASHTREE, 1)[1].removesuffix(".py").replace(os.sep, ".") + ":" + code.co_name
        elif owner is None and SGLANG in path and "site-packages" in path:
            owner = "sglang:" + code.co_name
        frame = frame.f_back
    return None


class _Dispatch(TorchDispatchMode):
    def __init__(self, owner):
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.owner._aten(func)
        return func(*args, **(kwargs or {}))


class _Function(TorchFunctionMode):
    def __init__(self, owner):
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in SYNC_METHODS or (name == "__getitem__" and len(args) > 1 and _bool_index(args[1])):
            self.owner._sync(name)
        return func(*args, **(kwargs or {}))


def _bool_index(index) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


@functools.cache
def _allocates(func) -> bool:
    """Whether an aten op returns a new tensor: not a view, writes none of its arguments (in place, out=) and returns a
    tensor (not a host scalar)."""
    schema = func._schema
    return (schema.name.split("::")[-1] not in VIEWS and any("Tensor" in str(r.type) for r in schema.returns)
            and not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments))


class StepOps:
    """Counts per step: `ops` (aten ops, views included), `launches` (ops less views), `allocs` (ops that return a
    new tensor: a caching-allocator call on CUDA; a kernel's own outputs are its wrapper's, tests/kernels), `syncs`,
    by owner."""

    def __init__(self):
        self.ops, self.launches, self.allocs, self.syncs = Counter(), Counter(), Counter(), Counter()
        self.calls = Counter()
        self.steps = 0
        self._paused = 0
        self._active = False

    def _aten(self, func):
        if self._paused:
            return
        owner = _owner()
        if owner is None or owner == "harness":
            return
        name = func._schema.name.split("::")[-1]
        self.ops[owner] += 1
        if name not in VIEWS:
            self.launches[owner] += 1
        if _allocates(func):
            self.allocs[owner] += 1
        if name in SYNC_OPS:
            self.syncs[f"{owner} ({name})"] += 1

    def _sync(self, name):
        if self._paused:
            return
        owner = _owner()
        if owner not in (None, "harness"):
            self.syncs[f"{owner} ({name})"] += 1

    def _call_event(self, frame, event, arg):
        if self._paused or event not in ("call", "c_call") or FLASHTREE not in frame.f_code.co_filename:
            return  # a "call" event's frame is the callee's, a "c_call" event's the calling code's
        if not _under_stand_in(frame):
            self.calls["python" if event == "call" else "builtin"] += 1

    @contextlib.contextmanager
    def one_launch(self, name):
        """A call that is one kernel launch on CUDA: one op, its CPU reference's ops not counted (nor the call, under
        a stand-in: a draft graph replay's tail)."""
        if self._active and not self._paused and _owner() not in (None, "harness"):
            self.ops[name] += 1
            self.launches[name] += 1
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    @contextlib.contextmanager
    def counting(self):
        self._active = True
        previous = sys.getprofile()
        try:
            with _Function(self), _Dispatch(self):
                sys.setprofile(self._call_event)
                try:
                    yield
                finally:
                    sys.setprofile(previous)
        finally:
            self._active = False
        self.steps += 1

    def per_step(self, counter: Counter) -> float:
        return sum(counter.values()) / max(self.steps, 1)

    def table(self, top: int = 25) -> str:
        lines = [f"per step over {self.steps} steps: ops {self.per_step(self.ops):.1f}, launches "
                 f"{self.per_step(self.launches):.1f}, allocations {self.per_step(self.allocs):.1f}, host syncs "
                 f"{self.per_step(self.syncs):.1f}, flashtree calls "
                 f"{ {k: v / max(self.steps, 1) for k, v in self.calls.items()} }"]
        for owner, n in self.launches.most_common(top):
            lines.append(f"  {n / self.steps:7.1f} launches {self.ops[owner] / self.steps:7.1f} ops "
                         f"{self.allocs[owner] / self.steps:7.1f} allocs  {owner}")
        for owner, n in self.syncs.most_common():
            lines.append(f"  {n / self.steps:7.1f} syncs  {owner}")
        return "\n".join(lines)


@contextlib.contextmanager
def kernels_as_launches(counter: StepOps):
    """Patch `KERNELS`, in every flashtree module that imported them, to count as one launch each."""
    import importlib

    saved = []

    def wrap(fn, name):
        @functools.wraps(fn)  # the adapters' probes read its signature
        def launch(*args, **kwargs):
            with counter.one_launch(name):
                return fn(*args, **kwargs)
        return launch

    for mod_name, attr in KERNELS:
        fn = getattr(importlib.import_module(mod_name), attr)
        wrapped = wrap(fn, f"kernel:{attr}")
        for target in [m for n, m in list(sys.modules.items()) if n.startswith("flashtree")]:
            if getattr(target, attr, None) is fn:
                saved.append((target, attr, fn))
                setattr(target, attr, wrapped)
    for mod_name, attr in SGLANG_KERNELS:
        target = importlib.import_module(mod_name)
        fn = getattr(target, attr)
        saved.append((target, attr, fn))
        setattr(target, attr, wrap(fn, f"kernel:{attr}"))
    try:
        yield
    finally:
        for target, attr, fn in saved:
            setattr(target, attr, fn)


@contextlib.contextmanager
def counting_steps(counter: StepOps, module, name: str, skip: int = 1):
    """Count the calls of module.name (a decode step) after the first `skip` (their one-time caches)."""
    step = getattr(module, name)
    calls = [0]

    def counted(*args, **kwargs):
        calls[0] += 1
        if calls[0] <= skip:
            return step(*args, **kwargs)
        with counter.counting():
            return step(*args, **kwargs)

    setattr(module, name, counted)
    try:
        with kernels_as_launches(counter):
            yield
    finally:
        setattr(module, name, step)
