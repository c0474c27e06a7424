"""FLASHTREE_SPLITKV_VERIFY on the real TritonAttnBackend.forward_extend (Triton interpreter on CPU).

The backend instance is sglang's real class with the attributes its verify extend path reads (its __init__ needs a
model runner with a GPU); flashtree's __init__ wrapper is applied on top of that, exactly as the installed patch does.
The same verify batch then runs through sglang's own extend attention and through the hooked path; outputs must agree.
The hooked path runs flashtree's kernel (`flashtree.attention.triton_verify.tree_attention_triton`) and a
torch model of the kernel contract the adapter relies on (test_contract_kernel_*), so the hookup is proven either way.
"""

from __future__ import annotations

import types

import pytest
import torch
from attention_cpu import attention_layer

import flashtree.patches as patches
from flashtree.patches import splitkv
from flashtree.patches.toggles import TreeToggles

HQ, HKV, D, W = 4, 2, 16, 4
PREFIX = [5, 9]
PARENTS = [0, 0, 1]  # tree nodes 1..3 (node 0 = root): 1 and 2 under the root, 3 under 1


def contract_kernel(calls):
    """A torch model of the kernel contract the adapter relies on (flashtree.attention.tree_attention_triton's
    signature; see flashtree/patches/splitkv.py). Records each call's per-request W x W blocks."""

    def tree_attention(q, k, v, k_buffer, v_buffer, kv_indptr, kv_indices, custom_mask, L, sm_scale=None,
                       mask_indptr=None, out=None, causal=False):
        bs = kv_indptr.shape[0] - 1
        group = q.shape[1] // k.shape[1]
        blocks = []
        assert (custom_mask is None) == causal, "a chain is causal=True without a mask; a tree has its mask"
        for b in range(bs):
            lo, hi = int(kv_indptr[b]), int(kv_indptr[b + 1])
            slots = kv_indices[lo:hi]
            if causal:
                block = torch.ones(L, L, dtype=torch.bool).tril()
            elif mask_indptr is None:
                block = custom_mask[b * L * L : (b + 1) * L * L].view(L, L).bool()
            else:
                start = int(mask_indptr[b])
                block = custom_mask[start : start + L * (hi - lo + L)].view(L, hi - lo + L)[:, hi - lo :].bool()
            blocks.append(block)
            keys = torch.cat([k_buffer[slots], k[b * L : (b + 1) * L]]).repeat_interleave(group, dim=1).float()
            vals = torch.cat([v_buffer[slots], v[b * L : (b + 1) * L]]).repeat_interleave(group, dim=1).float()
            visible = torch.cat([torch.ones(L, len(slots), dtype=torch.bool), block], dim=1)
            scores = torch.einsum("qhd,khd->hqk", q[b * L : (b + 1) * L].float(), keys) * sm_scale
            scores = scores.masked_fill(~visible, float("-inf"))
            out[b * L : (b + 1) * L] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vals).to(out.dtype)
        calls.append(torch.stack(blocks))
        return out

    return tree_attention


def ancestors(parents):
    w = len(parents) + 1
    m = torch.eye(w, dtype=torch.bool)
    for i, p in enumerate(parents, start=1):
        m[i] |= m[p]
    return m


def make_case(tree: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    bs = len(PREFIX)
    pool = 64
    k_buffer = torch.randn(pool, HKV, D, generator=g)
    v_buffer = torch.randn(pool, HKV, D, generator=g)
    slots = torch.randperm(pool - 1, generator=g)[: sum(PREFIX)] + 1
    kv_indptr = torch.tensor([0] + torch.tensor(PREFIX).cumsum(0).tolist(), dtype=torch.int32)
    kv_indices = slots.to(torch.int64)
    qo_indptr = torch.arange(0, (bs + 1) * W, W, dtype=torch.int32)
    if tree:
        block = ancestors(PARENTS)
        rows = [torch.cat([torch.ones(W, L, dtype=torch.bool), block], dim=1).flatten() for L in PREFIX]
        custom_mask = torch.cat(rows)
        mask_indptr = torch.tensor([0] + torch.tensor([W * (L + W) for L in PREFIX]).cumsum(0).tolist(), dtype=torch.int64)
    else:
        custom_mask, mask_indptr = None, torch.zeros(bs + 1, dtype=torch.int64)
    q = torch.randn(bs * W, HQ * D, generator=g)
    k = torch.randn(bs * W, HKV, D, generator=g)
    v = torch.randn(bs * W, HKV, D, generator=g)
    meta = types.SimpleNamespace(
        qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, custom_mask=custom_mask,
        mask_indptr=mask_indptr, max_extend_len=W, swa_out_cache_loc=None, out_cache_loc_full_physical=None,
        window_kv_indptr=None, window_kv_indices=None, window_kv_offsets=None,
    )
    return q, k, v, k_buffer, v_buffer, meta


def real_backend(k_buffer, v_buffer, meta):
    """sglang's TritonAttnBackend with what forward_extend reads on a verify batch (no GPU, no model runner)."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    backend = object.__new__(TritonAttnBackend)
    backend.forward_metadata = meta
    backend.token_to_kv_pool = types.SimpleNamespace(
        get_key_buffer=lambda layer_id: k_buffer, get_value_buffer=lambda layer_id: v_buffer
    )
    backend.req_to_token_pool = types.SimpleNamespace(size=8)
    backend.extend_attention_fwd = extend_attention_fwd
    backend.use_mla = False
    backend.use_dense_fp8_chunked_prefill = False
    backend.allow_bidirectional_attention_in_extend = False
    backend.dcp_size = 1
    backend.enable_deterministic = False
    backend.page_size = 1
    backend.use_verify_splitkv = False
    backend.use_verify_shared_kv = False
    backend.verify_splitkv_fwd = None
    backend.verify_shared_kv_fwd = None
    return backend


def layer(logit_cap=0.0):
    return attention_layer(HQ, HKV, D, logit_cap)


def verify_batch():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return types.SimpleNamespace(
        forward_mode=ForwardMode.TARGET_VERIFY, mha_one_shot=False, attn_attend_prefix_cache=False,
        extend_seq_lens_cpu=[W] * len(PREFIX), out_cache_loc=None,
    )


def run_both(kernel, tree: bool, logit_cap=0.0):
    q, k, v, kb, vb, meta = make_case(tree)
    lay, fb = layer(logit_cap), verify_batch()
    plain = real_backend(kb, vb, meta)
    want = plain.forward_extend(q, k, v, lay, fb, save_kv_cache=False)

    from flashtree.patches.adapters import select_adapter

    hooked = real_backend(kb, vb, meta)
    declined: dict = {}
    adapter = select_adapter()
    init = splitkv.make_triton_init(lambda self, model_runner: None, kernel, adapter.has_shared_kv, declined)
    init(hooked, types.SimpleNamespace(is_draft_worker=False))
    assert hooked.use_verify_splitkv is True
    got = hooked.forward_extend(q, k, v, lay, fb, save_kv_cache=False)
    return want, got, declined


def _check(kernel_factory, tree):
    calls = []
    want, got, declined = run_both(kernel_factory(calls), tree=tree)
    assert declined == {}
    assert len(calls) == 1, "the verify extend path did not reach flashtree's kernel"
    block = ancestors(PARENTS) if tree else torch.ones(W, W, dtype=torch.bool).tril()
    assert torch.equal(calls[0], block.expand(len(PREFIX), W, W)), "the kernel was handed the wrong verify mask"
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("tree", [True, False], ids=["tree", "chain"])
def test_contract_kernel_matches_sglang_extend_attention(tree):
    _check(contract_kernel, tree)


def _real_kernel_factory(calls):
    kernel = splitkv.load_kernel()  # flashtree.attention.triton_verify.tree_attention_triton (Triton interpreter on CPU)
    model = contract_kernel(calls)

    def counted(q, k, v, k_buffer, v_buffer, kv_indptr, kv_indices, custom_mask, L, sm_scale=None, mask_indptr=None,
                out=None, causal=False):
        # Record the blocks the adapter handed over (the model's output is discarded), then run the real kernel.
        model(q, k, v, k_buffer, v_buffer, kv_indptr, kv_indices, custom_mask, L, sm_scale, mask_indptr, out.clone(),
              causal)
        return kernel(q, k, v, k_buffer, v_buffer, kv_indptr, kv_indices, custom_mask, L, sm_scale=sm_scale,
                      mask_indptr=mask_indptr, out=out, causal=causal)

    return counted


@pytest.mark.parametrize("tree", [True, False], ids=["tree", "chain"])
def test_flashtree_kernel_matches_sglang_extend_attention(tree):
    _check(_real_kernel_factory, tree)


def test_declined_case_falls_back_to_sglang():
    calls = []
    want, got, declined = run_both(contract_kernel(calls), tree=True, logit_cap=30.0)
    assert calls == [] and declined == {"logit soft cap": 1}
    torch.testing.assert_close(got, want)


def test_draft_backends_keep_sglang_attention():
    backend = types.SimpleNamespace(use_verify_splitkv=False)
    init = splitkv.make_triton_init(lambda self, mr: None, contract_kernel([]), True)
    init(backend, types.SimpleNamespace(is_draft_worker=True))
    assert backend.use_verify_splitkv is False


def test_install_routes_real_class_init(monkeypatch):
    """The installed TritonAttnBackend.__init__ is flashtree's wrapper around sglang's, and uninstall restores it."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    import flashtree.attention.triton_decode_order  # noqa: F401  imported before the stub: it reads triton_verify
    monkeypatch.setitem(
        __import__("sys").modules, "flashtree.attention.triton_verify", types.SimpleNamespace(tree_attention_triton=contract_kernel([]))
    )
    original = TritonAttnBackend.__dict__["__init__"]
    patches.install(TreeToggles(splitkv_verify=True))
    assert TritonAttnBackend.__init__ is not original and TritonAttnBackend.__init__.__wrapped__ is original
    patches.uninstall()
    assert TritonAttnBackend.__dict__["__init__"] is original
