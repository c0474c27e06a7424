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


def test_a_chain_verify_replayed_on_flashinfer_graphs_gets_the_causal_mask(adapter):
    """DSPARK's chain step (a tree server's fallbacks, the planner's chain steps) verifies with no mask; the tree
    server's FlashInfer verify graphs are captured with one and read it at every replay. flashtree's
    init_forward_metadata_out_graph hands sglang's plan the chain's causal FULL_MASK (read back here through sglang's
    real generate_attn_arg_prefill, padding requests included), and leaves tree masks and other modes alone."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    from flashtree.patches import plan
    from flashtree.patches.toggles import read_toggles

    keys = [p.key for p in plan.patches(adapter, read_toggles({"FLASHTREE_TREE_N": "8"}))]
    if not adapter.flashinfer_verify:
        assert "FlashInferAttnBackend.init_forward_metadata_out_graph" not in keys  # FlashInfer targets are refused
        return
    (patch,) = [p for p in plan.patches(adapter, read_toggles({"FLASHTREE_TREE_N": "8"}))
                if p.key == "FlashInferAttnBackend.init_forward_metadata_out_graph"]
    sglang_cpu.force_triton_tree_kernels()
    seen = []
    replay = patch.make(lambda self, fb, in_capture=False: seen.append((fb.spec_info.custom_mask, in_capture)))
    w, seq_lens = 4, torch.tensor([5, 9, 1])  # the third request pads the batch to a captured size
    spec = DFlashVerifyInput(draft_token=None, positions=None, draft_token_num=w, custom_mask=None,
                             capture_hidden_mode=None)
    fb = types.SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, batch_size=3, seq_lens=seq_lens,
                               seq_lens_sum=int(seq_lens.sum()), seq_lens_cpu=seq_lens, spec_info=spec)
    replay(object(), fb)
    (mask, _), = seen
    assert spec.custom_mask is None  # the verify input as it was
    req_to_token = torch.arange(3 * 20, dtype=torch.int32).view(3, 20)
    got = spec.__class__(draft_token=None, positions=None, draft_token_num=w, custom_mask=mask, capture_hidden_mode=None)
    full = got.generate_attn_arg_prefill(torch.tensor([0, 1, 2]), seq_lens, int(seq_lens.sum()), req_to_token)[3]
    assert full.numel() == w * int(seq_lens.sum()) + 3 * w * w
    offset = 0
    for L in seq_lens.tolist():
        seg = full[offset: offset + w * (L + w)].view(w, L + w)
        offset += w * (L + w)
        assert seg[:, :L].all() and torch.equal(seg[:, L:], torch.ones(w, w, dtype=torch.bool).tril())
    tree_mask = torch.zeros(5, dtype=torch.bool)
    spec.custom_mask = tree_mask
    replay(object(), fb, in_capture=True)
    assert seen[-1][0] is tree_mask and seen[-1][1] is True
    spec.custom_mask, fb.forward_mode = None, ForwardMode.DECODE
    replay(object(), fb)
    assert seen[-1][0] is None
