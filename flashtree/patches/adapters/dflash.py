"""The DFLASH family of the tree step's primitives: sglang's `DFlashWorkerV2` (`--speculative-algorithm DFLASH`).

A DFLASH draft has no Markov head and no LM head of its own: one draft forward over the block [anchor, mask, ...,
mask] (DFLASH's `block_size` = the verify window W) gives each of the W - 1 draft positions a hidden state, the
target's LM head turns them into logits, and the positions are independent given the context. The tree step's N
candidates are N draws from those per-position distributions (candidate 0 the argmax block: DFLASH's own chain).

A leaf like the release adapters: `DFlashFamily` overrides what differs from DSPARK's worker; each release module
combines it with its own adapter (`class DFlash(DFlashFamily, Adapter)`), so release-specific answers (host lengths,
the req_to_token barrier) stay the release's. The DFLASH worker is one monolithic `forward_batch_generation`, so the
draft forward and the verify are rebuilt here from the worker's own parts (its buffers, mask token, draft model
runner, target worker), following each release's decode branch (`DFlashFamily`: 0.5.17's; `DFlashFamilyV20`:
what 0.5.20's and 0.5.23's share).
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from ..step_types import DraftOut, Verified, Window
from .base import DFLASH_UTILS, SglangAdapter, draft_hf_config
from .probe import Has, Sig, resolve, resolve_attr, resolve_once

DFLASH_MODULE = "sglang.srt.speculative.dflash_worker_v2"
DFLASH_WORKER = f"{DFLASH_MODULE}:DFlashWorkerV2"
FORWARD_BATCH = "sglang.srt.model_executor.forward_batch_info"

logger = logging.getLogger("flashtree.patches")

# What the DFLASH family calls on every release it adapts (each release adds its own).
DFLASH_PROBES = (
    Sig(f"{DFLASH_WORKER}.__init__", ("self", "server_args"), prefix=True),
    Has(f"{DFLASH_WORKER}.init_cuda_graphs"),
    Has(f"{DFLASH_WORKER}._ensure_draft_block_buffers", ("bs",)),
    Has(f"{DFLASH_MODULE}:_prepare_dflash_draft_block_unchecked",
        ("bonus_tokens", "prefix_lens", "req_pool_indices", "req_to_token", "block_ids_out", "positions_out",
         "cache_loc_out", "mask_token_id")),
    Has(f"{DFLASH_WORKER}._append_target_hidden_to_draft_kv_by_loc",
        ("target_hidden", "cache_loc", "positions", "cache_loc_2d", "commit_lens")),
    Has(f"{DFLASH_MODULE}:SIMULATE_ACC_LEN"),
    Has(f"{DFLASH_MODULE}:apply_dflash_simulated_acceptance",  # FLASHTREE_SIMULATE_ACC on DFLASH's chain steps
        ("candidates", "target_predict", "accept_len", "commit_lens", "bonus", "out_tokens", "simulate_acc_token_mode")),
    Has("sglang.srt.speculative.draft_worker_common:make_draft_input_v2", ("bonus_tokens", "new_seq_lens")),
    Has("sglang.srt.speculative.dflash_info:DFlashVerifyInput.prepare_for_verify", ("batch", "target_worker")),
    Has("sglang.srt.speculative.dflash_info:DFlashVerifyInput", ("draft_token", "positions", "draft_token_num", "custom_mask", "capture_hidden_mode")),
    Has(f"{FORWARD_BATCH}:ForwardBatch", ("forward_mode", "input_embeds", "spec_algorithm", "spec_info", "seq_lens_cpu")),
    Has(f"{DFLASH_UTILS}:apply_dflash_verify_logits_adjustments", ("next_token_logits", "sampling_info", "draft_token_num")),
    Has(f"{DFLASH_UTILS}:parse_dflash_draft_config", ("draft_hf_config",)),
    Has("sglang.srt.speculative.spec_info:SpeculativeAlgorithm.DFLASH"),
)

# FLASHTREE_GRAPH_DRAWS (graph_draws.py): the greedy head DFLASH folds into its draft graph's tail, which flashtree's
# sampler subclasses; a release lacking them keeps the eager draws (the reason logged at init_cuda_graphs).
DFLASH_TAIL_SAMPLER = f"{DFLASH_MODULE}:_DflashDraftSampler"
DFLASH_GRAPH_DRAW_PROBES = (
    Has(f"{DFLASH_WORKER}._maybe_build_draft_sampler"),
    Has(f"{DFLASH_TAIL_SAMPLER}.__init__", ("weight", "block_size", "num_org", "org_vocab_start", "max_bs")),
    Sig(f"{DFLASH_TAIL_SAMPLER}.__call__", ("self", "hidden_states", "input_ids")),
)


class DFlashFamily(SglangAdapter):
    algorithm = "DFLASH"
    worker_name = "DFlashWorkerV2"
    # the positions' marginals: `prob` ranks trie nodes by their product, best-first grows from them (each position's
    # distribution whatever its parent: DDTree's setting)
    draft_scores = ("logp", "anchor", "step_logprobs")
    independent_positions = True  # no Markov head: best-first's rounds read each position's top k (policy_draws.py)
    logp_from_draws = False
    flashmap_noise_draws = False  # over the release adapter's (0.5.20: FlashMap drafts are DSPARK's)
    draft_rows_release = False  # ditto (0.5.17: DSPARK's proposer)

    # ---- worker checks ---------------------------------------------------------------------------------------
    def gamma(self, worker) -> int:
        return int(worker.block_size) - 1

    def draft_block_size(self, worker) -> int | None:
        """The tokens the draft checkpoint was trained to propose: DFLASH's `block_size` counts the anchor, so one
        fewer (a 9-token block drafts 8; a deeper tree would grow into positions the draft never learnt)."""
        hf_config = draft_hf_config(worker)
        if hf_config is None:
            return None
        block = resolve(f"{DFLASH_UTILS}:parse_dflash_draft_config")(draft_hf_config=hf_config).block_size
        return None if block is None else int(block) - 1

    def simulate_acc_len(self, worker) -> float:
        return float(getattr(resolve(DFLASH_MODULE), "SIMULATE_ACC_LEN", -1.0))

    simulated_len_fn = "sglang.srt.speculative.spec_utils:sample_simulated_acc_len"

    def simulated_correct_len(self, simulate_acc_len: float, gamma: int) -> int:
        # DFLASH's verify draws a commit length in [1, block_size] once per step by SGLANG_SIMULATE_ACC_METHOD.
        method = resolve(f"{DFLASH_MODULE}:SIMULATE_ACC_METHOD")
        return int(resolve(self.simulated_len_fn)(simulate_acc_len, method, gamma + 1)) - 1

    def unsupported_worker(self, worker) -> str | None:
        if getattr(worker, "use_compact_draft_cache", False):
            return "the DFLASH draft keeps a sliding-window (compact) draft cache; the tree commit needs the full one"
        if getattr(worker, "_need_mamba_verify_commit", False):
            return "the DFLASH target has recurrent (mamba) state, which a tree verify cannot commit along a path"
        for attr, what in (("selector", "a candidate-selector draft"), ("lilicorr", "a LiLiCorr draft")):
            if getattr(worker, attr, None) is not None:
                return f"the DFLASH draft is {what}, which proposes its own block"
        if getattr(worker, "_is_domino", False):
            return "the DFLASH draft is a Domino draft (a recurrent projector over the block)"
        if not torch.is_floating_point(getattr(self.lm_head(worker), "weight", torch.empty(0, dtype=torch.int8))):
            return "the target's LM head has no floating-point weight (quantized), which the N draws read"
        if self.parallelism(worker):
            return "the DFLASH tree step reads the target's LM head unsharded (single GPU only)"
        return None

    def draft_model(self, worker):
        return worker.draft_model

    # ---- the tree step's primitives --------------------------------------------------------------------------
    def alloc_window(self, worker, batch, bs: int, draft_input) -> Window:
        """DFLASH's window req_to_token[req, seq_len : seq_len + W] (spec-v2 over-allocated it ahead) and the draft
        block [anchor, mask x K], written into DFLASH's own block buffers as its chain step writes them: one launch of
        its prepare-block kernel where DFLASH runs that kernel, five eager ops elsewhere."""
        worker._ensure_draft_block_buffers(bs)
        ids = worker._draft_block_ids_buf[:bs]
        positions = worker._draft_block_positions_buf[:bs]
        loc = worker._draft_verify_out_cache_loc_buf[:bs]
        table = self.req_to_token(worker)
        anchor = draft_input.bonus_tokens.view(-1)
        if getattr(worker, "_use_triton_prepare_block", False):
            try:
                resolve_attr(f"{DFLASH_MODULE}:_prepare_dflash_draft_block_unchecked")(
                    bonus_tokens=anchor, prefix_lens=batch.seq_lens.view(-1),
                    req_pool_indices=batch.req_pool_indices.view(-1), req_to_token=table, block_ids_out=ids,
                    positions_out=positions, cache_loc_out=loc, mask_token_id=int(worker._mask_token_id))
                return Window(positions, loc.view(-1), loc, None)
            except Exception as err:  # noqa: BLE001 - DFLASH's own rule: the kernel off for good, the eager ops
                worker._use_triton_prepare_block = False
                logger.warning("flashtree: DFLASH's prepare-block kernel failed; the eager path from now on: %s", err)
        ids.fill_(int(worker._mask_token_id))
        ids[:, 0].copy_(anchor)
        torch.add(batch.seq_lens.view(-1, 1), worker._block_pos_offsets, out=positions)
        loc.copy_(table[batch.req_pool_indices.view(-1, 1).to(torch.int64), positions])
        return Window(positions, loc.view(-1), loc, None)

    def noise_embeddings(self, worker, block_ids: torch.Tensor) -> torch.Tensor:
        """The block's input embeddings as DFLASH embeds it (0.5.17: the target's input embeddings)."""
        return worker.target_worker.model_runner.model.get_input_embeddings()(block_ids)

    def draft_batch_extra(self, batch, bs: int, block: int, device) -> dict:
        """Release-specific keyword arguments of the draft forward's ForwardBatch."""
        return {}

    def bind_draft_batch(self, worker, forward_batch, window: Window) -> None:
        """Hand the draft forward's ForwardBatch the step's KV ids (0.5.23: the window's KV-location plan)."""

    def verify_window_extra(self, worker, window: Window, w: int) -> dict:
        """DFlashVerifyInput's keyword arguments for the step's window (0.5.23: its plan and the columns verified)."""
        return {}

    def draft_context(self, worker):
        """Around the draft forward (0.5.20: DFLASH's draft TP context)."""
        return torch.inference_mode()

    def draft_host_lens(self, worker, batch, draft_input, block: int, bs: int):
        """(seq_lens_cpu, sum): DFLASH's host bound for the draft forward, committed prefix + one block."""
        out = worker._draft_seq_lens_cpu_buf[:bs]
        if batch.seq_lens_cpu is not None:
            out.copy_(batch.seq_lens_cpu)
            out.add_(block)
        elif self.reserved_lens(draft_input)[0] is not None:
            lens, total = self.reserved_lens(draft_input)
            out.copy_(lens)
            return out, int(total)
        else:
            self.unreserved_host_lens(batch, out)
        return out, int(out.sum())

    def unreserved_host_lens(self, batch, out: torch.Tensor) -> None:
        """The draft forward's host lengths where sglang keeps neither host lengths nor a reservation bound: the
        committed prefixes (0.5.23: each request's allocated KV length)."""
        out.copy_(batch.seq_lens.to("cpu", dtype=out.dtype))

    def draft_forward(self, worker, batch, draft_input, window: Window, bs: int, proposer=None, sampler=None,
                      graph_candidates: Callable | None = None) -> DraftOut:
        """One DFLASH draft forward over [anchor, mask x K] (its graph replays when DFLASH captured one) -> the
        candidates the graph's tail drew (`graph_candidates(bs)`, FLASHTREE_GRAPH_DRAWS), or else base logits
        (bs, K, V) through the target's LM head for the eager draws."""
        fb_mod = resolve_once(FORWARD_BATCH)
        block = int(worker.block_size)
        ids = worker._draft_block_ids_buf[:bs]  # [anchor, mask x K], written by alloc_window
        # the anchor is read within the step only (the build, the verify inputs): no copy of the bonus tokens
        anchor = draft_input.bonus_tokens.view(-1)
        embeds = self.noise_embeddings(worker, ids)
        seq_lens_cpu, seq_lens_sum = self.draft_host_lens(worker, batch, draft_input, block, bs)
        forward_batch = fb_mod.ForwardBatch(
            forward_mode=fb_mod.ForwardMode.TARGET_VERIFY,
            batch_size=bs,
            input_ids=ids.flatten(),
            req_pool_indices=batch.req_pool_indices,
            seq_lens=batch.seq_lens,
            out_cache_loc=window.cache_loc,
            seq_lens_sum=seq_lens_sum,
            seq_lens_cpu=seq_lens_cpu,
            positions=window.positions_2d.reshape(-1),
            input_embeds=embeds.view(-1, embeds.shape[-1]),
            spec_algorithm=resolve_once("sglang.srt.speculative.spec_info:SpeculativeAlgorithm").DFLASH,
            spec_info=worker._draft_block_spec_info,
            capture_hidden_mode=fb_mod.CaptureHiddenMode.NULL,
            **self.draft_batch_extra(batch, bs, block, ids.device),
        )
        self.bind_draft_batch(worker, forward_batch, window)
        with self.draft_context(worker):
            out = worker.draft_model_runner.forward(forward_batch)
        drawn = graph_candidates(bs) if graph_candidates is not None and out.can_run_graph else None
        if drawn is not None:  # the replayed graph's tail computed the block's logits and drew the candidates
            return DraftOut(anchor, None, None, drawn)
        hidden = out.logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("flashtree: the DFLASH draft forward returned no hidden states")
        hidden = hidden.view(bs, block, -1)[:, 1:]
        return DraftOut(anchor, self.lm_logits(worker, hidden), None, None)

    def lm_head(self, worker):
        return worker.target_worker.model_runner.model.lm_head

    # ---- graph draws (flashtree/patches/graph_draws.py): DFLASH's `_DflashDraftSampler` is the tail -------------
    def graph_draws_unsupported(self, worker, sampler) -> str | None:
        gaps = [msg for msg in (p.check() for p in DFLASH_GRAPH_DRAW_PROBES) if msg]
        if gaps:
            return f"sglang {self.release}'s DFLASH draft graph tail is not one flashtree adapts ({'; '.join(gaps)})"
        if not isinstance(sampler, resolve(DFLASH_TAIL_SAMPLER)):
            return f"DFLASH folded {type(sampler).__name__} into its draft graph, not its greedy head"
        if int(getattr(sampler, "tp_size", 1)) != 1 or int(sampler.org_vocab_start):
            return "DFLASH's draft graph tail reads a TP-sharded LM head"
        return None

    def draft_tail(self, sampler) -> tuple[int, int, torch.Tensor]:
        return int(sampler.out.shape[0]) // (int(sampler.block_size) - 1), int(sampler.num_org), sampler.weight

    def draft_sampler_holders(self, worker) -> tuple:
        return (worker,)

    def tail_batch_size(self, sampler, hidden_states: torch.Tensor) -> int:
        return hidden_states.shape[0] // int(sampler.block_size)

    def tail_inputs(self, sampler, hidden_states: torch.Tensor, input_ids: torch.Tensor):
        """(bs, the draft positions' hidden (bs, K, H) twice, anchor (bs,)): DFLASH's tail sees the whole block
        [anchor, mask x K], one row per token."""
        block = int(sampler.block_size)
        bs = self.tail_batch_size(sampler, hidden_states)
        positions = hidden_states.view(bs, block, -1)[:, 1:]
        return bs, positions, positions, input_ids.view(bs, block)[:, 0]

    def lm_logits(self, worker, hidden: torch.Tensor) -> torch.Tensor:
        """The target LM head's logits over its own (unpadded) vocabulary rows, as DFLASH's greedy head reads them."""
        head = self.lm_head(worker)
        weight = head.weight
        shard = getattr(head, "shard_indices", None)
        rows = int(shard.num_org_elements) if shard is not None else int(weight.shape[0])
        return torch.matmul(hidden.to(weight.dtype), weight[:rows].T)

    def sample_blocks(self, worker, base_logits, anchor, draft_hidden, n: int, sampler: Callable,
                      fused: Callable | None = None, row_draws: Callable | None = None) -> torch.Tensor:
        """N draws per position -> (bs, N, K), candidate 0 each position's argmax (DFLASH's chain block).
        `row_draws(rows) -> (rows, N)` (the fused sampler) draws all N of a position from one read of its logits;
        else one sampler call over the rows repeated N times, ordered (request, position, candidate)."""
        bs, k, v = base_logits.shape
        if row_draws is not None:
            return row_draws(base_logits.reshape(bs * k, v)).view(bs, k, n).transpose(1, 2).contiguous()
        rows = base_logits.repeat_interleave(n, dim=1).reshape(bs * k * n, v)
        return sampler(rows).view(bs, k, n).transpose(1, 2).contiguous()

    def verify_input_extra(self, batch) -> dict:
        return {}  # DFlashVerifyInput takes no live host lengths

    def candidate_logp(self, base_logits: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """(bs, N, K) log q of each candidate token under its position's marginal (positions are independent)."""
        k = candidates.shape[2]
        logq = torch.log_softmax(base_logits[:, :k].float(), dim=-1)  # (bs, K, V)
        logq = logq.unsqueeze(1).expand(-1, candidates.shape[1], -1, -1)
        return logq.gather(3, candidates.unsqueeze(-1)).squeeze(-1)

    def target_verify(self, worker, batch, draft_input, window: Window, ids_2d, positions_2d, custom_mask) -> Verified:
        """DFLASH's verify (its DFlashVerifyInput, prepared and run on the target worker) under the tree mask."""
        w = ids_2d.shape[1]
        verify_input = self.verify_input(batch, ids_2d, positions_2d, custom_mask,
                                         **self.verify_window_extra(worker, window, w))
        batch.out_cache_loc = window.cache_loc
        cpu_backup, sum_backup = batch.seq_lens_cpu, batch.seq_lens_sum
        self.add_window_to_host_lens(batch, draft_input, w)
        target = worker.target_worker
        forward_batch, _ = verify_input.prepare_for_verify(batch, target)
        batch.seq_lens_cpu, batch.seq_lens_sum = cpu_backup, sum_backup
        result = target.forward_batch_generation(batch=None, forward_batch=forward_batch, is_verify=True,
                                                 skip_attn_backend_init=True)
        out = result.logits_output
        if batch.sampling_info is not None:
            adjust = resolve_attr(f"{DFLASH_UTILS}:apply_dflash_verify_logits_adjustments")
            adjust(next_token_logits=out.next_token_logits, sampling_info=batch.sampling_info, draft_token_num=w)
        return Verified(out, out.next_token_logits, out.hidden_states, bool(result.can_run_cuda_graph))

    def inject_committed(self, worker, batch, hidden, cache_loc_2d, positions_2d, commit_lens) -> None:
        worker._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=hidden,
            cache_loc=cache_loc_2d.reshape(-1),
            cache_loc_2d=cache_loc_2d,
            positions=positions_2d.reshape(-1),
            commit_lens=commit_lens,
        )

    def make_next_draft_input(self, bonus, new_seq_lens):
        make = resolve_attr("sglang.srt.speculative.draft_worker_common:make_draft_input_v2")
        return make(bonus_tokens=bonus, new_seq_lens=new_seq_lens)


# What 0.5.20's and later DFlashWorkerV2s give the family (DFlashFamilyV20).
DFLASH_V20_PROBES = (
    Has(f"{DFLASH_MODULE}:_resolve_dflash_embedding_module", ("draft_model", "target_model")),
    Has(f"{FORWARD_BATCH}:enable_num_token_non_padded"),
    Has(f"{DFLASH_MODULE}:DFlashDraftInputV2", ("nxt_kv_lens_cpu",)),
    Has(f"{DFLASH_WORKER}._cache_full_embed_weight"),
    Has("sglang.srt.lora.layers:unwrap_lora_layer"),
)


class DFlashFamilyV20(DFlashFamily):
    """0.5.20's and later DFlashWorkerV2s: the block's embeddings may come from a replicated table and carry a noise
    scale, the target's LM head may be LoRA-wrapped, and the draft forward's ForwardBatch counts the non-padded
    tokens. Each release adds its draft TP context (`draft_context`)."""

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

    def draft_batch_extra(self, batch, bs: int, block: int, device) -> dict:
        padded = resolve_attr(f"{FORWARD_BATCH}:enable_num_token_non_padded")()
        return {
            "num_token_non_padded": torch.tensor(bs * block, dtype=torch.int32, device=device) if padded else None,
            "global_num_token_non_padded_cpu": bs * block,
        }

    def lm_head(self, worker):
        return resolve("sglang.srt.lora.layers:unwrap_lora_layer")(super().lm_head(worker))


class Both:
    """Two context managers entered in order (contextlib.ExitStack's job, without its per-step allocations)."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def __enter__(self):
        self.first.__enter__()
        self.second.__enter__()

    def __exit__(self, *exc):
        self.second.__exit__(*exc)
        return self.first.__exit__(*exc)
