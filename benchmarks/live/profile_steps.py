"""Harness plugin of the live runs (not part of flashtree): host-side measurements of DSPARK decode steps.

Decode steps A..B-1 (prefill and idle steps not counted) of `DSparkWorkerV2.forward_batch_generation` are measured,
DSPARK's own chain and flashtree's tree step alike (flashtree patches `_forward_decode`, one level below), and at step
B the result is written to FT_PROFILE_OUT (default /tmp):
  FT_PROFILE_STEPS=A:B  the steps run under cProfile -> profile_<pid>.txt (top functions by own and cumulative time,
                        and the mean host time per profiled step);
  FT_SYNC_STEPS=A:B     host-device synchronisations in the steps (torch.cuda.set_sync_debug_mode), counted per
                        call stack -> syncs_<pid>.txt;
  FT_STEP_TIMES=A:B     the steps are only timed -> steps_<pid>.json: host time per step (the call's wall time on the
                        CPU), device time per step (CUDA events around the call) and the device time from one step's
                        end to the next one's start, as mean and median, so servers compare step for step.
"""

import cProfile
import io
import json
import os
import pstats
import statistics
import time
import traceback
import warnings
from collections import Counter


def register() -> None:
    profile, times = os.environ.get("FT_PROFILE_STEPS"), os.environ.get("FT_STEP_TIMES")
    syncs = os.environ.get("FT_SYNC_STEPS")
    if not (profile or times or syncs):
        return
    out_dir = os.environ.get("FT_PROFILE_OUT", "/tmp")
    recorder = (CProfileRecorder(out_dir) if profile else SyncRecorder(out_dir) if syncs else TimingRecorder(out_dir))
    first, last = (int(x) for x in (profile or syncs or times).split(":"))
    from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

    original = DSparkWorkerV2.forward_batch_generation
    count = {"steps": 0}

    def forward_batch_generation(self, batch, *args, **kwargs):
        mode = batch.forward_mode
        if mode.is_extend() or batch.is_extend_in_batch or mode.is_idle():
            return original(self, batch, *args, **kwargs)
        count["steps"] += 1
        step = count["steps"]
        if not first <= step < last:
            if step == last:
                recorder.write(last - first)
            return original(self, batch, *args, **kwargs)
        return recorder.around(lambda: original(self, batch, *args, **kwargs))

    DSparkWorkerV2.forward_batch_generation = forward_batch_generation


class CProfileRecorder:
    def __init__(self, out_dir: str):
        self.path = os.path.join(out_dir, f"profile_{os.getpid()}.txt")
        self.profile = cProfile.Profile()
        self.host_s = 0.0

    def around(self, call):
        t0 = time.perf_counter()
        self.profile.enable()
        try:
            return call()
        finally:
            self.profile.disable()
            self.host_s += time.perf_counter() - t0

    def write(self, steps: int) -> None:
        buf = io.StringIO()
        buf.write(f"decode steps profiled: {steps}; mean host time per step under cProfile: "
                  f"{self.host_s / steps * 1e3:.3f} ms\n")
        stats = pstats.Stats(self.profile, stream=buf)
        for key in ("tottime", "cumulative"):
            buf.write(f"\n=== by {key}\n")
            stats.sort_stats(key).print_stats(45)
        with open(self.path, "w") as fh:
            fh.write(buf.getvalue())


class SyncRecorder:
    """Host-device synchronisations inside the steps (torch's sync debug mode), counted per call stack."""

    def __init__(self, out_dir: str):
        self.path = os.path.join(out_dir, f"syncs_{os.getpid()}.txt")
        self.stacks: Counter = Counter()

    def around(self, call):
        import torch

        def show(message, category, filename, lineno, file=None, line=None):
            frames = traceback.extract_stack()[:-1][-12:]
            where = " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno}({f.name})" for f in reversed(frames))
            self.stacks[f"{str(message)[:60]} @ {where}"] += 1

        cuda = torch.cuda.is_available()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = show
            if cuda:
                torch.cuda.set_sync_debug_mode(1)  # "warn": every synchronizing CUDA call warns
            try:
                return call()
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode(0)

    def write(self, steps: int) -> None:
        with open(self.path, "w") as fh:
            fh.write(f"decode steps: {steps}; synchronisations: {sum(self.stacks.values())}\n")
            for stack, count in self.stacks.most_common(30):
                fh.write(f"{count}x {stack}\n")


class TimingRecorder:
    def __init__(self, out_dir: str):
        self.path = os.path.join(out_dir, f"steps_{os.getpid()}.json")
        self.host_ms: list[float] = []
        self.events: list = []  # (start, end) CUDA events per step

    def around(self, call):
        import torch

        cuda = torch.cuda.is_available()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        try:
            return call()
        finally:
            self.host_ms.append((time.perf_counter() - t0) * 1e3)
            if cuda:
                end.record()
                self.events.append((start, end))

    def write(self, steps: int) -> None:
        result = {"steps": steps, "host_ms": summary(self.host_ms)}
        if self.events:
            self.events[-1][1].synchronize()
            result["device_ms"] = summary([s.elapsed_time(e) for s, e in self.events])
            result["between_ms"] = summary([e.elapsed_time(s) for (_, e), (s, _) in zip(self.events, self.events[1:])])
        with open(self.path, "w") as fh:
            json.dump(result, fh, indent=1)
        print(f"[profile_steps] decode steps {steps}: {json.dumps(result)}", flush=True)


def summary(values: list[float]) -> dict:
    return {"mean": round(statistics.fmean(values), 4), "median": round(statistics.median(values), 4)} if values else {}
