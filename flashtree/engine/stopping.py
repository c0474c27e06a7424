"""The stop rule of a request, shared by the engine and replay: which tokens stop it, and where it stops committing."""

from __future__ import annotations

import torch


def stop_end(tokens: torch.Tensor, *, prompt_len: int, max_new_tokens: int, stop_ids: torch.Tensor,
             start: int | None = None) -> int:
    """Exclusive end of what a request keeps of `tokens` (prompt included): just after its first stop token at or
    after `start` (default: its first new token; the engine passes the step's first token, the earlier ones were
    checked before), or prompt_len + max_new_tokens, whichever comes first. `stop_ids`: LongTensor of stop tokens."""
    end = prompt_len + max_new_tokens
    start = prompt_len if start is None else start
    if stop_ids.numel():
        hit = torch.isin(tokens[start:end], stop_ids.to(tokens.device)).nonzero()
        if hit.numel():
            end = start + int(hit[0]) + 1
    return end


def stop_ids(model, tokenizer) -> list[int]:
    """The stop tokens of a target: its tokenizer's end-of-sequence token and its generation config's."""
    ids = set()
    for source in (getattr(tokenizer, "eos_token_id", None), getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(int(i) for i in source)
    return sorted(ids)
