"""FLASHTREE_SPLITKV_VERIFY: sglang's Triton verify extend path routed to flashtree's tree-verify attention kernel.

sglang's `TritonAttnBackend.forward_extend` (0.5.17, 0.5.20, 0.5.23) calls, on TARGET_VERIFY batches when
`self.use_verify_splitkv` is set,

    self.verify_splitkv_fwd(q, k, v, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, custom_mask, causal,
                            mask_indptr, max_extend_len, k_descale, v_descale, sm_scale, *, logit_cap,
                            sliding_window_size, sinks, window_kv_offsets, xai_temperature_len, max_bs) -> bool

and falls back to its own `extend_attention_fwd` when that returns False. Upstream sets the flag only on AMD gfx95 with
topk == 1; flashtree's Triton init patch sets it per target-backend instance (plan.py installs it) and puts
`make_verify_fwd(kernel)` there. The function below keeps sglang's signature, declines (returns False, nothing written)
every case flashtree's kernel does not cover, and otherwise hands the call to flashtree's kernel in sglang's own layout:

    flashtree.attention.triton_verify.tree_attention_triton(q, k, v, k_buffer, v_buffer, kv_indptr, kv_indices, custom_mask, L,
                                              sm_scale=None, mask_indptr=None, out=None, causal=False)

    q (bs*L, Hq, D), k (bs*L, Hkv, D), v (bs*L, Hkv, Dv): the L = W verify tokens of each request, request-major;
    k_buffer (slots, Hkv, D), v_buffer (slots, Hkv, Dv): the layer's KV pool, indexed by token slot;
    kv_indptr (bs+1,), kv_indices: the slots of each request's prefix (every verify token sees all of it);
    custom_mask: sglang's FULL layout with mask_indptr (request b's L rows of prefix_b + L booleans start at
    mask_indptr[b]; the kernel reads only each request's L x L block), or the QLEN layout (bs*L*L) without it;
    out (bs*L, Hq, Dv) written in place.

A chain verify (DSPARK's own: custom_mask None, causal) takes the same kernel with `causal=True`: the kernel computes
the chain's mask, so a captured chain verify builds no mask tensor per layer. Only shapes are read on the host (no
synchronisation), so the path is CUDA-graph capturable.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from .toggles import load_for_toggle

logger = logging.getLogger("flashtree.patches")

KERNEL = "flashtree.attention.triton_verify:tree_attention_triton"
DECODE_ORDER_KERNEL = "flashtree.attention.triton_decode_order:decode_order_verify_triton"  # deterministic servers

_SERVED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def load_kernel(path: str = KERNEL) -> Callable:
    """flashtree's tree-verify attention kernel (or DECODE_ORDER_KERNEL), or a ToggleError (SystemExit) naming what is
    missing."""
    return load_for_toggle(path, "FLASHTREE_SPLITKV_VERIFY", "sglang's own verify attention")


def decline_reason(q, k, v, o, k_buffer, qo_indptr, custom_mask, causal, max_extend_len, k_descale, v_descale,
                   logit_cap, sliding_window_size, sinks, xai_temperature_len, extra) -> str | None:
    """Why flashtree's kernel cannot serve this call bit-for-bit like sglang's extend attention (None = it can)."""
    if extra:
        return f"unknown arguments {sorted(extra)}"
    if sinks is not None:
        return "attention sinks"
    if sliding_window_size is not None and sliding_window_size >= 0:
        return "sliding window"
    if logit_cap and logit_cap > 0:
        return "logit soft cap"
    if xai_temperature_len is not None and xai_temperature_len > 0:
        return "xai temperature"
    if float(k_descale) != 1.0 or float(v_descale) != 1.0:
        return "scaled (fp8) KV"
    if k_buffer.dtype not in _SERVED_DTYPES or q.dtype not in _SERVED_DTYPES:
        return f"dtype {k_buffer.dtype}/{q.dtype}"
    if custom_mask is None and not causal:
        return "non-causal attention without a mask"
    if max_extend_len is None or not isinstance(max_extend_len, int) or max_extend_len < 1:
        return "no fixed verify width"
    bs = qo_indptr.shape[0] - 1
    if bs < 1 or q.shape[0] != bs * max_extend_len:
        return "ragged verify lengths"
    return None


def make_verify_fwd(kernel: Callable, declined: dict | None = None) -> Callable:
    """sglang's `verify_splitkv_fwd` signature around flashtree's `tree_attention_triton`."""

    def verify_splitkv_fwd(q, k, v, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, custom_mask, causal,
                           mask_indptr, max_extend_len, k_descale=1.0, v_descale=1.0, sm_scale=None, *, logit_cap=0.0,
                           sliding_window_size=-1, sinks=None, window_kv_offsets=None, xai_temperature_len=-1,
                           max_bs=None, **extra) -> bool:
        reason = decline_reason(q, k, v, o, k_buffer, qo_indptr, custom_mask, causal, max_extend_len, k_descale,
                                v_descale, logit_cap, sliding_window_size, sinks, xai_temperature_len, extra)
        if reason is not None:
            if declined is not None:
                declined[reason] = declined.get(reason, 0) + 1
            return False
        bs = qo_indptr.shape[0] - 1
        w = max_extend_len
        chain = custom_mask is None  # a chain verify: causal within each request's block, computed in the kernel
        kernel(q, k, v, k_buffer, v_buffer, kv_indptr[: bs + 1], kv_indices, custom_mask, w, sm_scale=sm_scale,
               mask_indptr=None if chain else mask_indptr[: bs + 1], out=o, causal=chain)
        return True

    verify_splitkv_fwd.declined = declined
    return verify_splitkv_fwd


def make_triton_init(original, kernel, has_shared_kv: bool, declined: dict | None = None,
                     decode_order: Callable | None = None, required: bool = True):
    """TritonAttnBackend.__init__ that turns flashtree's verify attention on for target (not draft) backends. A
    deterministic backend sends verify batches to its one-stage unified path before it looks at `use_verify_splitkv`;
    there the decode-order kernel (exact_verify.py) takes that path over, so split-KV verify is decode-exact, at page
    size 1 only: a larger page stops the server when the toggle was set (`required`), else keeps sglang's path."""
    verify_fwd = torch.compiler.disable(make_verify_fwd(kernel, declined))

    def __init__(self, model_runner, *args, **kwargs):
        original(self, model_runner, *args, **kwargs)
        if getattr(model_runner, "is_draft_worker", False):
            return  # the draft's block forward keeps sglang's attention
        if getattr(self, "enable_deterministic", False):
            if not required and int(getattr(self, "page_size", 1) or 1) != 1:
                logger.info("flashtree: split-KV verify (the tree's default) stays off: this deterministic server's "
                            "--page-size %s has no decode-exact split-KV path; sglang's verify attention serves",
                            self.page_size)
                return
            from .exact_verify import take_over

            take_over(self, declined, "FLASHTREE_SPLITKV_VERIFY",
                      decode_order and torch.compiler.disable(decode_order))
            return
        self.use_verify_splitkv = True
        if has_shared_kv:
            self.use_verify_shared_kv = False  # 0.5.20+: the grouped-head kernel would take precedence
        self.verify_splitkv_fwd = verify_fwd

    return __init__
