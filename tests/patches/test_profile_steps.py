"""The live profiling harness plugin (benchmarks/live/profile_steps.py) against sglang's real DSparkWorkerV2."""

from __future__ import annotations

import os
import types

import harness_plugins


class Mode:
    def __init__(self, extend: bool = False):
        self.extend = extend

    def is_extend(self):
        return self.extend

    def is_idle(self):
        return False


def test_profiles_the_decode_steps_asked_for(monkeypatch, tmp_path):
    from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

    original = DSparkWorkerV2.__dict__["forward_batch_generation"]
    calls = []

    def stand_in(self, batch, *args, **kwargs):  # the step the plugin wraps: records which batches ran
        calls.append(batch.tag)
        return batch.tag

    try:
        DSparkWorkerV2.forward_batch_generation = stand_in
        monkeypatch.delenv("FT_PROFILE_STEPS", raising=False)
        harness_plugins.load("profile_steps").register()
        assert DSparkWorkerV2.forward_batch_generation is stand_in  # unset: nothing wrapped

        monkeypatch.setenv("FT_PROFILE_STEPS", "2:4")
        monkeypatch.setenv("FT_PROFILE_OUT", str(tmp_path))
        harness_plugins.load("profile_steps").register()
        assert DSparkWorkerV2.forward_batch_generation is not stand_in
        worker = DSparkWorkerV2.__new__(DSparkWorkerV2)
        batches = [types.SimpleNamespace(tag=f"prefill{i}", forward_mode=Mode(True), is_extend_in_batch=True)
                   for i in range(2)]
        batches += [types.SimpleNamespace(tag=f"decode{i}", forward_mode=Mode(), is_extend_in_batch=False)
                    for i in range(1, 6)]
        assert [worker.forward_batch_generation(b) for b in batches] == [b.tag for b in batches]
        assert calls == [b.tag for b in batches]  # every step still runs, profiled or not
        (out,) = tmp_path.glob("profile_*.txt")  # written once, at decode step 4: steps 2 and 3 were profiled
        text = out.read_text()
        assert text.startswith("decode steps profiled: 2;") and "stand_in" in text and "=== by cumulative" in text
    finally:
        DSparkWorkerV2.forward_batch_generation = original


def test_times_the_decode_steps_asked_for(monkeypatch, tmp_path):
    """FT_STEP_TIMES: the same window, timed without cProfile (host time per step; CUDA events where there is a GPU),
    overall and per batch size."""
    import json
    import time

    from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

    original = DSparkWorkerV2.__dict__["forward_batch_generation"]

    def stand_in(self, batch, *args, **kwargs):
        time.sleep(batch.sleep)
        return batch.tag

    try:
        DSparkWorkerV2.forward_batch_generation = stand_in
        monkeypatch.delenv("FT_PROFILE_STEPS", raising=False)
        monkeypatch.setenv("FT_STEP_TIMES", "1:4")
        monkeypatch.setenv("FT_PROFILE_OUT", str(tmp_path))
        monkeypatch.setenv("FT_PROFILE_TAG", "b_tree64wb512")  # the live scripts' server tag names the file
        harness_plugins.load("profile_steps").register()
        worker = DSparkWorkerV2.__new__(DSparkWorkerV2)
        batches = [types.SimpleNamespace(tag="prefill", forward_mode=Mode(True), is_extend_in_batch=True, sleep=0.2,
                                         seq_lens=[1])]
        batches += [types.SimpleNamespace(tag=f"decode{i}", forward_mode=Mode(), is_extend_in_batch=False,
                                          sleep=0.02 * i, seq_lens=[7] * (1 if i == 1 else 3)) for i in range(1, 5)]
        assert [worker.forward_batch_generation(b) for b in batches] == [b.tag for b in batches]
        (out,) = tmp_path.glob("steps_*.json")  # written at decode step 4: steps 1-3 (20, 40, 60 ms) were timed
        assert out.name == f"steps_b_tree64wb512_{os.getpid()}.json"
        result = json.loads(out.read_text())
        assert result["server"] == "b_tree64wb512" and result["steps"] == 3 and not list(tmp_path.glob("profile_*.txt"))
        assert 20 <= result["host_ms"]["mean"] < 150 and result["host_ms"]["median"] >= 40  # the 200 ms prefill is not in
        by_bs = result["by_bs"]
        assert sorted(by_bs) == ["1", "3"] and by_bs["1"]["steps"] == 1 and by_bs["3"]["steps"] == 2
        assert 20 <= by_bs["1"]["host_ms"]["mean"] < by_bs["3"]["host_ms"]["mean"]  # 20 ms against (40 + 60) / 2
    finally:
        DSparkWorkerV2.forward_batch_generation = original


def test_step_times_of_a_window_longer_than_the_run_are_still_written(monkeypatch, tmp_path):
    """A window that never reaches its end (e.g. 50:10000000, the whole run) rewrites its file every FLUSH_EVERY
    timed steps, so the server's file holds the steps so far when the run stops."""
    import json

    from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

    original = DSparkWorkerV2.__dict__["forward_batch_generation"]
    try:
        DSparkWorkerV2.forward_batch_generation = lambda self, batch, *a, **k: batch.tag
        monkeypatch.delenv("FT_PROFILE_STEPS", raising=False)
        monkeypatch.setenv("FT_STEP_TIMES", "1:10000000")
        monkeypatch.setenv("FT_PROFILE_OUT", str(tmp_path))
        plugin = harness_plugins.load("profile_steps")
        plugin.TimingRecorder.FLUSH_EVERY = 2
        plugin.register()
        worker = DSparkWorkerV2.__new__(DSparkWorkerV2)
        for i in range(1, 6):
            batch = types.SimpleNamespace(tag=i, forward_mode=Mode(), is_extend_in_batch=False, seq_lens=[0] * i)
            worker.forward_batch_generation(batch)
            files = list(tmp_path.glob("steps_*.json"))
            assert len(files) == (i >= 2)
            if files:
                result = json.loads(files[0].read_text())
                assert result["steps"] == i - i % 2 and len(result["by_bs"]) == i - i % 2
    finally:
        DSparkWorkerV2.forward_batch_generation = original


def test_counts_synchronisations_per_call_stack(monkeypatch, tmp_path):
    """FT_SYNC_STEPS: warnings raised inside the window's steps (torch's sync debug mode raises one per synchronizing
    CUDA call) are counted per call stack, naming the line that synced; steps outside the window are not counted."""
    import warnings

    from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

    original = DSparkWorkerV2.__dict__["forward_batch_generation"]

    def synced_here():
        warnings.warn("called a synchronizing CUDA operation")

    def stand_in(self, batch, *args, **kwargs):
        for _ in range(batch.syncs):
            synced_here()
        return batch.tag

    try:
        DSparkWorkerV2.forward_batch_generation = stand_in
        for var in ("FT_PROFILE_STEPS", "FT_STEP_TIMES"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("FT_SYNC_STEPS", "2:4")
        monkeypatch.setenv("FT_PROFILE_OUT", str(tmp_path))
        harness_plugins.load("profile_steps").register()
        worker = DSparkWorkerV2.__new__(DSparkWorkerV2)
        batches = [types.SimpleNamespace(tag=f"decode{i}", forward_mode=Mode(), is_extend_in_batch=False, syncs=i)
                   for i in range(1, 6)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the steps outside the window: their warnings are not the plugin's
            assert [worker.forward_batch_generation(b) for b in batches] == [b.tag for b in batches]
        (out,) = tmp_path.glob("syncs_*.txt")  # written at decode step 4: steps 2 and 3 (2 + 3 syncs) were watched
        lines = out.read_text().splitlines()
        assert lines[0] == "decode steps: 2; synchronisations: 5"
        assert lines[1].startswith("5x called a synchronizing CUDA operation @ ") and "(synced_here) <- " in lines[1]
        assert "(stand_in)" in lines[1] and len(lines) == 2
    finally:
        DSparkWorkerV2.forward_batch_generation = original


def test_loop_profile_and_trace_cover_the_scheduler_between_steps(monkeypatch, tmp_path):
    """FT_LOOP_PROFILE and FT_TRACE_STEPS measure the whole loop from step A's start to step B's start, work between
    the steps included (where a step's own cProfile sees none of it); with FT_STEP_TIMES on another window, all three
    write their results from one run."""
    import gzip
    import json

    import torch
    from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

    original = DSparkWorkerV2.__dict__["forward_batch_generation"]

    def stand_in(self, batch, *args, **kwargs):
        return batch.tag

    def scheduler_between_steps():
        return torch.ones(64, 64) @ torch.ones(64, 64)

    try:
        DSparkWorkerV2.forward_batch_generation = stand_in
        monkeypatch.delenv("FT_PROFILE_STEPS", raising=False)
        monkeypatch.delenv("FT_SYNC_STEPS", raising=False)
        monkeypatch.setenv("FT_STEP_TIMES", "1:3")
        monkeypatch.setenv("FT_LOOP_PROFILE", "3:6")
        monkeypatch.setenv("FT_TRACE_STEPS", "6:8")
        monkeypatch.setenv("FT_PROFILE_OUT", str(tmp_path))
        harness_plugins.load("profile_steps").register()
        worker = DSparkWorkerV2.__new__(DSparkWorkerV2)
        for i in range(1, 10):
            batch = types.SimpleNamespace(tag=f"decode{i}", forward_mode=Mode(), is_extend_in_batch=False)
            assert worker.forward_batch_generation(batch) == batch.tag
            scheduler_between_steps()
        assert json.loads(next(tmp_path.glob("steps_*.json")).read_text())["steps"] == 2
        (loop,) = tmp_path.glob("loop_*.txt")
        text = loop.read_text()
        assert text.startswith("decode steps profiled: 3; mean wall time per step (scheduler loop)")
        assert "scheduler_between_steps" in text and "stand_in" in text
        (trace,) = tmp_path.glob("trace_*.txt")
        lines = trace.read_text().splitlines()
        assert lines[0].startswith("decode steps traced: 2;")
        assert lines[1] == "device activity per step (kernels, copies, memsets): 0.0 launches, 0.0 us"  # CPU only
        mm = [line for line in lines if line.endswith("aten::mm")]
        assert mm and float(mm[0].split()[0]) == 1.0  # one matmul between each pair of traced steps
        (timeline,) = tmp_path.glob("trace_*.json.gz")
        assert "aten::mm" in gzip.decompress(timeline.read_bytes()).decode()
    finally:
        DSparkWorkerV2.forward_batch_generation = original


def test_step_device_times_read_incrementally_match_one_read(tmp_path):
    """Each dump reads only the events recorded since the last one; the device and between-step times of a recorder
    dumped after every few steps equal those of one read at the end (stand-in events carry their own clock)."""

    class Event:
        def __init__(self, t):
            self.t = t

        def elapsed_time(self, other):
            return other.t - self.t

        def synchronize(self):
            pass

    plugin = harness_plugins.load("profile_steps")
    clock = [0.0]

    def steps(recorder, n, dump_every):
        for i in range(n):
            start = Event(clock[0])
            clock[0] += 1.0 + (i % 3)  # the step
            recorder.events.append((start, Event(clock[0])))
            recorder.host_ms.append(0.5)
            recorder.sizes.append(1 + i % 2)
            clock[0] += 0.25 * (i % 4)  # the gap to the next step
            if dump_every and (i + 1) % dump_every == 0:
                recorder.dump(i + 1)
        return recorder.dump(n)

    clock[0] = 0.0
    once = steps(plugin.TimingRecorder(str(tmp_path)), 11, 0)
    clock[0] = 0.0
    incremental = plugin.TimingRecorder(str(tmp_path))
    assert steps(incremental, 11, 3) == once
    assert len(incremental.device_ms) == 11 and len(incremental.between_ms) == 10
    assert once["by_bs"]["1"]["steps"] == 6 and once["by_bs"]["2"]["steps"] == 5
