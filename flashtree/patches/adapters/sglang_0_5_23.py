"""sglang 0.5.23: the newest release.

Changed since 0.5.20 in what the tree step calls: `alloc_verify_window` needs `seq_lens_cpu` and returns a
`kv_loc_plan` (its `verify_cache_loc` holds virtual ids); `DraftBlockProposer._run_forward` gains `anchor_prepared`;
the Markov head exposes `init_state` / `step_bias` instead of `sample_block`; the draft pool's ids come from
`kv_injector.ids_for(plan)`; `_forward_decode` gains `coordination_plan` (DP attention). flashtree refuses, at worker
start, configurations whose KV ids are translated (unified / fused draft pools): req_to_token holds virtual ids there.
Its DFlashWorkerV2 plans each decode step's KV ids the same way (`DFlash` below), and syncs across TP ranks itself
(the DFLASH tree step is single-GPU).
"""

from __future__ import annotations

import torch

from ..step_types import Window
from .base import COMMON_PROBES, DRAFT, LIVE_LENS_PROBES, PLANNER, TRITON, WORKER, SglangAdapter
from .dflash import DFLASH_MODULE, DFLASH_PROBES, DFLASH_V20_PROBES, DFLASH_WORKER, FORWARD_BATCH, Both, DFlashFamilyV20
from .probe import Has, Sig, resolve_attr

TRANSLATOR = "sglang.srt.mem_cache.kv_index_translator:KVIndexTranslator"


def translating(runner) -> bool:
    """Whether the runner's KV ids are translated (virtual ids in req_to_token, other ids in its pool)."""
    translator = getattr(runner, "kv_index_translator", None)
    return translator is not None and bool(getattr(translator, "is_translating", False))


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

    def unsupported_pools(self, worker) -> str | None:
        # untranslated pools only: there virtual ids are the physical ids the commit and the injection write (the
        # runner's translator exists once its pool does)
        if translating(worker.model_runner):
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


class DFlash(DFlashFamilyV20, Adapter):
    """0.5.23's DFlashWorkerV2 plans each decode step's KV ids once (a `KVLocPlan` over the verify window) and hands
    that plan to every writer: the draft forward binds it, the verify input carries it. Untranslated pools only
    (`unsupported_worker`), where the plan's ids are the window's own slots, so the tree commit's req_to_token
    permutation and the committed path's draft-KV slots stay what they are on 0.5.20. Its deferred verify-logits
    gather (`_target_logits_processor`) defers a TP-sharded vocabulary only, and the tree step runs on one GPU."""

    probes = DFLASH_PROBES + DFLASH_V20_PROBES + (
        Sig(f"{DFLASH_WORKER}.forward_batch_generation",
            ("self", "batch", "on_publish", "grammar_barrier", "pp_proxy_tensors")),
        Sig(f"{DFLASH_MODULE}:draft_tp_context", ("layout",)),
        Has(f"{TRANSLATOR}.plan", ("req_pool_indices", "seq_lens", "seq_lens_cpu", "write_virtual", "read_extent")),
        Has("sglang.srt.mem_cache.kv_loc_plan:KVLocPlan.bind", ("batch", "reader", "cols")),
        Has("sglang.srt.speculative.dflash_info:DFlashVerifyInput", ("kv_loc_plan", "kv_loc_cols")),
        Has(f"{FORWARD_BATCH}:ForwardBatch", ("can_run_decode_cuda_graph", "kv_loc_plan")),
    )

    def unsupported_pools(self, worker) -> str | None:
        for which, runner in (("target", worker.model_runner), ("draft", worker.draft_model_runner)):
            if translating(runner):
                return (f"the DFLASH {which}'s KV ids are translated (a unified or fused draft KV pool); the tree "
                        "commit permutes req_to_token, which holds virtual ids there")
        return None

    def alloc_window(self, worker, batch, bs: int, draft_input) -> Window:
        # One plan per step over the whole window, as DFLASH plans it: the draft block, the verify and the draft-KV
        # writes all write that window, and their reads reach one block past the committed prefixes.
        window = super().alloc_window(worker, batch, bs, draft_input)
        seq_lens_cpu = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else draft_input.nxt_kv_lens_cpu
        window.native = worker.target_worker.model_runner.kv_index_translator.plan(
            req_pool_indices=batch.req_pool_indices, seq_lens=batch.seq_lens, seq_lens_cpu=seq_lens_cpu,
            write_virtual=window.cache_loc, read_extent=int(worker.block_size))
        return window

    def draft_batch_extra(self, batch, bs: int, block: int, device) -> dict:
        return {**super().draft_batch_extra(batch, bs, block, device),
                "can_run_decode_cuda_graph": batch.can_run_decode_cuda_graph}

    def bind_draft_batch(self, worker, forward_batch, window: Window) -> None:
        # the full draft cache (a compact one is refused) reads the target's req_to_token rows: the plan as it is
        window.native.bind(forward_batch, worker.draft_model_runner.kv_index_translator)

    def verify_window_extra(self, worker, window: Window, w: int) -> dict:
        # a narrower verify graph writes the window's first w columns only
        cols = None if w == int(worker.block_size) else slice(0, w)
        return {"kv_loc_plan": window.native, "kv_loc_cols": cols}

    def unreserved_host_lens(self, batch, out: torch.Tensor) -> None:
        # 0.5.23's bound: the allocated lengths, which include the in-flight verify reservation
        for i, req in enumerate(batch.reqs):
            out[i] = req.kv.kv_allocated_len

    def draft_context(self, worker):
        return Both(torch.inference_mode(), resolve_attr(f"{DFLASH_MODULE}:draft_tp_context")(worker.draft_parallel_layout))
