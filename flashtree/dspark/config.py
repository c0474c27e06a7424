"""The DSPARK draft's architecture, and its `config.json` in the layout sglang's DSparkDraftModel reads.

sglang (0.5.17 to 0.5.23) builds a dense DSPARK draft from a Qwen3-style HF config with `architectures:
["DSparkDraftModel"]`, `dflash_config: {target_layer_ids, mask_token_id, block_size, num_target_layers}`,
`markov_rank > 0` and `markov_head_type`. The draft borrows the target's embedding and LM head, so its hidden size
and vocabulary are the target's; `fc` maps len(target_layer_ids) * H -> H.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..files import load_json

CONFIG_FILE = "config.json"
ARCHITECTURE = "DSparkDraftModel"


@dataclass
class DSparkConfig:
    """Architecture of a DSPARK block drafter.

    block_size: draft tokens per block (sglang's gamma; serve with --speculative-num-draft-tokens block_size + 1).
        The block is [anchor, mask x (block_size - 1)] at positions anchor .. anchor + block_size - 1; the output row j
        proposes the token at position anchor + 1 + j (sglang's `sample_from_anchor`).
    target_layer_ids: target layers read as context (HF `hidden_states[i + 1]`, i.e. the output of layer i; sglang
        captures them before layer i + 1, so for a Llama target every id is <= num_target_layers - 2).
    mask_token_id: the target-vocabulary token that fills the block after the anchor (embedded by the target).
    markov_rank: rank R of the Markov head: step bias = markov_w2 @ markov_w1[previous token], both (V, R).
    """

    hidden_size: int
    vocab_size: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    num_hidden_layers: int = 3
    num_attention_heads: int = 9
    num_key_value_heads: int = 3
    head_dim: int = 64
    intermediate_size: int = 1536
    rms_norm_eps: float = 1e-6
    rope_theta: float = 100000.0
    max_position_embeddings: int = 8192
    block_size: int = 8
    mask_token_id: int = 0
    markov_rank: int = 32
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    extra: dict = field(default_factory=dict)  # provenance written under "flashtree" in config.json

    def __post_init__(self) -> None:
        self.target_layer_ids = tuple(int(i) for i in self.target_layer_ids)
        problems = []
        if self.block_size < 1:
            problems.append(f"block_size={self.block_size} must be >= 1")
        if self.markov_rank < 1:
            problems.append(f"markov_rank={self.markov_rank} must be >= 1 (sglang's DSPARK requires a Markov head)")
        if not self.target_layer_ids:
            problems.append("target_layer_ids must name at least one target layer")
        bad = [i for i in self.target_layer_ids if not 0 <= i <= self.num_target_layers - 2]
        if bad:
            problems.append(
                f"target_layer_ids {bad} outside 0..{self.num_target_layers - 2} (sglang captures layer i before "
                f"layer i + 1 of the target's {self.num_target_layers})"
            )
        if not 0 <= self.mask_token_id < self.vocab_size:
            problems.append(f"mask_token_id={self.mask_token_id} is outside the vocabulary of {self.vocab_size}")
        if self.num_attention_heads % self.num_key_value_heads:
            problems.append(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if problems:
            raise ValueError("bad DSPARK draft config: " + "; ".join(problems))

    @property
    def context_size(self) -> int:
        return len(self.target_layer_ids) * self.hidden_size

    @classmethod
    def for_target(cls, target, **overrides) -> "DSparkConfig":
        """A config fitting a transformers causal LM `target` (hidden size, vocabulary, layer count, special ids)."""
        text = target.config.get_text_config()
        vocab = int(target.get_output_embeddings().weight.shape[0])
        layers = int(text.num_hidden_layers)
        defaults = dict(
            hidden_size=int(text.hidden_size),
            vocab_size=vocab,
            num_target_layers=layers,
            target_layer_ids=spread_layers(layers, 5),
            bos_token_id=_int_or_none(getattr(text, "bos_token_id", None)),
            eos_token_id=_int_or_none(getattr(text, "eos_token_id", None)),
        )
        defaults.update(overrides)
        return cls(**defaults)

    # ---- sglang's config.json -------------------------------------------------------------------------------------

    def to_hf_dict(self, dtype: str = "bfloat16") -> dict:
        d = {
            "architectures": [ARCHITECTURE],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "attention_bias": False,
            "tie_word_embeddings": False,
            "torch_dtype": dtype,
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "dflash_config": {
                "target_layer_ids": list(self.target_layer_ids),
                "mask_token_id": self.mask_token_id,
                "block_size": self.block_size,
                "num_target_layers": self.num_target_layers,
            },
            "markov_rank": self.markov_rank,
            "markov_head_type": "vanilla",
            "sample_from_anchor": True,
            # No confidence head is trained: serve with SGLANG_RAGGED_VERIFY_MODE=static (sglang's default).
            "enable_confidence_head": False,
        }
        if self.bos_token_id is not None:
            d["bos_token_id"] = self.bos_token_id
        if self.eos_token_id is not None:
            d["eos_token_id"] = self.eos_token_id
        if self.extra:
            d["flashtree"] = self.extra
        return d

    @classmethod
    def from_hf_dict(cls, d: dict) -> "DSparkConfig":
        if ARCHITECTURE not in (d.get("architectures") or []):
            raise ValueError(f"not a DSPARK draft config: architectures={d.get('architectures')!r}")
        head = str(d.get("markov_head_type", "vanilla")).lower()
        if head != "vanilla":
            raise ValueError(f"markov_head_type={head!r}: flashtree's DSPARK drafter implements the vanilla head only")
        if not d.get("sample_from_anchor", True):
            raise ValueError("sample_from_anchor=false drafts are not supported (the anchor row must propose)")
        dflash = d.get("dflash_config") or {}
        block = dflash.get("block_size", d.get("block_size"))
        layers = dflash.get("target_layer_ids", d.get("target_layer_ids"))
        mask = dflash.get("mask_token_id", d.get("mask_token_id"))
        if block is None or layers is None or mask is None:
            raise ValueError("DSPARK config lacks dflash_config.block_size, target_layer_ids or mask_token_id")
        num_target = dflash.get("num_target_layers", d.get("num_target_layers"))
        rope = d.get("rope_parameters") or {}
        heads = int(d["num_attention_heads"])
        return cls(
            hidden_size=int(d["hidden_size"]),
            vocab_size=int(d["vocab_size"]),
            num_target_layers=int(num_target if num_target is not None else max(layers) + 2),
            target_layer_ids=tuple(layers),
            num_hidden_layers=int(d["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(d.get("num_key_value_heads", heads)),
            head_dim=int(d.get("head_dim", int(d["hidden_size"]) // heads)),
            intermediate_size=int(d["intermediate_size"]),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", d.get("rope_theta", 10000.0))),
            max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
            block_size=int(block),
            mask_token_id=int(mask),
            markov_rank=int(d["markov_rank"]),
            bos_token_id=_int_or_none(d.get("bos_token_id")),
            eos_token_id=_int_or_none(d.get("eos_token_id")),
            extra=dict(d.get("flashtree") or {}),
        )

    def save(self, folder, dtype: str = "bfloat16") -> Path:
        path = Path(folder) / CONFIG_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_hf_dict(dtype), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, folder) -> "DSparkConfig":
        path = Path(folder) / CONFIG_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: not a DSPARK draft checkpoint folder")
        return cls.from_hf_dict(load_json(path, "the DSPARK draft config"))

    def replace(self, **changes) -> "DSparkConfig":
        return dataclasses.replace(self, **changes)


def spread_layers(num_layers: int, count: int) -> tuple[int, ...]:
    """`count` target layer ids spread evenly over 1 .. num_layers - 2 (the deepest one sglang can capture)."""
    last = num_layers - 2
    if last < 0:
        raise ValueError(f"a target of {num_layers} layer(s) has no layer sglang can capture")
    first = min(1, last)
    count = max(1, min(count, last - first + 1))
    if count == 1:
        return (last,)
    return tuple(sorted({round(first + (last - first) * i / (count - 1)) for i in range(count)}))


def _int_or_none(value):
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return None if value is None else int(value)
