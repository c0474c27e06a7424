"""sglang 0.5.23: the newest release.

Changed since 0.5.20 in what the tree step calls: `alloc_verify_window` needs `seq_lens_cpu` and returns a
`kv_loc_plan` (its `verify_cache_loc` holds virtual ids); `DraftBlockProposer._run_forward` gains `anchor_prepared`;
the Markov head exposes `init_state` / `step_bias` instead of `sample_block`; the draft pool's ids come from
`kv_injector.ids_for(plan)`; `_forward_decode` gains `coordination_plan` (DP attention). flashtree refuses, at worker
start, configurations whose KV ids are translated (unified / fused draft pools): req_to_token holds virtual ids there.
"""

from __future__ import annotations

import torch

from .base import COMMON_PROBES, DRAFT, LIVE_LENS_PROBES, PLANNER, TRITON, WORKER, SglangAdapter
from .dflash import DFlashUnsupported
from .probe import Has, Sig


class Adapter(SglangAdapter):
    release = "0.5.23"
    run_forward_extra = {"anchor_prepared": False}  # 0.5.23 added it; False = the proposer prepares the anchor
    has_shared_kv = True
    flashinfer_verify = False  # its verify input reads KV ids through a translation plan (not wired for FlashInfer)
    probes = COMMON_PROBES + LIVE_LENS_PROBES + (
        Sig(f"{WORKER}._forward_decode", ("self", "batch", "on_publish", "grammar_barrier", "coordination_plan")),
        Sig(f"{PLANNER}:alloc_verify_window", ("batch", "bs", "device", "verify_num_draft_tokens", "block_pos_offsets", "model_runner", "seq_lens_cpu"), prefix=True),
        Has(f"{DRAFT}:DraftBlockProposer._run_forward", ("verify_window", "embed_module", "draft_sampler", "anchor_prepared")),
        Has("sglang.srt.models.dspark:BaseDSparkMarkovHead.step_bias", ("prev_tokens", "hidden_states", "state")),
        Has("sglang.srt.models.dspark:BaseDSparkMarkovHead.init_state"),
        Has(f"{TRITON}:TritonAttnBackend.__init__", ("dllm_fa4",)),
        Has("sglang.srt.speculative.dspark_components.dspark_kv_inject:TargetHiddenKvInjector.ids_for"),
    )

    def unsupported_worker(self, worker) -> str | None:
        # untranslated pools only: there virtual ids are the physical ids the commit and the injection write
        translator = getattr(worker.model_runner, "kv_index_translator", None)
        if translator is not None and getattr(translator, "is_translating", False):
            return "KV index translation (unified/fused draft KV pools) is on; the tree commit rewrites req_to_token"
        return None

    def alloc_window_extra(self, batch, draft_input) -> dict:
        # 0.5.23 needs host lengths; under overlap batch.seq_lens_cpu may be unset, then the reservation bound serves
        seq_lens_cpu = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else draft_input.nxt_kv_lens_cpu
        return {"seq_lens_cpu": seq_lens_cpu}

    def markov_draws(self, head, base_logits, anchor, draft_hidden, n: int, sampler) -> torch.Tensor:
        # 0.5.23's Markov head API: init_state / step_bias, one (bs*N, V) step at a time (no (bs*N, K, V) copy).
        bs, k, _v = base_logits.shape
        hidden = None if draft_hidden is None else draft_hidden.repeat_interleave(n, dim=0)
        prev = anchor.repeat_interleave(n, dim=0)
        state = head.init_state(hidden)
        out = []
        for j in range(k):
            bias, state = head.step_bias(prev, hidden_states=None if hidden is None else hidden[:, j], state=state)
            prev = sampler(base_logits[:, j].repeat_interleave(n, dim=0).to(bias.dtype) + bias)
            out.append(prev)
        return torch.stack(out, dim=1).view(bs, n, k)

    vanilla_bias_methods = ("get_prev_embeddings", "project_bias", "step_bias", "init_state")

    def graph_draw_bytes(self, *, rows: int, depth: int, vocab: int, logits_bytes: int) -> int:
        # Per step: the repeated base row, the bias and their sum, then the float32 scores / argmax temporaries.
        return 3 * rows * vocab * max(logits_bytes, 4) + 3 * rows * vocab * 4

    def graph_draws_unsupported(self, worker, sampler) -> str | None:
        head = getattr(sampler, "markov_head", None)
        if head is not None and getattr(head, "vocab_shard", None) is not None:
            return "the Markov head biases a TP-sharded vocabulary (SGLANG_DSPARK_OPT_MARKOV_W2_TP_SHARD)"
        return super().graph_draws_unsupported(worker, sampler)

    def parallelism(self, worker) -> list[str]:
        # 0.5.23 sets attention DP by its width (--attn-dp-size); the deprecated --enable-dp-attention resolves to it
        found = super().parallelism(worker)
        width = int(getattr(getattr(worker, "server_args", None), "attn_dp_size", 1) or 1)
        if width > 1:
            found.append(f"--attn-dp-size {width}")
        return found


class DFlash(DFlashUnsupported, Adapter):
    reason = ("sglang 0.5.23's DFlashWorkerV2 routes every KV write through KV-location plans (virtual ids, "
              "`_draft_write_ids`) and syncs its draft across TP ranks itself; flashtree's DFLASH tree step adapts "
              "0.5.17's and 0.5.20's worker only")
