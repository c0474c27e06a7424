"""Configs of a dummy-weight target of a real model's shapes and of a DSPARK draft for it (`--load-format dummy`,
`--speculative-draft-load-format dummy`, `--skip-tokenizer-init`): config.json files only, no weights, no tokenizer."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}


@dataclass
class DummyShapes:
    """A target of a real model's shapes with no weights (`--load-format dummy`), and a DSPARK draft for it; the
    shapes of each preset are in flashtree/configs/live/model/*-dummy.yaml."""

    architecture: str  # qwen3 | llama
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    draft_layers: int
    draft_target_layers: int  # target layers the draft reads (spread over the target)
    markov_rank: int


def target_config(shapes: DummyShapes, dtype: str = "bfloat16") -> dict:
    """The HF config.json of the target (transformers' Qwen3Config / LlamaConfig fields)."""
    d = {
        "architectures": [ARCHITECTURES[shapes.architecture]],
        "model_type": shapes.architecture,
        "hidden_size": shapes.hidden_size,
        "intermediate_size": shapes.intermediate_size,
        "num_hidden_layers": shapes.num_hidden_layers,
        "num_attention_heads": shapes.num_attention_heads,
        "num_key_value_heads": shapes.num_key_value_heads,
        "head_dim": shapes.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6 if shapes.architecture == "qwen3" else 1e-5,
        "vocab_size": shapes.vocab_size,
        "max_position_embeddings": shapes.max_position_embeddings,
        "rope_theta": shapes.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": shapes.rope_theta},
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
    }
    if shapes.architecture == "llama":
        d["mlp_bias"] = False
    return d


def draft_config(shapes: DummyShapes, block_size: int):
    """A DSPARK draft of the target's hidden size and vocabulary (it borrows the target's embedding and LM head),
    reading `draft_target_layers` target layers spread over the target -> a flashtree.dspark DSparkConfig."""
    from flashtree.dspark.config import DSparkConfig, spread_layers  # (flashtree.dspark imports torch)

    return DSparkConfig(
        hidden_size=shapes.hidden_size,
        vocab_size=shapes.vocab_size,
        num_target_layers=shapes.num_hidden_layers,
        target_layer_ids=spread_layers(shapes.num_hidden_layers, shapes.draft_target_layers),
        num_hidden_layers=shapes.draft_layers,
        num_attention_heads=shapes.num_attention_heads,
        num_key_value_heads=shapes.num_key_value_heads,
        head_dim=shapes.head_dim,
        intermediate_size=shapes.intermediate_size,
        rope_theta=shapes.rope_theta,
        max_position_embeddings=shapes.max_position_embeddings,
        block_size=block_size,
        mask_token_id=shapes.vocab_size - 1,
        markov_rank=shapes.markov_rank,
        extra={"dummy": "no weights: serve with --speculative-draft-load-format dummy"},
    )


def write(shapes: DummyShapes, target_dir, draft_dir, block_size: int, algorithm: str = "DSPARK") -> tuple[Path, Path]:
    """Write both config.json files -> their paths. DFLASH: the draft's config in DFlashDraftModel's layout (the same
    network without the Markov head, a block of block_size + 1 rows)."""
    target = Path(target_dir) / "config.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(target_config(shapes), indent=1) + "\n")
    draft = draft_config(shapes, block_size)
    if algorithm != "DFLASH":
        return target, draft.save(draft_dir)
    from flashtree.dspark.dflash_format import dflash_hf_dict

    path = Path(draft_dir) / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dflash_hf_dict(draft), indent=1) + "\n")
    return target, path
