"""The release's real DsparkDraftSampler on CPU, over a tiny draft model whose base logits are its hidden states.

TinyDraft keeps the contract DSPARK's sampler reads: `markov_head` (a real sglang head), `lm_head` (`weight`,
`org_vocab_size`), `compute_base_logits(hidden) -> (logits, features)` (here the identity projection: hidden size =
vocab, so a test writes the base logits directly), `sample_from_anchor` (0.5.20+) and `confidence_head` (0.5.23).
"""

from __future__ import annotations

import inspect
import types

import torch


class TinyDraft:
    def __init__(self, markov_head, vocab: int, sample_from_anchor: bool = False, dtype=torch.float32):
        self.markov_head = markov_head
        self.lm_head = types.SimpleNamespace(weight=torch.eye(vocab, dtype=dtype), org_vocab_size=vocab)
        self.sample_from_anchor = sample_from_anchor
        self.confidence_head = None
        self.base_logits_calls = 0

    def compute_base_logits(self, hidden):
        self.base_logits_calls += 1
        return hidden.to(self.lm_head.weight.dtype) @ self.lm_head.weight.T, hidden


class _OneRank:
    world_size = 1
    rank_in_group = 0


def stock_sampler(model, *, gamma: int, max_bs: int, confidence_fn=None, seed_key: int = 12345):
    """DSPARK's own DsparkDraftSampler for this release (folded sampling on), built as maybe_build_draft_sampler
    would on a single rank."""
    from sglang.srt.speculative.dspark_components.dspark_draft_sampler import DsparkDraftSampler

    params = inspect.signature(DsparkDraftSampler.__init__).parameters
    kwargs = dict(model=model, gamma=gamma, max_bs=max_bs, device="cpu")
    if "folded_sampling" in params:  # 0.5.17 / 0.5.20
        kwargs["folded_sampling"] = True
    if "confidence_fn" in params:
        kwargs["confidence_fn"] = confidence_fn
    if "tp_sync" in params:  # 0.5.20+
        from sglang.srt.speculative.spec_tp_sync import SpecTpSync

        kwargs["tp_sync"] = SpecTpSync(_OneRank())
    if "noise" in params:  # 0.5.23: philox key + counter of DSPARK's own draws
        from sglang.srt.speculative.dspark_components.dspark_draft import DraftNoise

        kwargs["noise"] = DraftNoise(key=seed_key, offset=torch.zeros(1, dtype=torch.int64))
        kwargs["greedy_draft"] = False
        kwargs["megakernel_sampler"] = None
    return DsparkDraftSampler(**kwargs)


def query_rows(sampler) -> int:
    """Rows per request DSPARK's tail receives (0.5.17: gamma; 0.5.20+: gamma + 1 unless sampling from the anchor)."""
    return int(getattr(sampler, "query_token_num", sampler.gamma))


def tail_args(sampler, base_logits: torch.Tensor, anchor: torch.Tensor):
    """(hidden_states, input_ids) for the tail such that request b's base logits are base_logits[b] (bs, K, V)."""
    bs, k, v = base_logits.shape
    q = query_rows(sampler)
    hidden = torch.zeros((bs, q, v), dtype=base_logits.dtype)
    hidden[:, q - k :] = base_logits  # 0.5.20+ without sample_from_anchor: row 0 is the anchor's, dropped by DSPARK
    hidden[:, : q - k] = 1e4  # would show if a dropped row leaked into the logits
    ids = torch.full((bs, q), 0, dtype=torch.int64)
    ids[:, 0] = anchor
    return hidden.view(bs * q, v), ids.view(-1)


def sampling_info(greedy: torch.Tensor, temperature: float = 0.8):
    bs = greedy.shape[0]
    return types.SimpleNamespace(
        is_all_greedy=bool(greedy.all()),
        temperatures=torch.where(greedy, 1.0, temperature).view(-1, 1),
        top_ks=torch.where(greedy, 1, 1 << 30).to(torch.int32),
        top_ps=torch.ones(bs),
    )


def dspark_outputs(sampler, bs: int) -> dict:
    """Everything DSPARK's own decode reads from its sampler after a tail run (per release)."""
    k = int(sampler.gamma)
    out = {"out": sampler.out[: bs * k].clone()}
    for name in ("corrected_out", "step_logits", "confidence_out", "confidence_raw_out", "verify_ids"):
        buf = getattr(sampler, name, None)
        if buf is not None:
            out[name] = buf[: bs * k].clone() if name == "corrected_out" else buf[:bs].clone()
    params = getattr(sampler, "params", None)
    if params is not None:  # 0.5.23's staged DraftParams
        out.update({f"params.{i}": t[:bs].clone() for i, t in enumerate(params)})
    for name in ("temperatures", "greedy_mask"):
        buf = getattr(sampler, name, None)
        if isinstance(buf, torch.Tensor):
            out[name] = buf[:bs].clone()
    return out
