"""Drafters: prompt lookup, FlashMap (tiny random), oracle, and load_drafter's checks."""

from __future__ import annotations

import pytest
import torch

from flashtree.drafters import (
    DraftState,
    Drafter,
    OracleDrafter,
    PromptLookupDrafter,
    check_compatible,
    load_drafter,
)
from flashtree.models import load_target


@pytest.fixture(scope="module")
def tiny():
    return load_target("tiny-llama")[0]


def state_of(rows: list[list[int]], new_from=None, hidden=None) -> DraftState:
    """A DraftState of right-padded rows."""
    width = max(map(len, rows))
    tokens = torch.full((len(rows), width), -1, dtype=torch.long)
    for b, row in enumerate(rows):
        tokens[b, : len(row)] = torch.tensor(row)
    lengths = torch.tensor([len(row) for row in rows])
    new_from = torch.zeros_like(lengths) if new_from is None else torch.tensor(new_from)
    return DraftState(tokens=tokens, lengths=lengths, new_from=new_from, hidden=hidden or {})


# ---- prompt lookup ---------------------------------------------------------------------------------------------------


def test_prompt_lookup_copies_the_continuation_of_the_longest_most_recent_match():
    drafter = PromptLookupDrafter(vocab_size=100, k=4)
    # "7 8 9" occurs at 0 (continued by 1 2 3 4) and at 6 (continued by 5 6 ...); the suffix is "7 8 9".
    drafter.start(state_of([[7, 8, 9, 1, 2, 3, 7, 8, 9, 5, 6, 0, 7, 8, 9]]))
    blocks = drafter.propose(3).candidates[0].tolist()
    assert blocks[0] == [5, 6, 0, 7]  # most recent 3-gram match first
    assert blocks[1] == [1, 2, 3, 7]  # then the older one
    # third: no other distinct continuation among the 2-gram/1-gram matches -> the best one again
    assert blocks[2] == blocks[0]


def test_prompt_lookup_falls_back_to_shorter_ngrams_and_fills_with_the_best():
    drafter = PromptLookupDrafter(vocab_size=100, k=3)
    # suffix "4 9": no earlier "4 9"; 1-gram "9" occurs at 5 (-> 6 4 9) and at 1 (-> 2 3 5)
    drafter.start(state_of([[1, 9, 2, 3, 5, 9, 6, 4, 9]]))
    blocks = drafter.propose(4).candidates[0].tolist()
    assert blocks[:2] == [[6, 4, 9], [2, 3, 5]]
    assert blocks[2:] == [[6, 4, 9], [6, 4, 9]]


def test_prompt_lookup_repeats_a_loop_past_the_present():
    drafter = PromptLookupDrafter(vocab_size=100, k=7)
    drafter.start(state_of([[5, 1, 2, 1, 2, 1, 2]]))
    # the latest "1 2 1" ... match continues "2"; running into the present it keeps copying the period-2 loop
    assert drafter.propose(1).candidates[0, 0].tolist() == [1, 2, 1, 2, 1, 2, 1]


def test_prompt_lookup_without_any_match_repeats_the_anchor():
    drafter = PromptLookupDrafter(vocab_size=100, k=3)
    drafter.start(state_of([[1, 2, 3]]))
    assert drafter.propose(2).candidates.tolist() == [[[3, 3, 3], [3, 3, 3]]]


def test_prompt_lookup_batches_rows_of_different_lengths_and_follows_advance():
    drafter = PromptLookupDrafter(vocab_size=100, k=2)
    rows = [[4, 5, 6, 4], [1, 2, 1, 2, 3, 1]]
    drafter.start(state_of(rows))
    out = drafter.propose(1).candidates
    assert out.shape == (2, 1, 2) and out.dtype == torch.long
    assert out[:, 0].tolist() == [[5, 6], [2, 3]]
    rows = [rows[0] + [5], rows[1] + [2]]
    drafter.advance(state_of(rows, new_from=[4, 6]))
    assert drafter.propose(1).candidates[:, 0].tolist() == [[6, 4], [3, 1]]


def test_prompt_lookup_is_a_drafter_and_the_default():
    assert isinstance(PromptLookupDrafter(10), Drafter)
    target, _ = load_target("tiny-llama")
    drafter = load_drafter("default", target, k=5)
    assert isinstance(drafter, PromptLookupDrafter) and drafter.k == 5 and drafter.hidden_layers == ()
    assert drafter.vocab_size == target.config.vocab_size
    with pytest.raises(ValueError, match="k"):
        PromptLookupDrafter(10, k=0)
    with pytest.raises(RuntimeError, match="start"):
        PromptLookupDrafter(10).propose(2)


# ---- FlashMap --------------------------------------------------------------------------------------------------------


def hidden_states(target, ids: torch.Tensor, layers) -> dict[int, torch.Tensor]:
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    return {i: out.hidden_states[i + 1] for i in layers}


def test_flashmap_draws_n_noise_samples_in_one_call_matching_single_draws(tiny):
    import flashmap

    drafter = load_drafter("flashmap", tiny, seed=1)
    ids = torch.arange(40, 70)[None]
    full = hidden_states(tiny, ids, drafter.hidden_layers)
    # start at 12 committed tokens, then commit 5 more: the drafter's cache must equal one built in one go
    drafter.start(state_of([ids[0, :12].tolist()], hidden={i: h[:, :11] for i, h in full.items()}))
    drafter.advance(state_of([ids[0, :17].tolist()], new_from=[12], hidden={i: h[:, :16] for i, h in full.items()}))
    n, k, vocab = 5, drafter.k, drafter.vocab_size
    noise = torch.randn(1, n, k, vocab, generator=torch.Generator().manual_seed(0))
    logits = drafter.draft_logits(n, noise=noise)
    assert logits.shape == (1, n, k, vocab)

    model, features = drafter.model, torch.cat([full[i][:, :16] for i in drafter.hidden_layers], dim=-1)
    for j in range(n):
        cache = flashmap.FlashMapCache(model.config, 1, 32)
        model.extend_context(cache, features)
        embed, head = tiny.get_input_embeddings(), tiny.get_output_embeddings()
        single = model.draft(ids[:, 16], cache, embed, head, noise=noise[:, j])
        torch.testing.assert_close(logits[0, j], single[0], rtol=1e-5, atol=1e-5)

    # greedy candidates are each draw's argmax; different noise gives different blocks; a seed reproduces them
    first = drafter.propose(8, torch.Generator().manual_seed(3))
    again = drafter.propose(8, torch.Generator().manual_seed(3))
    assert first.probs is None and first.candidates.shape == (1, 8, k)
    assert torch.equal(first.candidates, again.candidates)
    assert len({tuple(block) for block in first.candidates[0].tolist()}) > 1


def test_flashmap_batches_requests_of_different_lengths(tiny):
    drafter = load_drafter("flashmap", tiny, seed=2)
    ids = torch.arange(20, 50)[None]
    full = hidden_states(tiny, ids, drafter.hidden_layers)
    rows = [ids[0, :9].tolist(), ids[0, :14].tolist()]
    padded = {i: torch.cat([h[:, :13], h[:, :13]]) for i, h in full.items()}  # row 0 only reads its first 8
    drafter.start(state_of(rows, hidden=padded))
    noise = torch.randn(2, 3, drafter.k, drafter.vocab_size, generator=torch.Generator().manual_seed(1))
    batched = drafter.draft_logits(3, noise=noise)
    for b, row in enumerate(rows):
        alone = load_drafter("flashmap", tiny, seed=2)
        alone.start(state_of([row], hidden={i: h[:, : len(row) - 1] for i, h in full.items()}))
        expected = alone.draft_logits(3, noise=noise[b : b + 1])[0]
        torch.testing.assert_close(batched[b], expected, rtol=1e-5, atol=1e-5)


def test_flashmap_sampled_blocks_come_with_their_distributions(tiny):
    drafter = load_drafter("flashmap", tiny, temperature=0.8)
    ids = torch.arange(60, 80)[None]
    hidden = {i: h[:, :19] for i, h in hidden_states(tiny, ids, drafter.hidden_layers).items()}
    drafter.start(state_of([ids[0].tolist()], hidden=hidden))
    proposal = drafter.propose(6, torch.Generator().manual_seed(0))
    assert proposal.probs.shape == (1, 6, drafter.k, drafter.vocab_size)
    torch.testing.assert_close(proposal.probs.sum(-1), torch.ones(1, 6, drafter.k))
    picked = proposal.probs.gather(-1, proposal.candidates[..., None])
    assert bool((picked > 0).all())
    # sampling, not argmax: over several draws some slot differs from its distribution's mode
    draws = [drafter.propose(6, torch.Generator().manual_seed(s)) for s in range(4)]
    assert any(not torch.equal(p.candidates, p.probs.argmax(-1)) for p in draws)


def test_flashmap_rejects_a_drafter_that_does_not_fit_the_target(tiny):
    from flashtree.drafters.flashmap_drafter import tiny_flashmap_config

    config = tiny_flashmap_config(tiny)
    config.vocab_size = 1000
    with pytest.raises(ValueError, match="vocabulary 1000"):
        load_drafter("flashmap", tiny, config=config)
    config = tiny_flashmap_config(tiny)
    config.target_hidden_size = 32
    with pytest.raises(ValueError, match="hidden size 32"):
        load_drafter("flashmap", tiny, config=config)
    with pytest.raises(ValueError, match="target_layer_ids"):
        load_drafter("flashmap", tiny, config={**tiny_flashmap_config(tiny).to_dict(), "target_layer_ids": [3]})
    drafter = load_drafter("flashmap", tiny)
    with pytest.raises(ValueError, match="lacks the target layers"):
        drafter.start(state_of([[1, 2, 3]]))


# ---- oracle ----------------------------------------------------------------------------------------------------------


def matched(block: list[int], truth: list[int]) -> int:
    depth = 0
    while depth < len(block) and block[depth] == truth[depth]:
        depth += 1
    return depth


def run_oracle(drafter: OracleDrafter, reference: list[int], prompt: int, n: int):
    """Teacher-forced walk: each step commits the best candidate's correct prefix + one token (W unbounded)."""
    length, steps = prompt, []
    drafter.start(state_of([reference[:length]]))
    while length < len(reference):
        blocks = drafter.propose(n).candidates[0].tolist()
        truth = reference[length : length + drafter.k]
        steps.append((blocks, truth))
        length = min(len(reference), length + max(matched(b, truth) for b in blocks) + 1)
        drafter.advance(state_of([reference[:length]]))
    return steps


def test_oracle_controls_acceptance_depth_and_branch_order():
    reference = torch.randint(0, 50, (400,), generator=torch.Generator().manual_seed(0)).tolist()
    drafter = OracleDrafter([reference], vocab_size=50, k=4, rate=0.4, seed=7)
    steps = run_oracle(drafter, reference, prompt=10, n=6)
    full = [(b, t) for b, t in steps if len(t) == 4]
    best = [max(matched(b, t) for b in blocks) for blocks, t in full]
    assert best == [c[0] for c in drafter.ceilings[: len(full)]]  # the deepest correct prefix is the ceiling
    assert set(best) == {0, 1, 2, 3, 4}  # accepted depths 0..K all occur
    not_first = not_top = 0
    for blocks, truth in full:
        for depth in range(1, max(matched(b, truth) for b in blocks)):
            # the children of the correct node at `depth`, in order of first appearance, with their votes
            under = [b for b in blocks if b[:depth] == truth[:depth]]
            children = list(dict.fromkeys(b[depth] for b in under))
            votes = {c: sum(b[depth] == c for b in under) for c in children}
            not_first += children[0] != truth[depth]
            not_top += max(votes.values()) > votes[truth[depth]]
    assert not_first > 0 and not_top > 0  # correct paths of depth >= 2 through non-first and outvoted branches
    # corrupted slots never hold the true token
    for blocks, truth in full:
        for block in blocks:
            depth = matched(block, truth)
            assert depth == 4 or block[depth] != truth[depth]


def test_oracle_is_deterministic_and_detects_divergence():
    reference = list(range(1, 60))
    a = run_oracle(OracleDrafter([reference], 64, k=3, seed=5), reference, 5, 4)
    b = run_oracle(OracleDrafter([reference], 64, k=3, seed=5), reference, 5, 4)
    c = run_oracle(OracleDrafter([reference], 64, k=3, seed=6), reference, 5, 4)
    assert a == b and a != c
    drafter = OracleDrafter([reference], 64, k=3)
    drafter.start(state_of([reference[:5]]))
    drafter.advance(state_of([reference[:6] + [0]]))
    assert drafter.divergence == (0, 6)
    strict = OracleDrafter([reference], 64, k=3, strict=True)
    strict.start(state_of([reference[:5]]))
    with pytest.raises(AssertionError, match="position 6"):
        strict.advance(state_of([reference[:6] + [0]]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        OracleDrafter([[1, 2, 99]], 64)


# ---- load_drafter ----------------------------------------------------------------------------------------------------


def test_load_drafter_names_and_errors(tiny):
    with pytest.raises(ValueError, match="default, prompt-lookup, flashmap, dspark, dflash, oracle"):
        load_drafter("eagle", tiny)
    with pytest.raises(ValueError, match="sequences"):
        load_drafter("oracle", tiny)
    oracle = load_drafter("oracle", tiny, sequences=[[1, 2, 3]], k=3)
    assert isinstance(oracle, OracleDrafter) and oracle.vocab_size == tiny.config.vocab_size
    with pytest.raises(ValueError, match="vocabulary is 10, the target's 259"):
        check_compatible(PromptLookupDrafter(10), tiny)
    lookup = PromptLookupDrafter(259)
    lookup.hidden_layers = (0, 7)
    with pytest.raises(ValueError, match=r"layers \[7\]"):
        check_compatible(lookup, tiny)


# ---- real model ------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_prompt_lookup_accepts_real_tokens_on_smollm2():
    """Teacher-forced on SmolLM2's own greedy answers: several candidates accept at least as much as one, and more
    than nothing (SmolLM2-135M dequantized from the Q4_1 GGUF)."""
    from flashtree.datasets import encode_prompts, load_prompts

    target, tokenizer = load_target("smollm2-135m")
    prompts = encode_prompts(tokenizer, load_prompts("builtin", limit=3))
    references = []
    for ids in prompts:
        with torch.no_grad():
            out = target.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)
        references.append((len(ids), out[0].tolist()))
    tau = {}
    for n in (1, 8):
        committed = steps = 0
        for prompt_length, reference in references:
            drafter = PromptLookupDrafter(target.config.vocab_size, k=8)
            length = prompt_length
            drafter.start(state_of([reference[:length]]))
            while length < len(reference):
                truth = reference[length : length + 8]
                blocks = drafter.propose(n).candidates[0].tolist()
                length = min(len(reference), length + max(matched(b, truth) for b in blocks) + 1)
                steps += 1
                drafter.advance(state_of([reference[:length]]))
            committed += len(reference) - prompt_length
        tau[n] = committed / steps
    assert 1.05 < tau[1] <= tau[8]


def test_flashmap_loads_a_saved_drafter_folder(tiny, tmp_path):
    saved = load_drafter("flashmap", tiny, seed=4)
    saved.model.save_pretrained(tmp_path / "drafter")
    loaded = load_drafter("flashmap", tiny, model=str(tmp_path / "drafter"))
    assert all(torch.equal(p, q) for p, q in zip(saved.model.parameters(), loaded.model.parameters()))
    with pytest.raises(OSError, match="local folder"):
        load_drafter("flashmap", tiny, model=str(tmp_path / "nowhere"))
    other, _ = load_target("tiny-llama")
    other.resize_token_embeddings(300)
    with pytest.raises(ValueError, match="vocabulary 259 != the target's 300"):
        load_drafter("flashmap", other, model=str(tmp_path / "drafter"))

