"""FLASHTREE_EXACT_VERIFY, and FLASHTREE_SPLITKV_VERIFY on deterministic servers, on the real TritonAttnBackend
(Triton interpreter on CPU).

The claim: with the patch, every verify token's attention output equals, bit for bit, what sglang's own
`forward_decode` computes for that token once its path is committed (prefix + path as the sequence, the backend's
deterministic split rule). The test runs the verify batch through the real `forward_extend` (deterministic mode, so it
reaches `_forward_extend_unified`, which the patch takes over), then decodes every verify token on its own through the
real `forward_decode`, and compares with torch.equal. The split tile is 4 keys, so rows span several splits.

Split-KV verify on a deterministic server runs the same rows through flashtree's decode-order kernel. Its tiles pack
several tokens' heads into one dot; on the GPU a dot's output row depends on its own input row only, so the numbers are
the decode's bit for bit (`benchmarks/decode_order_check.py` checks that on the H200 against sglang's decode kernel).
The interpreter's dots are numpy matmuls, whose BLAS sums a row differently depending on the rows beside it, so here
those paths are compared to 1e-6 and the MHA fallback (sglang's decode kernel, no packing) bit for bit.
"""

from __future__ import annotations

import types

import pytest
import torch
from attention_cpu import attention_layer

import flashtree.patches as patches
from flashtree.patches import exact_verify, splitkv
from flashtree.patches.toggles import ToggleError, TreeToggles, read_toggles

HQ, HKV, D, W, TILE = 4, 2, 16, 4, 4
PREFIX = [5, 11]
TREES = {"tree": [0, 0, 1], "other-tree": [0, 1, 1], "chain": None}  # parents of nodes 1..3 (0 = the root)
MAX_CTX = 32


def ancestors(parents):
    m = torch.eye(W, dtype=torch.bool)
    for i, p in enumerate(parents, start=1):
        m[i] |= m[p]
    return m


def block_of(parents):
    return torch.ones(W, W, dtype=torch.bool).tril() if parents is None else ancestors(parents)


def make_case(parents, seed=0, hq=HQ):
    """A verify batch whose W fresh keys are already in the pool (forward_extend saves them first when serving)."""
    g = torch.Generator().manual_seed(seed)
    bs, pool = len(PREFIX), 64
    k_buffer = torch.randn(pool, HKV, D, generator=g)
    v_buffer = torch.randn(pool, HKV, D, generator=g)
    slots = (torch.randperm(pool - 1, generator=g)[: sum(PREFIX) + bs * W] + 1).to(torch.int64)
    kv_indices, out_cache_loc = slots[: sum(PREFIX)], slots[sum(PREFIX) :]
    kv_indptr = torch.tensor([0] + torch.tensor(PREFIX).cumsum(0).tolist(), dtype=torch.int32)
    if parents is None:
        custom_mask, mask_indptr = None, torch.zeros(bs + 1, dtype=torch.int64)
    else:
        block = ancestors(parents)
        custom_mask = torch.cat([torch.cat([torch.ones(W, L, dtype=torch.bool), block], 1).flatten() for L in PREFIX])
        mask_indptr = torch.tensor([0] + torch.tensor([W * (L + W) for L in PREFIX]).cumsum(0).tolist())
    q = torch.randn(bs * W, hq * D, generator=g)
    meta = types.SimpleNamespace(
        qo_indptr=torch.arange(0, (bs + 1) * W, W, dtype=torch.int32), kv_indptr=kv_indptr, kv_indices=kv_indices,
        custom_mask=custom_mask, mask_indptr=mask_indptr, max_extend_len=W, swa_out_cache_loc=None,
        out_cache_loc_full_physical=None, window_kv_indptr=None, window_kv_indices=None, window_kv_offsets=None,
    )
    return q, k_buffer, v_buffer, out_cache_loc, meta


def real_backend(k_buffer, v_buffer, meta):
    """sglang's TritonAttnBackend in deterministic mode, with what its extend and decode paths read (no GPU)."""
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
    from sglang.kernels.ops.attention.extend_attention import build_unified_kv_indices, extend_attention_fwd_unified
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    backend = object.__new__(TritonAttnBackend)
    attrs = dict(
        forward_metadata=meta, decode_attention_fwd=decode_attention_fwd,
        extend_attention_fwd_unified=extend_attention_fwd_unified, build_unified_kv_indices=build_unified_kv_indices,
        use_mla=False, use_pdl=False, use_dense_fp8_chunked_prefill=False, allow_bidirectional_attention_in_extend=False,
        dcp_size=1, page_size=1, enable_deterministic=True, split_tile_size=TILE, static_kv_splits=False,
        device_core_count=4, max_context_len=MAX_CTX, max_kv_splits=MAX_CTX // TILE, device="cpu",
        use_verify_splitkv=False, use_verify_shared_kv=False, enable_lean_attention=False, swa_v_head_dim=None,
        req_to_token_pool=types.SimpleNamespace(size=8),
        token_to_kv_pool=types.SimpleNamespace(get_key_buffer=lambda i: k_buffer, get_value_buffer=lambda i: v_buffer),
    )
    for name, value in attrs.items():
        setattr(backend, name, value)
    return backend


def layer(logit_cap=0.0, hq=HQ):
    return attention_layer(hq, HKV, D, logit_cap)


def batch(mode_name, out_cache_loc):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return types.SimpleNamespace(
        forward_mode=getattr(ForwardMode, mode_name), mha_one_shot=False, attn_attend_prefix_cache=False,
        extend_seq_lens_cpu=[W] * len(PREFIX), extend_seq_lens=torch.full((len(PREFIX),), W, dtype=torch.int32),
        extend_start_loc=torch.arange(0, len(PREFIX) * W, W, dtype=torch.int32), extend_prefix_lens=None,
        out_cache_loc=out_cache_loc, spec_info=None, batch_size=len(PREFIX),
    )


def hooked_backend(kb, vb, meta, declined=None):
    backend = real_backend(kb, vb, meta)
    init = exact_verify.make_triton_init(lambda self, model_runner: None, declined)
    init(backend, types.SimpleNamespace(is_draft_worker=False))
    return backend


def decode_one(kb, vb, q_row, slots, hq=HQ):
    """sglang's own forward_decode for one token whose sequence is `slots` (its own slot last)."""
    n = len(slots)
    splits = torch.empty(1, dtype=torch.int32)
    meta = types.SimpleNamespace(
        kv_indptr=torch.tensor([0, n], dtype=torch.int32), kv_indices=torch.tensor(slots, dtype=torch.int64),
        attn_logits=torch.empty(1, hq, MAX_CTX // TILE, D), attn_lse=torch.empty(1, hq, MAX_CTX // TILE),
        num_kv_splits=splits, swa_attn_logits=None, swa_out_cache_loc=None, out_cache_loc_full_physical=None,
        window_kv_indptr=None, window_kv_indices=None,
        lean_Mp=None, lean_Lp=None, lean_Op=None, lean_locks=None, uneven_batch=None,  # 0.5.20+ (ROCm only)
    )
    backend = real_backend(kb, vb, meta)
    backend.get_num_kv_splits(splits, torch.tensor([n]))
    return backend.forward_decode(q_row, None, None, layer(hq=hq), batch("DECODE", None), save_kv_cache=False)


def expected_rows(q, kb, vb, loc, meta, parents, hq=HQ):
    block, rows = block_of(parents), []
    for b, L in enumerate(PREFIX):
        prefix = meta.kv_indices[int(meta.kv_indptr[b]) : int(meta.kv_indptr[b + 1])].tolist()
        for i in range(W):
            path = [int(loc[b * W + j]) for j in range(W) if block[i, j]]
            rows.append(decode_one(kb, vb, q[b * W + i : b * W + i + 1], prefix + path, hq))
    return torch.cat(rows)


@pytest.mark.parametrize("shape", list(TREES))
def test_verify_rows_equal_sglang_decode_bit_for_bit(shape):
    q, kb, vb, loc, meta = make_case(TREES[shape])
    declined: dict = {}
    got = hooked_backend(kb, vb, meta, declined).forward_extend(
        q, kb[loc], vb[loc], layer(), batch("TARGET_VERIFY", loc), save_kv_cache=False
    )
    assert declined == {}
    want = expected_rows(q, kb, vb, loc, meta, TREES[shape])
    assert torch.equal(got, want), f"max |diff| {(got - want).abs().max():.3g}"
    # The same attention as sglang's own deterministic verify path (which is close, not bit-equal).
    plain = real_backend(kb, vb, meta).forward_extend(
        q, kb[loc], vb[loc], layer(), batch("TARGET_VERIFY", loc), save_kv_cache=False
    )
    torch.testing.assert_close(got, plain, atol=1e-5, rtol=1e-5)


def test_a_rerun_forward_rebuilds_its_rows():
    """Graph capture reruns one forward-metadata object; a second run with another tree must not reuse stale rows."""
    q, kb, vb, loc, meta = make_case(TREES["tree"])
    backend = hooked_backend(kb, vb, meta)
    backend.forward_extend(q, kb[loc], vb[loc], layer(), batch("TARGET_VERIFY", loc), save_kv_cache=False)
    _, _, _, _, other = make_case(TREES["other-tree"])
    meta.custom_mask = other.custom_mask  # same object, new contents: as a replayed graph's buffers
    got = backend.forward_extend(q, kb[loc], vb[loc], layer(), batch("TARGET_VERIFY", loc), save_kv_cache=False)
    assert torch.equal(got, expected_rows(q, kb, vb, loc, meta, TREES["other-tree"]))


def test_path_rows_list_prefix_then_root_first_path():
    _, _, _, loc, meta = make_case(TREES["tree"])
    blocks = exact_verify.tree_blocks(meta.custom_mask, meta.mask_indptr, torch.tensor(PREFIX), len(PREFIX), W)
    assert torch.equal(blocks, ancestors(TREES["tree"]).expand(len(PREFIX), W, W))
    indptr, indices, lens = exact_verify.path_rows(meta.kv_indptr, meta.kv_indices, loc, blocks, capacity=200)
    assert lens.tolist() == [L + d for L in PREFIX for d in (1, 2, 2, 3)]
    b, node = 1, 3  # node 3's path: root, node 1, node 3
    r = b * W + node
    row = indices[int(indptr[r]) : int(indptr[r + 1])].tolist()
    assert row == meta.kv_indices[5:16].tolist() + [int(loc[4]), int(loc[5]), int(loc[7])]


def test_declined_calls_keep_sglang_unified_path():
    q, kb, vb, loc, meta = make_case(TREES["tree"])
    declined: dict = {}
    got = hooked_backend(kb, vb, meta, declined).forward_extend(
        q, kb[loc], vb[loc], layer(logit_cap=30.0), batch("TARGET_VERIFY", loc), save_kv_cache=False
    )
    want = real_backend(kb, vb, meta).forward_extend(
        q, kb[loc], vb[loc], layer(logit_cap=30.0), batch("TARGET_VERIFY", loc), save_kv_cache=False
    )
    assert declined == {"logit soft cap": 1} and torch.equal(got, want)


def test_non_verify_batches_keep_sglang_unified_path():
    q, kb, vb, loc, meta = make_case(TREES["chain"])
    got = hooked_backend(kb, vb, meta).forward_extend(q, kb[loc], vb[loc], layer(), batch("EXTEND", loc), save_kv_cache=False)
    want = real_backend(kb, vb, meta).forward_extend(q, kb[loc], vb[loc], layer(), batch("EXTEND", loc), save_kv_cache=False)
    assert torch.equal(got, want)


def test_init_refuses_what_cannot_be_exact():
    kb = vb = torch.zeros(1)
    backend = real_backend(kb, vb, None)
    backend.enable_deterministic = False
    init = exact_verify.make_triton_init(lambda self, mr: None)
    with pytest.raises(ToggleError, match="--enable-deterministic-inference"):
        init(backend, types.SimpleNamespace(is_draft_worker=False))
    backend.enable_deterministic, backend.page_size = True, 16
    with pytest.raises(ToggleError, match="--page-size 1"):
        init(backend, types.SimpleNamespace(is_draft_worker=False))
    draft = real_backend(kb, vb, None)
    draft.enable_deterministic = False  # the draft's backend is left alone whatever its mode
    init(draft, types.SimpleNamespace(is_draft_worker=True))
    assert "_forward_extend_unified" not in draft.__dict__


def test_toggle_installs_on_the_real_class_and_uninstalls():
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    toggles = read_toggles({"FLASHTREE_EXACT_VERIFY": "1"})
    assert toggles == TreeToggles(exact_verify=True)
    original = TritonAttnBackend.__dict__["__init__"]
    patches.install(toggles)
    assert TritonAttnBackend.__init__.__wrapped__ is original
    patches.install(toggles)
    assert TritonAttnBackend.__init__.__wrapped__ is original
    patches.uninstall()
    assert TritonAttnBackend.__dict__["__init__"] is original


def splitkv_backend(kb, vb, meta, calls, declined=None):
    """A deterministic target backend with FLASHTREE_SPLITKV_VERIFY's init: the decode-order kernel, counted."""
    kernel = splitkv.load_kernel(splitkv.DECODE_ORDER_KERNEL)

    def counted(*args, **kwargs):
        calls.append(args[5].clone())  # the path slots it was handed
        return kernel(*args, **kwargs)

    backend = real_backend(kb, vb, meta)
    init = splitkv.make_triton_init(lambda self, mr: None, None, True, declined, counted)
    init(backend, types.SimpleNamespace(is_draft_worker=False))
    assert backend.use_verify_splitkv is False  # sglang's deterministic path never reads it: the unified hook serves
    return backend


@pytest.mark.parametrize("shape", list(TREES))
def test_splitkv_on_a_deterministic_server_is_the_decode_rows(shape):
    q, kb, vb, loc, meta = make_case(TREES[shape], seed=1)
    calls, declined = [], {}
    got = splitkv_backend(kb, vb, meta, calls, declined).forward_extend(
        q, kb[loc], vb[loc], layer(), batch("TARGET_VERIFY", loc), save_kv_cache=False
    )
    assert declined == {} and len(calls) == 1, "the verify batch did not reach the decode-order kernel once"
    block = block_of(TREES[shape])
    paths = [[int(loc[b * W + j]) for j in range(W) if block[i, j]] for b in range(len(PREFIX)) for i in range(W)]
    assert [row[: len(p)] for row, p in zip(calls[0].tolist(), paths)] == paths
    torch.testing.assert_close(got, expected_rows(q, kb, vb, loc, meta, TREES[shape]), atol=1e-6, rtol=1e-6)


def test_splitkv_mha_runs_sglang_decode_rows_bit_for_bit():
    """MHA decodes through sglang's other (ungrouped) kernel, which the decode-order kernel does not mirror."""
    q, kb, vb, loc, meta = make_case(TREES["tree"], hq=HKV)
    calls = []
    got = splitkv_backend(kb, vb, meta, calls).forward_extend(
        q, kb[loc], vb[loc], layer(hq=HKV), batch("TARGET_VERIFY", loc), save_kv_cache=False
    )
    assert calls == [] and torch.equal(got, expected_rows(q, kb, vb, loc, meta, TREES["tree"], hq=HKV))


def test_splitkv_on_a_deterministic_paged_server_is_refused():
    backend = real_backend(torch.zeros(1), torch.zeros(1), None)
    backend.page_size = 16
    init = splitkv.make_triton_init(lambda self, mr: None, None, True, None, None)
    with pytest.raises(ToggleError, match="FLASHTREE_SPLITKV_VERIFY=1 .*--page-size 1 only"):
        init(backend, types.SimpleNamespace(is_draft_worker=False))


def test_defaulted_splitkv_on_a_deterministic_paged_server_keeps_sglangs_path(caplog):
    """The tree's split-KV default (FLASHTREE_SPLITKV_VERIFY not set) does not stop a server it cannot serve exactly:
    sglang's unified path stays, with one log line."""
    backend = real_backend(torch.zeros(1), torch.zeros(1), None)
    backend.page_size = 16
    unified = backend._forward_extend_unified
    init = splitkv.make_triton_init(lambda self, mr: None, None, True, None, None, required=False)
    with caplog.at_level("INFO", logger="flashtree.patches"):
        init(backend, types.SimpleNamespace(is_draft_worker=False))
    assert backend._forward_extend_unified == unified and "stays off" in caplog.text


def test_defaulted_splitkv_needs_no_hook_the_release_lacks(monkeypatch):
    """Set, split-KV verify on a release without its hooks is refused; defaulted, it is left out."""
    from flashtree.patches import plan
    from flashtree.patches.adapters import base

    class NoHooks:  # a release whose every probe misses
        release = "x.y"
        meets = base.SglangAdapter.meets

        def require(self, probes, toggle, allowed):
            base.SglangAdapter.require(self, [types.SimpleNamespace(check=lambda: "no hook")], toggle, allowed)

    adapter = NoHooks()
    monkeypatch.setattr(base, "EXACT_VERIFY_PROBES", (types.SimpleNamespace(check=lambda: "no hook"),))
    assert plan._splitkv_patch(adapter, required=False) == []
    with pytest.raises(ToggleError, match="FLASHTREE_SPLITKV_VERIFY=1 cannot hook sglang x.y: no hook"):
        plan._splitkv_patch(adapter, required=True)


def test_exact_and_splitkv_verify_are_exclusive():
    with pytest.raises(ToggleError, match="at most one"):
        read_toggles({"FLASHTREE_EXACT_VERIFY": "1", "FLASHTREE_SPLITKV_VERIFY": "1"})


def test_a_release_without_the_hooks_is_refused_untouched(monkeypatch):
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    from flashtree.patches.adapters import base
    from flashtree.patches.adapters.probe import Has

    monkeypatch.setattr(base, "EXACT_VERIFY_PROBES", (Has(f"{base.TRITON}:TritonAttnBackend._no_such_extend_path"),))
    original = TritonAttnBackend.__dict__["__init__"]
    with pytest.raises(ToggleError, match="FLASHTREE_EXACT_VERIFY=1 cannot hook sglang .*_no_such_extend_path"):
        patches.install(TreeToggles(exact_verify=True))
    assert TritonAttnBackend.__dict__["__init__"] is original
