"""The pinned buffers of the step's host copies (statistics rows, planner credits) are reused, never while a copy
into them may still be in flight or while anything can still read them (flashtree/patches/host_copy.py)."""

from __future__ import annotations

import gc
import types

import torch

from flashtree.patches import host_copy
from flashtree.patches.host_copy import HostCopy, PinnedPool

KEY = (torch.Size([2, 4]), torch.int32, "cuda:0")


class Event:
    def __init__(self):
        self.done, self.records = True, 0

    def query(self) -> bool:
        return self.done

    def record(self):
        self.records += 1
        self.done = False  # in flight until the test says it landed

    def synchronize(self):
        self.done = True


class Host:
    def __init__(self):
        self.copied = []

    def copy_(self, src, non_blocking=False):
        assert non_blocking
        self.copied.append(src)


def fake_pool(keep=2):
    made = []

    def new(key):
        made.append(key)
        return Host(), Event()

    return PinnedPool(new=new, keep=keep), made


def test_an_idle_buffer_is_taken_again_only_once_its_copy_landed():
    pool, made = fake_pool()
    a = pool.take(KEY)
    a[1].record()
    pool.give(KEY, a)
    assert pool.take(KEY) is not a and len(made) == 2  # its copy may still be in flight
    a[1].done = True
    assert pool.take(KEY) is a and len(made) == 2
    assert pool.take(KEY) is not a and len(made) == 3
    other = (torch.Size([3, 4]), torch.int32, "cuda:0")
    pool.give(KEY, a)
    assert pool.take(other) is not a  # per shape


def test_at_most_keep_idle_buffers_per_shape():
    pool, _made = fake_pool(keep=2)
    for slot in [pool.take(KEY) for _ in range(5)]:
        pool.give(KEY, slot)
    assert len(pool.idle[KEY]) == 2


def test_a_host_copy_holds_its_buffer_until_it_is_dropped(monkeypatch):
    """Rows sglang has not collected yet keep their buffer; once dropped (and landed) the next step's copy reuses it,
    with its event re-recorded instead of a new one."""
    pool, made = fake_pool()
    monkeypatch.setattr(host_copy, "POOL", pool)
    device = types.SimpleNamespace(is_cuda=True, shape=KEY[0], dtype=KEY[1], device=KEY[2])
    first = HostCopy(device)
    second = HostCopy(device)
    assert len(made) == 2 and first.host is not second.host and first.host.copied == [device]
    assert not first.ready() and first.wait() is first.host and first.ready()
    slot = first._slot[1]
    del first
    gc.collect()
    third = HostCopy(device)
    assert len(made) == 2 and third._slot[1] is slot and slot[1].records == 2
    assert third.host is not second.host
