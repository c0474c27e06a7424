"""What every sglang adapter provides: probes, and the release-specific primitives of the tree step (a leaf: it
answers the release ABI and imports no feature module; plan.py decides what to patch).

The primitives here follow the DSPARK component API of sglang 0.5.17 and 0.5.20 (the two agree on every call the
tree step makes); `sglang_0_5_23` overrides what changed there.
"""

from __future__ import annotations

import copy
from typing import Callable

import torch

from ..step_types import DraftOut, Verified, Window
from ..toggles import ToggleError
from .probe import Has, Lacks, Sig, resolve, resolve_attr, resolve_once

WORKER = "sglang.srt.speculative.dspark_components.dspark_worker_v2:DSparkWorkerV2"
PLANNER = "sglang.srt.speculative.dspark_components.dspark_planner"
DRAFT = "sglang.srt.speculative.dspark_components.dspark_draft"
VERIFY = "sglang.srt.speculative.dspark_components.dspark_verify"
INJECT = "sglang.srt.speculative.dspark_components.dspark_kv_inject"
SCHEDULER = "sglang.srt.managers.scheduler:Scheduler"
ENGINE = "sglang.srt.entrypoints.engine"
RESULTS = "sglang.srt.managers.scheduler_components.batch_result_processor:SchedulerBatchResultProcessor"
TRITON = "sglang.srt.layers.attention.triton_backend"
FLASHINFER = "sglang.srt.layers.attention.flashinfer_backend"
DFLASH_UTILS = "sglang.srt.speculative.dflash_utils"
COMMON_DRAFT = "sglang.srt.speculative.draft_worker_common"
REQ = "sglang.srt.managers.schedule_batch:Req"
SAMPLER = "sglang.srt.layers.sampler"
PENALTIES = "sglang.srt.sampling.penaltylib.repetition_penalty"
GRAMMAR = "sglang.srt.constrained.base_grammar_backend:BaseGrammarObject"
LOGPROBS = "sglang.srt.layers.logprob_processor"
DSPARK_CONFIG = "sglang.srt.speculative.dspark_components.dspark_config"


def draft_hf_config(worker):
    """The draft checkpoint's Hugging Face config as the worker's draft runner loaded it; None where it has none."""
    runner = getattr(worker, "draft_model_runner", None)
    return getattr(getattr(runner, "model_config", None), "hf_config", None)


class SglangAdapter:
    release = "?"
    algorithm = "DSPARK"  # the speculative algorithm whose worker these primitives drive (adapters/dflash.py: DFLASH)
    worker_name = "DSparkWorkerV2"
    # the DraftScores fields this worker's tree step can give the score-reading tree policies (policy_draws.py): the
    # Markov head's log q recorded by the draws, its conditionals for best-first; DFLASH: its marginals (dflash.py)
    draft_scores: tuple = ("logp", "anchor", "step_logprobs")
    independent_positions = False  # a draft without a Markov head: each position's distribution ignores its parent
    logp_from_draws = True  # log q comes with the draws (False: `candidate_logp` computes it after them)
    run_forward_extra: dict = {}  # release-specific keyword arguments of DraftBlockProposer._run_forward
    # Probes that must all pass for this adapter to be chosen.
    probes: tuple = ()

    # ---- selection -------------------------------------------------------------------------------------------
    def mismatches(self) -> list[str]:
        return [msg for msg in (p.check() for p in self.probes) if msg]

    # ---- release flags (plan.py and checks.py read them) -----------------------------------------------------
    has_shared_kv = True  # TritonAttnBackend has use_verify_shared_kv (0.5.20+)
    # Req.update_finish_state checks the length limit before stop tokens (0.5.17; finish.py patches it)
    stops_after_length = False
    # A FlashMap draft (flashmap's own sglang model) gets its N candidates from its noise draws on this release
    # (flashtree/patches/flashmap_draft.py); elsewhere the worker refuses it at start (checks.flashmap_draft).
    flashmap_noise_draws = False
    # Calls flashtree's split-KV verify declined, by reason (they ran sglang's own extend attention instead).
    splitkv_declined: dict
    # The same for FLASHTREE_EXACT_VERIFY's decode rows.
    exact_declined: dict

    def __init__(self):
        self.splitkv_declined = {}
        self.exact_declined = {}

    def meets(self, probes) -> bool:
        """Whether this release has everything `probes` look for."""
        return not any(p.check() for p in probes)

    def require(self, probes, toggle: str, allowed: str) -> None:
        """A toggle's own probes: a ToggleError naming what this release lacks (nothing is patched yet)."""
        gaps = [msg for msg in (p.check() for p in probes) if msg]
        if gaps:
            raise ToggleError(f"flashtree: {toggle} cannot hook sglang {self.release}: {'; '.join(gaps)}; allowed: {allowed}")

    # ---- FLASHTREE_DRAFT_ROWS (draft_rows.py) -----------------------------------------------------------------
    draft_rows_release = False  # this release's draft proposer sizes its forward by `gamma` and its spec info only

    def check_draft_rows(self, rows: int) -> None:
        if not self.draft_rows_release:
            raise ToggleError(
                f"flashtree: FLASHTREE_DRAFT_ROWS={rows} needs sglang 0.5.17's DSPARK draft proposer (sglang "
                f"{self.release}'s sizes its forward by query_token_num); allowed: 'auto' (the whole window)"
            )
        self.require(DRAFT_ROWS_PROBES, "FLASHTREE_DRAFT_ROWS", "'auto' (the whole window)")

    def proposer_with_rows(self, worker, rows: int):
        """A shallow copy of DSPARK's proposer whose draft forward runs the first `rows` rows of the window: 0.5.17's
        `_run_forward` takes the block's ids, positions and slots (the window's first columns) and the draft
        attention's spec info from `gamma` and `_draft_block_spec_info` alone (other releases: refused by
        `check_draft_rows`, at install and at worker start)."""
        make_spec = resolve(f"{COMMON_DRAFT}:make_draft_block_spec_info")
        proposer = copy.copy(worker._proposer)
        proposer.gamma = int(rows)
        proposer._draft_block_spec_info = make_spec(draft_token_num=int(rows), device=worker.device)
        return proposer

    # ---- worker checks (at DSparkWorkerV2 construction) ------------------------------------------------------
    def gamma(self, worker) -> int:
        return int(worker.verify_num_draft_tokens) - 1

    def simulate_acc_len(self, worker) -> float:
        """The worker's SGLANG_SIMULATE_ACC_LEN as DSPARK read it (<= 0: off)."""
        return float(getattr(worker, "_simulate_acc_len", -1.0))

    def env_simulate_acc_len(self) -> float:
        """SGLANG_SIMULATE_ACC_LEN as sglang's envs read it (what DSPARK's worker will read)."""
        return float(resolve("sglang.srt.environ:envs").SGLANG_SIMULATE_ACC_LEN.get())

    def simulated_correct_len(self, simulate_acc_len: float, gamma: int) -> int:
        """One step's simulated accepted draft tokens, drawn as DSPARK's verify draws them (0.5.20, 0.5.23: once per
        step and batch, by SGLANG_SIMULATE_ACC_METHOD)."""
        spec_utils = "sglang.srt.speculative.spec_utils"
        draw = resolve(f"{spec_utils}:sample_simulated_acc_len")
        return int(draw(simulate_acc_len, resolve(f"{spec_utils}:SIMULATE_ACC_METHOD"), gamma + 1)) - 1

    def page_size(self, worker) -> int:
        return int(getattr(worker.model_runner, "page_size", 1) or 1)

    def unsupported_worker(self, worker) -> str | None:
        """Why the tree path cannot serve this worker on this release (None = it can)."""
        if getattr(worker, "_need_mamba_verify_commit", False):
            return "the target has recurrent (mamba) state, which a tree verify cannot commit along a path"
        return None

    def unsupported_pools(self, worker) -> str | None:
        """Why the tree path cannot serve this worker's KV pools (None = it can); sglang builds the pools after the
        workers, so this is asked at init_cuda_graphs."""
        return None

    # ---- FLASHTREE_TREE_N=auto (planning.py) -----------------------------------------------------------------
    def draft_block_size(self, worker) -> int | None:
        """The block length in the draft checkpoint's config (what it was trained on; sglang's gamma is larger under
        --speculative-dspark-block-size), None where the worker has no draft config or it names none."""
        hf_config = draft_hf_config(worker)
        if hf_config is None:
            return None
        block = resolve(f"{DSPARK_CONFIG}:parse_dspark_draft_config")(draft_hf_config=hf_config).gamma
        return None if block is None else int(block)

    def graph_replays(self, runner) -> dict[int, Callable[[], None]]:
        """A decode graph runner's captured graphs by batch size -> replay them as captured (inputs as last staged);
        {} where the runner keeps them another way. 0.5.17-0.5.23: its backend's `_graphs`, torch CUDA graphs keyed
        by ShapeKey (size: requests, for the capture sizes of plain decode graphs; ragged verify graphs are keyed by
        tokens, so a runner in that mode gives none)."""
        if getattr(runner, "ragged_verify_mode", False):
            return {}
        sizes = {int(b) for b in getattr(runner, "capture_bs", None) or ()}
        replays: dict[int, Callable[[], None]] = {}
        for key, graph in (getattr(getattr(runner, "backend", None), "_graphs", None) or {}).items():
            plain = getattr(key, "stream_idx", None) is None and getattr(key, "variant_label", None) in (None, "nolora")
            if plain and int(key.size) in sizes:
                replays.setdefault(int(key.size), graph.replay)
        return replays

    # ---- the tree step's primitives --------------------------------------------------------------------------
    def alloc_window_extra(self, batch, draft_input) -> dict:
        """Release-specific keyword arguments of `alloc_verify_window`."""
        return {}

    def alloc_window(self, worker, batch, bs: int, draft_input) -> Window:
        alloc = resolve_attr(f"{PLANNER}:alloc_verify_window")
        native = alloc(
            batch=batch,
            bs=bs,
            device=worker.device,
            verify_num_draft_tokens=worker.verify_num_draft_tokens,
            block_pos_offsets=worker._block_pos_offsets,
            model_runner=worker.model_runner,
            **self.alloc_window_extra(batch, draft_input),
        )
        return Window(native.positions_2d, native.verify_cache_loc, native.verify_cache_loc_2d, native)

    def draft_forward(self, worker, batch, draft_input, window: Window, bs: int, proposer=None, sampler=None,
                      graph_candidates: Callable | None = None) -> DraftOut:
        """One draft forward over the block -> anchor (bs,) and either the N candidates the draft graph's tail drew
        (`graph_candidates(bs)`, asked when the graph ran; None: it did not draw them) or base logits (bs, rows, V)
        and draft hidden (bs, rows, H) for the eager draws. proposer: DSPARK's (default) or its copy over fewer rows
        (FLASHTREE_DRAFT_ROWS); sampler: the draft sampler to stage before a replay (flashtree's graph draws)."""
        proposer = proposer or worker._proposer
        embed = self.embed_module(worker)
        with worker._draft_context():
            # flashtree's sampler: staged before a replay (DSPARK's part reads its sampling parameters); the replay
            # runs its tail. None (graph draws off): the captured tail, if any, is DSPARK's own.
            fwd = proposer._run_forward(
                batch=batch,
                draft_input=draft_input,
                verify_window=window.native,
                bs=bs,
                device=worker.device,
                embed_module=embed,
                draft_sampler=sampler,
                sampling_info=batch.sampling_info,
                **self.run_forward_extra,
            )
            anchor = fwd.draft_block_ids[:, 0].clone()
            drawn = graph_candidates(bs) if graph_candidates is not None and fwd.can_run_graph else None
            if drawn is not None:
                return DraftOut(anchor, None, None, drawn)
            base, _tap = proposer.draft_model.compute_base_logits(fwd.raw_hidden)
        k = proposer.gamma
        return DraftOut(anchor, base.view(bs, k, -1), fwd.draft_hidden_3d, None)

    def candidate_logp(self, base_logits: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor | None:
        """(bs, N, K) log q of the candidates' tokens, where "logp" is in `draft_scores` (None: not computed; policies
        that need it are refused at worker start)."""
        return None

    def draft_model(self, worker):
        return worker._proposer.draft_model

    def decode_graph_sizes(self) -> list[int] | None:
        """The decode CUDA-graph batch sizes sglang was configured with (`--cuda-graph-bs`), None when unknown (no
        server context, or another layout). sglang captures a subset of them (plus its max running requests)."""
        try:
            get_exec = resolve("sglang.srt.runtime_context:get_exec")
            return sorted({int(s) for s in get_exec().graph.cuda_graph_config.decode.bs})
        except Exception:  # noqa: BLE001 - not published outside a server
            return None

    def tail_inputs(self, sampler, hidden_states: torch.Tensor, input_ids: torch.Tensor):
        """(bs, hidden for the base logits, (bs, K, H) hidden for the Markov head, anchor (bs,)) as DSPARK's draft
        graph tail sees them: 0.5.17 feeds K rows per request; 0.5.20+ feed `query_token_num` = K + 1 (the anchor's
        row first) unless the draft samples from the anchor."""
        k = int(sampler.gamma)
        q = int(getattr(sampler, "query_token_num", k))
        bs = self.tail_batch_size(sampler, hidden_states)
        anchor = input_ids.view(bs, q)[:, 0]
        if q == k:
            return bs, hidden_states, hidden_states.view(bs, k, -1), anchor
        selected = hidden_states.view(bs, q, -1)[:, 1:].contiguous()
        return bs, selected.view(bs * k, -1), selected, anchor

    def tail_batch_size(self, sampler, hidden_states: torch.Tensor) -> int:
        return hidden_states.shape[0] // int(getattr(sampler, "query_token_num", sampler.gamma))

    def parallelism(self, worker) -> list[str]:
        """The multi-GPU settings this worker's server runs, as the flags that set them (empty: one GPU)."""
        args = getattr(worker, "server_args", None)
        if args is None:
            return []
        found = []
        for flag, size in (("--tp-size", "tp_size"), ("--pp-size", "pp_size")):
            value = int(getattr(args, size, 1) or 1)
            if value > 1:
                found.append(f"{flag} {value}")
        if getattr(args, "enable_dp_attention", False):
            found.append("--enable-dp-attention")
        return found

    def tp_group(self, worker):
        """The torch ProcessGroup of the worker's tensor-parallel ranks (the tree step's sync, tp_sync.py); None at
        --tp-size 1. DP attention and pipeline parallelism are refused at worker start, so this is sglang's TP group."""
        args = getattr(worker, "server_args", None)
        if int(getattr(args, "tp_size", 1) or 1) <= 1:
            return None
        return resolve("sglang.srt.distributed.parallel_state:get_tp_group")().device_group

    def embed_module(self, worker):
        proposer = worker._proposer
        unwrap = resolve("sglang.srt.lora.layers:unwrap_lora_layer")
        target_model = worker.target_worker.model_runner.model
        return unwrap(
            proposer.draft_model.embed_tokens if not proposer.sample_from_anchor else target_model.get_input_embeddings()
        )

    def verify_input_extra(self, batch) -> dict:
        return {"live_seq_lens_cpu": batch.seq_lens_cpu}

    def reserved_lens(self, draft_input):
        """Host bound on the lengths after this step's reservation (used when batch.seq_lens_cpu is stale/None)."""
        return draft_input.nxt_kv_lens_cpu, draft_input.nxt_kv_lens_sum

    def sample_blocks(self, worker, base_logits, anchor, draft_hidden, n: int, sampler: Callable,
                      fused: Callable | None = None, row_draws: Callable | None = None) -> torch.Tensor:
        """N draws of the block through the draft's Markov head -> (bs, N, K). `sampler(step_logits) -> tokens`;
        `fused(base_logits, anchor, w1, w2)`, when given, draws them all instead if the head is a vanilla one.
        `row_draws` serves drafts with independent positions (DFLASH), not a Markov head."""
        head = self.draft_model(worker).markov_head
        weights = self.vanilla_markov_weights(head) if fused is not None else None
        if weights is not None:
            return fused(base_logits, anchor, *weights)
        return self.markov_draws(head, base_logits, anchor, draft_hidden, n, sampler)

    # The methods that make a VanillaMarkov's step bias w2 @ w1[prev]: a subclass overriding one has another bias.
    vanilla_bias_methods = ("get_prev_embeddings", "project_bias", "compute_step_bias", "apply_step_logits",
                            "sample_block")

    def vanilla_markov_weights(self, head):
        """(w1, w2) when the head's step bias is exactly w2 @ w1[prev] (sglang's own VanillaMarkov), the bias
        flashtree's fused Markov draws compute; None for any other head (gated, RNN, sharded, subclassed)."""
        vanilla = resolve("sglang.srt.models.dspark:VanillaMarkov")
        sharded = getattr(head, "vocab_shard", None) is not None or getattr(head, "_w2_rows", None) is not None
        if not isinstance(head, vanilla) or sharded:
            return None
        if any(getattr(type(head), m) is not getattr(vanilla, m) for m in self.vanilla_bias_methods):
            return None
        w2 = head.markov_w2
        if type(w2) is not torch.nn.Linear or w2.bias is not None:
            return None
        return head.markov_w1.weight, w2.weight

    def markov_draws(self, head, base_logits, anchor, draft_hidden, n: int, sampler: Callable) -> torch.Tensor:
        """bs*N request-major rows through `head.sample_block` (0.5.17 / 0.5.20) -> (bs, N, K). Runs eagerly (tree
        step) and inside the draft graph's tail (graph draws): no host reads."""
        bs = base_logits.shape[0]

        def step(step_logits: torch.Tensor, step_idx: int) -> torch.Tensor:
            return sampler(step_logits)

        tokens, _ = head.sample_block(
            base_logits.repeat_interleave(n, dim=0),
            first_prev_tokens=anchor.repeat_interleave(n, dim=0),
            hidden_states=None if draft_hidden is None else draft_hidden.repeat_interleave(n, dim=0),
            sampler=step,
            **self.sample_block_extra,
        )
        return tokens.view(bs, n, -1)

    sample_block_extra: dict = {}  # release-specific keyword arguments of the Markov head's sample_block

    # ---- graph draws (flashtree/patches/graph_draws.py) ------------------------------------------------------
    def graph_draw_bytes(self, *, rows: int, depth: int, vocab: int, logits_bytes: int) -> int:
        """Graph-pool bytes of the tail's N draws at `rows` = max_bs * N rows: the repeated base logits and the
        corrected logits sample_block keeps (rows, K, V), and a step's float32 scores / argmax temporaries."""
        return 2 * rows * depth * vocab * logits_bytes + 3 * rows * vocab * 4

    def graph_draws_unsupported(self, worker, sampler) -> str | None:
        """Why the N draws cannot run in this worker's draft graph tail (None = they can)."""
        if getattr(sampler, "markov_head", None) is None:
            return "the draft sampler has no Markov head"
        return None

    def draft_tail(self, sampler) -> tuple[int, int, torch.Tensor]:
        """(the requests its buffers hold: the largest configured graph size, the vocabulary, the LM-head weight) of
        the sampler the worker folds into its draft graph."""
        head = sampler.model.lm_head
        return int(sampler.out.shape[0]) // int(sampler.gamma), int(head.org_vocab_size), head.weight

    def draft_sampler_holders(self, worker) -> tuple:
        """What holds the worker's draft sampler (its decode reads it from each): the worker and DSPARK's proposer."""
        return worker, worker._proposer

    def verify_input_cls(self):
        return resolve_attr("sglang.srt.speculative.dflash_info:DFlashVerifyInput")

    def verify_input(self, batch, ids_2d, positions_2d, custom_mask, **extra):
        """The release's verify input over the W tree tokens of each request (FULL_MASK layout, flat bool mask);
        `extra`: the caller's own fields of it."""
        capture = resolve_once("sglang.srt.model_executor.forward_batch_info:CaptureHiddenMode")
        return self.verify_input_cls()(
            draft_token=ids_2d.reshape(-1),
            positions=positions_2d.reshape(-1),
            draft_token_num=ids_2d.shape[1],
            custom_mask=custom_mask,
            capture_hidden_mode=capture.FULL,
            **self.verify_input_extra(batch),
            **extra,
        )

    def target_verify(self, worker, batch, draft_input, window: Window, ids_2d, positions_2d, custom_mask) -> Verified:
        """Target forward over the W tree tokens of each request under `custom_mask` (FULL_MASK layout, flat bool)."""
        executor = worker._verify_executor
        w = ids_2d.shape[1]
        verify_input = self.verify_input(batch, ids_2d, positions_2d, custom_mask)
        batch.out_cache_loc = window.cache_loc
        cpu_backup, sum_backup = batch.seq_lens_cpu, batch.seq_lens_sum
        if not executor._verify_backend_self_adds_seq_lens():
            self.add_window_to_host_lens(batch, draft_input, w)
        result = executor._forward_prepared_verify(
            batch=batch, verify_input=verify_input, seq_lens_cpu_backup=cpu_backup, seq_lens_sum_backup=sum_backup
        )
        out = result.logits_output
        # Raw logits: the tree step applies the sampling adjustments per node (node_logits.py), not DSPARK's
        # root-state broadcast.
        return Verified(out, out.next_token_logits, out.hidden_states, bool(result.can_run_cuda_graph))

    def add_window_to_host_lens(self, batch, draft_input, w: int) -> None:
        """The batch's host lengths as the verify forward sees them, each with its w window tokens (the reservation's
        bound when sglang keeps no host lengths); the caller restores the originals after the forward."""
        if batch.seq_lens_cpu is not None:
            batch.seq_lens_cpu = batch.seq_lens_cpu + w
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        elif self.reserved_lens(draft_input)[0] is not None:
            reserved_cpu, reserved_sum = self.reserved_lens(draft_input)
            batch.seq_lens_cpu, batch.seq_lens_sum = reserved_cpu, int(reserved_sum)

    def apply_custom_logit_processor(self, logits, sampling_info, rows_per_request: int) -> None:
        """sglang's custom logit processors over (bs * rows_per_request, V) logits, in place."""
        apply = resolve(f"{SAMPLER}:apply_custom_logit_processor")
        apply(logits, sampling_info, num_tokens_in_batch=rows_per_request)

    def overlap_schedule(self, worker) -> bool:
        """Whether the server runs sglang's overlap scheduler (on unless --disable-overlap-schedule; False without a
        server context)."""
        args = getattr(worker, "server_args", None)
        return args is not None and not getattr(args, "disable_overlap_schedule", True)

    def scaling_penalties(self, logits, scale) -> None:
        """sglang's repetition scaling of (rows, V) logits by (rows, V) factors, in place: its own (torch.compile'd)
        function, so each node's numbers are the ones its no-speculation decode step computes (a compiled division
        need not round as an eager one does)."""
        resolve(f"{PENALTIES}:apply_scaling_penalties")(logits, scale)

    # Whether sglang refuses return_logprob on DSPARK servers (0.5.17: the scheduler's check and the worker's entry;
    # flashtree lets them through to the tree step, logprobs.py); later releases' DSPARK serves it.
    dspark_refuses_logprobs = False
    # FlashInfer verifies the tree: DFlashVerifyInput.generate_attn_arg_prefill hands it the FULL_MASK and the
    # window's slots from req_to_token (0.5.17, 0.5.20; 0.5.23's goes through a KV translation plan, not wired).
    flashinfer_verify = True

    def top_logprobs(self, logprobs, nums: list[int]):
        """sglang's decode top-logprobs lists (values, indices) over (rows, V) logprobs, one count per row."""
        return resolve(f"{LOGPROBS}:get_top_logprobs")(logprobs, nums, no_copy_to_cpu=True)

    def token_ids_logprobs(self, logprobs, token_ids: list):
        """sglang's decode logprobs of requested token ids (values, ids), one list (or None) per row."""
        return resolve(f"{LOGPROBS}:get_token_ids_logprobs")(logprobs, token_ids, no_copy_to_cpu=True)

    def req_to_token(self, worker) -> torch.Tensor:
        return worker.model_runner.req_to_token_pool.req_to_token

    def inject_committed(self, worker, batch, hidden, cache_loc_2d, positions_2d, commit_lens) -> None:
        """Write the draft's context K/V for the committed tokens (the first commit_lens[b] columns)."""
        worker._verify_executor.kv_injector.inject_target_hidden(
            target_hidden=hidden,
            cache_loc=cache_loc_2d.reshape(-1),
            cache_loc_2d=cache_loc_2d,
            positions=positions_2d.reshape(-1),
            commit_lens=commit_lens,
        )

    def target_kv_pool(self, worker):
        return getattr(worker.model_runner, "token_to_kv_pool", None)  # DSparkWorkerV2.model_runner: the target's

    def copy_commit_unsupported(self, worker) -> str | None:
        """Why the paged-KV copy commit cannot run on this worker (None = it can)."""
        pool = self.target_kv_pool(worker)
        if not callable(getattr(pool, "move_kv_cache", None)):
            return f"the target KV pool ({type(pool).__name__}) has no move_kv_cache"
        return None

    def copy_committed_kv(self, worker, window_slots_2d: torch.Tensor, plan) -> None:
        """Paged KV: copy each accepted node's target KV (all layers) from its window slot to the slot of its depth.

        One `move_kv_cache(tgt, src)` call per depth, over all requests at once: a call's copies never touch each other's
        slots (one slot per request), and depth order keeps the plan's rule that no destination is a later source, so
        the pool's copy kernel may run a call's copies in any order. Masked-off entries copy a slot onto itself.
        """
        pool = self.target_kv_pool(worker)
        src = window_slots_2d.gather(1, plan.copy_src)
        dst = window_slots_2d.gather(1, plan.copy_dst)
        for j in range(src.shape[1]):
            pool.move_kv_cache(dst[:, j].contiguous(), src[:, j].contiguous())

    def _target_attn_backend(self, worker):
        backend = worker.target_worker.model_runner.attn_backend
        for _ in range(4):  # hybrid backends wrap the full-attention one
            inner = getattr(backend, "full_attn_backend", None)
            if inner is None:
                break
            backend = inner
        return backend

    def verify_mask_buffer(self, worker) -> torch.Tensor | None:
        """The target attention backend's verify-mask buffer, which its captured verify graphs read (None: none)."""
        mask = getattr(self._target_attn_backend(worker), "verify_mask", None)
        return None if mask is None else mask.buffer

    def prefix_sum_bound(self, worker, bs: int, draft_input, window: int) -> int | None:
        """A host int >= the batch's sum of seq_lens, known without a device sync (None: not on the host). Under
        overlap scheduling the host knows the reserved KV lengths, not this step's prefixes; each reservation holds
        its request's prefix and `window`-token verify window. Capped at bs x the backend's max_context_len, the
        per-request span its verify-mask buffers are sized for."""
        lens, total = self.reserved_lens(draft_input)
        if lens is None or total is None:
            return None
        bound = int(total) - bs * window
        ctx = getattr(self._target_attn_backend(worker), "max_context_len", None)
        return bound if ctx is None else min(bound, bs * int(ctx))

    def publish_req_to_token_write(self, worker) -> None:
        """The scheduler's next req_to_token write must wait for this step's reads (0.5.20+: a fresh event)."""
        runner = worker.target_worker.model_runner
        if torch.cuda.is_available() and hasattr(runner, "shared_read_done_event"):
            event = torch.cuda.Event()
            event.record()
            runner.shared_read_done_event = event

    def make_next_draft_input(self, bonus, new_seq_lens):
        return resolve_attr(f"{DRAFT}:make_next_draft_input")(bonus_tokens=bonus, new_seq_lens=new_seq_lens)

    def batch_result(self, **kwargs):
        return resolve_once("sglang.srt.managers.scheduler:GenerationBatchResult")(**kwargs)


COMMON_PROBES = (
    Sig(f"{WORKER}.__init__", ("self", "server_args"), prefix=True),  # kept as worker.server_args (parallelism)
    Has(f"{WORKER}.init_cuda_graphs"),  # startup.py: the checks and graphs that need the KV pools
    Sig(f"{SCHEDULER}._add_request_to_queue", ("self", "req", "is_retracted")),
    Has("sglang.srt.managers.schedule_batch:Req.set_finish_with_abort", ("error_msg",)),
    Sig(f"{DRAFT}:make_next_draft_input", ("bonus_tokens", "new_seq_lens")),
    Has(f"{VERIFY}:TargetVerifyExecutor._forward_prepared_verify", ("batch", "verify_input", "seq_lens_cpu_backup", "seq_lens_sum_backup")),
    Has(f"{VERIFY}:TargetVerifyExecutor._verify_backend_self_adds_seq_lens"),
    Has(f"{INJECT}:TargetHiddenKvInjector.inject_target_hidden", ("target_hidden", "cache_loc", "positions", "cache_loc_2d", "commit_lens")),
    Sig(f"{RESULTS}._maybe_collect_customized_info", ("self", "i", "req", "logits_output")),
    Has(f"{DFLASH_UTILS}:_DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS"),
    Sig(f"{SAMPLER}:apply_custom_logit_processor", ("logits", "sampling_batch_info", "num_tokens_in_batch")),
    Sig(f"{PENALTIES}:apply_scaling_penalties", ("logits", "scaling_penalties")),
    # grammar_masks.py: the grammar objects' own walk and mask calls
    *(Has(f"{GRAMMAR}.{name}", params) for name, params in (
        ("accept_token", ("token",)), ("rollback", ("k",)), ("is_terminated", ()),
        ("fill_vocab_mask", ("vocab_mask", "idx")), ("allocate_vocab_mask", ("vocab_size", "batch_size", "device")),
        ("apply_vocab_mask", ("logits", "vocab_mask")))),
    Sig(f"{LOGPROBS}:get_top_logprobs", ("logprobs", "top_logprobs_nums", "no_copy_to_cpu")),
    Sig(f"{LOGPROBS}:get_token_ids_logprobs", ("logprobs", "token_ids_logprobs", "no_copy_to_cpu")),
    Has("sglang.srt.speculative.dflash_info:DFlashVerifyInput", ("draft_token", "positions", "draft_token_num", "custom_mask", "capture_hidden_mode")),
    Has(f"{TRITON}:TritonAttnBackend.__init__", ("model_runner",)),
    Has(f"{TRITON}:TritonAttnBackend.verify_mask"),  # the buffer captured verify graphs read (stage_chain_mask)
    Has("sglang.srt.speculative.eagle_utils:build_tree_kernel_efficient", ("bonus_tokens", "parent_list", "top_scores_index", "draft_tokens", "seq_lens", "seq_lens_sum", "topk", "spec_steps", "num_verify_tokens", "tree_mask_mode")),
)

# What the narrower verify graphs of FLASHTREE_TREE_BUDGET / FLASHTREE_TREE_WIDTH need (checked only when one is set;
# verify_widths.py).
# FLASHTREE_SIMULATE_ACC on DSPARK's own steps: its verify's simulated length, per request (0.5.17, 0.5.20)
SIMULATED_CHAIN_PROBES = (
    Sig(f"{VERIFY}:TargetVerifyExecutor._simulated_correct_len", ("self", "bs", "dtype", "device")),
)

NARROW_VERIFY_PROBES = (
    Has(
        "sglang.srt.model_executor.runner.decode_cuda_graph_runner:DecodeCudaGraphRunner.__init__",
        ("model_runner", "attn_backend", "speculative_num_draft_tokens"),
    ),
)

# What FLASHTREE_DRAFT_ROWS builds on (checked only when it is set; draft_rows.py): the block's spec info, and the
# draft proposer's forward, run on a copy with fewer rows.
DRAFT_ROWS_PROBES = (
    Sig(f"{COMMON_DRAFT}:make_draft_block_spec_info", ("draft_token_num", "device")),
    Has(f"{DRAFT}:DraftBlockProposer._run_forward", ("batch", "draft_input", "verify_window", "bs", "draft_sampler")),
)

# What FLASHTREE_EXACT_VERIFY hooks (checked only when it is set): the deterministic extend path it takes over for
# verify batches, and the decode kernel and split rule it runs the rows through.
EXACT_VERIFY_PROBES = (
    Sig(
        f"{TRITON}:TritonAttnBackend._forward_extend_unified",
        ("self", "q", "o", "layer", "forward_batch", "causal", "logits_soft_cap", "sinks", "score_mod", "aux_tensors"),
    ),
    Sig(f"{TRITON}:TritonAttnBackend.get_num_kv_splits", ("self", "num_kv_splits", "seq_lens"), prefix=True),
    Has(
        "sglang.kernels.ops.attention.decode_attention:decode_attention_fwd",
        ("kv_indptr", "kv_indices", "attn_logits", "attn_lse", "num_kv_splits", "max_kv_splits", "has_mla", "use_pdl",
         "page_size"),
    ),
)

# Where sglang plans a FlashInfer verify batch, eagerly and before each graph replay: what FLASHTREE_EXACT_VERIFY's
# decode rows (exact_verify_flashinfer.py) and tree servers' chain masks (flashinfer_graphs.py) hook on FlashInfer.
FLASHINFER_VERIFY_PROBES = (
    Sig(f"{FLASHINFER}:FlashInferAttnBackend.init_forward_metadata", ("self", "forward_batch")),
    Sig(f"{FLASHINFER}:FlashInferAttnBackend.init_forward_metadata_out_graph", ("self", "forward_batch", "in_capture")),
)

# 0.5.20 and later.
LIVE_LENS_PROBES = (
    Has("sglang.srt.speculative.dflash_info:DFlashVerifyInput", ("live_seq_lens_cpu",)),
    Has("sglang.srt.lora.layers:unwrap_lora_layer"),
    Has("sglang.srt.speculative.dflash_info_v2:DFlashDraftInputV2", ("nxt_kv_lens_cpu",)),
)

# 0.5.17 and 0.5.20 share the chain-era block API the tree step calls.
CHAIN_ERA_PROBES = (
    Sig(f"{WORKER}._forward_decode", ("self", "batch", "on_publish", "grammar_barrier")),
    Sig(f"{PLANNER}:alloc_verify_window", ("batch", "bs", "device", "verify_num_draft_tokens", "block_pos_offsets", "model_runner")),
    Sig(
        f"{DRAFT}:DraftBlockProposer._run_forward",
        ("self", "batch", "draft_input", "verify_window", "bs", "device", "embed_module", "draft_sampler", "sampling_info"),
    ),
    Has("sglang.srt.models.dspark:VanillaMarkov.sample_block", ("base_logits", "first_prev_tokens", "hidden_states", "sampler")),
    Lacks(f"{TRITON}:TritonAttnBackend.__init__", ("dllm_fa4",)),
)
