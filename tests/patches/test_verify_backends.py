"""The target attention backends of the tree verify: Triton and FlashInfer accepted at worker start (FlashInfer on
sglang 0.5.17 / 0.5.20, whose verify input is checked here), every other one refused with one message naming the
supported ones; and what FlashInfer's verify reads from DSPARK's verify input (sglang's real
DFlashVerifyInput.generate_attn_arg_prefill, its Triton index kernel interpreted): each request's KV indices (prefix
slots, then the window's) and the tree's FULL_MASK as its custom mask, segment by segment. The FlashInfer kernels
themselves need a GPU."""

from __future__ import annotations

import types

import pytest
import torch

import sglang_cpu
from flashtree.patches import adapters, checks
from flashtree.patches.toggles import ToggleError
from flashtree.tree import ancestor_mask, build_vote_tree
from flashtree.tree.encode import verify_inputs


def worker_with(**args):
    base = {"attention_backend": None, "prefill_attention_backend": None, "decode_attention_backend": None}
    return types.SimpleNamespace(server_args=types.SimpleNamespace(**{**base, **args}))


@pytest.fixture(scope="module")
def adapter():
    return adapters.select_adapter()


def test_triton_and_flashinfer_are_accepted(adapter):
    checks.verify_backend(adapter, worker_with(attention_backend="triton"))
    checks.verify_backend(adapter, worker_with(attention_backend="triton", decode_attention_backend="triton"))
    if adapter.flashinfer_verify:
        checks.verify_backend(adapter, worker_with(attention_backend="flashinfer", decode_attention_backend="triton"))
    else:  # 0.5.23: its verify input reads KV ids through a translation plan
        with pytest.raises(ToggleError, match=r"supports --attention-backend triton on sglang 0\.5\.23: start with it"):
            checks.verify_backend(adapter, worker_with(attention_backend="flashinfer"))


def test_flashinfer_in_float32_is_refused_naming_the_dtypes(adapter):
    """FlashInfer has no float32 attention kernels (on the H200 sglang's own first forward stopped with KeyError:
    torch.float32): a float32 tree server on it stops at start with one message; bf16 and Triton in float32 start."""
    if not adapter.flashinfer_verify:
        pytest.skip("this release verifies trees on Triton only (test_triton_and_flashinfer_are_accepted)")
    with pytest.raises(ToggleError, match=r"^flashtree: .*float32.*flashinfer.*--dtype bfloat16 or float16.*triton"):
        checks.verify_backend(adapter, worker_with(attention_backend="flashinfer", dtype="float32"))
    checks.verify_backend(adapter, worker_with(attention_backend="flashinfer", dtype="bfloat16"))
    checks.verify_backend(adapter, worker_with(attention_backend="triton", dtype="float32"))


@pytest.mark.parametrize("args, named", [
    ({"attention_backend": "fa3"}, "--attention-backend fa3"),
    ({"attention_backend": None}, "--attention-backend unset (sglang picks)"),
    ({"attention_backend": "triton", "decode_attention_backend": "fa3"}, "--decode-attention-backend fa3"),
    ({"attention_backend": "triton", "prefill_attention_backend": "torch_native"},
     "--prefill-attention-backend torch_native"),
])
def test_other_backends_are_refused_naming_the_supported_ones(adapter, args, named):
    with pytest.raises(ToggleError) as err:
        checks.verify_backend(adapter, worker_with(**args))
    msg = str(err.value)
    supported = "triton or flashinfer" if adapter.flashinfer_verify else "triton"
    assert named in msg and f"supports --attention-backend {supported} on sglang" in msg and msg.startswith("flashtree:")


def test_flashinfer_reads_the_tree_mask_and_the_window_slots(adapter):
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    if not adapter.flashinfer_verify:
        pytest.skip(f"sglang {adapter.release}: FlashInfer is refused at worker start (test above)")
    sglang_cpu.force_triton_tree_kernels()
    g = torch.Generator().manual_seed(3)
    bs, n, k, w, max_len = 2, 4, 3, 6, 40
    tree = build_vote_tree(torch.randint(0, 3, (bs, n, k), generator=g), w)
    seq_lens = torch.tensor([5, 9])
    inputs = verify_inputs(tree, torch.tensor([7, 8]), seq_lens, int(seq_lens.sum()))
    req_to_token = torch.randperm(3 * max_len, generator=g).view(3, max_len).to(torch.int32)
    rows = torch.tensor([2, 0])
    spec = DFlashVerifyInput(draft_token=inputs.ids.reshape(-1), positions=inputs.positions.reshape(-1),
                             draft_token_num=w, custom_mask=inputs.mask, capture_hidden_mode=None)
    kv_indices, kv_indptr, qo_indptr, mask = spec.generate_attn_arg_prefill(rows, seq_lens, int(seq_lens.sum()),
                                                                            req_to_token)[:4]
    assert qo_indptr.tolist() == [0, w, 2 * w]
    assert kv_indptr.tolist() == [0, 5 + w, 5 + w + 9 + w]
    anc = ancestor_mask(tree)
    offset = 0
    for b in range(bs):
        L = int(seq_lens[b])
        span = kv_indices[int(kv_indptr[b]): int(kv_indptr[b + 1])]
        assert span.tolist() == req_to_token[rows[b], : L + w].tolist()  # prefix slots, then the window's
        seg = mask[offset: offset + w * (L + w)].view(w, L + w)
        offset += w * (L + w)
        assert seg[:, :L].all() and torch.equal(seg[:, L:], anc[b])  # every node sees the prefix and its ancestors
