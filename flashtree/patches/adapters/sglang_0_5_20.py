"""sglang 0.5.20: the release the public peer (flashmap 0.1.0) targets."""

from __future__ import annotations

import torch

from .base import CHAIN_ERA_PROBES, COMMON_PROBES, LIVE_LENS_PROBES, TRITON, SglangAdapter
from .dflash import DFLASH_MODULE, DFLASH_PROBES, DFLASH_WORKER, FORWARD_BATCH, DFlashFamily
from .probe import Has, Sig, resolve


class Adapter(SglangAdapter):
    release = "0.5.20"
    has_shared_kv = True
    probes = COMMON_PROBES + CHAIN_ERA_PROBES + LIVE_LENS_PROBES + (
        Has(f"{TRITON}:_should_use_verify_shared_kv"),
        Has("sglang.srt.model_executor.model_runner:ModelRunner"),
        Has("sglang.srt.models.dspark:VanillaMarkov.sample_block", ("collect_corrected",)),
    )

    # The tree's draws never read the corrected logits (0.5.20's sample_block can skip keeping them).
    sample_block_extra = {"collect_corrected": False}

    def graph_draw_bytes(self, *, rows: int, depth: int, vocab: int, logits_bytes: int) -> int:
        return rows * depth * vocab * logits_bytes + 3 * rows * vocab * 4  # the repeated base logits only

    # ---- FlashMap drafts (flashtree/patches/flashmap_draft.py) -----------------------------------------------
    flashmap_noise_draws = True  # flashmap 0.1.0's sglang draft model runs on this release only (flashmap_draft.py)


class DFlash(DFlashFamily, Adapter):
    """0.5.20's DFlashWorkerV2: the block's embeddings may come from a replicated table and carry a noise scale, the
    draft forward runs in DFLASH's draft TP context, and its ForwardBatch counts the non-padded tokens."""

    probes = DFLASH_PROBES + (
        Sig(f"{DFLASH_WORKER}.forward_batch_generation",
            ("self", "batch", "on_publish", "grammar_barrier", "pp_proxy_tensors")),
        Has(f"{DFLASH_MODULE}:_resolve_dflash_embedding_module", ("draft_model", "target_model")),
        Has(f"{FORWARD_BATCH}:enable_num_token_non_padded"),
        Has(f"{DFLASH_MODULE}:DFlashDraftInputV2", ("nxt_kv_lens_cpu",)),
        Has(f"{DFLASH_WORKER}._cache_full_embed_weight"),
    )

    def noise_embeddings(self, worker, block_ids: torch.Tensor) -> torch.Tensor:
        full = getattr(worker, "_full_embed_gpu", None)
        if full is not None:
            embeds = torch.nn.functional.embedding(block_ids, full)
        else:
            pick = resolve(f"{DFLASH_MODULE}:_resolve_dflash_embedding_module")
            unwrap = resolve("sglang.srt.lora.layers:unwrap_lora_layer")
            embeds = unwrap(pick(worker.draft_model, worker.target_worker.model_runner.model))(block_ids)
        scale = float(getattr(worker, "_noise_embed_scale", 1.0))
        return embeds * scale if scale != 1.0 else embeds

    def draft_batch_extra(self, bs: int, block: int, device) -> dict:
        padded = resolve(f"{FORWARD_BATCH}:enable_num_token_non_padded")()
        return {
            "num_token_non_padded": torch.tensor(bs * block, dtype=torch.int32, device=device) if padded else None,
            "global_num_token_non_padded_cpu": bs * block,
        }

    def draft_context(self, worker):
        return _Both(torch.inference_mode(), worker.draft_tp_context(worker.draft_model_runner.tp_group))

    def lm_head(self, worker):
        return resolve("sglang.srt.lora.layers:unwrap_lora_layer")(super().lm_head(worker))


class _Both:
    """Two context managers entered in order (contextlib.ExitStack's job, without its per-step allocations)."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def __enter__(self):
        self.first.__enter__()
        self.second.__enter__()

    def __exit__(self, *exc):
        self.second.__exit__(*exc)
        return self.first.__exit__(*exc)
