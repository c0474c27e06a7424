"""FLASHTREE_EXACT_VERIFY on the real FlashInferAttnBackend (each release's class; FlashInfer's decode wrapper is a
torch stand-in, flashinfer_cpu.py, since its kernels need CUDA).

The claim tested here: with the patch, sglang's own `forward_extend` of a verify batch returns, for every verify token,
what the decode wrapper returns for that token decoded on its own (its prefix from req_to_token, then its tree path,
root first, planned as sglang plans a decode row), eagerly and through the graph path's capture and replay; the
window's keys are saved first; sglang's verify kernel is never called. That FlashInfer's kernel then gives decode's
numbers bit for bit is the GPU's check (`+preset=serving 'run=[identity]'` with the FlashInfer servers).
"""

from __future__ import annotations

import logging
import types

import pytest
import torch
from attention_cpu import attention_layer
from flashinfer_cpu import StandInDecodeWrapper

import flashtree.patches as patches
from flashtree.patches import exact_verify_flashinfer as fi
from flashtree.patches.toggles import ToggleError, read_toggles

HQ, HKV, D, W = 4, 2, 16, 4
PREFIX = [5, 11]
TREES = {"tree": [0, 0, 1], "other-tree": [0, 1, 1], "chain": None}  # parents of nodes 1..3 (0 = the root)
CTX, POOL = 32, 64


@pytest.fixture
def serving_release():
    """The releases whose verify input hands FlashInfer the tree's mask and req_to_token's slots (0.5.23's goes through
    a KV translation plan: there the toggle stops a FlashInfer target at start, the last test)."""
    from flashtree.patches.adapters import select_adapter

    if not select_adapter().flashinfer_verify:
        pytest.skip("FlashInfer exact verify is refused on this release (test_toggle_installs_on_the_real_class...)")


def block_of(parents):
    if parents is None:
        return torch.ones(W, W, dtype=torch.bool).tril()
    m = torch.eye(W, dtype=torch.bool)
    for i, p in enumerate(parents, start=1):
        m[i] |= m[p]
    return m


class Pool:
    """sglang's KV pool as forward_extend uses it: one (slots, heads, dim) key and value buffer."""

    def __init__(self, g):
        self.k, self.v = torch.randn(POOL, HKV, D, generator=g), torch.randn(POOL, HKV, D, generator=g)

    def get_kv_buffer(self, layer_id):
        return self.k, self.v

    def set_kv_buffer(self, layer, loc, k, v, *scales):
        self.k[loc.loc], self.v[loc.loc] = k.view(-1, HKV, D), v.view(-1, HKV, D)


class NotCalled:
    def forward(self, *args, **kwargs):
        raise AssertionError("sglang's verify kernel ran")

    forward_return_lse = forward


def make_case(parents, seed=0, padded_bs=None):
    """A verify batch: two requests' prefixes in req_to_token, W fresh slots each, the tree's FULL mask."""
    g = torch.Generator().manual_seed(seed)
    bs = len(PREFIX)
    slots = (torch.randperm(POOL - 1, generator=g)[: sum(PREFIX) + bs * W] + 1).to(torch.int32)
    req_to_token = torch.zeros(4, CTX, dtype=torch.int32)
    pools = torch.tensor([2, 1])
    start = 0
    for b, L in enumerate(PREFIX):
        req_to_token[pools[b], :L] = slots[start : start + L]
        start += L
    loc = slots[start:].to(torch.int64)
    mask = None
    if parents is not None:
        mask = torch.cat([torch.cat([torch.ones(W, L, dtype=torch.bool), block_of(parents)], 1).flatten() for L in PREFIX])
    n = padded_bs or bs
    seq_lens = torch.tensor(PREFIX + [1] * (n - bs))
    fb = types.SimpleNamespace(
        forward_mode=mode("TARGET_VERIFY"), batch_size=n, seq_lens=seq_lens, seq_lens_cpu=seq_lens,
        seq_lens_sum=int(seq_lens.sum()), req_pool_indices=torch.cat([pools, torch.zeros(n - bs, dtype=torch.int64)]),
        out_cache_loc=loc, encoder_lens=None, encoder_out_cache_loc=None, extend_prefix_lens_cpu=None,
        spec_info=types.SimpleNamespace(custom_mask=mask, draft_token_num=W, ragged_verify_layout=None),
    )
    q = torch.randn(bs * W, HQ * D, generator=g)
    k, v = torch.randn(bs * W, HKV * D, generator=g), torch.randn(bs * W, HKV * D, generator=g)
    return fb, req_to_token, q, k, v, Pool(g)


def mode(name):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return getattr(ForwardMode, name)


def real_backend(req_to_token, pool, deterministic=True):
    """sglang's FlashInferAttnBackend with what its verify planning and forward_extend read (no GPU): its original
    init_forward_metadata(_out_graph) plan sglang's verify wrapper, which must never run."""
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend, PrefillMetadata

    backend = object.__new__(FlashInferAttnBackend)
    workspace = torch.empty(8, dtype=torch.uint8)
    attrs = dict(
        enable_deterministic=deterministic, page_size=1, num_wrappers=1, dispatch_reason=None,
        decode_backend="fa2", decode_use_tensor_cores=True, workspace_buffer=workspace,
        decode_wrappers=[StandInDecodeWrapper(workspace, "NHD", backend="fa2", use_tensor_cores=True)],
        indices_updater_decode=types.SimpleNamespace(num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D,
                                                     data_type=torch.float32, q_data_type=torch.float32),
        req_to_token_pool=types.SimpleNamespace(req_to_token=req_to_token), token_to_kv_pool=pool,
        forward_metadata=None, prefill_uses_dequant_workspace=False, decode_uses_dequant_workspace=False,
        use_sliding_window_kv_pool=False, kv_cache_quant_method=types.SimpleNamespace(needs_global_scale=lambda: True),
        cuda_graph_kv_indices=[torch.zeros(2 * W * CTX, dtype=torch.int32)], decode_split_tile_size=2048,
    )
    for name, value in attrs.items():
        setattr(backend, name, value)
    plans = []

    def sglang_plan(forward_batch, in_capture=False):
        plans.append(in_capture)
        backend.forward_metadata = PrefillMetadata([NotCalled()], False, False)

    backend.init_forward_metadata = sglang_plan
    backend.init_forward_metadata_out_graph = sglang_plan
    backend.sglang_plans = plans
    return backend


def hooked(backend, declined=None, supported=True, draft=False, context=CTX):
    runner = types.SimpleNamespace(is_draft_worker=draft, model_config=types.SimpleNamespace(context_len=context))
    fi.make_flashinfer_init(lambda self, model_runner: None, supported, "x.y", declined)(backend, runner)
    return backend


def layer():
    return attention_layer(HQ, HKV, D)


def decode_one(pool, q_row, slots):
    """A decode of one token whose sequence is `slots` (its own slot last), planned as sglang plans a decode row."""
    wrapper = StandInDecodeWrapper(torch.empty(8, dtype=torch.uint8), "NHD", backend="fa2", use_tensor_cores=True)
    wrapper.plan(torch.tensor([0, len(slots)], dtype=torch.int32), torch.tensor(slots, dtype=torch.int32),
                 torch.ones(1, dtype=torch.int32), HQ, HKV, D, 1)
    return wrapper.forward(q_row.view(1, HQ, D), pool.get_kv_buffer(0)).view(1, HQ * D)


def expected(fb, req_to_token, q, pool, parents):
    block, rows = block_of(parents), []
    for b, L in enumerate(PREFIX):
        prefix = req_to_token[fb.req_pool_indices[b], :L].tolist()
        for i in range(W):
            path = [int(fb.out_cache_loc[b * W + j]) for j in range(W) if block[i, j]]
            rows.append(decode_one(pool, q[b * W + i], prefix + path))
    return torch.cat(rows)


def verify(backend, fb, q, k, v):
    return backend.forward_extend(q, k, v, layer(), fb, save_kv_cache=True)


@pytest.mark.parametrize("shape", list(TREES))
def test_eager_verify_rows_equal_decode_rows(shape, serving_release):
    fb, r2t, q, k, v, pool = make_case(TREES[shape])
    backend = hooked(real_backend(r2t, pool))
    backend.init_forward_metadata(fb)
    got = verify(backend, fb, q, k, v)
    assert backend.sglang_plans == [False]
    assert torch.equal(pool.k[fb.out_cache_loc], k.view(-1, HKV, D)), "forward_extend did not save the window's keys"
    assert torch.equal(got, expected(fb, r2t, q, pool, TREES[shape]))
    plan = backend._flashtree_decode_rows.eager.plans[-1]
    assert plan["rows"] == len(PREFIX) * W and plan["heads"] == (HQ, HKV, D) and plan["disable_split_kv"] is True


def test_graph_capture_then_replay_with_another_tree(serving_release):
    fb, r2t, q, k, v, pool = make_case(TREES["tree"])
    backend = hooked(real_backend(r2t, pool))
    backend.init_forward_metadata_out_graph(fb, in_capture=True)
    rows = backend._flashtree_decode_rows
    wrapper = rows.graphed[len(PREFIX) * W]
    assert wrapper.is_cuda_graph_enabled and wrapper._paged_kv_indices_buf is backend.cuda_graph_kv_indices[0]
    assert torch.equal(verify(backend, fb, q, k, v), expected(fb, r2t, q, pool, TREES["tree"]))
    # a replay: sglang plans out of the graph, the captured kernel reads the same wrapper's buffers
    fb.spec_info.custom_mask = make_case(TREES["other-tree"])[0].spec_info.custom_mask
    backend.init_forward_metadata_out_graph(fb)
    assert rows.graphed == {len(PREFIX) * W: wrapper} and backend.sglang_plans == [True, False]
    assert torch.equal(wrapper.forward(q.view(-1, HQ, D), pool.get_kv_buffer(0)).view(-1, HQ * D),
                       expected(fb, r2t, q, pool, TREES["other-tree"]))


def test_a_padded_replay_batch_keeps_the_real_requests_rows(serving_release):
    """Graph replays pad the batch to a captured size; the padding's mask and window slots are not there."""
    fb, r2t, q, k, v, pool = make_case(TREES["tree"], padded_bs=3)
    fb.seq_lens_sum = None  # as sglang's replay view has it when the batch carried none
    indptr, indices, w = fi.verify_rows(fb, r2t)
    assert w == W and indptr.shape == (3 * W + 1,)
    block = block_of(TREES["tree"])
    for b, L in enumerate(PREFIX):
        for i in range(W):
            r = b * W + i
            path = [int(fb.out_cache_loc[b * W + j]) for j in range(W) if block[i, j]]
            assert indices[int(indptr[r]) : int(indptr[r + 1])].tolist() == r2t[fb.req_pool_indices[b], :L].tolist() + path


def test_ragged_verify_keeps_sglangs_path_and_is_counted(serving_release):
    fb, r2t, q, k, v, pool = make_case(TREES["tree"])
    fb.spec_info.ragged_verify_layout = object()
    declined: dict = {}
    backend = hooked(real_backend(r2t, pool), declined)
    backend.init_forward_metadata(fb)
    assert isinstance(backend.forward_metadata.prefill_wrappers[0], NotCalled)
    assert declined == {"ragged verify lengths": 1}


def test_non_verify_batches_are_left_to_sglang(serving_release):
    fb, r2t, q, k, v, pool = make_case(TREES["tree"])
    fb.forward_mode = mode("EXTEND")
    backend = hooked(real_backend(r2t, pool))
    backend.init_forward_metadata(fb)
    assert isinstance(backend.forward_metadata.prefill_wrappers[0], NotCalled)
    assert backend._flashtree_decode_rows.eager.plans == []


def test_start_refuses_what_cannot_be_exact(caplog):
    r2t, pool = torch.zeros(1, 1, dtype=torch.int32), None
    with pytest.raises(ToggleError, match="--enable-deterministic-inference"):
        hooked(real_backend(r2t, pool, deterministic=False))
    for attr, value, match in (("page_size", 16, "--page-size 16"), ("num_wrappers", 2, "sliding-window"),
                               ("decode_uses_dequant_workspace", True, "dequantisation")):
        backend = real_backend(r2t, pool)
        setattr(backend, attr, value)
        with pytest.raises(ToggleError, match=f"flashinfer .*{match}.*--attention-backend triton"):
            hooked(backend)
    backend = real_backend(r2t, pool)
    del backend.decode_wrappers
    with pytest.raises(ToggleError, match="cannot hook sglang x.y's FlashInferAttnBackend \\(no decode_wrappers\\)"):
        hooked(backend)
    with pytest.raises(ToggleError, match="not supported on sglang x.y; allowed: --attention-backend triton"):
        hooked(real_backend(r2t, pool), supported=False)
    draft = hooked(real_backend(r2t, pool, deterministic=False), draft=True)  # the draft's backend is left alone
    assert not hasattr(draft, "_flashtree_decode_rows")
    with caplog.at_level(logging.WARNING, logger="flashtree.patches"):
        hooked(real_backend(r2t, pool), context=4096)
    assert "SGLANG_FLASHINFER_DECODE_SPLIT_TILE_SIZE=2048" in caplog.text and "(4096)" in caplog.text


def test_toggle_installs_on_the_real_class_and_uninstalls(sglang_release):
    """Installed on every release; on one whose verify input does not hand FlashInfer the tree's mask
    (adapter.flashinfer_verify), a FlashInfer target with the toggle stops at start."""
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend

    from flashtree.patches import plan
    from flashtree.patches.adapters import select_adapter

    toggles = read_toggles({"FLASHTREE_EXACT_VERIFY": "1"})
    original = FlashInferAttnBackend.__dict__["__init__"]
    patches.install(toggles)
    assert FlashInferAttnBackend.__init__.__wrapped__ is original
    patches.uninstall()
    assert FlashInferAttnBackend.__dict__["__init__"] is original

    adapter = select_adapter()
    (patch,) = [p for p in plan.patches(adapter, toggles) if p.key == "FlashInferAttnBackend.__init__"]
    init = patch.make(lambda self, model_runner: None)
    backend = real_backend(torch.zeros(1, 1, dtype=torch.int32), None)
    runner = types.SimpleNamespace(is_draft_worker=False, model_config=types.SimpleNamespace(context_len=CTX))
    if adapter.flashinfer_verify:
        init(backend, runner)
        assert isinstance(backend._flashtree_decode_rows, fi.DecodeRows)
    else:
        with pytest.raises(ToggleError, match=f"not supported on sglang {sglang_release}"):
            init(backend, runner)
