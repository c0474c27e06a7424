"""Host time of flashtree's tree step per decode step, on CPU, by owner: flashtree's own Python vs the torch ops it
issues vs sglang vs the CPU stand-ins (CPU stand-in measurements, not a GPU's numbers).

    TRITON_INTERPRET=1 .venv-sglang-0.5.17/bin/python benchmarks/host_step_profile.py [--steps 300] [--top 25]

Runs the tree step through the CPU harnesses of tests/patches (test_dflash_cpu.run / test_decode_cpu.run: the real
DFLASH worker and adapters, stand-in models) for many steps with tiny tensors, twice: unprofiled (the step's wall time
less the time inside the stand-ins and kernels: the host time to compare), then under cProfile for the attribution.
The stand-in models, KV writers, the draft graph's tail (a graph replay on a GPU) and the tree kernels (one Triton
launch each on a GPU: their torch references run here; sglang's prepare-block kernel as a torch stand-in, not the
Triton interpreter) are counted as "stand-in" / "kernel" and excluded, with everything they call (split by caller).
Per step it prints: flashtree's Python (its functions' own time, plus the non-torch builtins they call: getattr,
isinstance, ...), the torch ops flashtree calls (dispatch and CPU execution of tiny tensors), sglang's functions
flashtree calls, and flashtree's Python function calls (cProfile's count; deterministic). cProfile's per-call
overhead inflates every Python-heavy share, so compare runs of this script with each other only.
Configurations: DFLASH best-first W = 16 with graph draws, the planner (FLASHTREE_TREE_N=auto with best-first,
graph draws) and DSPARK vote N = 8 with graph draws (the DSPARK harness's 6-token window).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import os
import pstats
import sys
import time
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "patches")]  # this checkout's flashtree and harnesses
os.environ.setdefault("TRITON_INTERPRET", "1")

import sglang_cpu  # noqa: E402

sglang_cpu.prepare()

import torch  # noqa: E402

import step_ops  # noqa: E402

FLASHTREE = os.sep + "flashtree" + os.sep
TESTS = os.sep + "tests" + os.sep
SGLANG = os.sep + "sglang" + os.sep
TORCH = os.sep + "torch" + os.sep
# the stand-ins' and kernels' entry points, by function name (their subtrees are not the step's host work)
EXCLUDED = {name.rsplit(".", 1)[-1] for name in step_ops.STAND_INS} | {"kernel_launch", "prepare_block_stand_in",
                                                                         "replay_tail", "hook"}


def prepare_block_stand_in(bonus_tokens, prefix_lens, req_pool_indices, req_to_token, block_ids_out, positions_out,
                           cache_loc_out, mask_token_id):
    """DFLASH's prepare-block kernel (one launch on a GPU) in torch: [anchor, mask x K], positions and slots."""
    block_ids_out.fill_(mask_token_id)
    block_ids_out[:, 0].copy_(bonus_tokens)
    torch.add(prefix_lens.view(-1, 1), torch.arange(block_ids_out.shape[1]), out=positions_out)
    cache_loc_out.copy_(req_to_token[req_pool_indices.view(-1, 1), positions_out])


@contextlib.contextmanager
def kernels_as_stand_ins(timed=lambda fn: fn):
    """step_ops.KERNELS and sglang's prepare kernel behind a `kernel_launch` frame (excluded), counted per call."""
    import importlib

    calls = defaultdict(int)
    saved = []

    def wrap(fn, name, like=None):
        inner = timed(fn)

        @functools.wraps(like or fn)  # the adapters' probes read its signature
        def kernel_launch(*args, **kwargs):
            calls[name] += 1
            return inner(*args, **kwargs)
        return kernel_launch

    for mod_name, attr in step_ops.KERNELS:
        fn = getattr(importlib.import_module(mod_name), attr)
        for module in [m for n, m in list(sys.modules.items()) if n.startswith("flashtree")]:
            if getattr(module, attr, None) is fn:
                saved.append((module, attr, fn))
                setattr(module, attr, wrap(fn, attr))
    for mod_name, attr in step_ops.SGLANG_KERNELS:
        module = importlib.import_module(mod_name)
        saved.append((module, attr, getattr(module, attr)))
        setattr(module, attr, wrap(prepare_block_stand_in, attr, getattr(module, attr)))
    try:
        yield calls
    finally:
        for module, attr, fn in saved:
            setattr(module, attr, fn)


class Excluded:
    """Wall time inside the stand-ins and kernels (the outermost of nested ones), for the unprofiled pass."""

    ENTRIES = (("test_dflash_cpu", "draft_forward"), ("test_dflash_cpu", "target_forward"),
               ("test_dflash_cpu", "DraftPool.set_kv_buffer_prefix_valid"), ("test_decode_cpu", "StandInAdapter.alloc_window"),
               ("test_decode_cpu", "StandInAdapter.target_verify"), ("test_decode_cpu", "StandInAdapter.inject_committed"),
               ("test_decode_cpu", "StandInProposer._run_forward"))

    def __init__(self):
        self.seconds, self.depth = 0.0, 0

    def wrap(self, fn):
        @functools.wraps(fn)
        def excluded(*args, **kwargs):
            self.depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth -= 1
                if not self.depth:
                    self.seconds += time.perf_counter() - start
        return excluded

    @contextlib.contextmanager
    def timing(self, monkeypatch):
        import importlib

        for mod_name, path in self.ENTRIES:
            owner = importlib.import_module(mod_name)
            *outer, name = path.split(".")
            for part in outer:
                owner = getattr(owner, part)
            monkeypatch.setattr(owner, name, self.wrap(getattr(owner, name)))
        yield


class Profiled:
    """The wrapped calls (after `skip` warm-up calls) timed, under cProfile when `profile`."""

    def __init__(self, profile: bool, skip: int = 2):
        self.profile = cProfile.Profile() if profile else None
        self.skip, self.calls, self.steps, self.wall = skip, 0, 0, 0.0

    def wrap(self, step):
        def profiled(*args, **kwargs):
            self.calls += 1
            if self.calls <= self.skip:
                return step(*args, **kwargs)
            start = time.perf_counter()
            if self.profile is not None:
                self.profile.enable()
            try:
                return step(*args, **kwargs)
            finally:
                if self.profile is not None:
                    self.profile.disable()
                self.wall += time.perf_counter() - start
                self.steps += 1
        return profiled


def owner(func) -> str:
    path, _line, name = func
    if path == "~":
        return "torch op" if "torch" in name or "Tensor" in name else "builtin"
    if path.endswith(os.path.join("flashtree", "tree", "checks.py")):
        return "tree checks"  # the public API's argument checks (their content reads run on CPU tensors only)
    if FLASHTREE in path:
        return "flashtree"
    if TESTS in path or path.endswith("host_step_profile.py"):
        return "excluded" if name in EXCLUDED else "harness"
    if SGLANG in path:
        return "sglang"
    if TORCH in path:
        return "torch python"
    return "other"


def attribute(stats: pstats.Stats, steps: int) -> dict:
    """µs per step by owner, the stand-ins' subtrees excluded (each function's time split by its callers)."""
    raw = stats.stats  # func -> (cc, nc, tt, ct, callers{caller: (cc, nc, tt, ct)})
    excluded_share: dict = {}

    def share(func, depth=0) -> float:  # fraction of func's own time spent under an excluded entry point
        if owner(func) == "excluded":
            return 1.0
        if func in excluded_share:
            return excluded_share[func]
        excluded_share[func] = 0.0  # recursion guard
        _cc, _nc, tt, _ct, callers = raw[func]
        total = sum(c[2] for c in callers.values()) or 1e-12
        value = sum(c[2] * share(caller, depth + 1) for caller, c in callers.items() if caller in raw) / total
        excluded_share[func] = value
        return value

    by_owner = defaultdict(float)
    flashtree_funcs = defaultdict(float)
    flashtree_calls = 0.0
    others = defaultdict(float)
    for func, (_cc, nc, tt, _ct, callers) in raw.items():
        kind = owner(func)
        for caller, (_c, cnc, ctt, _cct) in callers.items():
            if caller not in raw:
                continue
            if share(caller) >= 1.0 or owner(caller) == "excluded":
                by_owner["excluded"] += ctt
                continue
            caller_kind = owner(caller)
            if kind in ("builtin", "torch op") and caller_kind == "flashtree":
                key = "flashtree" if kind == "builtin" else "torch op (from flashtree)"
                by_owner[key] += ctt
                if key == "flashtree":
                    flashtree_funcs[f"{func[2]} (in {caller[2]})"] += ctt
            elif kind == "flashtree":
                by_owner["flashtree"] += ctt
                flashtree_funcs[f"{os.path.relpath(func[0], ROOT)}:{func[1]}({func[2]})"] += ctt
                flashtree_calls += cnc
            else:
                key = kind if kind != "builtin" else f"builtin (from {caller_kind})"
                by_owner[key] += ctt
                others[f"{key}: {os.path.relpath(func[0], ROOT) if func[0] != '~' else ''}:{func[2]} (in {caller[2]})"] += ctt
        if not callers:  # the profiled entry point
            by_owner[kind] += tt
            if kind == "flashtree":
                flashtree_funcs[f"{os.path.relpath(func[0], ROOT)}:{func[1]}({func[2]})"] += tt
                flashtree_calls += nc
    us = 1e6 / steps
    return dict(owners={k: v * us for k, v in by_owner.items()},
                functions={k: v * us for k, v in flashtree_funcs.items()},
                others={k: v * us for k, v in others.items()}, calls=flashtree_calls / steps)


def dflash_best_first(profiled, steps, monkeypatch, planned=False):
    import test_dflash_cpu as h

    from flashtree.patches import dflash_step
    from flashtree.patches.toggles import AUTO_N

    family = h.stand_in_family()
    make = dflash_step.make_forward_batch_generation
    dflash_step.make_forward_batch_generation = lambda *a: profiled.wrap(make(*a))
    costs = (lambda shape, bs: 1.0 if shape.label() == "best-first,W=8" else 50.0) if planned else None
    try:
        with h.one_gpu_server():
            done = 0
            while done < steps:
                prompts = [[(3 * b + j + done) % 29 + 1 for j in range(3 + b % 5)] for b in range(1)]
                h.run(family, n=AUTO_N if planned else 16, steps=4, prompts=prompts, policy="best-first",
                      graphs=(max(h.GRAPH_BS), monkeypatch), costs=costs)
                done += 4
    finally:
        dflash_step.make_forward_batch_generation = make


def dspark_vote(profiled, steps, monkeypatch):
    import test_decode_cpu as h

    step = h.tree_step
    h.tree_step = profiled.wrap(step)
    try:
        done = 0
        while done < steps:
            prompts = [[(3 * b + j + done) % 29 + 1 for j in range(3 + b % 5)] for b in range(1)]
            h.run(n=8, steps=8, prompts=prompts, graph_max_bs=8)
            done += 8
    finally:
        h.tree_step = step


@contextlib.contextmanager
def window(width: int):
    """The DFLASH harness's block (its module constants) widened to `width` tokens."""
    import test_dflash_cpu as h
    import test_decode_cpu as d

    saved = h.W, h.K, d.W
    h.W, h.K, d.W = width, width - 1, width
    try:
        yield
    finally:
        h.W, h.K, d.W = saved


def widened(width: int, fn):
    def run(*args):
        with window(width):
            fn(*args)
    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--others", action="store_true", help="also list the other owners' top functions")
    parser.add_argument("--callees", default="", help="print what the functions matching this regex call")
    parser.add_argument("--only", default="", help="one configuration: best-first, planner, dspark-vote")
    args = parser.parse_args()
    from _pytest.monkeypatch import MonkeyPatch

    import test_decode_cpu  # noqa: F401 - the harnesses' own imports, before the kernels are wrapped
    import test_dflash_cpu  # noqa: F401

    sglang_cpu.force_triton_tree_kernels()
    torch.cuda.is_current_stream_capturing = lambda: False
    configs = {
        "best-first": widened(16, lambda p, m: dflash_best_first(p, args.steps, m)),
        "planner": widened(16, lambda p, m: dflash_best_first(p, args.steps, m, planned=True)),
        "dspark-vote": lambda p, m: dspark_vote(p, args.steps, m),
    }
    import logging

    logging.getLogger("flashtree.patches").setLevel(logging.ERROR)
    for name, fn in configs.items():
        if args.only and name != args.only:
            continue
        plain, excluded = Profiled(profile=False), Excluded()
        monkeypatch = MonkeyPatch()
        try:
            with kernels_as_stand_ins(excluded.wrap), excluded.timing(monkeypatch):
                fn(plain, monkeypatch)
        finally:
            monkeypatch.undo()
        profiled = Profiled(profile=True)
        monkeypatch = MonkeyPatch()
        try:
            with kernels_as_stand_ins() as launches:
                fn(profiled, monkeypatch)
        finally:
            monkeypatch.undo()
        stats = pstats.Stats(profiled.profile)
        if args.callees:
            stats.sort_stats("tottime").print_callees(args.callees)
        result = attribute(stats, profiled.steps)
        owners = result["owners"]
        print(f"== {name}: unprofiled, {(plain.wall - excluded.seconds) / plain.steps * 1e6:.0f} µs per step outside "
              f"the stand-ins and kernels ({plain.wall / plain.steps * 1e6:.0f} µs with them); kernel calls per step: "
              + ", ".join(f"{k} {v / profiled.calls:.2f}" for k, v in sorted(launches.items())))
        print(f"   profiled: flashtree Python {owners.get('flashtree', 0):.0f} µs/step, {result['calls']:.0f} flashtree "
              f"function calls/step; torch ops from flashtree {owners.get('torch op (from flashtree)', 0):.0f} µs; "
              + ", ".join(f"{k} {v:.0f}" for k, v in sorted(owners.items())
                          if k not in ("flashtree", "torch op (from flashtree)")))
        for func, t in sorted(result["functions"].items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"   {t:7.1f} µs  {func}")
        if args.others:
            for func, t in sorted(result["others"].items(), key=lambda kv: -kv[1])[: args.top]:
                print(f"   {t:7.1f} µs  {func}")


if __name__ == "__main__":
    main()
