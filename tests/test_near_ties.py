"""benchmarks/live/near_ties.py: the top-2 logit gap of each greedy step, on a tiny model."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "live"))

from near_ties import greedy_gaps  # noqa: E402

from flashtree.models import tiny_target  # noqa: E402


def test_gaps_are_the_greedy_steps_top_two_differences():
    model, tok = tiny_target("tiny-llama")
    ids = tok("a tiny prompt")["input_ids"]
    gaps = greedy_gaps(model, ids, 6, eos=None)
    assert len(gaps) == 6 and all(g >= 0 for g in gaps)
    # the same gaps from a step-by-step greedy decode of the same model
    seq = torch.tensor([ids])
    for g in gaps:
        with torch.no_grad():
            logits = model(seq).logits[0, -1]
        top = logits.topk(2).values
        assert abs(float(top[0] - top[1]) - g) < 1e-4
        seq = torch.cat([seq, logits.argmax().view(1, 1)], dim=1)
