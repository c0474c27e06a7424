"""CUDA host functions (flashtree/patches/host_funcs.py) without a GPU: the driver's entry point replaced by one that
calls the trampoline when the test says the stream got there, as the driver does on its own thread."""

from __future__ import annotations

import types

import pytest

from flashtree.patches.host_funcs import HostFuncs, side_work


class Driver:
    def __init__(self, rc: int = 0):
        self.rc, self.calls = rc, []

    def __call__(self, stream, fn, user_data):
        self.calls.append((stream.value, fn))
        return self.rc

    def reach(self):  # the stream reaches the queued host functions, in order
        calls, self.calls = self.calls, []
        for _stream, fn in calls:
            fn(None)


STREAM = types.SimpleNamespace(cuda_stream=0x1234)


def test_host_functions_run_in_queue_order_when_the_stream_reaches_them():
    driver, ran = Driver(), []
    funcs = HostFuncs(driver)
    for i in range(3):
        funcs.launch(STREAM, lambda i=i: ran.append(i))
    assert ran == [] and [s for s, _ in driver.calls] == [0x1234] * 3
    driver.reach()
    assert ran == [0, 1, 2]


def test_a_failed_host_function_is_raised_by_the_next_launch():
    driver = Driver()
    funcs = HostFuncs(driver)
    funcs.launch(STREAM, lambda: 1 / 0)
    funcs.launch(STREAM, lambda: None)
    driver.reach()  # the exception stays in the driver's thread: kept
    with pytest.raises(RuntimeError, match="host function failed.*ZeroDivisionError"):
        funcs.launch(STREAM, lambda: None)
    with pytest.raises(RuntimeError):
        funcs.check()


def test_a_refused_launch_raises_and_queues_nothing():
    funcs = HostFuncs(Driver(rc=1))
    with pytest.raises(RuntimeError, match="CUresult 1"):
        funcs.launch(STREAM, lambda: None)
    assert len(funcs._queued) == 0


def test_no_host_functions_without_a_gpu():
    import torch

    assert side_work(torch.device("cpu")) is None


def test_side_work_bounds_the_gil_wait(monkeypatch):
    """A host function waits for the GIL: with side work the switch interval drops below the verify it hides behind."""
    import sys

    import torch

    from flashtree.patches import host_funcs

    monkeypatch.setattr(torch.cuda, "Stream", lambda device: object())  # no CUDA stream on the CPU
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        host_funcs.SideWork(HostFuncs(lambda *a: 0), torch.device("cpu"))
        assert sys.getswitchinterval() <= host_funcs.SWITCH_INTERVAL_S
    finally:
        sys.setswitchinterval(before)
