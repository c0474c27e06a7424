"""return_logprob for tree steps: the committed path's logprobs, read from the verify logits of the nodes that
produced each committed token (after the per-node adjustments, node_logits.py).

What sglang's no-speculation sampler returns for the same token: log_softmax of the logits, divided by each request's
temperature unless the whole batch is greedy (sglang's greedy rows carry temperature 1), before top-k / top-p / min_p
filtering; top logprobs and the logprobs of requested token ids from the same row. The layout is the one sglang's
result processor reads for a speculative step: `next_token_logprobs` (bs, K + 1) and the top / token-id lists flat,
request-major, K + 1 entries per request; entries past a request's committed tokens are filler it never reads.
"""

from __future__ import annotations

import torch


def committed_logprobs(logits: torch.Tensor, path: torch.Tensor, tokens: torch.Tensor, sampling_info) -> torch.Tensor:
    """(bs, K + 1, V) log-probabilities at the nodes that produced the committed tokens: logits (bs, W, V), path
    (bs, K + 1) node indices root first (-1 past the accepted path), tokens (bs, K + 1) committed tokens."""
    bs, _w, v = logits.shape
    rows = logits.gather(1, path.clamp(min=0).unsqueeze(-1).expand(bs, path.shape[1], v)).float()
    if sampling_info is not None and not sampling_info.is_all_greedy:
        rows = rows / sampling_info.temperatures.view(bs, 1, 1).float()
    return rows.log_softmax(dim=-1).clamp(min=torch.finfo(torch.float32).min)


def write(adapter, logits_output, batch, logits: torch.Tensor, path: torch.Tensor, tokens: torch.Tensor) -> None:
    """Fill logits_output's next-token logprob fields for the committed tokens (sglang's speculative layout)."""
    bs, k1 = tokens.shape
    logprobs = committed_logprobs(logits, path, tokens, batch.sampling_info)
    logits_output.next_token_logprobs = logprobs.gather(2, tokens.clamp(min=0).unsqueeze(-1)).view(bs, k1)
    flat = logprobs.view(bs * k1, -1)
    nums = getattr(batch, "top_logprobs_nums", None) or []
    if any(x > 0 for x in nums):
        per_row = [x for x in nums for _ in range(k1)]
        logits_output.next_token_top_logprobs_val, logits_output.next_token_top_logprobs_idx = adapter.top_logprobs(
            flat, per_row)
    ids = getattr(batch, "token_ids_logprobs", None) or []
    if any(x is not None for x in ids):
        per_row = [x for x in ids for _ in range(k1)]
        (logits_output.next_token_token_ids_logprobs_val,
         logits_output.next_token_token_ids_logprobs_idx) = adapter.token_ids_logprobs(flat, per_row)
