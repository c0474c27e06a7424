"""A speculative step stops where one-token decoding stops, on every supported release (real `Req` class).

sglang 0.5.17 checks max_new_tokens before the accepted tokens' stop tokens, so a step that accepts a stop token and
reaches the limit keeps the tokens after it; flashtree's servers install flashtree/patches/finish.py there. 0.5.20 and
0.5.23 already check stops first. The test feeds the same token stream to a request one token per step and in
multi-token steps, and asserts the same visible output and finish reason.
"""

from __future__ import annotations

import random
import types
from array import array

import pytest

import flashtree.patches as patches
from flashtree.patches.toggles import TreeToggles

STOP, LIMIT = 2, 12


def fresh_req():
    from sglang.srt.managers.schedule_batch import Req

    req = object.__new__(Req)
    attrs = dict(
        output_ids=array("q"), finished_reason=None, finished_len=None, to_finish=None, tokenizer=None,
        eos_token_ids={STOP}, vocab_size=100, grammar=None,
        sampling_params=types.SimpleNamespace(max_new_tokens=LIMIT, ignore_eos=False, stop_token_ids=set(),
                                              stop_strs=[], stop_regex_strs=[]),
    )
    for name, value in attrs.items():
        setattr(req, name, value)
    return req


def run(tokens, steps):
    """Feed `tokens` in chunks of `steps` sizes until the request finishes: (reason class, visible output)."""
    req, pos = fresh_req(), 0
    for size in steps:
        req.output_ids.extend(tokens[pos : pos + size])
        pos += size
        req.update_finish_state(size)
        if req.finished():
            break
    out = list(req.output_ids[: req.finished_len] if req.finished_len is not None else req.output_ids)
    return type(req.finished_reason).__name__, out


def cases():
    rng = random.Random(0)
    for stop_at in [None, 0, 5, LIMIT - 3, LIMIT - 2, LIMIT - 1, LIMIT]:
        tokens = [rng.randrange(3, 100) for _ in range(LIMIT + 8)]
        if stop_at is not None:
            tokens[stop_at] = STOP
        for _ in range(6):
            steps = [rng.randint(1, 6) for _ in range(LIMIT + 8)]
            yield tokens, steps


@pytest.mark.parametrize("toggles", [TreeToggles(exact_verify=True), TreeToggles(splitkv_verify=True),
                                     TreeToggles(tree_n=4)], ids=["exact", "splitkv", "tree"])
def test_multi_token_steps_stop_like_one_token_steps(sglang_release, toggles):
    patches.install(toggles)
    from sglang.srt.managers.schedule_batch import Req

    assert (sglang_release == "0.5.17") == patches.installer.is_flashtree(Req.__dict__["update_finish_state"])
    crossing = 0
    for tokens, steps in cases():
        want = run(tokens, [1] * len(tokens))
        assert run(tokens, steps) == want, (tokens, steps)
        crossing += want[0] == "FINISH_MATCHED_TOKEN" and len(want[1]) < LIMIT
    assert crossing > 0


def test_unpatched_only_0_5_17_keeps_the_token_after_the_stop(sglang_release):
    """The release behaviour the patch exists for: sglang alone, a stop accepted in the step that reaches the limit."""
    tokens = [5] * (LIMIT - 2) + [STOP, 7]
    if sglang_release == "0.5.17":
        assert run(tokens, [LIMIT - 4, 4]) == ("FINISH_LENGTH", tokens)
    else:
        assert run(tokens, [LIMIT - 4, 4]) == ("FINISH_MATCHED_TOKEN", tokens[:-1])
