"""Replay of the probability policies from one recording equals direct runs, step for step: `prob` from the recorded
log-probabilities, `best-first` from its trees recorded at the widest width (narrower ones are their prefixes)."""

from pathlib import Path

import pytest
import torch

from flashtree.drafters import load_drafter
from flashtree.engine import tree_generate
from flashtree.engine.replay import record, replay
from tests.test_dspark import random_model, small_config

RECORDING = Path(__file__).resolve().parents[2] / "benchmarks" / "recordings" / "smollm2-dspark-gsm8k.pt"


@pytest.fixture(scope="module")
def setup():
    from flashtree.models import load_target

    tiny = load_target("tiny-llama")[0]
    cfg = small_config(tiny)
    drafter = load_drafter("dspark", tiny, model=random_model(cfg, std=0.05), temperature=0.0)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    rec = record(tiny, drafter, prompt, n_max=4, max_new_tokens=16, grown_width=8)
    return tiny, drafter, prompt, rec


def test_a_scored_recording_holds_logp_and_grown_trees(setup):
    _, _, _, rec = setup
    positions = rec.candidates.shape[0]
    assert rec.logp.shape == rec.candidates.shape and rec.logp.dtype == torch.float16
    tokens, parents = rec.grown["best-first"]
    assert tokens.shape == parents.shape == (positions, 7)


@pytest.mark.parametrize("policy,width", [("vote", 8), ("prob", 4), ("best-first", 4), ("best-first", 8)])
def test_replay_equals_direct(setup, policy, width):
    tiny, drafter, prompt, rec = setup
    direct = tree_generate(tiny, drafter, torch.tensor([prompt]), n=4, width=width, max_new_tokens=16, policy=policy)
    replayed = replay(rec, 4, width, policy)
    key = lambda steps: [(s.position, s.accept_len, s.tree_size, s.accepted_path) for s in steps]  # noqa: E731
    assert key(replayed) == key(direct.steps)


def test_a_width_beyond_the_recorded_trees_is_refused(setup):
    *_, rec = setup
    with pytest.raises(ValueError, match="holds its trees up to 8 tokens"):
        replay(rec, 4, 16, "best-first")


@pytest.mark.parametrize("policy", ["vote", "prob", "best-first"])
def test_the_prompts_replayed_together_are_each_replayed_alone(policy):
    """`replay_all` walks every prompt of a recording in one batch: each prompt's steps are those of its own replay
    (the shipped SmolLM2 recording, prompts of different lengths finishing at different steps)."""
    from flashtree.engine.replay import Recording, replay_all

    shipped = torch.load(RECORDING, weights_only=False)["recordings"][:6]
    recs = [Recording(**r) for r in shipped]
    assert len({r.end - r.prompt_len for r in recs}) > 1
    for n, width in [(1, 4), (8, 16), (32, 33)]:
        together = replay_all(recs, n, width, policy)
        assert together == [replay(rec, n, width, policy) for rec in recs]
