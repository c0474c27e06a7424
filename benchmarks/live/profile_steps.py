"""Harness plugin of the live runs (not part of flashtree): host-side measurements of DSPARK decode steps.

Decode steps A..B-1 (prefill and idle steps not counted) of `DSparkWorkerV2.forward_batch_generation` are measured,
DSPARK's own chain and flashtree's tree step alike (flashtree patches `_forward_decode`, one level below), and at step
B the result is written to FT_PROFILE_OUT (default /tmp). Each mode has its own window; set several at once on
disjoint windows (one server run then gives all of them without one mode perturbing another):
  FT_PROFILE_STEPS=A:B  the steps run under cProfile -> profile_<pid>.txt (top functions by own and cumulative time,
                        and the mean host time per profiled step);
  FT_LOOP_PROFILE=A:B   cProfile from step A's start to step B's start: the scheduler's whole loop (result processing,
                        batch scheduling, output streaming) as well as the steps -> loop_<pid>.txt, with the mean wall
                        time per step;
  FT_TRACE_STEPS=A:B    torch.profiler (CPU and CUDA activity) over the same whole-loop window -> trace_<pid>.txt (ops
                        by own CPU time and by device time, per step) and the timeline trace_<pid>.json.gz;
  FT_SYNC_STEPS=A:B     host-device synchronisations in the steps (torch.cuda.set_sync_debug_mode), counted per
                        call stack -> syncs_<pid>.txt;
  FT_STEP_TIMES=A:B     the steps are only timed -> steps_<pid>.json (steps_<tag>_<pid>.json with FT_PROFILE_TAG): host time per step (the call's wall time on the
                        CPU), device time per step (CUDA events around the call) and the device time from one step's
                        end to the next one's start, as mean and median, so servers compare step for step; the
                        same per batch size ("by_bs"), so one window over the whole run gives the step at 32
                        requests as well as at 1. The file is rewritten every 1000 timed steps, so a window longer
                        than the run (e.g. 50:10000000) still leaves one.
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
    out_dir = os.environ.get("FT_PROFILE_OUT", "/tmp")
    windows = []  # (recorder, first step, last step)
    for var, make in RECORDERS.items():
        value = os.environ.get(var)
        if value:
            first, last = (int(x) for x in value.split(":"))
            windows.append((make(out_dir), first, last))
    if not windows:
        return
    from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

    original = DSparkWorkerV2.forward_batch_generation
    count = {"steps": 0}

    def forward_batch_generation(self, batch, *args, **kwargs):
        mode = batch.forward_mode
        if mode.is_extend() or batch.is_extend_in_batch or mode.is_idle():
            return original(self, batch, *args, **kwargs)
        count["steps"] += 1
        step = count["steps"]
        call = lambda: original(self, batch, *args, **kwargs)  # noqa: E731
        for recorder, first, last in windows:
            if step == last:
                recorder.write(last - first)
            elif step == first:
                recorder.begin()
            if first <= step < last:
                recorder.see(batch)
                call = inside(recorder, call)
        return call()

    DSparkWorkerV2.forward_batch_generation = forward_batch_generation


def output_path(out_dir: str, kind: str, ext: str) -> str:
    """<kind>_<pid><ext>, or <kind>_<tag>_<pid><ext> with FT_PROFILE_TAG (the live scripts set each server's tag, so
    a run's files say which server wrote them)."""
    tag = os.environ.get("FT_PROFILE_TAG")
    return os.path.join(out_dir, f"{kind}_{tag + '_' if tag else ''}{os.getpid()}{ext}")


def inside(recorder, call):
    return lambda: recorder.around(call)


class Recorder:
    """A window's measurement: `begin` at its first step, `around` each of its steps, `write` at its end."""

    def begin(self) -> None:
        pass

    def see(self, batch) -> None:
        """Called with each of the window's batches before its step runs."""

    def around(self, call):
        return call()

    def write(self, steps: int) -> None:
        raise NotImplementedError


class CProfileRecorder(Recorder):
    """cProfile around each step (FT_PROFILE_STEPS) or, with `loop`, over the whole window (FT_LOOP_PROFILE)."""

    def __init__(self, out_dir: str, loop: bool = False):
        self.loop = loop
        self.path = output_path(out_dir, "loop" if loop else "profile", ".txt")
        self.profile = cProfile.Profile()
        self.host_s = 0.0
        self.t0 = 0.0

    def begin(self) -> None:
        if self.loop:
            self.t0 = time.perf_counter()
            self.profile.enable()

    def around(self, call):
        if self.loop:
            return call()
        t0 = time.perf_counter()
        self.profile.enable()
        try:
            return call()
        finally:
            self.profile.disable()
            self.host_s += time.perf_counter() - t0

    def write(self, steps: int) -> None:
        if self.loop:
            self.profile.disable()
            self.host_s = time.perf_counter() - self.t0
        what = "wall time per step (scheduler loop)" if self.loop else "host time per step"
        buf = io.StringIO()
        buf.write(f"decode steps profiled: {steps}; mean {what} under cProfile: {self.host_s / steps * 1e3:.3f} ms\n")
        stats = pstats.Stats(self.profile, stream=buf)
        for key in ("tottime", "cumulative"):
            buf.write(f"\n=== by {key}\n")
            stats.sort_stats(key).print_stats(60 if self.loop else 45)
        with open(self.path, "w") as fh:
            fh.write(buf.getvalue())


class TraceRecorder(Recorder):
    """torch.profiler over the whole window: every op and CUDA runtime call with its CPU time, every kernel with its
    device time, so launches, copies and host waits per step compare between servers."""

    def __init__(self, out_dir: str):
        self.path = output_path(out_dir, "trace", "")
        self.profiler = None

    def begin(self) -> None:
        import torch

        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(activities=activities)
        self.t0 = time.perf_counter()
        self.profiler.__enter__()

    def write(self, steps: int) -> None:
        self.profiler.__exit__(None, None, None)
        wall_ms = (time.perf_counter() - self.t0) * 1e3
        from torch.autograd import DeviceType

        events = self.profiler.key_averages()
        gpu = [e for e in events if e.device_type == DeviceType.CUDA]  # kernels, copies, memsets
        lines = [f"decode steps traced: {steps}; mean wall time per step (scheduler loop, under the profiler): "
                 f"{wall_ms / steps:.3f} ms",
                 f"device activity per step (kernels, copies, memsets): {sum(e.count for e in gpu) / steps:.1f} "
                 f"launches, {sum(device_us(e) for e in gpu) / steps:.1f} us",
                 "", "per step: calls, own CPU us, device us (top 60 by own CPU time)"]
        rows = sorted(events, key=lambda e: -e.self_cpu_time_total)[:60]
        rows += sorted((e for e in events if e not in rows), key=lambda e: -device_us(e))[:30]
        for e in rows:
            lines.append(f"{e.count / steps:8.2f} {e.self_cpu_time_total / steps:10.1f} {device_us(e) / steps:10.1f}  "
                         f"{e.key[:110]}")
        with open(self.path + ".txt", "w") as fh:
            fh.write("\n".join(lines) + "\n")
        self.profiler.export_chrome_trace(self.path + ".json.gz")  # torch gzips a ".gz" path


def device_us(event) -> float:
    return getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0)


class SyncRecorder(Recorder):
    """Host-device synchronisations inside the steps (torch's sync debug mode), counted per call stack."""

    def __init__(self, out_dir: str):
        self.path = output_path(out_dir, "syncs", ".txt")
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


class TimingRecorder(Recorder):
    FLUSH_EVERY = 1000  # timed steps between rewrites of the file (a host wait for the last step's end event)

    def __init__(self, out_dir: str):
        self.path = output_path(out_dir, "steps", ".json")
        self.host_ms: list[float] = []
        self.events: list = []  # (start, end) CUDA events per step
        self.device_ms: list[float] = []  # read from the events at each dump, the new ones only
        self.between_ms: list[float] = []
        self.sizes: list[int] = []  # requests per step

    def see(self, batch) -> None:
        seq_lens = getattr(batch, "seq_lens", None)
        self.sizes.append(len(seq_lens) if seq_lens is not None else 0)

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
            if len(self.host_ms) % self.FLUSH_EVERY == 0:
                self.dump(len(self.host_ms))

    def dump(self, steps: int) -> dict:
        result = {"server": os.environ.get("FT_PROFILE_TAG"), "steps": steps, "host_ms": summary(self.host_ms)}
        if self.events:
            self.events[-1][1].synchronize()
            done = len(self.device_ms)
            self.device_ms += [s.elapsed_time(e) for s, e in self.events[done:]]
            pairs = zip(self.events[max(done - 1, 0):], self.events[max(done, 1):])
            self.between_ms += [e.elapsed_time(s) for (_, e), (s, _) in pairs]
            result["device_ms"] = summary(self.device_ms)
            result["between_ms"] = summary(self.between_ms)
        groups: dict = {}
        for i, bs in enumerate(self.sizes[: len(self.host_ms)]):
            groups.setdefault(bs, []).append(i)
        result["by_bs"] = {
            str(bs): {"steps": len(rows), "host_ms": summary([self.host_ms[i] for i in rows]),
                      **({"device_ms": summary([self.device_ms[i] for i in rows])} if self.device_ms else {})}
            for bs, rows in sorted(groups.items())
        }
        with open(self.path, "w") as fh:
            json.dump(result, fh, indent=1)
        return result

    def write(self, steps: int) -> None:
        result = self.dump(steps)
        line = {k: v for k, v in result.items() if k != "by_bs"}
        print(f"[profile_steps] decode steps {steps}: {json.dumps(line)}", flush=True)


def summary(values: list[float]) -> dict:
    return {"mean": round(statistics.fmean(values), 4), "median": round(statistics.median(values), 4)} if values else {}


RECORDERS = {
    "FT_PROFILE_STEPS": CProfileRecorder,
    "FT_LOOP_PROFILE": lambda out_dir: CProfileRecorder(out_dir, loop=True),
    "FT_TRACE_STEPS": TraceRecorder,
    "FT_SYNC_STEPS": SyncRecorder,
    "FT_STEP_TIMES": TimingRecorder,
}
