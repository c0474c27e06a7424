"""What sglang's Triton attention backend reads of a RadixAttention layer, for the CPU attention tests."""

from __future__ import annotations

import types


def attention_layer(hq: int, hkv: int, d: int, logit_cap: float = 0.0):
    """A decoder self-attention layer 0 with hq query heads, hkv KV heads of dimension d, no sliding window, no fp8."""
    from sglang.srt.layers.radix_attention import AttentionType

    return types.SimpleNamespace(
        tp_q_head_num=hq, tp_k_head_num=hkv, qk_head_dim=d, v_head_dim=d, head_dim=d, layer_id=0,
        logit_capping_method="tanh", logit_cap=logit_cap, is_cross_attention=False, attn_type=AttentionType.DECODER,
        sliding_window_size=-1, k_scale=None, v_scale=None, k_scale_float=None, v_scale_float=None,
        scaling=d**-0.5, xai_temperature_len=-1,
    )
