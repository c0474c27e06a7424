"""DFLASH draft checkpoints in the layout sglang's DFlashDraftModel loads (`--speculative-algorithm DFLASH`).

A DFLASH draft is flashtree's DSPARK draft network without the Markov head: the same `layers.*`, `norm`, `fc` and
`hidden_norm` tensors, a Qwen3-style config with `architectures: ["DFlashDraftModel"]` and `dflash_config:
{target_layer_ids, mask_token_id, block_size, num_target_layers}`. sglang's DFLASH runs the block [anchor, mask x K]
of `block_size` = K + 1 rows and reads row j >= 1 as the token at the mask's own position a + j, where a DSPARK draft
(sample from anchor) reads row j as the token at a + 1 + j. So a DSPARK checkpoint converted here keeps its weights
but not its row convention: its DFLASH proposals are shifted by one row. Train DFLASH drafts with `format=dflash`
(loss.block_loss's dflash objective); `convert` is for weights trained that way, or for shape tests.

    python -m flashtree.dspark.dflash_format SRC_DSPARK_FOLDER DST_FOLDER
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from .checkpoint import DTYPES, SINGLE_FILE, load_checkpoint, read_tensors
from .config import CONFIG_FILE, DSparkConfig
from .model import DSparkDraftModel

ARCHITECTURE = "DFlashDraftModel"
MARKOV_PREFIX = "markov_head."
# sglang's DSPARK confidence head (an adaptive chain length's), which flashtree's network does not hold: DFLASH has
# no counterpart, so a conversion drops it
CONFIDENCE_PREFIX = "confidence_head."


def dflash_hf_dict(cfg: DSparkConfig, dtype: str = "bfloat16") -> dict:
    """sglang DFLASH's config.json for a draft of `cfg`'s shapes: block_size = K + 1 rows (the verify window)."""
    d = cfg.to_hf_dict(dtype)
    for key in ("markov_rank", "markov_head_type", "sample_from_anchor", "enable_confidence_head"):
        d.pop(key, None)
    d["architectures"] = [ARCHITECTURE]
    d["block_size"] = cfg.block_size + 1
    d["dflash_config"] = {**d["dflash_config"], "block_size": cfg.block_size + 1}
    return d


def dflash_tensors(tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", dtype).contiguous() for k, v in tensors.items() if not k.startswith(MARKOV_PREFIX)}


def save_dflash_checkpoint(model: DSparkDraftModel, folder, *, dtype: str = "bfloat16") -> list[Path]:
    """config.json + model.safetensors of `model` without its Markov head. Returns the files written."""
    from safetensors.torch import save_file

    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: use one of {', '.join(DTYPES)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("model*.safetensors*"):
        old.unlink()
    config = folder / CONFIG_FILE
    config.write_text(json.dumps(dflash_hf_dict(model.config, dtype), indent=1) + "\n")
    weights = folder / SINGLE_FILE
    save_file(dflash_tensors(dict(model.named_parameters()), DTYPES[dtype]), str(weights), metadata={"format": "pt"})
    return [config, weights]


def convert(src, dst, *, dtype: str = "bfloat16") -> list[Path]:
    """A DSPARK checkpoint folder -> a DFLASH one (see the module doc for the row convention); a confidence head is
    dropped with the Markov head."""
    read_tensors(src)  # a clear error for a folder without weights, before the config is parsed
    return save_dflash_checkpoint(load_checkpoint(src, ignore=(CONFIDENCE_PREFIX,)), dst, dtype=dtype)


def load_dflash_config(folder) -> DSparkConfig:
    """The DSparkConfig of a DFLASH checkpoint (K = block_size - 1 draft tokens; a rank-1 placeholder head)."""
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: not a DFLASH draft checkpoint folder")
    d = json.loads(path.read_text())
    if ARCHITECTURE not in (d.get("architectures") or []):
        raise ValueError(f"{path}: not a DFLASH draft config (architectures={d.get('architectures')!r})")
    block = int((d.get("dflash_config") or {}).get("block_size", d.get("block_size")))
    return DSparkConfig.from_hf_dict({**d, "architectures": ["DSparkDraftModel"], "markov_rank": 1,
                                      "dflash_config": {**d["dflash_config"], "block_size": block - 1}})


def load_dflash_checkpoint(folder, *, dtype: torch.dtype = torch.float32, device="cpu") -> DSparkDraftModel:
    """A DSparkDraftModel holding a DFLASH checkpoint's weights; its (absent) Markov head is zero, and the engine's
    DFLASH drafter never reads it."""
    cfg = load_dflash_config(folder)
    tensors = {k.removeprefix("model."): v for k, v in read_tensors(folder).items()}
    model = DSparkDraftModel(cfg)
    expected = {n for n, _ in model.named_parameters() if not n.startswith(MARKOV_PREFIX)}
    if set(tensors) != expected:
        raise ValueError(f"DFLASH checkpoint {folder} does not match its config: missing "
                         f"{sorted(expected - set(tensors))}, unexpected {sorted(set(tensors) - expected)}")
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(tensors[name].to(p.dtype) if name in tensors else torch.zeros_like(p))
    return model.to(device=device, dtype=dtype).eval()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Convert a DSPARK draft checkpoint to sglang DFLASH's layout.")
    parser.add_argument("src", help="DSPARK checkpoint folder (config.json + safetensors)")
    parser.add_argument("dst", help="output folder")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    args = parser.parse_args(argv)
    for path in convert(args.src, args.dst, dtype=args.dtype):
        print(path)


if __name__ == "__main__":
    main()
