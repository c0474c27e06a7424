"""sglang 0.5.20: the release the public peer (flashmap 0.1.0) targets. flashtree refuses, at worker start, DSPARK
servers with --enable-unified-memory (the one setting whose target KV ids are translated here): req_to_token holds
virtual ids there."""

from __future__ import annotations

import torch

from .base import CHAIN_ERA_PROBES, COMMON_PROBES, LIVE_LENS_PROBES, TRITON, SglangAdapter
from .dflash import DFLASH_PROBES, DFLASH_V20_PROBES, DFLASH_WORKER, Both, DFlashFamilyV20
from .probe import Has, Sig


class Adapter(SglangAdapter):
    release = "0.5.20"
    has_shared_kv = True
    probes = COMMON_PROBES + CHAIN_ERA_PROBES + LIVE_LENS_PROBES + (
        Has(f"{TRITON}:_should_use_verify_shared_kv"),
        Has("sglang.srt.model_executor.model_runner:ModelRunner"),
        Has("sglang.srt.models.dspark:VanillaMarkov.sample_block", ("collect_corrected",)),
        Has("sglang.srt.server_args:ServerArgs", ("enable_unified_memory",)),
    )

    def unsupported_worker(self, worker) -> str | None:
        # The flag, not the target's KVIndexTranslator: sglang builds that with the pools, after this worker. With
        # it the target's allocator is a unified one (or the pool build fails), and sglang lets only DSPARK through.
        found = super().unsupported_worker(worker)
        if found:
            return found
        if getattr(getattr(worker, "server_args", None), "enable_unified_memory", False):
            return ("this server runs --enable-unified-memory, whose unified KV pool keeps virtual KV ids in "
                    "req_to_token, which the tree commit rewrites (sglang audits only DSPARK's chain verify on it)")
        return None

    # The tree's draws never read the corrected logits (0.5.20's sample_block can skip keeping them).
    sample_block_extra = {"collect_corrected": False}

    def graph_draw_bytes(self, *, rows: int, depth: int, vocab: int, logits_bytes: int) -> int:
        return rows * depth * vocab * logits_bytes + 3 * rows * vocab * 4  # the repeated base logits only

    # ---- FlashMap drafts (flashtree/patches/flashmap_draft.py) -----------------------------------------------
    flashmap_noise_draws = True  # flashmap 0.1.0's sglang draft model runs on this release only (flashmap_draft.py)


class DFlash(DFlashFamilyV20, Adapter):
    """0.5.20's DFlashWorkerV2: the draft forward runs in DFLASH's draft TP context, the worker's own method."""

    probes = DFLASH_PROBES + DFLASH_V20_PROBES + (
        Sig(f"{DFLASH_WORKER}.forward_batch_generation",
            ("self", "batch", "on_publish", "grammar_barrier", "pp_proxy_tensors")),
    )

    def draft_context(self, worker):
        return Both(torch.inference_mode(), worker.draft_tp_context(worker.draft_model_runner.tp_group))
