"""FLASHTREE_PROFILE_HOST: cProfile over decode steps N + 1 to 2N, the host's busiest functions logged once."""

from __future__ import annotations

import logging
import time

from flashtree.patches.host_profile import HostProfile
from flashtree.patches.toggles import read_toggles


def scheduler_work():  # stands in for what the scheduler does between two decode steps
    end = time.perf_counter() + 0.002
    while time.perf_counter() < end:
        pass


def warmup_work():  # only before the profiled steps: must not be in the report
    time.sleep(0.001)


def test_profiles_the_second_n_steps_only_and_logs_the_busiest_functions(caplog):
    profile = HostProfile(steps=3)
    with caplog.at_level(logging.INFO, logger="flashtree.patches"):
        for step in range(1, 10):
            profile.on_decode_step()
            assert (profile.profile is not None) == (4 <= step <= 6)  # on from step 4's start to step 7's
            (scheduler_work if 4 <= step <= 6 else warmup_work)()
    reports = [r.getMessage() for r in caplog.records if "flashtree host profile" in r.getMessage()]
    assert len(reports) == 1
    report = reports[0]
    assert report.startswith("flashtree host profile over decode steps 4-6")
    assert "top 30 by own time" in report and "top 30 by cumulative time" in report
    assert "(scheduler_work)" in report and "(warmup_work)" not in report
    cumulative = report.split("by cumulative time")[1]
    line = next(x for x in cumulative.splitlines() if "(scheduler_work)" in x)
    ms, calls = (float(v) for v in line.split()[:2])
    assert calls == 1.0 and 1.5 < ms < 20  # one 2 ms call per step, its time checks included
    per_step = float(report.splitlines()[0].split(", ")[-1].split()[0])
    assert per_step >= ms


def test_the_toggle():
    assert read_toggles({"FLASHTREE_TREE_N": "4", "FLASHTREE_PROFILE_HOST": "200"}).profile_host == 200
    assert read_toggles({"FLASHTREE_TREE_N": "4"}).profile_host == 0
