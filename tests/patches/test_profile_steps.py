"""The live profiling harness plugin (benchmarks/live/profile_steps.py) against sglang's real DSparkWorkerV2."""

from __future__ import annotations

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
    """FT_STEP_TIMES: the same window, timed without cProfile (host time per step; CUDA events where there is a GPU)."""
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
        monkeypatch.setenv("FT_STEP_TIMES", "1:3")
        monkeypatch.setenv("FT_PROFILE_OUT", str(tmp_path))
        harness_plugins.load("profile_steps").register()
        worker = DSparkWorkerV2.__new__(DSparkWorkerV2)
        batches = [types.SimpleNamespace(tag="prefill", forward_mode=Mode(True), is_extend_in_batch=True, sleep=0.2)]
        batches += [types.SimpleNamespace(tag=f"decode{i}", forward_mode=Mode(), is_extend_in_batch=False,
                                          sleep=0.02 * i) for i in range(1, 4)]
        assert [worker.forward_batch_generation(b) for b in batches] == [b.tag for b in batches]
        (out,) = tmp_path.glob("steps_*.json")  # written at decode step 3: steps 1 and 2 (20 and 40 ms) were timed
        result = json.loads(out.read_text())
        assert result["steps"] == 2 and not list(tmp_path.glob("profile_*.txt"))
        assert 20 <= result["host_ms"]["mean"] < 150 and result["host_ms"]["median"] >= 20  # the 200 ms prefill is not in
    finally:
        DSparkWorkerV2.forward_batch_generation = original
