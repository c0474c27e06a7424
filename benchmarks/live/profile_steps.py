"""Harness plugin of the live runs (not part of flashtree): a host-side cProfile of DSPARK decode steps.

With FT_PROFILE_STEPS=A:B in a server's environment, decode steps A..B-1 (prefill and idle steps not counted) of
`DSparkWorkerV2.forward_batch_generation` run under cProfile, DSPARK's own chain and flashtree's tree step alike
(flashtree patches `_forward_decode`, one level below). At step B the profile (top functions by own time and by
cumulative time, and the mean host time per profiled step) is written to FT_PROFILE_OUT/profile_<pid>.txt.
"""

import cProfile
import io
import os
import pstats
import time


def register() -> None:
    spec = os.environ.get("FT_PROFILE_STEPS")
    if not spec:
        return
    first, last = (int(x) for x in spec.split(":"))
    out_dir = os.environ.get("FT_PROFILE_OUT", "/tmp")
    from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

    original = DSparkWorkerV2.forward_batch_generation
    state = {"steps": 0, "host_s": 0.0, "profile": cProfile.Profile()}

    def forward_batch_generation(self, batch, *args, **kwargs):
        mode = batch.forward_mode
        if mode.is_extend() or batch.is_extend_in_batch or mode.is_idle():
            return original(self, batch, *args, **kwargs)
        state["steps"] += 1
        step = state["steps"]
        if not first <= step < last:
            if step == last:
                write(state, os.path.join(out_dir, f"profile_{os.getpid()}.txt"), last - first)
            return original(self, batch, *args, **kwargs)
        t0 = time.perf_counter()
        state["profile"].enable()
        try:
            return original(self, batch, *args, **kwargs)
        finally:
            state["profile"].disable()
            state["host_s"] += time.perf_counter() - t0

    DSparkWorkerV2.forward_batch_generation = forward_batch_generation


def write(state, path: str, steps: int) -> None:
    buf = io.StringIO()
    buf.write(f"decode steps profiled: {steps}; mean host time per step under cProfile: "
              f"{state['host_s'] / steps * 1e3:.3f} ms\n")
    stats = pstats.Stats(state["profile"], stream=buf)
    for key in ("tottime", "cumulative"):
        buf.write(f"\n=== by {key}\n")
        stats.sort_stats(key).print_stats(45)
    with open(path, "w") as fh:
        fh.write(buf.getvalue())
