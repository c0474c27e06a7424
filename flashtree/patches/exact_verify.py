"""FLASHTREE_EXACT_VERIFY: verify attention that reproduces decode attention bit for bit.

Greedy speculative decoding commits the target's argmax at every verified position. In float32 the verify forward's
logits differ from a plain decode's in the last bits (other GEMM shapes, another attention kernel), and at a near-tie
that flips the argmax: every speculative server, DSPARK's own chain included, then drifts from no speculation on a
few prompts in fifty. Under sglang's `--enable-deterministic-inference` every GEMM and norm is batch invariant (a
row's result does not depend on the other rows), and decode attention splits each sequence into fixed
`SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE` tiles; the only op left whose reduction order differs between verify and
decode is attention (deterministic verify runs sglang's one-stage extend kernel).

This patch closes that gap. On the target's Triton backend it takes over the deterministic extend path
(`TritonAttnBackend._forward_extend_unified`) for TARGET_VERIFY batches. Each verify token becomes one decode row: its
keys are the request's prefix followed by the token's tree path (its ancestors and itself, root first). These are
exactly the keys, in the same order, that a plain decode at that position attends. The rows then run through the
backend's own `decode_attention_fwd`, with the split count the backend's `get_num_kv_splits` gives a decode row of
that length. A verified token's logits are therefore the decode's logits, and greedy outputs equal no speculation
token for token (chain or tree).

Each verify token reads its request's prefix again, once per row instead of once per request. On SmolLM2-135M in
float32 that did not show (benchmarks/HISTORY.md); a long-prefix, large-batch server would pay for it.
FLASHTREE_SPLITKV_VERIFY=1 on a deterministic server avoids that: the same rows, in the same arithmetic, through
flashtree's decode-order split-KV kernel (`flashtree.attention.triton_decode_order`), which reads each prefix block
once for the 16 query rows of a tile. Only shapes are read on the host, so both paths are CUDA-graph capturable.
"""

from __future__ import annotations

import torch

from .toggles import ToggleError

DETERMINISTIC_FLAG = "--enable-deterministic-inference"

def tree_blocks(custom_mask, mask_indptr, prefix_lens: torch.Tensor, bs: int, w: int) -> torch.Tensor:
    """(bs, W, W) bool: row i, column j = verify token i sees verify token j. sglang's FULL mask layout (request b's
    W rows of prefix_b + W entries start at mask_indptr[b]), or a causal chain when `custom_mask` is None."""
    device = prefix_lens.device
    if custom_mask is None:
        return torch.ones(w, w, dtype=torch.bool, device=device).tril().expand(bs, w, w)
    i = torch.arange(w, device=device).view(1, w, 1)
    j = torch.arange(w, device=device).view(1, 1, w)
    pre = prefix_lens.view(bs, 1, 1).to(torch.int64)
    flat = mask_indptr[:bs].view(bs, 1, 1).to(torch.int64) + i * (pre + w) + pre + j
    return custom_mask[flat].bool()


def path_columns(blocks: torch.Tensor):
    """(bs*W, W + 1) int64: row r's k-th entry is the k-th tree column row r sees, in column order (parents come
    before children: root-first path order; the entries past its path are 0), and (bs*W,) how many it sees."""
    bs, w, _ = blocks.shape
    seen = blocks.reshape(bs * w, w)
    rank = torch.where(seen, seen.cumsum(-1) - 1, w)  # unseen columns land in the extra last entry
    cols = torch.zeros(bs * w, w + 1, dtype=torch.int64, device=blocks.device)
    cols.scatter_(1, rank, torch.arange(w, device=blocks.device).expand(bs * w, w).contiguous())
    return cols, seen.sum(-1)


def path_rows(kv_indptr, kv_indices, out_cache_loc, blocks: torch.Tensor, capacity: int):
    """One decode row per verify token. Returns (row_indptr (bs*W + 1,) int32, row_indices (capacity,) int64, row_lens
    (bs*W,) int32): row b*W + i lists request b's prefix slots (kv_indices[kv_indptr[b]:kv_indptr[b + 1]]), then the
    slots of the tree columns row i of `blocks` sees, in column order (parents come before children, so that is
    root-first path order). Entries past row_indptr[-1] are padding. Fixed shapes, no host synchronisation."""
    bs = blocks.shape[0]
    start = kv_indptr[:bs].to(torch.int64)
    last = max(kv_indices.numel() - 1, 0)
    return rows_of(
        (kv_indptr[1 : bs + 1] - kv_indptr[:bs]).to(torch.int64),
        lambda b, off: kv_indices[(start[b] + off).clamp_(0, last)],
        out_cache_loc, blocks, capacity,
    )


def rows_of(prefix: torch.Tensor, prefix_slot, out_cache_loc, blocks: torch.Tensor, capacity: int):
    """`path_rows` for any prefix source: `prefix` (bs,) int64 lengths, `prefix_slot(b, off)` the slots of request
    b's prefix positions `off` (both (capacity,) int64; `off` may run past the prefix there, where the result is
    discarded, so the source must clamp rather than fail)."""
    bs, w, _ = blocks.shape
    rows = bs * w
    device = blocks.device
    path_cols, path_lens = path_columns(blocks)
    row_lens = prefix.repeat_interleave(w) + path_lens
    row_indptr = torch.zeros(rows + 1, dtype=torch.int64, device=device)
    row_indptr[1:] = row_lens.cumsum(0)
    p = torch.arange(capacity, device=device)
    r = torch.searchsorted(row_indptr[1:], p, right=True).clamp_(max=rows - 1)
    off = p - row_indptr[r]
    b = torch.div(r, w, rounding_mode="floor")
    pre = prefix[b]
    col = path_cols[r, (off - pre).clamp_(0, w - 1)]
    from_path = out_cache_loc[b * w + col].to(torch.int64)
    row_indices = torch.where(off < pre, prefix_slot(b, off).to(torch.int64), from_path)
    return row_indptr.to(torch.int32), row_indices, row_lens.to(torch.int32)


def path_slots(out_cache_loc, blocks: torch.Tensor):
    """The decode-order kernel's view of the same rows: (bs*W, W) int64 slots of each token's path, root first, and
    (bs*W,) int32 path lengths; the prefix stays in kv_indptr / kv_indices."""
    bs, w, _ = blocks.shape
    cols, lens = path_columns(blocks)
    base = torch.arange(bs, device=blocks.device).repeat_interleave(w).view(-1, 1) * w
    return out_cache_loc.to(torch.int64)[base + cols[:, :w]], lens.to(torch.int32)


def decline_reason(layer, meta, causal, logits_soft_cap, sinks, score_mod, q, bs: int) -> str | None:
    """Why a verify call cannot run as decode rows (None = it can). sglang's unified path serves those instead."""
    w = meta.max_extend_len
    if meta.custom_mask is None and not causal:
        return "non-causal attention without a mask"
    if sinks is not None:
        return "attention sinks"
    if score_mod is not None:
        return "score_mod"
    if logits_soft_cap and logits_soft_cap > 0:
        return "logit soft cap"
    if layer.sliding_window_size is not None and layer.sliding_window_size > -1:
        return "sliding window"
    if layer.k_scale is not None or layer.v_scale is not None:
        return "scaled (fp8) KV"
    if layer.qk_head_dim != layer.v_head_dim:
        return "MLA head dims"
    if not isinstance(w, int) or w < 1 or q.shape[0] != bs * w:
        return "ragged verify lengths"
    return None


def _per_forward(backend, layer, build):
    """What `build(meta, bs, w, blocks)` makes of this forward, built once at its first layer and reused by the
    others. Layers run in increasing id order, so an id that does not increase starts a new forward (graph capture
    reruns one forward object several times; each run must rebuild so the captured graph holds the build)."""
    meta = backend.forward_metadata
    cached = getattr(backend, "_flashtree_exact_rows", None)
    if cached is not None and cached[0] is meta and layer.layer_id > cached[1]:
        backend._flashtree_exact_rows = (meta, layer.layer_id, cached[2])
        return cached[2]
    bs = meta.qo_indptr.shape[0] - 1
    w = meta.max_extend_len
    prefix = meta.kv_indptr[1 : bs + 1] - meta.kv_indptr[:bs]
    built = build(meta, bs, w, tree_blocks(meta.custom_mask, meta.mask_indptr, prefix, bs, w))
    backend._flashtree_exact_rows = (meta, layer.layer_id, built)
    return built


def _decode_rows(backend, forward_batch):
    """build: the rows as sglang's decode kernel reads them, and each row's split count."""

    def build(meta, bs, w, blocks):
        capacity = min(bs * w * backend.max_context_len, w * meta.kv_indices.numel() + bs * w * w)
        row_indptr, row_indices, row_lens = path_rows(
            meta.kv_indptr, meta.kv_indices, forward_batch.out_cache_loc, blocks, capacity
        )
        splits = torch.empty(bs * w, dtype=torch.int32, device=row_lens.device)
        backend.get_num_kv_splits(splits, row_lens)
        return row_indptr, row_indices, splits

    return build


def _decode_order_paths(forward_batch):
    """build: the tree paths as the decode-order kernel reads them (the prefix stays in kv_indptr / kv_indices)."""
    return lambda meta, bs, w, blocks: path_slots(forward_batch.out_cache_loc, blocks)


def _run_decode_rows(backend, q, o, layer, forward_batch):
    row_indptr, row_indices, splits = _per_forward(backend, layer, _decode_rows(backend, forward_batch))
    rows, hq = q.shape[0], layer.tp_q_head_num
    attn_logits = torch.empty(rows, hq, backend.max_kv_splits, layer.v_head_dim, dtype=torch.float32, device=q.device)
    attn_lse = torch.empty(rows, hq, backend.max_kv_splits, dtype=torch.float32, device=q.device)
    backend.decode_attention_fwd(
        q.view(-1, hq, layer.qk_head_dim),
        backend.token_to_kv_pool.get_key_buffer(layer.layer_id),
        backend.token_to_kv_pool.get_value_buffer(layer.layer_id),
        o.view(-1, hq, layer.v_head_dim),
        row_indptr,
        row_indices,
        attn_logits,
        attn_lse,
        splits,
        backend.max_kv_splits,
        layer.scaling,
        1.0,
        1.0,
        logit_cap=0.0,
        sinks=None,
        xai_temperature_len=layer.xai_temperature_len,
        has_mla=backend.use_mla,
        use_pdl=backend.use_pdl,
        page_size=backend.page_size,
    )


def _run_decode_order(backend, kernel, q, o, layer, forward_batch):
    slots, lens = _per_forward(backend, layer, _decode_order_paths(forward_batch))
    meta = backend.forward_metadata
    bs = meta.qo_indptr.shape[0] - 1
    hq = layer.tp_q_head_num
    kernel(
        q.view(-1, hq, layer.qk_head_dim),
        backend.token_to_kv_pool.get_key_buffer(layer.layer_id),
        backend.token_to_kv_pool.get_value_buffer(layer.layer_id),
        meta.kv_indptr[: bs + 1],
        meta.kv_indices,
        slots,
        lens,
        meta.max_extend_len,
        layer.scaling,
        backend.split_tile_size,
        backend.max_kv_splits,
        out=o.view(-1, hq, layer.v_head_dim),
    )


def make_forward_extend_unified(backend, original, declined: dict | None = None, decode_order=None):
    """`_forward_extend_unified` for one target backend: TARGET_VERIFY batches as decode rows (through
    `decode_order`, flashtree's split-KV kernel in decode order, where given and the heads are grouped: MHA decodes
    with another sglang kernel), the rest unchanged."""

    def _forward_extend_unified(q, o, layer, forward_batch, causal, logits_soft_cap, sinks, score_mod=None,
                                aux_tensors=None):
        meta = backend.forward_metadata
        if not forward_batch.forward_mode.is_target_verify():
            return original(q, o, layer, forward_batch, causal, logits_soft_cap, sinks, score_mod=score_mod,
                            aux_tensors=aux_tensors)
        bs = meta.qo_indptr.shape[0] - 1
        reason = decline_reason(layer, meta, causal, logits_soft_cap, sinks, score_mod, q, bs)
        if reason is not None:
            if declined is not None:
                declined[reason] = declined.get(reason, 0) + 1
            return original(q, o, layer, forward_batch, causal, logits_soft_cap, sinks, score_mod=score_mod,
                            aux_tensors=aux_tensors)
        if decode_order is not None and layer.tp_q_head_num > layer.tp_k_head_num:
            _run_decode_order(backend, decode_order, q, o, layer, forward_batch)
        else:
            _run_decode_rows(backend, q, o, layer, forward_batch)
        return o

    return _forward_extend_unified


def take_over(backend, declined: dict | None, toggle: str, decode_order=None) -> None:
    """Put the exact verify path on one deterministic target backend, or stop the server where it cannot be exact."""
    if int(getattr(backend, "page_size", 1) or 1) != 1:
        raise ToggleError(
            f"flashtree: {toggle}=1 on a {DETERMINISTIC_FLAG} server gives decode-exact verify attention, which "
            f"supports --page-size 1 only (got {backend.page_size}); allowed: --page-size 1, or set {toggle}=0"
        )
    backend._forward_extend_unified = make_forward_extend_unified(
        backend, backend._forward_extend_unified, declined, decode_order
    )


def make_triton_init(original, declined: dict | None = None):
    """TritonAttnBackend.__init__ that puts the exact verify path on target (not draft) backends, or stops the server
    when this backend cannot give decode-identical verify attention."""

    def __init__(self, model_runner, *args, **kwargs):
        original(self, model_runner, *args, **kwargs)
        if getattr(model_runner, "is_draft_worker", False):
            return  # the draft's block forward keeps sglang's attention
        if not getattr(self, "enable_deterministic", False):
            raise ToggleError(
                f"flashtree: FLASHTREE_EXACT_VERIFY=1 needs sglang's {DETERMINISTIC_FLAG} (batch-invariant GEMMs and "
                "fixed decode splits: without them verify and decode logits differ whatever the attention does); "
                f"allowed: start the server with {DETERMINISTIC_FLAG}, or set FLASHTREE_EXACT_VERIFY=0"
            )
        take_over(self, declined, "FLASHTREE_EXACT_VERIFY")

    return __init__
