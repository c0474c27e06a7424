"""The stream's wait on a pinned host flag (flashtree/patches/host_flag.py): its tickets against a recording driver
entry point on the CPU; on a GPU (`pytest --noconftest tests/patches/test_host_flag.py` there), the driver's real wait
in a fresh process with eager module loading: work queued behind it, a copy from pinned rows and kernels' first
launches included, runs only after the release and reads what the host wrote before it; with lazy loading no flag is
made."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from flashtree.patches import host_flag
from flashtree.patches.host_flag import WAIT_GEQ, HostFlag

ROOT = Path(__file__).resolve().parents[2]


class Driver:
    def __init__(self, rc: int = 0):
        self.rc, self.calls = rc, []

    def __call__(self, stream, address, value, flags):
        self.calls.append((stream.value, address, value, flags))
        return self.rc


def cpu_flag(driver, start: int = 0):
    word = torch.tensor([start], dtype=torch.int32)
    return HostFlag(driver, word, 0xABC0), word


def test_tickets_count_up_and_the_release_writes_the_word(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: types.SimpleNamespace(cuda_stream=0x1234))
    driver = Driver()
    flag, word = cpu_flag(driver)
    assert [flag.wait(torch.device("cpu")) for _ in range(3)] == [1, 2, 3]
    assert driver.calls == [(0x1234, 0xABC0, t, WAIT_GEQ) for t in (1, 2, 3)]
    assert int(word[0]) == 0  # nothing released yet: the stream waits
    flag.release(2)
    assert int(word[0]) == 2


def test_tickets_wrap_in_32_bits(monkeypatch):
    """The word is an int32 the driver compares as (int32)(*addr - value) >= 0: a ticket past 2**31 is stored as its
    negative twin, and the count wraps to 0 after 2**32 - 1."""
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: types.SimpleNamespace(cuda_stream=1))
    driver = Driver()
    flag, word = cpu_flag(driver, start=-2)  # 0xFFFFFFFE
    assert flag.ticket == -2
    first = flag.wait(torch.device("cpu"))
    assert first == 0xFFFFFFFF and driver.calls[-1][2] == 0xFFFFFFFF
    flag.release(first)
    assert int(word[0]) == -1
    assert flag.wait(torch.device("cpu")) == 0


def test_a_refused_wait_raises_and_takes_no_ticket(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: types.SimpleNamespace(cuda_stream=1))
    flag, _word = cpu_flag(Driver(rc=801))
    with pytest.raises(RuntimeError, match="CUresult 801"):
        flag.wait(torch.device("cpu"))
    assert flag.ticket == 0


def test_no_flag_without_a_gpu():
    assert host_flag.host_flag(torch.device("cpu")) is None


def test_a_lazily_loading_driver_gets_no_flag(monkeypatch, caplog):
    """Lazy module loading (CUDA's default since 12.2) can synchronise the context at a kernel's first launch, which
    would wait for the held stream: no flag there, one warning naming the setting; an eager driver gets one."""
    addresses = []

    def device_ptr(out, pointer, flags):
        out._obj.value = 0xD000
        addresses.append(pointer.value)
        return 0

    for mode, made in [(2, False), (0, False), (host_flag.EAGER_LOADING, True)]:
        monkeypatch.setattr(host_flag, "driver_wait", lambda: (Driver(), device_ptr, lambda: mode))
        caplog.clear()
        flag = host_flag.host_flag(torch.device("cuda"))
        assert (flag is not None) == made
        assert ("needs eager CUDA module loading" in caplog.text) != made
    assert flag.address == 0xD000 and len(addresses) == 1


def test_the_overlap_turns_eager_loading_back_on_after_sglangs_setup(monkeypatch):
    """sglang 0.5.17's `_set_envs_and_config` sets CUDA_MODULE_LOADING=AUTO (lazy) for the processes it spawns, over the
    user's environment: with the overlap on, the launching process's function is wrapped so EAGER follows it, and
    installing it asks for EAGER in that process too. The plugin loads there before the launcher imports the engine
    (live run 59: no patch, the warning in every overlap server), so the launching process imports it; a spawned
    process does not (it inherits the variable). With the overlap off nothing is patched. (sglang's engine module does
    not import on a CPU box: a stand-in carries the function here, and the release's source is read for its name.)"""
    if not torch.cuda.is_available():
        import sglang_cpu  # noqa: F401  (sglang importable without a GPU)
    from flashtree.patches import adapters, plan
    from flashtree.patches.adapters.base import ENGINE
    from flashtree.patches.toggles import read_toggles

    source = Path(importlib.util.find_spec("sglang").submodule_search_locations[0], "srt/entrypoints/engine.py")
    assert "def _set_envs_and_config(server_args" in source.read_text()
    calls, imports = [], []

    def sglang_setup(server_args):
        calls.append(server_args)
        os.environ[host_flag.LOADING_ENV] = "AUTO"  # as sglang 0.5.17's launcher does

    stand_in = types.SimpleNamespace(_set_envs_and_config=sglang_setup)
    monkeypatch.setattr(plan, "import_engine", lambda: imports.append(ENGINE) or stand_in)
    adapter = adapters.select_adapter()
    tree, overlap = {"FLASHTREE_TREE_N": "8"}, {"FLASHTREE_TREE_N": "8", "FLASHTREE_GRAMMAR_OVERLAP": "1"}
    keys = lambda env: [p.key for p in plan.patches(adapter, read_toggles(env))]  # noqa: E731
    monkeypatch.delitem(sys.modules, ENGINE, raising=False)
    assert "engine._set_envs_and_config" not in keys(tree) and imports == []
    monkeypatch.setattr(plan.multiprocessing, "parent_process", lambda: object())  # a spawned process
    assert "engine._set_envs_and_config" not in keys(overlap) and imports == []
    monkeypatch.setattr(plan.multiprocessing, "parent_process", lambda: None)  # the launching process
    (patch,) = [p for p in plan.patches(adapter, read_toggles(overlap)) if p.key == "engine._set_envs_and_config"]
    assert imports == [ENGINE] and patch.owner is stand_in
    monkeypatch.setenv(host_flag.LOADING_ENV, "LAZY")
    wrapped = patch.make(getattr(patch.owner, patch.name))
    assert os.environ[host_flag.LOADING_ENV] == "EAGER"  # installed after sglang's setup: this process asks already
    os.environ[host_flag.LOADING_ENV] = "AUTO"
    wrapped("args")
    assert calls == ["args"] and os.environ[host_flag.LOADING_ENV] == "EAGER"
    monkeypatch.setitem(sys.modules, ENGINE, stand_in)  # imported already: patched without another import
    assert "engine._set_envs_and_config" in keys(overlap) and imports == [ENGINE]


WAIT_CHECK = """
import time, torch
from flashtree.patches import host_flag
device = torch.device("cuda")
flag = host_flag.host_flag(device)
assert flag is not None, "this driver cannot wait on host memory"
rows = torch.zeros(4, dtype=torch.int32, pin_memory=True)
x = torch.zeros(1, device=device)
torch.cuda.synchronize()
ticket = flag.wait(device)
copied = rows.to(device, non_blocking=True)  # reads the rows when the stream gets there
x.add_(1)  # the add kernel's first launch, behind the wait
done = torch.cuda.Event()
done.record()
time.sleep(0.05)
assert not done.query()  # held at the wait
rows.copy_(torch.arange(1, 5, dtype=torch.int32))
flag.release(ticket)
done.synchronize()
assert copied.tolist() == [1, 2, 3, 4] and x.item() == 1.0
again = flag.wait(device)  # the next ticket waits again
x.mul_(3)
done.record()
time.sleep(0.02)
assert not done.query()
flag.release(again)
done.synchronize()
assert x.item() == 3.0
print("released")
"""


def run_gpu_check(script: str, loading: str) -> subprocess.CompletedProcess:
    """A fresh process (the loading mode is read when CUDA starts), under a time limit: a stream that never gets past
    its wait shows as a timeout, not a hung suite."""
    env = dict(os.environ, CUDA_MODULE_LOADING=loading)
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120,
                          cwd=ROOT)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the driver's wait needs a GPU (run there with --noconftest)")
def test_the_stream_waits_for_the_release_and_copies_what_the_host_wrote():
    done = run_gpu_check(WAIT_CHECK, "EAGER")
    assert done.returncode == 0 and "released" in done.stdout, done.stderr[-2000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the driver's loading mode needs a GPU")
def test_lazy_loading_on_a_gpu_gets_no_flag():
    script = "import torch; from flashtree.patches import host_flag; print(host_flag.host_flag(torch.device('cuda')))"
    done = run_gpu_check(script, "LAZY")
    assert done.returncode == 0 and done.stdout.strip() == "None", done.stderr[-2000:]
