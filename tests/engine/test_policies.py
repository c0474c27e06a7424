"""The engine and replay build every tree through the policy registry (`flashtree.tree.build_tree`)."""

from __future__ import annotations

import pytest
import torch

from flashtree.drafters import load_drafter
from flashtree.drafters.oracle import OracleDrafter
from flashtree.engine import tree_generate
from flashtree.engine.replay import record, replay
from flashtree.models import load_target
from flashtree.tree import POLICIES, UnknownPolicy, build_vote_tree
from flashtree.tree.policies import Policy

NEW = 24


@pytest.fixture
def first_candidate(monkeypatch):
    """A test policy: the chain of candidate 0 alone (the other N - 1 are drawn but never verified)."""
    calls = []

    def build(candidates, width, scores=None):
        calls.append(tuple(candidates.shape))
        return build_vote_tree(candidates[:, :1], width)

    monkeypatch.setitem(POLICIES, "first-candidate", Policy("first-candidate", build, (), "candidate 0's chain"))
    return calls


@pytest.fixture(scope="module")
def tiny():
    model, tok = load_target("tiny-llama")
    prompt = torch.tensor(tok.encode("1, 2, 3, 4, 1, 2, 3, 4, 1, 2,"))
    ref = model.generate(prompt.view(1, -1), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)[0]
    return model, prompt, ref


def test_engine_builds_through_the_named_policy_and_stays_lossless(tiny, first_candidate):
    model, prompt, ref = tiny
    drafter = OracleDrafter([ref.tolist()], model.config.vocab_size, k=4, rate=0.3, seed=1, strict=True)
    res = tree_generate(model, drafter, prompt, n=4, width=8, max_new_tokens=NEW, policy="first-candidate")
    assert torch.equal(res.sequences[0], ref)  # the target-only walk is exact for any tree
    assert first_candidate == [(1, 4, 4)] * len(res.steps)  # one build per step, over all N candidates
    assert {s.policy for s in res.steps} == {"first-candidate"}
    assert all(s.tree_size <= 4 for s in res.steps)  # one candidate's chain: at most K nodes of W - 1 = 7
    assert max(s.accept_len for s in res.steps) >= 2  # real acceptance went through the policy's trees
    vote = tree_generate(model, OracleDrafter([ref.tolist()], model.config.vocab_size, k=4, rate=0.3, seed=1,
                                              strict=True), prompt, n=4, width=8, max_new_tokens=NEW)
    assert {s.policy for s in vote.steps} == {"vote"} and max(s.tree_size for s in vote.steps) > 4


def test_replay_builds_through_the_named_policy_as_the_engine_does(tiny, first_candidate):
    model, prompt, _ = tiny
    drafter = load_drafter("default", model)
    rec = record(model, drafter, prompt.tolist(), n_max=4, max_new_tokens=NEW)
    direct = tree_generate(model, drafter, prompt, n=4, width=8, max_new_tokens=NEW, policy="first-candidate")
    built = len(first_candidate)
    replayed = replay(rec, 4, 8, policy="first-candidate")
    assert len(first_candidate) - built == len(replayed)
    fields = lambda steps: [(s.position, s.policy, s.accept_len, s.tree_size, s.accepted_path, s.oracle_len)  # noqa: E731
                            for s in steps]
    assert fields(replayed) == fields(direct.steps)


def test_unknown_policy_fails_before_any_work_listing_the_registered_names(tiny):
    model, prompt, ref = tiny

    class NoDraft(OracleDrafter):
        def propose(self, n, generator=None):
            raise AssertionError("drafted before the policy was checked")

    drafter = NoDraft([ref.tolist()], model.config.vocab_size, k=4)
    with pytest.raises(UnknownPolicy, match="registered: vote"):
        tree_generate(model, drafter, prompt, n=4, width=8, max_new_tokens=NEW, policy="nope")
    rec = record(model, load_drafter("default", model), prompt.tolist(), n_max=2, max_new_tokens=4)
    with pytest.raises(UnknownPolicy, match="registered: vote"):
        replay(rec, 2, 8, policy="nope")


def test_a_policy_that_reads_scores_needs_a_drafter_that_proposes_them(tiny):
    model, prompt, ref = tiny
    drafter = OracleDrafter([ref.tolist()], model.config.vocab_size, k=4)  # proposes tokens only
    with pytest.raises(ValueError, match="tree policy 'prob' needs the draft's logp"):
        tree_generate(model, drafter, prompt, n=4, width=8, max_new_tokens=NEW, policy="prob")
