"""The tree step's tensor-parallel sync (flashtree/patches/tp_sync.py): two gloo processes, each with its own random
candidates and draws, hold rank 0's after the sync; the agreement check passes on equal commits and stops both ranks
with one error naming the steps on different ones. At TP 1 (no group) nothing happens."""

from __future__ import annotations

import datetime
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flashtree.patches import tp_sync
from flashtree.patches.tp_sync import TpDivergence, TpSync


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=15))
    try:
        tp_sync.CHECK_EVERY = 2  # a spawned process: the module's constant, not the parent's
        sync = TpSync(dist.group.WORLD)
        gen = torch.Generator().manual_seed(100 + rank)
        candidates = torch.randint(0, 1000, (3, 4, 5), generator=gen)
        draws = torch.randint(0, 1000, (3, 6), generator=gen)
        lengths = torch.tensor([rank + 2]).expand(3)  # an expanded (non-dense) tensor, as a simulated length is
        sent = [t.clone() for t in (candidates, draws, lengths)]
        got = [sync.from_first(t) for t in (candidates, draws, lengths)]
        tokens = torch.arange(12).view(3, 4)
        lens = torch.tensor([1, 4, 2])
        sync.committed(tokens, lens, 1)
        sync.committed(tokens, lens, 2)  # a check: equal commits
        sync.committed(tokens, lens, 3)
        error = None
        try:  # rank 1 commits one more token at step 4: the check at step 4 must stop both ranks
            sync.committed(tokens, lens + torch.tensor([0, 0, rank]), 4)
        except TpDivergence as err:
            error = str(err)
        out[rank] = {"sent": sent, "got": got, "error": error, "checked": sync.checked}
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(60)
def test_two_gloo_ranks_take_rank_zeros_draws_and_catch_a_divergence():
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(_free_port(), out), nprocs=2, join=True)  # a failing or hung rank raises here
        out = dict(out)
    sent0 = out[0]["sent"]
    assert not torch.equal(sent0[0], out[1]["sent"][0]) and not torch.equal(sent0[1], out[1]["sent"][1])
    for rank in (0, 1):
        for want, got in zip(sent0, out[rank]["got"]):
            assert torch.equal(got, want)
        assert out[rank]["checked"] == 2  # the check at step 2 passed; step 4's failed
        assert out[rank]["error"] == out[0]["error"]
    assert out[0]["error"].startswith(
        "flashtree: tensor-parallel ranks committed different tokens between tree steps 3 and 4 (checksums from ")


def test_tp1_does_nothing():
    sync = TpSync(None)
    candidates = torch.randint(0, 9, (2, 3, 4))
    assert sync.from_first(candidates) is candidates
    for step in range(1, 130):
        sync.committed(torch.zeros(2, 5, dtype=torch.long), torch.ones(2, dtype=torch.int32), step)
    assert sync.checksum is None and sync.checked == 0


class Recorder:
    """torch.distributed as the tree step's sync sees it on the first rank of a TP group: broadcasts leave the tensor
    as it is, the all-reduce of an agreeing group too; every call is recorded."""

    ReduceOp = dist.ReduceOp

    def __init__(self):
        self.calls = []

    def get_global_rank(self, group, rank):
        return 0

    def broadcast(self, tensor, src, group):
        self.calls.append(("broadcast", tuple(tensor.shape), tensor.dtype))

    def all_reduce(self, tensor, op, group):
        self.calls.append(("all_reduce", tuple(tensor.shape), tensor.dtype))


@pytest.mark.parametrize("sampled", [False, True])
def test_tree_step_syncs_candidates_draws_and_checks_commits(monkeypatch, sampled):
    """Through the tree step on stand-ins (test_decode_cpu.run) with a TP group: each step broadcasts the candidates
    (bs, N, K) after the draws and, in a sampled batch, the walk's per-node draws (bs, W) before the walk; every
    CHECK_EVERY steps one all-reduce of the checksum. Greedy rows still equal the sequential greedy decode."""
    import types

    from test_decode_cpu import W, run

    from flashtree.patches.adapters.base import SglangAdapter

    recorder = Recorder()
    monkeypatch.setattr(tp_sync, "dist", recorder)
    monkeypatch.setattr(tp_sync, "CHECK_EVERY", 2)
    monkeypatch.setattr(SglangAdapter, "tp_group", lambda self, worker: "tp-group")
    info = None
    if sampled:
        top_ks = torch.tensor([1, 1 << 30, 1], dtype=torch.int32)
        info = types.SimpleNamespace(is_all_greedy=False, temperatures=torch.tensor([[1.0], [0.7], [1.0]]),
                                     top_ks=top_ks, top_ps=torch.ones(3))
    _accepts, state, _generated, _world = run(n=4, steps=4, sampling_info=info)
    assert state.steps == 4 and state.tp.checked == 4
    step = [("broadcast", (3, 4, W - 1), torch.int64)] + [("broadcast", (3, W), torch.int64)] * sampled
    check = [("all_reduce", (2,), torch.int64)]
    assert recorder.calls == (step + step + check) * 2
