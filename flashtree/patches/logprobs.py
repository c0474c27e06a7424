"""return_logprob for tree steps: the committed path's logprobs, read from the verify logits of the nodes that
produced each committed token (after the per-node adjustments, node_logits.py).

What sglang's no-speculation sampler returns for the same token: log_softmax of the logits, divided by each request's
temperature unless the whole batch is greedy (sglang's greedy rows carry temperature 1), before top-k / top-p / min_p
filtering; top logprobs and the logprobs of requested token ids from the same row. The layout is the one sglang's
result processor reads for a speculative step: `next_token_logprobs` (bs, K + 1) and the top / token-id lists flat,
request-major, K + 1 entries per request; entries past a request's committed tokens are filler it never reads.

sglang 0.5.17 refuses return_logprob on DSPARK servers twice: the scheduler's `validate_dflash_request` aborts the
request on arrival, and `DSparkWorkerV2.forward_batch_generation` raises on any batch carrying it, prefill included.
Its prefill needs nothing of DSPARK for logprobs (the target's own forward computes them), and its decode steps are
the tree's, which write them here, so on that release (`adapter.dspark_refuses_logprobs`) a tree server lets such
requests through both (`patches`) and keeps their decode batches on the tree step (`needs_tree`): DSPARK's own
decode, the tree path's fallback, would return none. DFLASH servers keep flashtree's refusal there (admission.py).
"""

from __future__ import annotations

import importlib

import torch

from .installer import Patch

VALIDATE = "sglang.srt.managers.scheduler"  # the module whose `validate_dflash_request` the scheduler calls


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


def needs_tree(adapter, batch) -> bool:
    """Whether a decode batch must take the tree step because DSPARK's own decode would return no logprobs."""
    return adapter.dspark_refuses_logprobs and bool(getattr(batch, "return_logprob", False))


def patches(adapter, worker_cls) -> list[Patch]:
    """On a release whose DSPARK refuses return_logprob: the scheduler's check defers it to flashtree's admission,
    and the worker's entry lets such batches through to its prefill and decode."""
    if not adapter.dspark_refuses_logprobs:
        return []
    return [Patch(importlib.import_module(VALIDATE), "validate_dflash_request", make_validate,
                  "scheduler.validate_dflash_request"),
            Patch(worker_cls, "forward_batch_generation", make_forward_batch_generation,
                  "DSparkWorkerV2.forward_batch_generation")]


def make_validate(original):
    def validate_dflash_request(req, enable_overlap):
        if not getattr(req, "return_logprob", False):
            return original(req, enable_overlap)
        req.return_logprob = False  # sglang's other checks still run; flashtree's admission judges the logprobs
        try:
            return original(req, enable_overlap)
        finally:
            req.return_logprob = True

    return validate_dflash_request


def make_forward_batch_generation(original):
    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None):
        if not getattr(batch, "return_logprob", False):
            return original(self, batch, on_publish, grammar_barrier)
        # DSPARK's own dispatch, without its refusal: prefill (the target computes the logprobs) or the decode step,
        # which a return_logprob batch always runs as a tree step (needs_tree)
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            self._verify_planner.note_non_decode_step()
            self._observers.note_prefill_step()
            return self._forward_prefill(batch, on_publish)
        return self._forward_decode(batch, on_publish, grammar_barrier)

    return forward_batch_generation
