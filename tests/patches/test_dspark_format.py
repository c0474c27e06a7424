"""A DSPARK draft checkpoint written by flashtree loads through sglang's real DSparkDraftModel and its weight loader
(the same files `load_drafter("dspark", ...)` reads), every tensor landing in a parameter, and sglang computes the
same context projection, context K (k_norm + RoPE) and Markov bias as flashtree. Runs under a sglang venv
(scripts/test_patches.sh); CPU import recipe in sglang_cpu.py."""

from __future__ import annotations

import glob
import os

import pytest
import torch

import sglang_cpu

from flashtree.dspark import DSparkConfig, DSparkDraftModel, read_tensors, save_checkpoint
from flashtree.dspark.model import rope_cos_sin

H, V, HEADS, KV_HEADS, HEAD_DIM, LAYERS, RANK, BLOCK = 64, 300, 4, 2, 16, 2, 8, 7


def flashtree_checkpoint(folder) -> DSparkDraftModel:
    cfg = DSparkConfig(hidden_size=H, vocab_size=V, num_target_layers=6, target_layer_ids=(1, 2, 4),
                       num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                       head_dim=HEAD_DIM, intermediate_size=96, block_size=BLOCK, mask_token_id=V - 3,
                       markov_rank=RANK, rope_theta=100000.0, max_position_embeddings=512)
    model = DSparkDraftModel(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():  # every tensor distinct (norms too), so a misplaced one shows
            p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (1.0 if p.ndim == 1 else 0.0))
    save_checkpoint(model, folder, dtype="float32", max_shard_bytes=60_000)  # sharded + index, as exported
    return model


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """(flashtree model, checkpoint tensors, sglang model loaded from the checkpoint by sglang's loader)."""
    from transformers import AutoConfig

    from sglang.srt.model_loader.weight_utils import filter_duplicate_safetensors_files, safetensors_weights_iterator
    from sglang.srt.models.dspark import DSparkDraftModel as SglangDSpark

    folder = str(tmp_path_factory.mktemp("dspark"))
    ours = flashtree_checkpoint(folder)
    config = AutoConfig.from_pretrained(folder)  # sglang reads the draft config through transformers
    files = filter_duplicate_safetensors_files(sorted(glob.glob(os.path.join(folder, "*.safetensors"))), folder,
                                               "model.safetensors.index.json")
    seen = []

    def weights():
        for name, tensor in safetensors_weights_iterator(files):
            seen.append(name)
            yield name, tensor

    with sglang_cpu.cpu_model_construction():
        theirs = SglangDSpark(config)
        theirs.load_weights(weights())
    return ours, read_tensors(folder), theirs, seen, config


def test_sglang_reads_the_dspark_config(loaded):
    from sglang.srt.speculative.dspark_components.dspark_config import parse_dspark_draft_config, resolve_runtime_config

    _, _, theirs, _, config = loaded
    parsed = parse_dspark_draft_config(draft_hf_config=config)
    assert parsed.target_layer_ids == [1, 2, 4] and parsed.markov_rank == RANK
    assert parsed.markov_head_type == "vanilla" and parsed.mask_token_id == V - 3 and parsed.gamma == BLOCK
    runtime = resolve_runtime_config(draft_hf_config=config, speculative_num_draft_tokens=BLOCK + 1,
                                     target_vocab_size=V)
    assert (runtime.gamma, runtime.verify_num_draft_tokens, runtime.mask_token_id) == (BLOCK, BLOCK + 1, V - 3)
    # 0.5.17 has no flag: its block is always [anchor, mask...] with every row proposing (sample from anchor)
    assert theirs.num_context_features == 3 and theirs.gamma == BLOCK and getattr(theirs, "sample_from_anchor", True)
    assert theirs.confidence_head is None  # static ragged-verify mode (the default): no confidence weights needed


def test_every_tensor_is_consumed_into_the_matching_parameter(loaded):
    _, tensors, theirs, seen, _ = loaded
    assert sorted(seen) == sorted(tensors)  # sglang's iterator read every tensor of every shard
    params = dict(theirs.named_parameters())
    expected = {}
    for name, t in tensors.items():
        for fused, parts in (("qkv_proj", ("q_proj", "k_proj", "v_proj")), ("gate_up_proj", ("gate_proj", "up_proj"))):
            if any(f".{p}." in name for p in parts):
                key = name.replace(next(p for p in parts if f".{p}." in name), fused)
                expected.setdefault(key, {})[name] = t
                break
        else:
            expected[name] = t
    assert set(expected) == set(params)  # every sglang parameter is fed by the checkpoint, nothing is left over
    for key, value in expected.items():
        if isinstance(value, dict):  # fused: the shards stacked in q, k, v / gate, up order
            order = sorted(value, key=lambda n: ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"].index(
                next(p for p in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj") if f".{p}." in n)))
            value = torch.cat([value[n] for n in order])
        assert torch.equal(params[key].data, value), key


def assert_context_kv_matches(ours, theirs, ctx, positions):
    """Layer 1's context K and V as sglang writes them to the draft KV pool (kv_proj_only -> k_norm -> RoPE) equal
    flashtree's draft's."""
    attn = theirs.layers[1].self_attn
    k, v = attn.kv_proj_only(ctx)
    k = attn.k_norm.forward_native(k.reshape(-1, HEAD_DIM)).view_as(k)
    _, k = attn.rotary_emb.forward_native(positions, k.new_zeros(k.shape), k)
    cos, sin = rope_cos_sin(positions[None], HEAD_DIM, 100000.0, ctx.dtype)
    our_k, our_v = ours.layers[1].self_attn.kv(ctx[None], cos, sin)
    n = positions.numel()
    assert torch.allclose(our_k[0].transpose(0, 1).reshape(n, -1), k, atol=1e-4)
    assert torch.allclose(our_v[0].transpose(0, 1).reshape(n, -1), v, atol=1e-5)


def test_sglang_computes_the_same_context_and_markov_bias(loaded):
    ours, _, theirs, _, _ = loaded
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(5, 3 * H, generator=g)
    positions = torch.arange(10, 15)
    with torch.no_grad():
        ctx = ours.project_context(feats)
        their_ctx = theirs.hidden_norm.forward_native(theirs.fc(feats))
        assert torch.allclose(ctx, their_ctx, atol=1e-5)
        assert_context_kv_matches(ours, theirs, ctx, positions)
        prev = torch.tensor([0, 5, V - 1])
        head = theirs.markov_head
        if hasattr(head, "compute_step_bias"):  # 0.5.17 / 0.5.20
            bias = head.compute_step_bias(prev, None)
        else:  # 0.5.23: BaseDSparkMarkovHead.step_bias
            bias = head.step_bias(prev, hidden_states=None, state=None)[0]
        assert torch.allclose(ours.markov_bias(prev), bias, atol=1e-5)
