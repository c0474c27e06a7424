"""A DFLASH draft checkpoint written by flashtree (flashtree.dspark.dflash_format: a DSPARK checkpoint converted, the
Markov head dropped) loads through each release's real DFlashDraftModel and weight loader, every tensor landing in a
parameter, and sglang computes the same context projection and context K/V as flashtree's network."""

from __future__ import annotations

import os

import pytest
import torch

import sglang_cpu
from test_dspark_format import BLOCK, H, V, assert_context_kv_matches, flashtree_checkpoint

from flashtree.dspark import read_tensors
from flashtree.dspark.dflash_format import convert, load_dflash_checkpoint


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    from transformers import AutoConfig

    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator
    from sglang.srt.models.dflash import DFlashDraftModel

    src, dst = tmp_path_factory.mktemp("dspark"), tmp_path_factory.mktemp("dflash")
    ours = flashtree_checkpoint(src)
    files = convert(src, dst, dtype="float32")
    config = AutoConfig.from_pretrained(dst)
    seen = []

    def weights():
        for name, tensor in safetensors_weights_iterator([str(f) for f in files if f.suffix == ".safetensors"]):
            seen.append(name)
            yield name, tensor

    with sglang_cpu.cpu_model_construction():
        theirs = DFlashDraftModel(config)
        theirs.load_weights(weights())
    return ours, dst, theirs, seen, config


def test_sglang_reads_the_dflash_config(loaded):
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config

    _, _, theirs, _, config = loaded
    parsed = parse_dflash_draft_config(draft_hf_config=config)
    assert parsed.resolve_block_size() == BLOCK + 1 == theirs.block_size  # the verify window: anchor + K drafts
    assert parsed.target_layer_ids == [1, 2, 4] and parsed.mask_token_id == V - 3
    assert theirs.num_context_features == 3


def test_every_tensor_is_consumed_and_the_markov_head_is_gone(loaded):
    ours, dst, theirs, seen, _ = loaded
    tensors = read_tensors(dst)
    assert sorted(seen) == sorted(tensors) and not any(n.startswith("markov_head.") for n in tensors)
    params = dict(theirs.named_parameters())
    fused = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
             "up_proj": "gate_up_proj"}
    fed = {next((name.replace(p, f) for p, f in fused.items() if f".{p}." in name), name) for name in tensors}
    assert fed == set(params)
    assert torch.equal(params["fc.weight"], tensors["fc.weight"]) and torch.equal(params["norm.weight"],
                                                                                  tensors["norm.weight"])
    # the engine's loader reads the same folder back (no head)
    back = load_dflash_checkpoint(dst)
    assert back.config.block_size == BLOCK and torch.equal(back.fc.weight, ours.fc.weight)


def test_sglang_computes_the_same_context_projection_and_kv(loaded):
    ours, _, theirs, _, _ = loaded
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(5, 3 * H, generator=g)
    positions = torch.arange(10, 15)
    with torch.no_grad():
        ctx = ours.project_context(feats)
        assert torch.allclose(ctx, theirs.project_target_hidden(feats), atol=1e-5)
        assert_context_kv_matches(ours, theirs, ctx, positions)


def test_convert_refuses_a_folder_without_weights(tmp_path):
    os.makedirs(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="holds neither"):
        convert(tmp_path / "empty", tmp_path / "out")


def test_convert_drops_a_dspark_confidence_head(tmp_path):
    """sglang's DSPARK drafts may carry a confidence head (the live tiny example's does); the DFLASH checkpoint has
    none, and a stray tensor of any other name still stops the conversion."""
    import shutil

    from safetensors.torch import save_file

    from flashtree.dspark.checkpoint import SINGLE_FILE
    from flashtree.dspark.config import CONFIG_FILE

    flashtree_checkpoint(tmp_path / "exported")
    tensors = read_tensors(tmp_path / "exported")

    def checkpoint_with(name, extra):  # the exported weights in one file, plus tensors flashtree's network lacks
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(tmp_path / "exported" / CONFIG_FILE, folder / CONFIG_FILE)
        save_file({**tensors, **extra}, str(folder / SINGLE_FILE))
        return folder

    src = checkpoint_with("confident", {"confidence_head.proj.weight": torch.zeros(1, H + 4),
                                        "confidence_head.proj.bias": torch.zeros(1)})
    files = convert(src, tmp_path / "dflash", dtype="float32")
    assert len(files) == 2 and any(k.startswith("confidence_head.") for k in read_tensors(src))
    out = read_tensors(tmp_path / "dflash")
    assert not any(k.startswith(("confidence_head.", "markov_head.")) for k in out) and len(out) > 0
    with pytest.raises(ValueError, match="unexpected \\['stray.weight'\\]"):
        convert(checkpoint_with("stray", {"stray.weight": torch.zeros(1)}), tmp_path / "again", dtype="float32")
