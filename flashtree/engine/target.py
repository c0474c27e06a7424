"""The target side of a tree step on a Hugging Face causal LM: prefill, tree-masked verify, KV crop and reorder; and
the target's own greedy decoding, the reference every greedy run must equal."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache


@dataclass
class TargetOutput:
    logits: torch.Tensor  # (1, T, V) float32
    hidden: dict[int, torch.Tensor]  # layer id -> (1, T, H): output of that layer (HF hidden_states[i + 1])


def context_limit(model) -> int | None:
    return getattr(model.config, "max_position_embeddings", None)


def _forward(model, input_ids, cache, position_ids, mask, hidden_layers) -> TargetOutput:
    out = model(
        input_ids=input_ids,
        past_key_values=cache,
        position_ids=position_ids,
        attention_mask=mask,
        use_cache=True,
        output_hidden_states=bool(hidden_layers),
    )
    hidden = {i: out.hidden_states[i + 1] for i in hidden_layers}
    return TargetOutput(logits=out.logits.float(), hidden=hidden)


def prefill(model, prompt: torch.Tensor, hidden_layers: tuple[int, ...]) -> tuple[DynamicCache, TargetOutput | None]:
    """Fill the cache with every prompt token but the last (the first anchor, verified with the first tree)."""
    cache = DynamicCache(config=model.config)
    if prompt.shape[1] < 2:
        return cache, None
    body = prompt[:, :-1]
    pos = torch.arange(body.shape[1], device=body.device).view(1, -1)
    return cache, _forward(model, body, cache, pos, None, hidden_layers)


def verify_forward(
    model,
    cache: DynamicCache,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    tree_mask: torch.Tensor,
    hidden_layers: tuple[int, ...],
) -> TargetOutput:
    """One forward over the W tree tokens (root first) after the cached prefix, under the tree's ancestor mask.

    tokens, positions: (1, W); tree_mask: (1, W, W) bool. The mask is additive float (0 / dtype min) so eager and
    SDPA attention both read it; the prefix is visible to every row.
    """
    prefix = cache.get_seq_length()
    w = tokens.shape[1]
    dtype = model.dtype
    visible = torch.cat([tree_mask.new_ones((1, w, prefix)), tree_mask], dim=2)
    mask = torch.zeros(visible.shape, dtype=dtype, device=tokens.device)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return _forward(model, tokens, cache, positions, mask.unsqueeze(1), hidden_layers)


def keep_in_cache(cache: DynamicCache, prefix: int, window_keep: torch.Tensor) -> None:
    """Crop the cache to `prefix` entries plus the verify-window entries `window_keep` (offsets, in order)."""
    idx = torch.cat([torch.arange(prefix, device=window_keep.device), prefix + window_keep])
    for layer in cache.layers:
        layer.keys = layer.keys.index_select(2, idx.to(layer.keys.device))
        layer.values = layer.values.index_select(2, idx.to(layer.values.device))


def greedy_reference(model, input_ids, max_new_tokens: int, stop: list[int] | None):
    """The target's own greedy decoding (prompt included), as plain `generate` returns it."""
    with torch.no_grad():
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=stop or None,
            pad_token_id=(stop or [0])[0],
        )
    return out
