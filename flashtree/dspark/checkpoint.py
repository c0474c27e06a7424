"""DSPARK draft checkpoints in the layout sglang's DSparkDraftModel loads: `config.json` + safetensors.

Tensor names are the draft's own parameter names (no `model.` prefix, no embedding or LM head: both are the target's):
`layers.N.{input_layernorm,post_attention_layernorm}.weight`, `layers.N.self_attn.{q,k,v,o}_proj.weight`,
`layers.N.self_attn.{q,k}_norm.weight`, `layers.N.mlp.{gate,up,down}_proj.weight`, `norm.weight`, `fc.weight`,
`hidden_norm.weight`, `markov_head.markov_w1.weight` (V, R), `markov_head.markov_w2.weight` (V, R).
Large drafts are sharded HF-style (`model-0000i-of-0000n.safetensors` + `model.safetensors.index.json`), which both
sglang's loader and `load_checkpoint` read.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..files import load_json, load_safetensors
from .config import DSparkConfig
from .model import DSparkDraftModel

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def state_dict_for_export(model: DSparkDraftModel, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {name: p.detach().to("cpu", dtype).contiguous() for name, p in model.named_parameters()}


def save_checkpoint(model: DSparkDraftModel, folder, *, dtype: str = "bfloat16", max_shard_bytes: int | None = None):
    """Write config.json and the weights to `folder`; shards of at most `max_shard_bytes` when given (a tensor is
    never split). Returns the list of files written."""
    from safetensors.torch import save_file

    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: use one of {', '.join(DTYPES)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in list(folder.glob("model*.safetensors")) + list(folder.glob(INDEX_FILE)):
        old.unlink()
    tensors = state_dict_for_export(model, DTYPES[dtype])
    written = [model.config.save(folder, dtype)]
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if max_shard_bytes is not None and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(folder / SINGLE_FILE), metadata={"format": "pt"})
        return written + [folder / SINGLE_FILE]
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
        written.append(folder / name)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (folder / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    return written + [folder / INDEX_FILE]


def read_tensors(folder) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder (single file or shards listed by the index)."""
    folder = Path(folder)
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = load_json(index, "the DSPARK checkpoint index")
        if not isinstance(weight_map, dict) or not isinstance(weight_map.get("weight_map"), dict):
            raise ValueError(f"the DSPARK checkpoint index {index} has no weight_map: rewrite it with save_checkpoint")
        files = sorted(set(weight_map["weight_map"].values()))
    elif (folder / SINGLE_FILE).is_file():
        files = [SINGLE_FILE]
    else:
        raise FileNotFoundError(f"{folder} holds neither {SINGLE_FILE} nor {INDEX_FILE}")
    tensors = {}
    for name in files:
        tensors.update(load_safetensors(folder / name, "the DSPARK checkpoint weights"))
    return tensors


def load_checkpoint(folder, *, dtype: torch.dtype = torch.float32, device="cpu",
                    ignore: tuple[str, ...] = ()) -> DSparkDraftModel:
    """A DSparkDraftModel from a checkpoint folder; every tensor must match a parameter and every parameter must be
    present (a clear error names the difference). Tensors whose names start with an `ignore` prefix are dropped."""
    cfg = DSparkConfig.load(folder)
    tensors = {k.removeprefix("model."): v for k, v in read_tensors(folder).items()}
    tensors = {k: v for k, v in tensors.items() if not k.startswith(ignore)}  # startswith(()) is False
    with torch.device("meta"):
        model = DSparkDraftModel(cfg)
    expected = {name: p.shape for name, p in model.named_parameters()}
    unexpected = sorted(set(tensors) - set(expected))
    missing = sorted(set(expected) - set(tensors))
    wrong = [f"{k}: {tuple(tensors[k].shape)} != {tuple(s)}" for k, s in expected.items()
             if k in tensors and tuple(tensors[k].shape) != tuple(s)]
    if unexpected or missing or wrong:
        raise ValueError(
            f"DSPARK checkpoint {folder} does not match its config: missing {missing}, unexpected {unexpected}, "
            f"wrong shapes {wrong}"
        )
    model = model.to_empty(device=device)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(tensors[name].to(device=device))
    return model.to(dtype).eval()
