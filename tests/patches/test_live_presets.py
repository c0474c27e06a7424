"""The 8B presets' dummy-weight configs (flashtree/configs/live/model/*-dummy.yaml, written by flashtree/live/dummy.py) as
sglang reads them: its HF config loader for the target and its DSPARK draft-config parser (block, Markov head, target
layers against the target's layer count), and the KV bytes per token the presets' memory check (flashtree/live/memory.py)
counts against sglang's own sizing of a DSPARK server's pool."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from flashtree.live import memory
from flashtree.live.dummy import DummyShapes, write

MODELS = Path(__file__).resolve().parents[2] / "flashtree" / "configs" / "live" / "model"


def shapes(preset: str) -> DummyShapes:
    """The preset's `dummy` shapes, over those of the preset it extends (its Hydra defaults)."""
    cfg = yaml.safe_load((MODELS / f"{preset}.yaml").read_text())
    base = {}
    for parent in cfg.get("defaults", []):
        if isinstance(parent, str) and parent != "_self_":
            base = {**shapes(parent).__dict__}
    return DummyShapes(**{**base, **cfg["dummy"]})


@pytest.mark.parametrize("preset, layers, vocab", [("qwen3-8b-dummy", 36, 151936), ("llama31-8b-dummy", 32, 128256)])
def test_sglang_parses_the_dummy_configs(tmp_path, preset, layers, vocab):
    from sglang.srt.speculative.dspark_components.dspark_config import parse_dspark_draft_config
    from sglang.srt.utils.hf_transformers_utils import get_config

    write(shapes(preset), tmp_path / "target", tmp_path / "draft", block_size=7)
    target = get_config(str(tmp_path / "target"), trust_remote_code=False)
    assert (target.num_hidden_layers, target.hidden_size, target.vocab_size) == (layers, 4096, vocab)
    assert (target.num_attention_heads, target.num_key_value_heads, target.head_dim) == (32, 8, 128)
    parsed = parse_dspark_draft_config(draft_hf_config=get_config(str(tmp_path / "draft"), trust_remote_code=False))
    assert parsed.num_target_layers == layers and parsed.num_hidden_layers == 1
    assert parsed.resolve_gamma() == 7 and parsed.require_markov() and parsed.markov_rank == 256
    assert parsed.mask_token_id == vocab - 1
    assert all(0 <= i <= layers - 2 for i in parsed.target_layer_ids)


@pytest.mark.parametrize("preset", ["qwen3-8b-dummy", "llama31-8b-dummy"])
def test_kv_bytes_per_token_as_sglang_sizes_a_dspark_pool(preset):
    from sglang.srt.speculative.dflash_utils import scale_kv_cell_size_per_token_for_dflash

    s = shapes(preset)
    target = memory.kv_bytes_per_token(s, speculative=False)
    assert memory.kv_bytes_per_token(s, speculative=True) == scale_kv_cell_size_per_token_for_dflash(
        target_cell_size_per_token=target, target_num_layers=s.num_hidden_layers, draft_num_layers=s.draft_layers)
