"""FLASHTREE_EXACT_VERIFY on `--attention-backend flashinfer`: the verify as decode rows through FlashInfer's decode.

Under `--enable-deterministic-inference` sglang's FlashInfer decode runs every request as one tensor-core decode row
(`decode_use_tensor_cores`), unsplit under CUDA graphs. Its verify runs FlashInfer's prefill kernel over the W query
rows of each request under the tree's mask, whose tiles reduce the keys in another order. In bf16 that flips greedy
tokens on most prompts, DSPARK's own chain included (BENCHMARKS.md 4.0b, live run 28: 18 of 50 equal).

Here each verify token becomes one decode row, as in exact_verify.py: the request's prefix (from req_to_token), then
the token's tree path, root first. The rows run through a decode wrapper built as sglang builds its own: the same
class, FlashInfer backend, tensor-core setting and float workspace. sglang's `forward_extend` stays in charge: it saves
the window's keys, then calls the verify's paged wrapper, which is this module's stand-in for the rows' wrapper.

The rows never split (`disable_split_kv`), as sglang's deterministic decode under CUDA graphs. Unsplit, FlashInfer's
plan needs no row lengths: it gets placeholder host lengths, and the true row offsets go to the wrapper's device buffer
after it. So nothing waits for the device. Planning runs where sglang plans its verify: `init_forward_metadata`
eagerly, `init_forward_metadata_out_graph` before each graph replay, with one wrapper per captured row count (its own
offset buffers; the key slots share sglang's graph kv-indices buffer, which the replaced verify kernel never reads).
"""

from __future__ import annotations

import logging

import torch

from .exact_verify import DETERMINISTIC_FLAG, rows_of, tree_blocks
from .flashinfer_graphs import prefix_total
from .toggles import ToggleError

logger = logging.getLogger("flashtree.patches")

SPLIT_TILE_ENV = "SGLANG_FLASHINFER_DECODE_SPLIT_TILE_SIZE"
# What the rows read of sglang's backend once it is built (the release probes cover its methods).
BACKEND_ATTRS = ("indices_updater_decode", "decode_wrappers", "decode_backend", "decode_use_tensor_cores",
                 "workspace_buffer", "forward_metadata", "req_to_token_pool")


def verify_rows(forward_batch, req_to_token: torch.Tensor):
    """The decode rows of one FlashInfer verify batch: (row_indptr (bs*W + 1,) int32, row_indices int32, W). Its
    custom mask is sglang's FULL layout over prefix_b = seq_lens[b] (None: DSPARK's causal chain)."""
    spec = forward_batch.spec_info
    bs, w = forward_batch.batch_size, int(spec.draft_token_num)
    prefix = forward_batch.seq_lens[:bs].to(torch.int64)
    device = prefix.device
    total = prefix_total(forward_batch, prefix)
    mask, mask_indptr = spec.custom_mask, None
    if mask is not None:
        mask_indptr = torch.zeros(bs + 1, dtype=torch.int64, device=device)
        mask_indptr[1:] = (w * (prefix + w)).cumsum(0)
        need = w * total + w * w * bs
        if mask.numel() < need:  # graph replays pad the batch; sglang pads the mask the same way
            mask = torch.cat([mask, torch.ones(need - mask.numel(), dtype=mask.dtype, device=device)])
    blocks = tree_blocks(mask, mask_indptr, prefix, bs, w)
    loc = forward_batch.out_cache_loc.to(torch.int64)
    if loc.numel() < bs * w:
        loc = torch.cat([loc, loc.new_zeros(bs * w - loc.numel())])
    pools = forward_batch.req_pool_indices[:bs].to(torch.int64)
    last = req_to_token.shape[1] - 1
    row_indptr, row_indices, _ = rows_of(
        prefix, lambda b, off: req_to_token[pools[b], off.clamp(0, last)], loc, blocks, w * total + bs * w * w,
    )
    return row_indptr, row_indices.to(torch.int32), w


class RowsAsVerify:
    """What `forward_extend` calls as the verify's paged prefill wrapper: the rows' decode wrapper, called as sglang's
    `forward_decode` calls its own (`window_left` and `causal` have no meaning for decode rows)."""

    def __init__(self, rows_wrapper):
        self.rows_wrapper = rows_wrapper

    def forward(self, q, kv_cache, **kwargs):
        return self.rows_wrapper.forward(
            q, kv_cache, sm_scale=kwargs.get("sm_scale"), logits_soft_cap=kwargs.get("logits_soft_cap"),
            k_scale=kwargs.get("k_scale"), v_scale=kwargs.get("v_scale"),
        )


class DecodeRows:
    """One target backend's decode-row wrappers: an eager one, and one per captured row count."""

    def __init__(self, backend, declined: dict | None):
        self.backend = backend
        self.declined = declined
        updater = backend.indices_updater_decode
        self.req_to_token = backend.req_to_token_pool.req_to_token
        self.heads = (updater.num_qo_heads, updater.num_kv_heads, updater.head_dim)
        self.dtypes = {"data_type": updater.data_type, "q_data_type": updater.q_data_type}
        self.wrapper_cls = type(backend.decode_wrappers[0])
        self.eager = self._make()
        self.graphed: dict[int, object] = {}
        self.placeholders: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # per row count: host indptr, page lens

    def _make(self, rows: int | None = None):
        b = self.backend
        kwargs = {"backend": b.decode_backend, "use_tensor_cores": b.decode_use_tensor_cores}
        if rows is not None:
            device = b.workspace_buffer.device
            kwargs.update(
                use_cuda_graph=True,
                paged_kv_indptr_buffer=torch.zeros(rows + 1, dtype=torch.int32, device=device),
                paged_kv_indices_buffer=b.cuda_graph_kv_indices[0],
                paged_kv_last_page_len_buffer=torch.ones(rows, dtype=torch.int32, device=device),
            )
        return self.wrapper_cls(b.workspace_buffer, "NHD", **kwargs)

    def serve(self, forward_batch, in_graph: bool, in_capture: bool = False) -> None:
        """Plan the rows of this verify batch and hand them to forward_extend; a batch they cannot serve keeps
        sglang's verify (counted per reason)."""
        spec = forward_batch.spec_info
        if getattr(spec, "ragged_verify_layout", None) is not None:
            if self.declined is not None:
                self.declined["ragged verify lengths"] = self.declined.get("ragged verify lengths", 0) + 1
            return
        row_indptr, row_indices, w = verify_rows(forward_batch, self.req_to_token)
        rows = forward_batch.batch_size * w
        if not in_graph:
            wrapper = self.eager
        else:
            if in_capture and rows not in self.graphed:
                self.graphed[rows] = self._make(rows)
            wrapper = self.graphed[rows]
        if rows not in self.placeholders:
            self.placeholders[rows] = (torch.arange(rows + 1, dtype=torch.int32), torch.ones(rows, dtype=torch.int32))
        indptr, last_page = self.placeholders[rows]
        wrapper.plan(indptr, row_indices, last_page, *self.heads, 1, non_blocking=True, disable_split_kv=True,
                     **self.dtypes)
        wrapper._paged_kv_indptr_buf.copy_(row_indptr)  # the plan saw placeholder lengths (unsplit rows need none)
        self.backend.forward_metadata.prefill_wrappers = [RowsAsVerify(wrapper)]


def check_backend(backend, model_runner, supported: bool, release: str) -> None:
    """Stop the server where FlashInfer verify cannot equal its decode; warn where eager decode splits rows."""
    if not supported:
        raise ToggleError(
            f"flashtree: FLASHTREE_EXACT_VERIFY=1 on --attention-backend flashinfer is not supported on sglang "
            f"{release}; allowed: --attention-backend triton, or set FLASHTREE_EXACT_VERIFY=0"
        )
    missing = [name for name in BACKEND_ATTRS if not hasattr(backend, name)]
    if missing:
        raise ToggleError(
            f"flashtree: FLASHTREE_EXACT_VERIFY=1 cannot hook sglang {release}'s FlashInferAttnBackend (no "
            f"{', '.join(missing)}); allowed: --attention-backend triton, or set FLASHTREE_EXACT_VERIFY=0"
        )
    if not getattr(backend, "enable_deterministic", False):
        raise ToggleError(
            f"flashtree: FLASHTREE_EXACT_VERIFY=1 needs sglang's {DETERMINISTIC_FLAG} (batch-invariant GEMMs and "
            "tensor-core decode rows: without them verify and decode logits differ whatever the attention does); "
            f"allowed: start the server with {DETERMINISTIC_FLAG}, or set FLASHTREE_EXACT_VERIFY=0"
        )
    page = int(getattr(backend, "page_size", 1) or 1)
    why = None
    if page != 1:
        why = f"--page-size {page} (rows list key slots: --page-size 1 only)"
    elif getattr(backend, "num_wrappers", 1) != 1:
        why = "a model with sliding-window or cross-attention layers (two FlashInfer wrappers)"
    elif getattr(backend, "decode_uses_dequant_workspace", False) or getattr(backend, "prefill_uses_dequant_workspace", False):
        why = "a KV cache FlashInfer reads through a dequantisation workspace"
    if why is not None:
        raise ToggleError(
            f"flashtree: FLASHTREE_EXACT_VERIFY=1 on --attention-backend flashinfer gives decode-exact verify "
            f"attention only on plain paged KV, not with {why}; allowed: --attention-backend triton, or set "
            "FLASHTREE_EXACT_VERIFY=0"
        )
    tile = getattr(backend, "decode_split_tile_size", None)
    context = getattr(getattr(model_runner, "model_config", None), "context_len", None)
    if tile and context and context > tile:
        logger.warning(
            "flashtree: FLASHTREE_EXACT_VERIFY on FlashInfer: verify rows never split, as decode under CUDA graphs; "
            "eager decode (batches past the captured sizes) splits rows longer than %s=%d, so there outputs past "
            "that length can differ from no speculation's; set it to the context length (%d) for identity",
            SPLIT_TILE_ENV, tile, context,
        )


def take_over(backend, declined: dict | None) -> None:
    """Route one deterministic FlashInfer target backend's verify batches through decode rows."""
    rows = DecodeRows(backend, declined)
    init, init_out_graph = backend.init_forward_metadata, backend.init_forward_metadata_out_graph

    def init_forward_metadata(forward_batch, *args, **kwargs):
        out = init(forward_batch, *args, **kwargs)
        if forward_batch.forward_mode.is_target_verify():
            rows.serve(forward_batch, in_graph=False)
        return out

    def init_forward_metadata_out_graph(forward_batch, *args, in_capture: bool = False, **kwargs):
        out = init_out_graph(forward_batch, *args, in_capture=in_capture, **kwargs)
        if forward_batch.forward_mode.is_target_verify():
            rows.serve(forward_batch, in_graph=True, in_capture=in_capture)
        return out

    backend.init_forward_metadata = init_forward_metadata
    backend.init_forward_metadata_out_graph = init_forward_metadata_out_graph
    backend._flashtree_decode_rows = rows


def make_flashinfer_init(original, supported: bool, release: str, declined: dict | None = None):
    """FlashInferAttnBackend.__init__ that puts the decode-row verify on target (not draft) backends, or stops the
    server where FlashInfer cannot give decode-identical verify attention."""

    def __init__(self, model_runner, *args, **kwargs):
        original(self, model_runner, *args, **kwargs)
        if getattr(model_runner, "is_draft_worker", False):
            return  # the draft's block forward keeps sglang's attention
        check_backend(self, model_runner, supported, release)
        take_over(self, declined)

    return __init__
