"""Greedy tree decoding reproduces the target's own greedy decoding, token for token."""

from collections import Counter

import pytest
import torch

from flashtree.drafters.oracle import OracleDrafter
from flashtree.engine import tree_generate
from flashtree.models import load_target

PROMPTS = ["hello world, hello", "def f(x):\n    return", "1, 2, 3, 4,", "The cat sat on the mat. The dog"]
NEW = 48


@pytest.fixture(scope="module")
def tiny():
    model, tok = load_target("tiny-llama")
    prompts = [torch.tensor(tok.encode(p)) for p in PROMPTS]
    refs = [model.generate(p.view(1, -1), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)[0] for p in prompts]
    return model, prompts, refs


@pytest.mark.parametrize("n,width", [(1, 4), (1, 16), (4, 4), (4, 16), (8, 4), (8, 16)])
def test_tree_generate_equals_greedy_on_tiny_model(tiny, n, width):
    model, prompts, refs = tiny
    histogram, off_first_branch, depth_rejections = Counter(), 0, Counter()
    for i, (p, ref) in enumerate(zip(prompts, refs)):
        drafter = OracleDrafter([ref.tolist()], model.config.vocab_size, k=4, rate=0.3, seed=10 * n + i, strict=True)
        res = tree_generate(model, drafter, p, n=n, width=width, max_new_tokens=NEW)
        assert torch.equal(res.sequences[0], ref)
        assert res.new_tokens == [NEW]
        for s, ceilings in zip(res.steps, drafter.ceilings):
            histogram[s.accept_len] += 1
            off_first_branch += s.accept_len >= 2 and s.accepted_path != tuple(range(1, s.accept_len + 1))
            if s.accept_len < ceilings[0]:
                depth_rejections[s.accept_len] += 1  # the tree held more than it accepted
            if s.accept_len < drafter.k:
                assert s.accept_len <= ceilings[0]
        assert res.acceptance_length == pytest.approx(sum(s.accept_len + 1 for s in res.steps) / len(res.steps))
    # the walk was exercised: rejections at every depth, deep acceptances, and (for trees) other branches
    assert all(histogram[d] > 0 for d in range(0, 4)), histogram
    if n > 1 and width > 4:
        assert off_first_branch > 0


def test_batched_prompts_of_different_lengths(tiny):
    model, prompts, refs = tiny
    drafter = OracleDrafter([r.tolist() for r in refs], model.config.vocab_size, k=4, rate=0.3, seed=3, strict=True)
    res = tree_generate(model, drafter, [p.tolist() for p in prompts], n=4, width=8, max_new_tokens=NEW, pad_token_id=-1)
    for b, ref in enumerate(refs):
        assert res.sequences[b, : ref.numel()].tolist() == ref.tolist()
        assert (res.sequences[b, ref.numel() :] == -1).all()
    assert {s.request for s in res.steps} == set(range(len(prompts)))


def test_stop_tokens_end_the_request(tiny):
    model, prompts, refs = tiny
    ref = refs[0]
    stop = int(ref[prompts[0].numel() + 5])  # the 6th generated token
    drafter = OracleDrafter([ref.tolist()], model.config.vocab_size, k=4, seed=0)
    res = tree_generate(model, drafter, prompts[0], n=4, width=8, max_new_tokens=NEW, stop_token_ids=[stop])
    out = res.sequences[0].tolist()
    first = ref.tolist().index(stop, prompts[0].numel())
    assert out == ref[: first + 1].tolist()


def test_bad_input_fails_before_any_work(tiny):
    model, prompts, refs = tiny
    drafter = OracleDrafter([refs[0].tolist()], model.config.vocab_size, k=4)
    with pytest.raises(ValueError, match="width"):
        tree_generate(model, drafter, prompts[0], n=4, width=1, max_new_tokens=8)
    with pytest.raises(ValueError, match="n \\(candidate"):
        tree_generate(model, drafter, prompts[0], n=0, width=4, max_new_tokens=8)
    too_long = torch.zeros(model.config.max_position_embeddings, dtype=torch.long)
    with pytest.raises(ValueError, match="context"):
        tree_generate(model, drafter, too_long, n=4, width=4, max_new_tokens=8)
    wrong_vocab = OracleDrafter([[1, 2, 3]], model.config.vocab_size + 5, k=4)
    with pytest.raises(ValueError, match="vocabulary"):
        tree_generate(model, wrong_vocab, prompts[0], n=4, width=4, max_new_tokens=8)
