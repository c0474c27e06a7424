"""sglang 0.5.17: the release whose torch (2.11) matches the lent H200.

Same DSPARK block API as 0.5.20 for every call the tree step makes. Differences that matter here: no
`model_runner.shared_read_done_event` (the scheduler's write-after-read barrier waits on
`model_worker.war_fastpath_runner.war_fastpath_read_done_event` when one was published, else on the whole forward
stream), no `TritonAttnBackend.use_verify_shared_kv`.
"""

from __future__ import annotations

from .base import CHAIN_ERA_PROBES, COMMON_PROBES, REQ, SCHEDULER, TRITON, WORKER, SglangAdapter
from .dflash import DFLASH_MODULE, DFLASH_PROBES, DFLASH_WORKER, DFlashFamily
from .probe import Has, Lacks, Sig


class Adapter(SglangAdapter):
    release = "0.5.17"
    has_shared_kv = False
    draft_rows_release = True  # FLASHTREE_DRAFT_ROWS: base.proposer_with_rows
    stops_after_length = True  # its stop check after the length limit (finish.py)
    dspark_refuses_logprobs = True  # and flashtree lets them through (logprobs.py)
    probes = COMMON_PROBES + CHAIN_ERA_PROBES + (
        Lacks(f"{TRITON}:_should_use_verify_shared_kv"),
        Has(f"{SCHEDULER}._apply_war_barrier"),
        Has("sglang.srt.speculative.dflash_info_v2:DFlashDraftInputV2", ("reserved_seq_lens_cpu",)),
        Lacks("sglang.srt.speculative.dflash_info:DFlashVerifyInput", ("live_seq_lens_cpu",)),
        Sig(f"{REQ}.update_finish_state", ("self", "new_accepted_len")),
        Sig(f"{REQ}._check_token_based_finish", ("self", "new_accepted_tokens")),
        Lacks(f"{REQ}._cap_finished_len_at_max_new_tokens"),  # 0.5.20's fix of the stop check (finish.py)
        # return_logprob through its two refusals (logprobs.py)
        Sig("sglang.srt.managers.scheduler:validate_dflash_request", ("req", "enable_overlap")),
        Sig(f"{WORKER}.forward_batch_generation", ("self", "batch", "on_publish", "grammar_barrier")),
        Sig(f"{WORKER}._forward_prefill", ("self", "batch", "on_publish")),
    )

    def simulated_correct_len(self, simulate_acc_len: float, gamma: int) -> int:
        # 0.5.17's DSPARK verify commits a constant: round(min(max(L - 1, 0), gamma)) draft tokens every step.
        return int(round(min(max(simulate_acc_len - 1.0, 0.0), float(gamma))))

    def embed_module(self, worker):
        # 0.5.17's proposer always embeds the block with the target's input embeddings.
        return worker.target_worker.model_runner.model.get_input_embeddings()

    def verify_input_extra(self, batch) -> dict:
        return {}  # no live_seq_lens_cpu in 0.5.17's DFlashVerifyInput

    def reserved_lens(self, draft_input):
        return draft_input.reserved_seq_lens_cpu, draft_input.reserved_seq_lens_sum

    def publish_req_to_token_write(self, worker) -> None:
        # 0.5.17's barrier falls back to waiting on the whole forward stream unless a fast-path event is published.
        # flashtree publishes none, so the coarse barrier covers the tree step's req_to_token reads and writes.
        return None


class DFlash(DFlashFamily, Adapter):
    """0.5.17's DFlashWorkerV2: the target's input embeddings embed the block; no DP/TP draft context."""

    probes = DFLASH_PROBES + (
        Sig(f"{DFLASH_WORKER}.forward_batch_generation", ("self", "batch", "on_publish", "grammar_barrier")),
        Has("sglang.srt.speculative.spec_utils:_sample_simulated_acc_len"),
        Has(f"{DFLASH_MODULE}:DFlashDraftInputV2", ("reserved_seq_lens_cpu",)),
    )
    simulated_len_fn = "sglang.srt.speculative.spec_utils:_sample_simulated_acc_len"
