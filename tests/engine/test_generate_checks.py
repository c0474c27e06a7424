"""tree_generate checks its arguments as the configs do: one ValueError naming the argument, never a silent fallback
(greedy, filter off, token 0) or a torch internal error."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def tiny():
    from flashtree.drafters import load_drafter
    from flashtree.models import load_target

    model, _ = load_target("tiny-llama")
    return model, load_drafter("prompt-lookup", model)


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=float("nan")), "temperature must be a finite number"),
    (dict(temperature=0.7, top_p=0.0), "top_p must be in (0, 1]"),
    (dict(temperature=0.7, top_p=1.5), "top_p must be in (0, 1]"),
    (dict(temperature=0.7, top_k=-1), "top_k must be an int >= 0"),
    (dict(n=0), "n (candidate blocks per step) must be an int >= 1, got 0"),
    (dict(n=2.5), "n (candidate blocks per step) must be an int >= 1, got 2.5"),
    (dict(width=1), "width must be an int >= 2"),
    (dict(input_ids=torch.tensor([[1.0, 2.0, 3.0]])), "input_ids must hold integer token ids, got dtype torch.float32"),
    (dict(input_ids=[[1.5, 2.0]]), "input_ids must hold integer token ids"),
    (dict(input_ids=torch.tensor([[1, 2, 10**6]])), "input_ids holds token id 1000000, outside the vocabulary"),
    (dict(input_ids=torch.tensor([[1, -2, 3]])), "input_ids holds a negative token id (-2)"),
])
def test_bad_arguments_raise_one_clear_error(tiny, kwargs, message):
    from flashtree.engine import tree_generate

    model, drafter = tiny
    args = dict(input_ids=torch.tensor([[1, 2, 3, 4]]), n=2, width=4, max_new_tokens=4) | kwargs
    with pytest.raises(ValueError) as err:
        tree_generate(model, drafter, args.pop("input_ids"), **args)
    assert message in str(err.value)


def test_a_drafter_with_no_block_is_refused(tiny):
    from flashtree.engine import tree_generate

    model, drafter = tiny
    drafter.k, k = 0, drafter.k
    try:
        with pytest.raises(ValueError, match=r"\.k \(the drafter's block length K\) must be an int >= 1, got 0"):
            tree_generate(model, drafter, torch.tensor([[1, 2, 3]]), n=2, width=4, max_new_tokens=4)
    finally:
        drafter.k = k


def test_the_context_limit_message_quotes_the_users_max_new_tokens(monkeypatch):
    """The sweep's warm-up generates 4 tokens first; the message must quote what the user asked for (8)."""
    from flashtree.datasets import encode_prompts, load_prompts
    from flashtree.experiments.config import (DatasetConfig, DrafterConfig, EngineConfig, LoggerConfig, RunConfig,
                                              TargetConfig, TreeConfig)
    from flashtree.experiments.run import generate_prompts, load

    cfg = RunConfig(target=TargetConfig(name="tiny-llama"), drafter=DrafterConfig(), tree=TreeConfig(n=2, width=4),
                    dataset=DatasetConfig(limit=1), engine=EngineConfig(max_new_tokens=8),
                    logger=LoggerConfig(progress=False))
    model, tokenizer = load(cfg)
    prompt = len(encode_prompts(tokenizer, load_prompts("builtin", limit=1))[0])
    monkeypatch.setattr(model.config, "max_position_embeddings", prompt + 5)  # too short for the warm-up too
    with pytest.raises(ValueError, match=f"prompt of {prompt} tokens \\+ max_new_tokens 8 \\+ width 4 exceeds"):
        generate_prompts(cfg, "x")
