"""The 8B presets' dummy-weight configs load as transformers' Qwen3 / Llama configs and pass flashtree's DSPARK
config checks (tests/patches/test_live_presets.py reads them with sglang 0.5.17's own parser)."""

from __future__ import annotations

import json

import pytest

from flashtree.dspark.config import DSparkConfig
from flashtree.live.config import to_live_config
from flashtree.live.dummy import write

from .helpers import compose


@pytest.mark.parametrize("preset, cls, layers, inter, vocab", [
    ("qwen3-8b-dummy", "Qwen3Config", 36, 12288, 151936),
    ("llama31-8b-dummy", "LlamaConfig", 32, 14336, 128256),
])
def test_dummy_configs(tmp_path, preset, cls, layers, inter, vocab):
    import transformers

    cfg = to_live_config(compose(f"+preset={preset}", f"live.work_dir={tmp_path}"))
    target_file, draft_file = write(cfg.model.dummy, cfg.model.target, cfg.model.draft, cfg.model.draft_block_size)
    assert target_file.parent == tmp_path / "models" / preset / "target"
    t = getattr(transformers, cls).from_pretrained(target_file.parent)
    assert (t.num_hidden_layers, t.hidden_size, t.num_attention_heads, t.num_key_value_heads, t.head_dim,
            t.intermediate_size, t.vocab_size) == (layers, 4096, 32, 8, 128, inter, vocab)
    assert t.tie_word_embeddings is False
    raw = json.loads(draft_file.read_text())
    assert raw["num_target_layers"] == raw["dflash_config"]["num_target_layers"] == layers
    assert raw["architectures"] == ["DSparkDraftModel"] and raw["markov_rank"] == 256
    d = DSparkConfig.load(draft_file.parent)  # flashtree's own checks (layer ids capturable, mask id in vocab, ...)
    assert (d.num_hidden_layers, d.block_size, d.hidden_size, d.vocab_size) == (1, 7, 4096, vocab)
    assert max(d.target_layer_ids) <= layers - 2 and len(d.target_layer_ids) == 5
    assert not (target_file.parent / "tokenizer.json").exists() and not list(target_file.parent.glob("*.safetensors"))
