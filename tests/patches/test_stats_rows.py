"""Per-request tree statistics reach the response: sglang slices customized_info by output-token offsets, so the
tree step's one row per step must be padded to one entry per committed token (flashtree.patches.decode)."""

from __future__ import annotations

import random
import types

import torch

from flashtree.patches.decode import STATS_KEY, DeferredRows, make_collect_stats


def real_collect():
    from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor

    return SchedulerBatchResultProcessor._maybe_collect_customized_info


def decode(collect, depths: list[int], sends: set[int]):
    """One request through len(depths) tree steps after its prefill token, as sglang runs them: a step's tokens join
    output_ids, then customized_info is collected; the output streamer sends `values[sent : len(output_ids)]` at every
    output chunk (after the steps in `sends`, and at the end)."""
    req = types.SimpleNamespace(customized_info=None, output_ids=[0])
    sent, received = 0, []
    for step, depth in enumerate(depths):
        rows = torch.tensor([[8, 5, 7, depth], [8, 1, 7, 0]], dtype=torch.int32)  # request 0, and another request
        req.output_ids += [0] * (depth + 1)
        collect(None, 0, req, types.SimpleNamespace(customized_info={STATS_KEY: DeferredRows(rows)}))
        if step in sends or step == len(depths) - 1:
            received += req.customized_info[STATS_KEY][sent : len(req.output_ids)]
            sent = len(req.output_ids)
    return [r for r in received if r is not None]


def test_every_row_reaches_the_response_whatever_the_chunking():
    collect = make_collect_stats(real_collect())
    rng = random.Random(0)
    for _ in range(20):
        depths = [rng.randint(0, 7) for _ in range(rng.randint(1, 40))]
        sends = {s for s in range(len(depths)) if rng.random() < 0.3}
        assert decode(collect, depths, sends) == [[8, 5, 7, d] for d in depths]


def test_unpadded_rows_are_lost_when_chunks_arrive_mid_request():
    """The bug the padding fixes: sglang's own collection alone drops rows once tokens outrun steps."""
    depths, sends = [3, 3, 3, 3, 3, 3], {1, 3}
    got = decode(real_collect(), depths, sends)
    assert len(got) < len(depths)
    assert decode(make_collect_stats(real_collect()), depths, sends) == [[8, 5, 7, 3]] * 6


def test_other_customized_info_is_left_alone():
    collect = make_collect_stats(real_collect())
    req = types.SimpleNamespace(customized_info=None, output_ids=[0, 0, 0])
    collect(None, 0, req, types.SimpleNamespace(customized_info={"other": [[1], [2]]}))
    collect(None, 0, req, types.SimpleNamespace(customized_info=None))
    assert req.customized_info == {"other": [[1]]}
