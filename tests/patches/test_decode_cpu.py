"""The tree decode step end to end on CPU: real flashtree tree code, sglang's real EAGLE tree kernel (Triton
interpreter), real Markov head / draft-input / batch-result classes; stand-ins only for the draft forward and the
target verify (tiny deterministic models that keep the real contracts: shapes, dtypes, KV slots written per node)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import types
from collections import Counter

import pytest
import torch

import sglang_cpu
from flashtree.patches import adapters
from flashtree.patches.decode import create_state, tree_step
from flashtree.patches.stage_times import STAGES
from flashtree.patches.step_types import DraftOut, Verified, Window
from flashtree.patches.toggles import TreeToggles
from flashtree.tree.encode import child_links

V, GAMMA, BS, H = 32, 5, 3, 2
W = GAMMA + 1
MAX_LEN = 160
# The stand-in target's next-token distribution: three plausible tokens (offsets from its greedy token), the rest ~0.
SUPPORT_OFFSETS, SUPPORT_LOGITS = (0, 5, 11), (1.0, 0.5, 0.0)


def target_next(context: list[int]) -> int:
    """The stand-in target's greedy next token: depends on the whole context (a wrong tree mask shows)."""
    return (7 * sum(context) + 3 * len(context) + 1) % V


def target_logits(context: list[int]) -> torch.Tensor:
    logits = torch.full((V,), -30.0)
    top = target_next(context)
    for off, val in zip(SUPPORT_OFFSETS, SUPPORT_LOGITS):
        logits[(top + off) % V] = val
    return logits


def reference(prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    while len(seq) < len(prompt) + n:
        seq.append(target_next(seq))
    return seq


def skip_reason(plan, batch):
    """decode.skip_reason as the decode hook asks it, keeps_tree's answer first."""
    from flashtree.patches import decode

    return decode.skip_reason(plan, batch, (), {}, decode.keeps_tree(plan, batch))


class StandIns:
    """Target KV pool, draft KV pool and the two model forwards, over a real req_to_token table.

    page_size 1: every position gets its own random slot. page_size P > 1: positions map to slots through random
    pages, slot = page * P + position % P (the paged layout a copy commit must preserve)."""

    def __init__(self, prompts, refs, page_size: int = 1):
        bs = len(prompts)
        self.refs, self.page_size = refs, page_size
        g = torch.Generator().manual_seed(1)
        self.req_to_token = torch.zeros((bs + 1, MAX_LEN), dtype=torch.int64)
        self.rows = torch.tensor([2, 0, 3] if bs == 3 else list(range(1, bs + 1)))
        if page_size == 1:
            slots = torch.randperm(bs * MAX_LEN, generator=g) + 1  # slot 0 = dummy
            self.req_to_token[self.rows] = slots.view(bs, MAX_LEN)
        else:
            pages_per_req = MAX_LEN // page_size
            pages = (torch.randperm(bs * pages_per_req, generator=g) + 1).view(bs, pages_per_req)  # page 0 = dummy
            pos = torch.arange(MAX_LEN)
            self.req_to_token[self.rows] = pages[:, pos // page_size] * page_size + pos % page_size
        n_slots = int(self.req_to_token.max()) + 1
        self.kv = torch.full((n_slots, 2), -1, dtype=torch.int64)  # target KV: (position, token) per slot
        self.draft_kv = torch.full((n_slots, H), -1.0)
        for b, p in enumerate(prompts):
            s = self.req_to_token[self.rows[b], : len(p)]
            self.kv[s, 0] = torch.arange(len(p))
            self.kv[s, 1] = torch.tensor(p)
        self.moves = 0
        # The target's verify-mask buffer, which sglang's captured verify graphs read (FULL_MASK layout, uint8).
        self.verify_mask = torch.zeros(bs * W * (MAX_LEN + W), dtype=torch.uint8)

    def request(self, batch, b: int) -> int:
        """The request at position b of `batch` (batches may hold any subset of the requests, in any order)."""
        return self.rows.tolist().index(int(batch.req_pool_indices[b]))

    def context(self, b: int, seq_len: int) -> list[int]:
        slots = self.req_to_token[self.rows[b], :seq_len]
        assert torch.equal(self.kv[slots, 0], torch.arange(seq_len)), "req_to_token prefix is not sequential"
        return self.kv[slots, 1].tolist()

    def move_kv_cache(self, tgt_loc, src_loc):
        """MHATokenToKVPool.move_kv_cache's contract, copying pair by pair in reverse order (as a parallel copy
        kernel may): a call whose copies depend on each other corrupts the pool here."""
        assert tgt_loc.shape == src_loc.shape and tgt_loc.dim() == 1
        for t, s_ in reversed(list(zip(tgt_loc.tolist(), src_loc.tolist()))):
            self.kv[t] = self.kv[s_]
        self.moves += 1


class StandInAdapter:
    """The release's real adapter with the two model forwards (and the window) replaced."""

    def __init__(self, real, world: StandIns):
        self.real, self.world = real, world
        self.release = real.release

    def __getattr__(self, name):
        return getattr(self.real, name)

    def verify_mask_buffer(self, worker):
        return self.world.verify_mask

    def alloc_window(self, worker, batch, bs, draft_input):
        # alloc_verify_window's contract: slots req_to_token[req, seq_len : seq_len + W], positions seq_len + j.
        cols = batch.seq_lens.view(-1, 1) + torch.arange(W)
        loc = self.world.req_to_token[batch.req_pool_indices.view(-1, 1), cols]
        return Window(cols, loc.reshape(-1), loc, None)

    def draft_forward(self, worker, batch, draft_input, window, bs, proposer=None, sampler=None, graph_candidates=None):
        if getattr(worker, "_draft_sampler", None) is not None:
            # FLASHTREE_GRAPH_DRAWS: the real adapter's draft forward over the stand-in proposer (StandInProposer).
            return self.real.draft_forward(worker, batch, draft_input, window, bs, proposer, sampler, graph_candidates)
        anchor = draft_input.bonus_tokens.view(-1)
        return DraftOut(anchor, standin_base_logits(self.world, batch, anchor, bs), None)

    def target_verify(self, worker, batch, draft_input, window, ids_2d, positions_2d, custom_mask):
        """As a replayed verify graph captured with a mask buffer: a request's mask is copied into the buffer (sglang's
        replay), a verify without one (DSPARK's chain) reads whatever the buffer holds."""
        world = self.world
        bs, w = ids_2d.shape
        runner = getattr(worker.model_runner, "decode_cuda_graph_runner", None)
        assert runner is None or runner.width == w, "verify must replay the graph runner captured at its width"
        if custom_mask is not None:
            world.verify_mask[: custom_mask.numel()].copy_(custom_mask)
        custom_mask = world.verify_mask.bool()
        # A target writes KV for every verify token at its window slot.
        world.kv[window.cache_loc, 0] = positions_2d.reshape(-1)
        world.kv[window.cache_loc, 1] = ids_2d.reshape(-1)
        logits = torch.full((bs, w, V), -30.0)
        offset = 0
        for b in range(bs):
            L = int(batch.seq_lens[b])
            rows = custom_mask[offset : offset + w * (L + w)].view(w, L + w)
            offset += w * (L + w)
            assert rows[:, :L].all(), "prefix must be visible to every tree node"
            prefix = world.context(world.request(batch, b), L)
            for i in range(w):
                seen = rows[i, L:].nonzero().flatten()
                tokens = ids_2d[b, seen]
                assert positions_2d[b, i] == L + len(seen) - 1, "position must be prefix + depth"
                logits[b, i] = target_logits(prefix + tokens.tolist())
        hidden = torch.stack([positions_2d.reshape(-1).float(), ids_2d.reshape(-1).float()], dim=1)
        out = types.SimpleNamespace(next_token_logits=logits.view(bs * w, V), hidden_states=hidden, customized_info=None)
        return Verified(out, out.next_token_logits, hidden, False)

    def req_to_token(self, worker):
        return self.world.req_to_token

    def inject_committed(self, worker, batch, hidden, cache_loc_2d, positions_2d, commit_lens):
        for b in range(cache_loc_2d.shape[0]):
            c = int(commit_lens[b])
            self.world.draft_kv[cache_loc_2d[b, :c]] = hidden.view(-1, cache_loc_2d.shape[1], H)[b, :c]

    def publish_req_to_token_write(self, worker):
        pass


class StandInAttnBackend:
    def __init__(self, model_runner):
        self.model_runner = model_runner


class StandInGraphRunner:
    """sglang's DecodeCudaGraphRunner's constructor contract (what verify_widths.capture calls); a GPU captures here."""

    def __init__(self, model_runner, *, attn_backend=None, speculative_num_draft_tokens=None, capture_bs=None):
        self.width = speculative_num_draft_tokens or W
        self.attn_backend = attn_backend
        self.capture_bs = capture_bs or model_runner.decode_cuda_graph_runner.capture_bs
        assert attn_backend is None or (isinstance(attn_backend, StandInAttnBackend) and attn_backend.model_runner
                                        is model_runner and attn_backend is not model_runner.attn_backend)


def standin_base_logits(world: StandIns, batch, anchor, bs: int, rows: int = GAMMA) -> torch.Tensor:
    """The stand-in draft's base logits (bs, K, V): it knows the target's greedy block from the request's actual
    context but puts only 60% on each greedy token (the rest on a per-depth decoy); at about a third of the positions
    the decoy is the draft's favourite (55%), so the greedy block (candidate 0) is wrong there and the draws must find
    the target's token."""
    base = torch.full((bs, rows, V), -30.0)
    for b in range(bs):
        L = int(batch.seq_lens[b])
        ctx = world.context(world.request(batch, b), L) + [int(anchor[b])]
        for j in range(rows):
            tok = target_next(ctx)
            decoy = (tok + 1 + j) % V
            base[b, j, tok] = 0.0
            base[b, j, decoy] = -0.4055  # log(0.4/0.6)
            if (sum(ctx) + j) % 3 == 0:
                base[b, j, tok], base[b, j, decoy] = -0.2007, 0.0  # log(0.45/0.55)
            ctx.append(tok)
    return base


class StandInProposer:
    """DSPARK's DraftBlockProposer over the stand-in draft (hidden states = its base logits): `_run_forward` runs
    `gamma` block rows (as 0.5.17's does; FLASHTREE_DRAFT_ROWS runs a copy with fewer) and replays the draft model
    runner's current graph runner for batches up to graph_max_bs when that runner was captured at its width (the tail
    runs), eagerly otherwise (the tail does not run)."""

    def __init__(self, world: StandIns, worker, graph_max_bs: int):
        from draft_sampler_cpu import TinyDraft
        from sglang.srt.speculative.draft_worker_common import make_draft_block_spec_info

        self.world, self.worker, self.graph_max_bs = world, worker, graph_max_bs
        self.draft_model = TinyDraft(worker._proposer.draft_model.markov_head, V, sample_from_anchor=True)
        self.gamma, self.sample_from_anchor = GAMMA, True
        self._draft_block_spec_info = make_draft_block_spec_info(draft_token_num=GAMMA, device="cpu")
        self.rows_run = Counter()  # block rows per forward -> forwards

    def _run_forward(self, *, batch, draft_input, bs, draft_sampler, sampling_info, **kw):
        rows = self.gamma
        assert self._draft_block_spec_info.draft_token_num == rows, "the draft attention's spec info has the block's rows"
        self.rows_run[rows] += 1
        anchor = draft_input.bonus_tokens.view(-1)
        hidden = standin_base_logits(self.world, batch, anchor, bs, rows).view(bs * rows, V)
        ids = torch.zeros((bs, rows), dtype=torch.int64)
        ids[:, 0] = anchor
        runner = self.worker.draft_model_runner.decode_cuda_graph_runner
        graph = bs <= self.graph_max_bs and runner.width == rows  # sglang's replay checks the captured width
        if graph:
            assert draft_sampler is self.worker._draft_sampler
            draft_sampler.stage_sampling_params(bs=bs, sampling_info=sampling_info)
            runner.replay_tail(hidden, ids.view(-1))
        return types.SimpleNamespace(draft_block_ids=ids, raw_hidden=hidden, draft_hidden_3d=hidden.view(bs, rows, V),
                                     can_run_graph=graph)


class StandInDraftGraphRunner:
    """sglang's draft decode graph runner: captured at `speculative_num_draft_tokens - 1` rows per request (a DSPARK
    draft worker's width), its tail the model runner's capture_tail_hooks at construction (what its capture records),
    run at each replay."""

    def __init__(self, model_runner, *, attn_backend=None, speculative_num_draft_tokens=None):
        self.width = speculative_num_draft_tokens - 1
        self.attn_backend = attn_backend
        self.capture_bs = [1, 2, 4, 8]  # (which batches replay: StandInProposer's graph_max_bs)
        self.hooks = list(model_runner.capture_tail_hooks)
        assert attn_backend is None or attn_backend.model_runner is model_runner

    def replay_tail(self, hidden, input_ids):
        for hook in self.hooks:
            hook(self, types.SimpleNamespace(hidden_states=hidden), types.SimpleNamespace(input_ids=input_ids),
                 hidden.shape[0])


def standin_proposer(world: StandIns, worker, graph_max_bs: int) -> None:
    """What DSparkWorkerV2.__init__ leaves for FLASHTREE_GRAPH_DRAWS on the stand-in draft: the proposer, the draft model
    runner (no graphs yet) and the target's embeddings."""
    worker._proposer = StandInProposer(world, worker, graph_max_bs)
    worker._draft_context = contextlib.nullcontext
    worker.draft_model_runner = types.SimpleNamespace(capture_tail_hooks=[], decode_cuda_graph_runner=None)
    worker.draft_model_runner.attn_backend = StandInAttnBackend(worker.draft_model_runner)
    embeds = lambda ids: ids  # noqa: E731  (the stand-in forward takes no embeddings)
    worker.target_worker = types.SimpleNamespace(
        model_runner=types.SimpleNamespace(model=types.SimpleNamespace(get_input_embeddings=lambda: embeds)))
    worker._proposer.draft_model.embed_tokens = embeds


def graph_sampler(worker, state, graph_max_bs: int) -> None:
    """What DSPARK's init_cuda_graphs does with FLASHTREE_GRAPH_DRAWS: the release's real DsparkDraftSampler, built and
    wrapped by graph_draws.build, as the draft graphs' tail (its capture hook), then the draft graphs' capture."""
    from draft_sampler_cpu import stock_sampler

    from flashtree.patches import graph_draws

    model = worker._proposer.draft_model
    worker._draft_sampler = graph_draws.build(state, worker, stock_sampler(model, gamma=GAMMA, max_bs=graph_max_bs))
    assert graph_draws.sampler_of(worker) is worker._draft_sampler
    dmr = worker.draft_model_runner
    dmr.capture_tail_hooks.append(lambda runner, out, fb, n: worker._draft_sampler(out.hidden_states, fb.input_ids))
    dmr.decode_cuda_graph_runner = StandInDraftGraphRunner(dmr, speculative_num_draft_tokens=GAMMA + 1)


def real_markov_head():
    from sglang.srt.models.dspark import VanillaMarkov  # 0.5.17/0.5.20: sample_block; 0.5.23: init_state/step_bias

    head = VanillaMarkov(vocab_size=V, markov_rank=4)
    torch.nn.init.zeros_(head.markov_w2.weight)  # no bigram bias: draws follow the base logits
    return head


def standin_worker(world: StandIns, page_size: int = 1, **attrs):
    """DSPARK's worker as the patched decode reads it: the stand-in target's KV pool and the real Markov head (plus
    `attrs`); standin_proposer adds the draft side for graph draws."""
    return types.SimpleNamespace(
        verify_num_draft_tokens=W, device="cpu",
        model_runner=types.SimpleNamespace(page_size=page_size, token_to_kv_pool=world),
        _proposer=types.SimpleNamespace(draft_model=types.SimpleNamespace(markov_head=real_markov_head())), **attrs)


@pytest.fixture(scope="module", autouse=True)
def tree_kernels():
    sglang_cpu.force_triton_tree_kernels()


def run(n: int, steps: int, prompts=None, sampling_info=None, page_size: int = 1, on_step=None, stage_times: int = 0,
        graph_max_bs: int | None = None, depth: int = 0, budget: int = 0, width: int = 0, capture_bs=None,
        reserve: int = 0, draft_rows: int = 0, simulate_acc_len: float = -1.0, simulate_acc: str = "",
        policy: str = "vote", fused: bool = False, refs=None, reqs=None, batch_extra=None):
    """Decode `steps` tree steps. Greedy rows (all rows without sampling_info, else rows with top_k == 1) are checked
    token for token against the stand-in target's sequential greedy decode; every row's commit is checked for the
    req_to_token / KV layout, the draft-context injection and the step's bookkeeping. Returns (accept-length
    histogram, tree state, generated tokens per request, world). graph_max_bs: FLASHTREE_GRAPH_DRAWS on, with draft
    graphs "captured" up to that batch size (the N draws come from the tail's buffer; eager above it). depth:
    FLASHTREE_TREE_DEPTH (0 = gamma). budget / width: FLASHTREE_TREE_BUDGET / FLASHTREE_TREE_WIDTH, with stand-in
    verify graph runners "captured" at the batch sizes capture_bs (verify_widths.capture, as after init_cuda_graphs).
    reserve > 0: as under overlap scheduling, the host has no seq_lens sum, only DSPARK's reserved KV lengths
    (seq_lens + reserve on each request's draft input). draft_rows: FLASHTREE_DRAFT_ROWS (with graph_max_bs: the
    D-row draft graphs captured as after init_cuda_graphs). simulate_acc_len / simulate_acc: SGLANG_SIMULATE_ACC_LEN as
    DSPARK read it / FLASHTREE_SIMULATE_ACC (then no row is checked against the greedy decode, only the layout).
    policy: FLASHTREE_TREE_POLICY. fused: FLASHTREE_FUSED_SAMPLER (the fused Markov draws' CPU reference).
    refs: each request's expected sequence (prompt, then the greedy decode) when it is not the stand-in target's plain
    greedy decode (sampling features); reqs: sglang Req objects for the batch (their req_pool_idx and first output
    token are set here); batch_extra: more ScheduleBatch fields of every step's batch (return_logprob, ...)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.dspark_components.dspark_draft import make_next_draft_input

    real = adapters.select_adapter()
    prompts = prompts or [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9]]
    bs = len(prompts)
    refs = refs or [reference(p, MAX_LEN - len(p) - 2 * W) for p in prompts]
    world = StandIns(prompts, refs, page_size)
    adapter = StandInAdapter(real, world)
    worker = standin_worker(world, page_size, _simulate_acc_len=simulate_acc_len)
    if reserve:  # the backend whose max_context_len caps the reserved-length bound
        worker.target_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(
            attn_backend=types.SimpleNamespace(max_context_len=MAX_LEN)))
    if graph_max_bs is not None:
        standin_proposer(world, worker, graph_max_bs)
    toggles = TreeToggles(tree_n=n, seed=5, stage_times=stage_times, graph_draws=graph_max_bs is not None,
                          tree_depth=depth, tree_budget=budget, tree_width=width, draft_rows=draft_rows,
                          simulate_acc=simulate_acc, tree_policy=policy, fused_sampler=fused)
    state = create_state(adapter, toggles, worker)
    if capture_bs is not None:
        from flashtree.patches import verify_widths

        worker.model_runner.attn_backend = StandInAttnBackend(worker.model_runner)
        worker.model_runner.decode_cuda_graph_runner = StandInGraphRunner(worker.model_runner, capture_bs=capture_bs)
        verify_widths.capture(state, worker)
    if graph_max_bs is not None:
        # The graph draws' noise comes from torch's default generator (FLASHTREE_SEED seeds the eager draws only).
        # Seeded so the greedy test's coverage holds: accepts at depth 4 are rare here (about 2 in 120 request-steps
        # with either draw path), seed 7 has them.
        torch.manual_seed(7)
        graph_sampler(worker, state, graph_max_bs)
        if state.draft_rows is not None:
            from flashtree.patches import draft_rows as rows_module

            rows_module.capture(state, worker)
    greedy_rows = [True] * bs if sampling_info is None else (sampling_info.top_ks <= 1).tolist()
    simulated = state.simulate is not None
    if simulated:
        greedy_rows = [False] * bs
    seq_lens = torch.tensor([len(p) for p in prompts])
    bonus = torch.tensor([r[len(p)] for r, p in zip(refs, prompts)])
    generated = [[int(bonus[b])] for b in range(bs)]
    for b, req in enumerate(reqs or []):
        req.req_pool_idx, req.output_ids = int(world.rows[b]), [int(bonus[b])]
    draft_input = make_next_draft_input(bonus_tokens=bonus, new_seq_lens=seq_lens)
    initial_table = world.req_to_token.clone()
    published, accepts = [], Counter()
    for _ in range(steps):
        if int(seq_lens.max()) + 2 * W >= MAX_LEN - 2 * W:
            break
        batch = types.SimpleNamespace(
            seq_lens=seq_lens.clone(),
            seq_lens_cpu=seq_lens.clone(),
            seq_lens_sum=int(seq_lens.sum()),
            req_pool_indices=world.rows.clone(),
            forward_mode=ForwardMode.DECODE,
            sampling_info=sampling_info,
            spec_info=draft_input,
            reqs=reqs,
            **{"return_logprob": False, "has_grammar": False, **(batch_extra or {})},
        )
        if reserve:
            reserved = seq_lens + reserve
            for lens, total in (("reserved_seq_lens_cpu", "reserved_seq_lens_sum"), ("nxt_kv_lens_cpu", "nxt_kv_lens_sum")):
                setattr(draft_input, lens, reserved)  # 0.5.17's names, then 0.5.20+'s
                setattr(draft_input, total, int(reserved.sum()))
            batch.seq_lens_cpu = batch.seq_lens_sum = None
        res = tree_step(state, worker, batch, published.append)
        commit = res.accept_lens.to(torch.int64)
        assert res.accept_lens.dtype == torch.int32 and res.next_token_ids.shape == (bs * W,)
        assert torch.equal(res.new_seq_lens, seq_lens + commit)
        assert torch.equal(published[-1], res.new_seq_lens)
        out = res.next_token_ids.view(bs, W)
        for b in range(bs):
            L, c = int(seq_lens[b]), int(commit[b])
            ctx = world.context(b, L + c)  # asserts positions 0 .. L + c - 1 hold sequential KV
            # req_to_token after commit: the prefix, the anchor and the accepted drafts, in order.
            assert ctx == prompts[b] + generated[b] + out[b, : c - 1].tolist()
            assert int(res.next_draft_input.bonus_tokens[b]) == int(out[b, c - 1])
            if greedy_rows[b]:
                # Committed tokens: the anchor's successors, exactly the target's sequential greedy decode.
                assert out[b, :c].tolist() == refs[b][L + 1 : L + 1 + c]
            # The draft context was injected for the committed tokens only, at their sequential positions.
            slots = world.req_to_token[world.rows[b], L : L + c]
            assert world.draft_kv[slots, 0].tolist() == list(range(L, L + c))
            assert world.draft_kv[slots, 1].tolist() == ctx[L : L + c]
            generated[b].extend(out[b, :c].tolist())
            accepts[c - 1] += 1
        if page_size > 1:
            # Paged KV: the table never changes; the accepted KV moved instead.
            assert torch.equal(world.req_to_token, initial_table)
        stats = res.logits_output.customized_info["flashtree"]
        drawn = state.plan.draws_for(bs)  # N, or fewer under a budget (the stand-in graphs run the tail at bs itself)
        if policy == "best-first":  # it draws no candidates
            assert [s[:2] for s in stats] == [[0, 0]] * bs and all(1 <= s[2] <= W - 1 for s in stats)
        else:
            assert [s[0] for s in stats] == [drawn] * bs
            assert all(1 <= s[1] <= drawn and 1 <= s[2] <= W - 1 for s in stats)
        assert [s[3] for s in stats] == (commit - 1).tolist()
        assert [s[4:] for s in stats] == [[state.widths_for(bs)[1], int(simulated), 0, 0]] * bs  # 0, 0: no planner
        if on_step is not None:
            on_step(res)
        seq_lens = res.new_seq_lens
        draft_input = res.next_draft_input
    return accepts, state, generated, world


GRAPH_MODES = pytest.mark.parametrize(
    "graph_max_bs", [None, 8, 2], ids=["eager-draws", "graph-draws", "graph-draws-above-captured-bs"]
)


def expected_draw_path(graph_max_bs, bs):
    return "graph" if graph_max_bs is not None and bs <= graph_max_bs else "eager"


@pytest.fixture(autouse=True)
def _cpu_torch_capture_query(monkeypatch):
    # DSPARK 0.5.23's sampler asks torch.cuda whether a capture is running; a CPU torch build raises there.
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)


@GRAPH_MODES
def test_tree_step_matches_sequential_greedy_decode(monkeypatch, graph_max_bs):
    """Drafts accepted deep, through non-first children, and rejected at every depth; every commit exact.
    (Seeded; seen on 0.5.20: accept lengths 0..5 -> 5, 34, 54, 18, 4, 5 request-steps over 40 steps.)"""
    import flashtree.patches.decode as decode

    seen = {"non_first_deep": 0}
    real_walk = decode.walk

    def walk(state, tree, logits, sampling_info, *commit_args, **step):
        result, plan, out = real_walk(state, tree, logits, sampling_info, *commit_args, **step)
        first_child, _ = child_links(tree)
        path = result.path
        for b in range(tree.batch_size):
            nodes = [int(x) for x in path[b] if x >= 0]
            through_other = any(first_child[b, p] != c for p, c in zip(nodes, nodes[1:]))
            if through_other and len(nodes) - 1 >= 2:
                seen["non_first_deep"] += 1
        return result, plan, out

    monkeypatch.setattr(decode, "walk", walk)
    accepts, state, _gen, _world = run(n=4, steps=40, graph_max_bs=graph_max_bs)
    assert state.draw_paths == {expected_draw_path(graph_max_bs, BS): state.steps}
    assert state.steps > 0
    assert all(accepts[d] > 0 for d in range(GAMMA)), f"not rejected at every depth: {sorted(accepts.items())}"
    assert sum(v for d, v in accepts.items() if d >= 2) > 0, sorted(accepts.items())
    assert seen["non_first_deep"] > 0, "no acceptance of depth >= 2 through a branch other than the first child"


@pytest.mark.parametrize("graph_max_bs", [8, 2], ids=["graph-draws", "graph-draws-above-captured-bs"])
def test_graph_draws_falling_back_to_eager_draws_say_so_once(caplog, graph_max_bs):
    """With FLASHTREE_GRAPH_DRAWS=1, tree steps whose draft forward ran eagerly (a batch above the captured draft
    graphs) draw their candidates eagerly: one warning with the reason, however many such steps (it said nothing)."""
    with caplog.at_level(logging.WARNING, logger="flashtree.patches"):
        _accepts, state, _gen, _world = run(n=4, steps=6, graph_max_bs=graph_max_bs)
    said = [r.getMessage() for r in caplog.records if "drawn eagerly" in r.getMessage()]
    if graph_max_bs >= BS:
        assert said == [] and state.draw_paths == {"graph": state.steps}
        return
    assert state.draw_paths == {"eager": state.steps} and state.steps > 1
    assert said == [
        f"flashtree: FLASHTREE_GRAPH_DRAWS=1, but a batch of {BS} requests ran its draft forward eagerly (no captured "
        "draft graph took it: above --cuda-graph-max-bs, or a batch sglang's graphs do not run), so its N candidates "
        "were drawn eagerly (logged once)"
    ]


def test_eager_draws_under_a_max_bs_name_the_limit(caplog):
    """A replayed graph captured without the draws (its size above FLASHTREE_TREE_MAX_BS's buffer) is the other
    reason, logged once too."""
    from flashtree.patches import graph_draws

    run_state = types.SimpleNamespace(eager_draws_logged=set())
    draws = types.SimpleNamespace(covers=lambda bs: False, max_bs=4)
    with caplog.at_level(logging.WARNING, logger="flashtree.patches"):
        for bs in (3, 4, 3):
            graph_draws.note_eager(run_state, draws, bs)
    assert [r.getMessage() for r in caplog.records] == [
        "flashtree: FLASHTREE_GRAPH_DRAWS=1, but the draft graph a batch of 3 requests replays was captured without "
        "the draws (its size is above the 4 requests FLASHTREE_TREE_MAX_BS sized the draw buffers to), so its N "
        "candidates were drawn eagerly (logged once)"
    ]


@GRAPH_MODES
def test_trees_wider_than_their_depth_fill_the_window(graph_max_bs):
    """FLASHTREE_TREE_DEPTH = 3 below gamma = 5: the candidates keep 3 draft positions, the trees fill DSPARK's whole
    window of W = 6 (5 nodes, wider than a depth-3 chain's 3), verify through its W reserved slots per request, and
    commit at most depth + 1 tokens per step, exactly the sequential greedy decode (run() checks every commit, the
    req_to_token layout and the draft context)."""
    depth = 3
    sizes = Counter()

    def on_step(res):
        sizes.update(row[2] for row in res.logits_output.customized_info["flashtree"])

    accepts, state, _gen, _world = run(n=4, steps=40, graph_max_bs=graph_max_bs, depth=depth, on_step=on_step)
    assert (state.plan.depth, state.plan.width) == (depth, W)
    if graph_max_bs is not None:
        assert state.graph_draws.out.shape[-1] == depth  # the tail draws only the positions the trees keep
    assert state.draw_paths == {expected_draw_path(graph_max_bs, BS): state.steps}
    assert max(accepts) == depth and all(accepts[d] > 0 for d in range(depth + 1)), sorted(accepts.items())
    assert max(sizes) == W - 1 > depth, sorted(sizes.items())


def test_the_verify_mask_is_sized_from_the_reserved_lengths(monkeypatch):
    """Without a host seq_lens sum (overlap scheduling) the step sizes its verify mask by DSPARK's reserved KV lengths,
    sum(reserved) - bs * W, capped at bs x the backend's max_context_len, instead of summing the device seq_lens (a
    host sync every step); the mask's blocks stay where the attention reads them, so every commit is still exactly
    the sequential greedy decode (run() checks it)."""
    import flashtree.patches.decode as decode

    bounds, real = [], decode.verify_inputs

    def verify_inputs(tree, anchor, seq_lens, seq_lens_sum, candidates, workspace=None):
        bounds.append((seq_lens_sum, int(seq_lens.sum())))
        return real(tree, anchor, seq_lens, seq_lens_sum, candidates, workspace)

    def no_sum(*args, **kwargs):
        raise AssertionError("the step summed the device seq_lens")

    monkeypatch.setattr(decode, "verify_inputs", verify_inputs)
    reserve = 2 * W + 3
    _accepts, state, _gen, _world = run(n=4, steps=20, reserve=reserve)
    assert state.steps > 0 and len(bounds) == state.steps
    assert all(bound == exact + BS * (reserve - W) for bound, exact in bounds), bounds[:3]

    worker = types.SimpleNamespace(target_worker=types.SimpleNamespace(model_runner=types.SimpleNamespace(
        attn_backend=types.SimpleNamespace(max_context_len=10))))
    draft = types.SimpleNamespace(reserved_seq_lens_cpu=torch.tensor([30, 40]), reserved_seq_lens_sum=70,
                                  nxt_kv_lens_cpu=torch.tensor([30, 40]), nxt_kv_lens_sum=70)
    adapter = adapters.select_adapter()
    assert adapter.prefix_sum_bound(worker, 2, draft, W) == 20  # 70 - 2 * W = 58, capped at 2 x 10
    worker.target_worker.model_runner.attn_backend = types.SimpleNamespace()
    assert adapter.prefix_sum_bound(worker, 2, draft, W) == 70 - 2 * W
    batch = types.SimpleNamespace(seq_lens=torch.tensor([5, 6]), spec_info=draft, seq_lens_sum=None)
    plan = dataclasses.replace(state.plan, adapter=adapter)
    monkeypatch.setattr(torch.Tensor, "sum", no_sum)  # the bound never reads the device lengths
    assert decode.mask_prefix_bound(plan, worker, batch) == 70 - 2 * W


def test_fused_walk_and_commit_kernel_in_the_tree_step(monkeypatch):
    """The CUDA path of the greedy walk: the fused walk + commit Triton kernel (Triton interpreter here) rewrites the
    stand-in server's real req_to_token layout and writes the step's outputs, its step-local ones in the run's
    workspace buffers (reused every other step), and every commit still equals the sequential greedy decode."""
    import flashtree.patches.decode as decode
    from flashtree.tree.triton_walk import walk_and_commit_triton

    launches = []

    def fused(tree, targets, req_to_token=None, rows=None, starts=None, seq_lens=None, **step):
        launches.append(req_to_token is not None and seq_lens is not None and step["workspace"] is not None)
        return walk_and_commit_triton(tree, targets, seq_lens, req_to_token, rows, starts, **step)

    monkeypatch.setattr(decode, "walk_and_commit", fused)
    accepts, state, _gen, _world = run(n=4, steps=12)
    assert launches == [True] * state.steps and state.steps > 0
    assert sum(v for d, v in accepts.items() if d >= 1) > 0, sorted(accepts.items())


def test_verify_inputs_kernel_in_the_tree_step(monkeypatch):
    """The CUDA path of the verify inputs: the one-launch Triton kernel (interpreter here) gives the target verify its
    ids, positions and FULL_MASK, and the statistics rows, in the run's workspace buffers (reused every other step);
    commits still equal the sequential greedy decode."""
    import flashtree.patches.decode as decode
    from flashtree.tree.triton_mask import verify_inputs_triton

    launches = []

    def kernel(tree, anchor, seq_lens, seq_lens_sum, candidates=None, workspace=None):
        launches.append(candidates is not None and workspace is not None)
        return verify_inputs_triton(tree, anchor, seq_lens, seq_lens_sum, candidates, workspace)

    monkeypatch.setattr(decode, "verify_inputs", kernel)
    accepts, state, _gen, _world = run(n=4, steps=10)
    assert launches == [True] * state.steps and state.steps > 0
    assert sum(v for d, v in accepts.items() if d >= 1) > 0, sorted(accepts.items())


def test_flashtree_walk_agrees_with_sglang_tree_walk():
    """flashtree's greedy walk and sglang's verify_tree_greedy_func (Triton) accept the same path on a vote tree."""
    from sglang.srt.speculative import eagle_utils

    from flashtree.tree import build_vote_tree, to_eagle, verify_greedy

    g = torch.Generator().manual_seed(3)
    cands = torch.randint(0, 3, (2, 6, GAMMA), generator=g)
    tree = build_vote_tree(cands, W)
    target = torch.randint(0, 3, (2, W), generator=g)
    mine = verify_greedy(tree, target)
    enc = to_eagle(tree)
    anchor = torch.tensor([7, 8])
    seq_lens = torch.tensor([4, 9])
    out = eagle_utils.build_tree_kernel_efficient(
        anchor, enc.parent_list, enc.top_scores_index, enc.draft_tokens, seq_lens, int(seq_lens.sum()),
        enc.topk, enc.spec_steps, enc.num_verify_tokens,
    )
    _mask, _pos, r_index, r_next, r_sib, flat = out
    accept_index = torch.full((2, GAMMA + 1), -1, dtype=torch.int32)
    accept_len = torch.zeros(2, dtype=torch.int32)
    predict = torch.zeros(2 * W, dtype=torch.int32)
    eagle_utils.verify_tree_greedy_func(
        predicts=predict, accept_index=accept_index, accept_token_num=accept_len,
        candidates=flat.view(2, W), retrieve_index=r_index, retrieve_next_token=r_next,
        retrieve_next_sibling=r_sib, target_predict=target,
    )
    assert accept_len.tolist() == mine.accept_len.tolist()
    for b in range(2):
        want = [b * W + int(x) for x in mine.path[b] if x >= 0]
        assert [int(x) for x in accept_index[b] if x >= 0] == want


@GRAPH_MODES
def test_n1_chain_equals_dspark_chain_accept(monkeypatch, graph_max_bs):
    """N = 1: the tree is the drafted chain, and each step commits what DSPARK's own chain accept commits."""
    import flashtree.patches.decode as decode
    from sglang.srt.speculative.dspark_components.dspark_verify import accept_draft_tokens

    checked = []
    real_walk = decode.walk

    def walk(state, tree, logits, sampling_info, *commit_args, **step):
        result, plan, out = real_walk(state, tree, logits, sampling_info, *commit_args, **step)
        bs = tree.batch_size
        assert torch.equal(tree.parents, torch.arange(W - 1).expand(bs, W - 1)), "N = 1 must give the chain"
        anchor = torch.zeros(bs, 1, dtype=torch.int64)  # the anchor is not compared by the chain accept
        block = types.SimpleNamespace(
            draft_tokens=tree.tokens, corrected_logits=None,
            greedy_mask=torch.ones(bs, dtype=torch.bool), temperatures=torch.ones(bs),
        )
        correct_len, bonus, _cap = accept_draft_tokens(
            candidates=torch.cat([anchor, tree.tokens], dim=1), target_logits=logits.view(bs * W, V),
            draft_block=block, sampling_info=None, draft_input=None, gamma=GAMMA, verify_num_draft_tokens=W,
        )
        assert correct_len.tolist() == result.accept_len.tolist()
        assert bonus.tolist() == result.bonus.tolist()
        checked.append(bs)
        return result, plan, out

    monkeypatch.setattr(decode, "walk", walk)
    accepts, state, _gen, _world = run(n=1, steps=12, graph_max_bs=graph_max_bs)
    assert state.draw_paths == {expected_draw_path(graph_max_bs, BS): state.steps}
    assert len(checked) == state.steps > 0
    assert sum(accepts.values()) == BS * state.steps


@pytest.mark.parametrize("graph_max_bs", [None, 8], ids=["eager-draws", "graph-draws"])
def test_paged_kv_commit_copies_accepted_kv(graph_max_bs):
    """Page size 4: req_to_token stays as allocated (paged layout intact); the accepted nodes' KV is copied to the
    window's first offsets through the pool's move_kv_cache; commits still equal the sequential greedy decode."""
    accepts, state, _gen, world = run(n=4, steps=25, page_size=4, graph_max_bs=graph_max_bs)
    assert state.draw_paths == {expected_draw_path(graph_max_bs, BS): state.steps}
    assert state.plan.page_size == 4 and world.moves == state.steps * GAMMA  # one move_kv_cache call per depth per step
    assert sum(v for d, v in accepts.items() if d >= 2) > 0, sorted(accepts.items())


def test_paged_kv_needs_a_pool_that_moves_kv():
    from flashtree.patches.startup import make_init_cuda_graphs

    worker = types.SimpleNamespace(
        verify_num_draft_tokens=W, device="cpu",
        model_runner=types.SimpleNamespace(page_size=16, token_to_kv_pool=object()),
    )
    worker._flashtree = create_state(adapters.select_adapter(), TreeToggles(tree_n=4), worker)
    with pytest.raises(SystemExit, match=r"with --page-size 16 the tree path commits by copying the accepted KV, but the target KV pool \(object\) has no move_kv_cache"):
        make_init_cuda_graphs(lambda self: None, narrow=False)(worker)  # checked once sglang has the pools


def test_budget_narrows_trees_per_batch_size():
    worker = types.SimpleNamespace(
        verify_num_draft_tokens=W, device="cpu", model_runner=types.SimpleNamespace(page_size=1, token_to_kv_pool=None),
    )
    state = create_state(adapters.select_adapter(), TreeToggles(tree_n=4, tree_budget=8), worker)
    assert [state.plan.width_for(bs) for bs in (1, 2, 3, 4, 8, 32)] == [W, 4, 2, 2, 2, 2]
    # The candidates scale with the tree: ceil(N * w / W) of N = 4 over W = 6.
    assert [state.plan.draws_for(bs) for bs in (1, 2, 3, 32)] == [4, 3, 2, 2]
    # Without narrower verify graphs the trees are padded to DSPARK's window.
    assert [state.widths_for(bs) for bs in (1, 3)] == [(W, W), (2, W)]
    assert create_state(adapters.select_adapter(), TreeToggles(tree_n=4), worker).plan.width_for(32) == W


@pytest.mark.parametrize(
    "budget, width, capture_bs, widths, verify_w",
    [(12, 0, [1, 2, 3, 4], [3, 4], 4), (10, 0, [1, 2, 4], [2, 5], 5), (0, 4, [1, 2, 4], [4], 4)],
    ids=["a-graph-at-the-budget-width", "the-next-wider-graph", "fixed-width"],
)
def test_narrow_trees_verify_at_a_narrower_captured_width(budget, width, capture_bs, widths, verify_w):
    """FLASHTREE_TREE_BUDGET (or a fixed FLASHTREE_TREE_WIDTH below the window) with verify graphs captured at the
    trees' widths (verify_widths.capture after init_cuda_graphs): a batch of 3 requests builds its tree at the smallest
    captured width >= budget // 3 (or the fixed width), verifies the first slots of DSPARK's window with that width's
    graph runner swapped in (the stand-in verify asserts it), and every commit is still exactly the sequential greedy
    decode (run() checks layout, KV and draft context too)."""
    sizes = Counter()

    def on_step(res):
        sizes.update(row[2] for row in res.logits_output.customized_info["flashtree"])

    accepts, state, _gen, world = run(n=4, steps=30, budget=budget, width=width, capture_bs=capture_bs, on_step=on_step)
    assert sorted(state.verify_runners) == widths and state.widths_for(BS) == (verify_w, verify_w)
    assert all(r.width == w and r.capture_bs == capture_bs for w, r in state.verify_runners.items())
    assert max(sizes) == verify_w - 1 and max(accepts) >= 2, (sorted(sizes.items()), sorted(accepts.items()))


class FailingCapture(StandInGraphRunner):
    """A graph runner whose capture at another width fails, as an out-of-memory capture does on a GPU."""

    def __init__(self, model_runner, *, attn_backend=None, speculative_num_draft_tokens=None, capture_bs=None):
        if attn_backend is not None:
            raise RuntimeError("CUDA out of memory")
        super().__init__(model_runner, capture_bs=capture_bs)


@pytest.mark.parametrize("budget, width, named", [
    (8, 0, r"FLASHTREE_TREE_BUDGET=8 needs target verify CUDA graphs at width 2, .*unset FLASHTREE_TREE_BUDGET \("),
    (0, 4, r"FLASHTREE_TREE_WIDTH=4 needs target verify CUDA graphs at width 4, .*unset FLASHTREE_TREE_WIDTH \("),
    (8, 4, "FLASHTREE_TREE_WIDTH=4 with FLASHTREE_TREE_BUDGET=8 needs .*unset FLASHTREE_TREE_WIDTH and "
           "FLASHTREE_TREE_BUDGET"),
], ids=["budget", "width", "both"])
def test_a_failed_narrow_verify_capture_stops_the_server(budget, width, named):
    """The narrower verify graphs exist only because a toggle asked for them: a capture that fails stops the server
    with one message naming the toggle, the error and what to do (it was a warning, and a server without them)."""
    from flashtree.patches import verify_widths

    worker = types.SimpleNamespace(
        verify_num_draft_tokens=W, device="cpu", model_runner=types.SimpleNamespace(page_size=1, token_to_kv_pool=None),
    )
    state = create_state(adapters.select_adapter(), TreeToggles(tree_n=4, tree_budget=budget, tree_width=width), worker)
    worker.model_runner.attn_backend = StandInAttnBackend(worker.model_runner)
    worker.model_runner.decode_cuda_graph_runner = FailingCapture(worker.model_runner, capture_bs=[1, 2, 4])
    with pytest.raises(SystemExit) as exc:
        verify_widths.capture(state, worker)
    assert re.search(named, str(exc.value)) and "failed (RuntimeError: CUDA out of memory)" in str(exc.value)
    assert "--cuda-graph-max-bs" in str(exc.value)


def test_budget_draws_fewer_candidates_in_the_draft_graph_tail():
    """FLASHTREE_TREE_BUDGET with graph draws: the draft graph's tail at 3 requests draws ceil(N * w / W) = 4 of N = 5
    candidates per request (w = 12 // 3 = 4, W = 6), the step builds its 4-token trees from those 4 and verifies them
    at the captured width 4; every commit is still exactly the sequential greedy decode (run() checks it, and that
    each step's statistics row counts the 4 candidates)."""
    accepts, state, _gen, _world = run(n=5, steps=30, budget=12, capture_bs=[1, 2, 3, 4], graph_max_bs=8)
    draws = state.graph_draws
    assert state.plan.draws_for(BS) == 4 and draws.drawn_sizes == {BS: 4} and draws.read(BS).shape == (BS, 4, GAMMA)
    assert state.draw_paths == {"graph": state.steps} and state.steps > 0 and max(accepts) >= 2


def chi2_critical_001(dof: int) -> float:
    """Chi-square critical value at p = 0.001 (Wilson-Hilferty; within 1% of the table for dof >= 3)."""
    z = 3.0902
    return dof * (1 - 2 / (9 * dof) + z * (2 / (9 * dof)) ** 0.5) ** 3


def sampled_two_steps(monkeypatch, graph_max_bs, policy: str = "vote", wrong_walk=None):
    """Two tree steps of a mixed batch: temperature 0.7 rows (N = 4) served by the target-only walk, top_k = 1 rows
    (run() checks them against the greedy decode). Each step's walk equals flashtree.tree.verify_sampled on the same
    draws with the per-row settings taken from sglang's sampling info (greedy rows at temperature 0). Returns
    (chi-square of the sampled rows' first two tokens against the target's exact two-step distribution, its
    p = 0.001 critical value, tokens outside the target's support, the first tokens drawn, the target's greedy token
    there). wrong_walk: a deliberately wrong walk in place of the real one (the negative control)."""
    import flashtree.patches.decode as decode
    from flashtree.tree import verify_sampled

    prompt = [4, 4, 2, 7]
    bs, temp = 1600, 0.7
    greedy = torch.arange(bs) % 8 == 0
    sampling_info = types.SimpleNamespace(
        is_all_greedy=False,
        temperatures=torch.where(greedy, 1.0, temp).view(-1, 1),
        top_ks=torch.where(greedy, 1, 1 << 30).to(torch.int32),
        top_ps=torch.ones(bs),
    )
    real_walk = decode.walk
    replayed = []

    def walk(state, tree, logits, info, *commit_args, **step):
        before = state.generator.get_state()
        result, plan, out = real_walk(state, tree, logits, info, *commit_args, **step)
        replay = torch.Generator().set_state(before)
        want = verify_sampled(
            tree, logits.view(bs, W, V), torch.where(greedy, 0.0, temp), generator=replay, top_k=torch.zeros(bs, dtype=torch.long)
        )
        assert torch.equal(want.tokens, result.tokens) and torch.equal(want.accept_len, result.accept_len)
        replayed.append(True)
        return result, plan, out

    monkeypatch.setattr(decode, "walk", wrong_walk or walk)
    accepts, state, generated, _world = run(n=4, steps=2, prompts=[prompt] * bs, sampling_info=sampling_info,
                                            graph_max_bs=graph_max_bs, policy=policy)
    assert state.draw_paths == {expected_draw_path(graph_max_bs, bs): state.steps} and state.steps == 2
    assert wrong_walk is not None or len(replayed) == state.steps
    sampled_rows = [b for b in range(bs) if not greedy[b]]
    assert sum(v for d, v in accepts.items() if d >= 2) > 0, "no sampled step accepted two drafts"

    # The exact two-step distribution of the stand-in target after prompt + anchor, at temperature 0.7.
    anchor = generated[0][0]
    ctx = prompt + [anchor]
    p1 = (target_logits(ctx) / temp).softmax(-1)
    cells, expected = [], []
    for t1 in p1.nonzero().flatten().tolist():
        if p1[t1] < 1e-6:
            continue
        p2 = (target_logits(ctx + [t1]) / temp).softmax(-1)
        for t2 in p2.nonzero().flatten().tolist():
            if p2[t2] >= 1e-6:
                cells.append((t1, t2))
                expected.append(float(p1[t1] * p2[t2]))
    counts = Counter((generated[b][1], generated[b][2]) for b in sampled_rows)
    n = len(sampled_rows)
    stat = sum((counts.get(c, 0) - n * e) ** 2 / (n * e) for c, e in zip(cells, expected))
    outside = set(counts) - set(cells)
    return stat, chi2_critical_001(len(cells) - 1), outside, {t1 for (t1, _t2) in counts}, target_next(ctx)


@pytest.mark.parametrize("graph_max_bs", [None, 2048], ids=["eager-draws", "graph-draws"])
def test_sampled_walk_is_lossless_in_a_mixed_batch(monkeypatch, graph_max_bs):
    """The first two sampled tokens after the anchor follow the target's own two-step distribution (chi-square,
    seeded; sampled_two_steps), greedy rows of the same batch the greedy decode."""
    stat, critical, outside, firsts, top = sampled_two_steps(monkeypatch, graph_max_bs)
    assert not outside, f"tokens outside the target's support: {outside}"
    assert stat < critical, f"chi-square {stat:.1f} above {critical:.1f}"
    # And the walk did not just copy the draft: tokens the draft never favours (offset 11) were sampled too.
    assert (top + 11) % V in firsts


@pytest.mark.parametrize("policy,graph_max_bs", [("prob", None), ("prob", 2048), ("best-first", None)])
def test_sampled_walk_is_lossless_under_each_policy(monkeypatch, policy, graph_max_bs):
    """prob's and best-first's trees, sampled: the same chi-square as trie-vote's (the target-only walk is exact for
    any tree the policy keeps; best-first's tail grows the eager trees, test_policies_commit_...)."""
    stat, critical, outside, _firsts, _top = sampled_two_steps(monkeypatch, graph_max_bs, policy)
    assert not outside and stat < critical, f"chi-square {stat:.1f} above {critical:.1f}, outside {outside}"


@pytest.mark.parametrize("policy", ["prob"])
def test_sampled_chi_square_fails_a_walk_that_favours_the_tree(monkeypatch, policy):
    """The negative control: a walk that accepts the root's first child whenever the target's own draw there
    would not (its draw replaced by the child's token, as a verifier biased to the draft would) fails the test."""
    import flashtree.patches.decode as decode

    real_walk = decode.walk

    def biased(state, tree, logits, info, *commit_args, **step):
        logits = logits.clone().view(tree.batch_size, tree.width, -1)
        logits[torch.arange(tree.batch_size), 0, tree.tokens[:, 0]] += 3.0  # the root favours node 1's token
        return real_walk(state, tree, logits.view(-1, logits.shape[-1]), info, *commit_args, **step)

    stat, critical, outside, _firsts, _top = sampled_two_steps(monkeypatch, None, policy, wrong_walk=biased)
    assert outside or stat > critical, f"the biased walk passed: chi-square {stat:.1f} <= {critical:.1f}"


def test_n1_sampled_batches_keep_dspark_chain_sampling():
    """FLASHTREE_TREE_N=1: sampled batches go to DSPARK's own decode (chain rejection sampling with the draft's
    probabilities); greedy batches take the tree step."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    import flashtree.patches.decode as decode

    calls = []
    original = lambda self, batch, on_publish, *a, **k: calls.append("dspark") or "dspark-result"  # noqa: E731
    adapter = adapters.select_adapter()
    fwd = decode.make_forward_decode(original, adapter, TreeToggles(tree_n=1))
    worker = types.SimpleNamespace(
        verify_num_draft_tokens=W, device="cpu", model_runner=types.SimpleNamespace(page_size=1),
        target_worker=types.SimpleNamespace(model_runner=types.SimpleNamespace(attn_backend=object())),  # no mask buffer
    )
    worker._flashtree = create_state(adapter, TreeToggles(tree_n=1), worker)

    def batch(all_greedy):
        info = types.SimpleNamespace(is_all_greedy=all_greedy)
        return types.SimpleNamespace(forward_mode=ForwardMode.DECODE, sampling_info=info, has_grammar=False, return_logprob=False)

    assert fwd(worker, batch(False), None) == "dspark-result" and calls == ["dspark"]
    assert worker._flashtree.fallbacks == {"sampled-n1": 1}
    assert skip_reason(worker._flashtree.plan, batch(True)) is None
    plan = dataclasses.replace(worker._flashtree.plan, toggles=TreeToggles(tree_n=4))
    assert skip_reason(plan, batch(False)) is None


def test_stage_times_cover_every_stage_of_each_step(caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="flashtree.patches"):
        _, state, generated, _ = run(4, 6, stage_times=3)
    timer = state.timer
    assert timer.steps == state.steps == 6 and timer.batch_rows == 6 * 3
    assert list(timer.totals_ms) == ["draft", "draws", "build", "verify", "walk", "commit", "output"]
    assert tuple(timer.totals_ms) == STAGES  # the engine's stage names
    assert all(ms >= 0 for ms in timer.totals_ms.values()) and sum(timer.totals_ms.values()) > 0
    lines = [r.getMessage() for r in caplog.records if "stage times" in r.getMessage()]
    assert len(lines) == 2 and "mean over steps 4-6" in lines[-1] and "verify" in lines[-1]
    assert lines[-1].endswith("; draws ran: eager 3")
    # host time per step >= the stages' wall time on CPU; the gaps between consecutive steps are measured (>= 0),
    # median <= max and mean <= max
    m = re.search(r"total ([\d.]+); host ([\d.]+); between steps \(median / mean / max\) ([\d.]+) / ([\d.]+) / "
                  r"([\d.]+);", lines[-1])
    assert m and float(m.group(2)) >= float(m.group(1))
    median, mean, longest = (float(m.group(i)) for i in (3, 4, 5))
    assert 0 <= median <= longest and 0 <= mean <= longest


@pytest.mark.parametrize("fused", [False, True])
def test_candidate_zero_is_the_greedy_block(fused):
    """The N draws: row 0 of each request is the draft's greedy block (DSPARK's chain), the others are samples; with
    FLASHTREE_FUSED_SAMPLER's noise state, through the fused Markov draws (their CPU reference here)."""
    import flashtree.patches.decode as decode
    from flashtree.patches.state import TreePlan, TreeRun
    from flashtree.sampler.markov import new_state
    from flashtree.sampler.reference import sample_rows

    def tree_run(toggles, sampler, noise):
        plan = TreePlan(adapter=adapters.select_adapter(), toggles=toggles, gamma=GAMMA, depth=GAMMA, width=W,
                        page_size=1, tree_width=W, policy="vote", sampler=sampler, forward_rows=GAMMA)
        return TreeRun(plan=plan, generator=torch.Generator().manual_seed(1), noise=noise)

    head = real_markov_head()
    torch.nn.init.normal_(head.markov_w2.weight, std=0.5)  # a real bigram bias: greedy depends on the previous token
    bs, n = 3, 6
    base = torch.randn(bs, GAMMA, V) * 2
    anchor = torch.randint(0, V, (bs,))
    state = tree_run(TreeToggles(tree_n=n, draft_temperature=1.0), sample_rows, new_state(1, "cpu") if fused else None)
    worker = types.SimpleNamespace(_proposer=types.SimpleNamespace(draft_model=types.SimpleNamespace(markov_head=head)))
    cands = decode.draw_candidates(state, worker, base, anchor, None, n)
    assert int(state.noise[1]) == 1 if fused else state.noise is None  # the fused draws ran (or did not)
    assert cands.shape == (bs, n, GAMMA)
    greedy_state = tree_run(TreeToggles(tree_n=1, draft_temperature=1.0),
                            lambda logits, temps, generator=None: logits.argmax(dim=-1), None)
    greedy = decode.draw_candidates(greedy_state, worker, base, anchor, None, 1)
    assert torch.equal(cands[:, 0], greedy[:, 0])
    assert (cands[:, 1:] != cands[:, :1]).any(dim=-1).any()  # the draws are not all the greedy block


# ---- FLASHTREE_TREE_MAX_BS: batches above the limit run DSPARK's own chain step ---------------------------------
class ChainStep:
    """Stand-in for DSPARK's own `_forward_decode` (the original the patch falls back to), keeping what it leaves
    behind (sglang 0.5.17 / 0.5.20 / 0.5.23): the verify window req_to_token[req, L : L + W] used in place (DSPARK
    never rewrites req_to_token), the draft's greedy block (after a draft graph replay: DSPARK's own folded sampler
    output, `out`), a causal chain verify over [anchor, block], sglang's real chain accept (`accept_draft_tokens`),
    target KV and the draft context committed in place, and `make_next_draft_input(bonus, new_seq_lens)`."""

    def __init__(self, adapter: StandInAdapter):
        self.adapter = adapter
        self.calls: list[int] = []  # batch sizes
        self.graph_blocks = 0  # blocks taken from DSPARK's own graph-folded sampler

    def __call__(self, worker, batch, on_publish, *args, **kwargs):
        from sglang.srt.speculative.dspark_components.dspark_verify import accept_draft_tokens

        adapter, world = self.adapter, self.adapter.world
        bs = len(batch.seq_lens)
        self.calls.append(bs)
        draft_input = batch.spec_info
        window = adapter.alloc_window(worker, batch, bs, draft_input)
        anchor = draft_input.bonus_tokens.view(-1)
        head = worker._proposer.draft_model.markov_head
        base = standin_base_logits(world, batch, anchor, bs)
        greedy = adapter.real.markov_draws(head, base, anchor, None, 1, lambda logits: logits.argmax(-1))[:, 0]
        block = greedy
        sampler = getattr(worker, "_draft_sampler", None)
        if sampler is not None:  # DSPARK's propose: a draft graph replay runs the captured tail (flashtree's sampler)
            fwd = worker._proposer._run_forward(batch=batch, draft_input=draft_input, bs=bs, draft_sampler=sampler,
                                                sampling_info=batch.sampling_info)
            if fwd.can_run_graph:
                block = sampler.out[: bs * GAMMA].view(bs, GAMMA).clone()
                assert torch.equal(block, greedy), "DSPARK's own tail did not run in the replay"
                self.graph_blocks += 1
        ids = torch.cat([anchor.view(bs, 1), block], dim=1)
        # DSPARK's chain verify passes no mask: a replayed graph reads the buffer flashtree staged (stage_chain_mask)
        verified = adapter.target_verify(worker, batch, draft_input, window, ids, window.positions_2d, None)
        draft_block = types.SimpleNamespace(draft_tokens=block, corrected_logits=None,
                                            greedy_mask=torch.ones(bs, dtype=torch.bool), temperatures=torch.ones(bs))
        correct_len, bonus, _cap = accept_draft_tokens(
            candidates=ids, target_logits=verified.logits, draft_block=draft_block, sampling_info=None,
            draft_input=None, gamma=GAMMA, verify_num_draft_tokens=W,
        )
        commit = (correct_len + 1).to(torch.int32)
        out = torch.zeros((bs, W), dtype=torch.int64)
        for b in range(bs):
            c = int(commit[b])
            out[b, : c - 1] = block[b, : c - 1]
            out[b, c - 1] = bonus[b]
        adapter.inject_committed(worker, batch, verified.hidden, window.cache_loc_2d, window.positions_2d, commit)
        new_seq_lens = batch.seq_lens + commit.to(batch.seq_lens.dtype)
        if on_publish is not None:
            on_publish(new_seq_lens)
        return adapter.batch_result(
            logits_output=verified.logits_output, next_token_ids=out.reshape(-1), accept_lens=commit,
            block_accept_lens=commit, can_run_cuda_graph=False,
            next_draft_input=adapter.make_next_draft_input(bonus.to(torch.int64), new_seq_lens),
            speculative_num_draft_tokens=W, new_seq_lens=new_seq_lens,
        )


def decode_batch(world, idx, seq, bonus, sampling_info=None):
    """A DSPARK decode batch of the requests `idx` (lengths `seq`, next bonus tokens `bonus`) over the stand-ins."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.dspark_components.dspark_draft import make_next_draft_input

    seq_lens = torch.tensor([seq[i] for i in idx])
    return types.SimpleNamespace(
        seq_lens=seq_lens.clone(), seq_lens_cpu=seq_lens.clone(), seq_lens_sum=int(seq_lens.sum()),
        req_pool_indices=world.rows[idx].clone(), forward_mode=ForwardMode.DECODE, sampling_info=sampling_info,
        spec_info=make_next_draft_input(bonus_tokens=torch.tensor([bonus[i] for i in idx]), new_seq_lens=seq_lens),
        has_grammar=False, return_logprob=False,
    )


def run_routed(limit: int, schedule: list[list[int]], steps: int, graph_max_bs: int | None = None):
    """Decode with the patched `_forward_decode` (FLASHTREE_TREE_MAX_BS = limit, N = 4) over DSPARK's stand-in chain
    step, each step on the subset of the requests `schedule` names (cycled; any order), as sglang's scheduler forms
    batches when requests arrive, finish or are retracted: every request carries its own seq_len and next draft
    input (its bonus token) from whichever step served it last. Every commit is checked against the stand-in target's
    sequential greedy decode and the sequential req_to_token / KV / draft-context layout. Returns (paths per step,
    accept lengths per path, tree state, chain stand-in)."""

    import flashtree.patches.decode as decode

    prompts = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9]]
    refs = [reference(p, MAX_LEN - len(p) - 2 * W) for p in prompts]
    world = StandIns(prompts, refs)
    adapter = StandInAdapter(adapters.select_adapter(), world)
    worker = standin_worker(world)
    if graph_max_bs is not None:
        standin_proposer(world, worker, graph_max_bs)
    toggles = TreeToggles(tree_n=4, seed=5, tree_max_bs=limit, graph_draws=graph_max_bs is not None)
    worker._flashtree = state = create_state(adapter, toggles, worker)
    if graph_max_bs is not None:
        torch.manual_seed(7)
        graph_sampler(worker, state, graph_max_bs)
    chain = ChainStep(adapter)
    forward = decode.make_forward_decode(chain, adapter, toggles)

    seq = [len(p) for p in prompts]
    bonus = [refs[i][len(p)] for i, p in enumerate(prompts)]
    generated = [[bonus[i]] for i in range(len(prompts))]
    paths, accepts = [], {"tree": Counter(), "chain": Counter()}
    for step in range(steps):
        idx = schedule[step % len(schedule)]
        if max(seq) + 2 * W >= MAX_LEN - 2 * W:
            break
        seq_lens = torch.tensor([seq[i] for i in idx])
        batch = decode_batch(world, idx, seq, bonus)
        tree_steps, published = state.steps, []
        res = forward(worker, batch, published.append)
        path = "tree" if state.steps == tree_steps + 1 else "chain"
        paths.append(path)
        commit = res.accept_lens.to(torch.int64)
        assert torch.equal(res.new_seq_lens, seq_lens + commit) and torch.equal(published[-1], res.new_seq_lens)
        out = res.next_token_ids.view(len(idx), W)
        for j, i in enumerate(idx):
            L, c = seq[i], int(commit[j])
            ctx = world.context(i, L + c)  # positions 0 .. L + c - 1 hold sequential KV through req_to_token
            assert ctx == prompts[i] + generated[i] + out[j, : c - 1].tolist()
            assert out[j, :c].tolist() == refs[i][L + 1 : L + 1 + c], f"step {step} ({path}) request {i}"
            slots = world.req_to_token[world.rows[i], L : L + c]
            assert world.draft_kv[slots, 0].tolist() == list(range(L, L + c))
            assert world.draft_kv[slots, 1].tolist() == ctx[L : L + c]
            assert int(res.next_draft_input.bonus_tokens[j]) == int(out[j, c - 1])
            assert int(res.next_draft_input.new_seq_lens[j]) == L + c
            seq[i], bonus[i] = L + c, int(res.next_draft_input.bonus_tokens[j])
            generated[i].extend(out[j, :c].tolist())
            accepts[path][c - 1] += 1
    return paths, accepts, state, chain


def test_max_bs_skip_reason():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    import flashtree.patches.decode as decode

    worker = types.SimpleNamespace(verify_num_draft_tokens=W, device="cpu", model_runner=types.SimpleNamespace(page_size=1))
    state = create_state(adapters.select_adapter(), TreeToggles(tree_n=4, tree_max_bs=2), worker)

    def batch(bs, mode=ForwardMode.DECODE):
        return types.SimpleNamespace(forward_mode=mode, seq_lens=torch.zeros(bs, dtype=torch.int64), sampling_info=None,
                                     has_grammar=False, return_logprob=False)

    assert [skip_reason(state.plan, batch(bs)) for bs in (1, 2, 3, 64)] == [None, None, "batch-size", "batch-size"]
    assert skip_reason(state.plan, batch(5, ForwardMode.IDLE)) == "idle"  # idle keeps its own reason
    plan = dataclasses.replace(state.plan, toggles=TreeToggles(tree_n=4))  # 0 = no limit
    assert skip_reason(plan, batch(4096)) is None


@pytest.mark.parametrize("graph_max_bs", [None, 8], ids=["eager-draws", "graph-draws"])
def test_max_bs_below_the_batch_runs_dspark_chain_every_step(graph_max_bs):
    """FLASHTREE_TREE_MAX_BS=2 with 3 running requests: every step is DSPARK's own (counted as "batch-size"), the tree
    step never runs, and the commits are the greedy decode. With graph draws the draw buffers hold 2 requests and the
    tail of the 3-request replays runs DSPARK's part only (its greedy block feeds the chain step)."""
    paths, accepts, state, chain = run_routed(2, [[0, 1, 2]], 10, graph_max_bs=graph_max_bs)
    assert paths == ["chain"] * 10 and chain.calls == [3] * 10
    assert state.fallbacks == {"batch-size": 10} and state.steps == 0 and state.draw_paths == {}
    assert sum(v for d, v in accepts["chain"].items() if d >= 1) > 0, accepts
    if graph_max_bs is not None:
        draws = state.graph_draws
        assert draws.out.shape[0] == 2 and draws.skipped_sizes == {3} and draws.skips == 10 and draws.calls == 0
        assert chain.graph_blocks == 10


@pytest.mark.parametrize("graph_max_bs", [None, 8], ids=["eager-draws", "graph-draws"])
def test_max_bs_crossed_both_paths_commit_the_greedy_decode(graph_max_bs):
    """FLASHTREE_TREE_MAX_BS=2 while the batch goes 3, 2, 1, 3, 2, 1, 3, 2 requests (subsets in changing order):
    3-request batches run DSPARK's chain step, smaller ones the tree step; each request moves between the two many
    times and every commit of either path is the stand-in target's sequential greedy decode, over the layout the other
    path left (req_to_token, KV, draft context, next draft input)."""
    schedule = [[0, 1, 2], [2, 0], [1], [0, 1, 2], [1, 2], [0], [2, 1, 0], [0, 1]]
    paths, accepts, state, chain = run_routed(2, schedule, 24, graph_max_bs=graph_max_bs)
    want = ["chain" if len(schedule[s % len(schedule)]) > 2 else "tree" for s in range(len(paths))]
    assert len(paths) == 24 and paths == want
    assert state.fallbacks == {"batch-size": want.count("chain")} and chain.calls == [3] * want.count("chain")
    assert state.steps == want.count("tree") > 0
    # Neither path is degenerate: both accept drafts, the tree also at depth >= 2.
    assert sum(v for d, v in accepts["chain"].items() if d >= 1) > 0, accepts
    assert sum(v for d, v in accepts["tree"].items() if d >= 2) > 0, accepts
    if graph_max_bs is None:
        assert state.draw_paths == {"eager": state.steps}
    else:  # buffers for 2 requests: the tree steps' replays drew, the chain steps' replays (3) did not
        draws = state.graph_draws
        assert state.draw_paths == {"graph": state.steps} and draws.out.shape[0] == 2
        assert set(draws.drawn_sizes) == {1, 2} and draws.skipped_sizes == {3}
        assert draws.calls == state.steps and draws.skips == want.count("chain") == chain.graph_blocks


def test_warmup_covers_every_tree_shape_a_batch_takes(monkeypatch):
    """FLASHTREE_TREE_BUDGET with graph draws and narrower verify graphs: steps over 1 to 4 requests build, encode and
    walk trees of the (candidates, tree width, verify width) the server-start warm-up lists for their batch size, and
    the warm-up's dummy inputs run through the Triton kernels (interpreter here) of every shape it lists."""
    import flashtree.patches.decode as decode
    from flashtree.patches import warmup
    from flashtree.tree.triton_build import build_vote_tree_triton
    from flashtree.tree.triton_mask import verify_inputs_triton
    from flashtree.tree.triton_walk import walk_and_commit_triton

    used = []
    build, encode = decode.build_tree, decode.verify_inputs
    monkeypatch.setattr(decode, "build_tree", lambda c, width, policy, scores: used.append([c.shape[1], width])
                        or build(c, width, policy, scores))
    monkeypatch.setattr(decode, "verify_inputs", lambda tree, *a, **kw: used[-1].append(tree.width)
                        or encode(tree, *a, **kw))
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9], [2, 7, 1, 8]]
    listed = set()
    for bs in range(1, 5):
        used.clear()
        _accepts, state, _gen, _world = run(n=5, steps=4, budget=12, capture_bs=[1, 2, 4], graph_max_bs=4,
                                            prompts=prompts[:bs])
        assert {tuple(u) for u in used} == {warmup.step_shape(state, bs, graph_bs=4)}, bs
        listed.add(warmup.step_shape(state, bs, graph_bs=4))
        assert warmup.step_shape(state, bs, graph_bs=4) in warmup.shapes(state, max_bs=4, graph_bs=4)
    assert len(listed) >= 3  # the budget gives several shapes over 1-4 requests

    calls = []
    monkeypatch.setattr(warmup, "build_tree", lambda c, w, policy, scores: calls.append((c.shape[1], w))
                        or build_vote_tree_triton(c, w))
    monkeypatch.setattr(warmup, "verify_inputs", verify_inputs_triton)
    monkeypatch.setattr(warmup, "walk_and_commit", lambda tree, targets, table, rows, starts, seq_lens, **step:
                        walk_and_commit_triton(tree, targets, seq_lens, table, rows, starts, **step))
    worker = types.SimpleNamespace(device="cpu")
    assert warmup.warm(state, worker, 4, 4) == warmup.shapes(state, 4, 4)
    assert calls == [(n, tree_w) for n, tree_w, _w in warmup.shapes(state, 4, 4)]


@pytest.mark.parametrize("graph_max_bs", [8, 2], ids=["graph-draws", "graph-draws-above-captured-bs"])
def test_draft_rows_run_the_draft_forward_over_fewer_rows(graph_max_bs):
    """FLASHTREE_DRAFT_ROWS=4 with depth 3 in DSPARK's 5-row window (sglang 0.5.17): every tree step's draft forward
    runs 4 rows, through draft graphs captured at 4 rows whose tail is flashtree's draws alone (batches above the
    captured sizes: eagerly, drawing from the 4 rows' base logits); DSPARK's proposer and graphs stay as they were;
    commits still equal the sequential greedy decode (run's checks). Releases whose proposer sizes its forward by
    query_token_num (0.5.20, 0.5.23) refuse the toggle at worker start."""
    if not adapters.select_adapter().draft_rows_release:
        with pytest.raises(SystemExit, match=r"FLASHTREE_DRAFT_ROWS=4 needs sglang 0\.5\.17's DSPARK draft proposer .*; allowed: 'auto'"):
            run(n=4, steps=1, depth=3, draft_rows=4, graph_max_bs=graph_max_bs)
        return
    accepts, state, _gen, _world = run(n=4, steps=25, depth=3, draft_rows=4, graph_max_bs=graph_max_bs)
    rows = state.draft_rows
    worker = rows.proposer.worker
    assert state.plan.forward_rows == rows.proposer.gamma == 4 and worker._proposer.gamma == GAMMA
    assert rows.proposer._draft_block_spec_info.draft_token_num == 4
    assert rows.proposer.rows_run == {4: state.steps}  # no tree step ran DSPARK's 5 rows
    assert state.draw_paths == {expected_draw_path(graph_max_bs, BS): state.steps}
    dmr = worker.draft_model_runner
    assert rows.runner.width == 4 and rows.runner.attn_backend is not dmr.attn_backend
    assert len(rows.runner.hooks) == 1 and rows.runner.hooks[0] not in dmr.capture_tail_hooks  # flashtree's tail only
    assert dmr.decode_cuda_graph_runner.width == GAMMA and len(dmr.capture_tail_hooks) == 1  # DSPARK's, restored
    assert sum(v for d, v in accepts.items() if d >= 2) > 0, sorted(accepts.items())


def test_draft_rows_between_the_depth_and_gamma():
    worker = types.SimpleNamespace(verify_num_draft_tokens=W, device="cpu",
                                   model_runner=types.SimpleNamespace(page_size=1, token_to_kv_pool=None),
                                   _proposer=types.SimpleNamespace(gamma=GAMMA))
    adapter = adapters.select_adapter()
    for rows, depth in ((2, 3), (GAMMA + 1, 0)):
        with pytest.raises(SystemExit, match=rf"FLASHTREE_DRAFT_ROWS={rows} is outside the draft rows a tree step can run, from the tree's depth \({depth or GAMMA}\) to DSPARK's gamma \({GAMMA}\); allowed: 'auto' or an integer from {depth or GAMMA} to {GAMMA}"):
            create_state(adapter, TreeToggles(tree_n=4, tree_depth=depth, draft_rows=rows), worker)
    assert create_state(adapter, TreeToggles(tree_n=4, tree_depth=3, draft_rows=GAMMA), worker).draft_rows is None


def test_draft_rows_without_draft_graphs_run_eagerly():
    """A server without draft graphs (sglang's eager runner in their place): no D-row graphs are captured and tree
    steps run the D-row proposer with the model runner's runner left alone."""
    from flashtree.patches import draft_rows

    eager = object()
    path = draft_rows.DraftRows(proposer="d-row proposer")
    state = types.SimpleNamespace(draft_rows=path, plan=types.SimpleNamespace(forward_rows=4, gamma=GAMMA))
    worker = types.SimpleNamespace(draft_model_runner=types.SimpleNamespace(decode_cuda_graph_runner=eager))
    draft_rows.capture(state, worker)
    assert path.runner is None
    with draft_rows.drafting(state, worker) as proposer:
        assert proposer == "d-row proposer" and worker.draft_model_runner.decode_cuda_graph_runner is eager
    with draft_rows.drafting(types.SimpleNamespace(draft_rows=None), worker) as proposer:
        assert proposer is None  # DSPARK's own proposer



@pytest.mark.parametrize("length, accepted", [(1.0, 0), (2.6, 2), (4.0, 3), (50.0, GAMMA)])
def test_sglang_simulated_length_commits_along_one_path_of_the_tree(length, accepted):
    """SGLANG_SIMULATE_ACC_LEN on a tree server: each step accepts what the release's DSPARK verify would (0.5.17: the
    constant round(min(max(L - 1, 0), gamma)); 0.5.20 / 0.5.23: one draw per step, 'match-expected' between the two
    nearest lengths), capped by the depth of the tree's first-child path; the KV layout stays exact."""
    adapter = adapters.select_adapter()
    accepts, state, _gen, _world = run(n=4, steps=12, simulate_acc_len=length)
    assert state.simulate is not None and sum(accepts.values()) == 12 * BS
    if adapter.release == "0.5.17":
        assert set(accepts) == {accepted}, sorted(accepts.items())
    else:
        lo = max(0, int(length) - 1)
        assert set(accepts) <= {lo, min(lo + 1, GAMMA)} | set(range(lo)), sorted(accepts.items())


def test_recorded_simulated_lengths_follow_the_table(tmp_path):
    """FLASHTREE_SIMULATE_ACC: per request, a length drawn from the table's distribution for the step's shape (the
    nearest recorded one), cut where the tree's path ends; each row is marked simulated."""
    from flashtree.planner.accept_table import AcceptTable

    table = tmp_path / "accept.json"
    AcceptTable({(4, W): (1, 0, 3), (64, 64): (0, 0, 0, 1)}).save(table)
    rows = []
    accepts, state, _gen, _world = run(n=4, steps=40, simulate_acc=str(table),
                                       on_step=lambda res: rows.extend(res.logits_output.customized_info["flashtree"]))
    # 0 or 2 as the table draws them, never cut: the simulated tree is built from copies of candidate 0
    assert set(accepts) == {0, 2} and accepts[2] > 2 * accepts[0] > 0, sorted(accepts.items())
    assert rows and all(r[1] == 1 and r[5] == 1 for r in rows)  # one distinct candidate, marked simulated


def test_a_bad_accept_table_stops_the_server(tmp_path):
    from flashtree.patches.toggles import ToggleError

    bad = tmp_path / "accept.json"
    bad.write_text('{"format": "flashtree-accept-table", "version": 1, "shapes": []}')
    with pytest.raises(ToggleError, match=r"FLASHTREE_SIMULATE_ACC: accept table .*accept.json: no shapes"):
        run(n=4, steps=1, simulate_acc=str(bad))


def test_a_failed_draft_rows_capture_stops_the_server():
    """FLASHTREE_DRAFT_ROWS below gamma asks for draft graphs at that many rows: a capture that fails stops the server
    naming the toggle, the error and what to do (it was a warning, and every draft forward then ran eagerly); DSPARK's
    tail hooks are restored first."""
    from flashtree.patches import draft_rows

    class FailingDraftCapture(StandInDraftGraphRunner):
        def __init__(self, model_runner, *, attn_backend=None, speculative_num_draft_tokens=None):
            if speculative_num_draft_tokens != W:
                raise RuntimeError("CUDA out of memory")
            super().__init__(model_runner, speculative_num_draft_tokens=speculative_num_draft_tokens)

    dspark_hooks = ["DSPARK's tail"]
    dmr = types.SimpleNamespace(capture_tail_hooks=[])
    dmr.attn_backend = StandInAttnBackend(dmr)
    dmr.decode_cuda_graph_runner = FailingDraftCapture(dmr, speculative_num_draft_tokens=W)
    dmr.capture_tail_hooks = dspark_hooks
    worker = types.SimpleNamespace(draft_model_runner=dmr, _draft_context=contextlib.nullcontext)
    path = draft_rows.DraftRows(proposer="d-row proposer")
    state = types.SimpleNamespace(draft_rows=path, plan=types.SimpleNamespace(forward_rows=4, gamma=GAMMA))
    with pytest.raises(SystemExit, match=rf"FLASHTREE_DRAFT_ROWS=4 needs draft CUDA graphs captured at 4 rows, and "
                                         rf"capturing them failed \(RuntimeError: CUDA out of memory\); unset "
                                         rf"FLASHTREE_DRAFT_ROWS \(DSPARK's {GAMMA} rows and graphs\)"):
        draft_rows.capture(state, worker)
    assert dmr.capture_tail_hooks is dspark_hooks and path.runner is None


# ---- FLASHTREE_TREE_POLICY: prob and best-first on the server step ----------------------------------------------
@pytest.mark.parametrize("policy,graph_max_bs,fused", [
    ("prob", None, False), ("prob", 8, False), ("prob", 8, True), ("best-first", None, False), ("best-first", 8, True)])
def test_policies_commit_the_sequential_greedy_decode(monkeypatch, policy, graph_max_bs, fused):
    """Each policy's tree step commits exactly the sequential greedy decode (run() checks every commit), accepting
    deep. prob builds from the candidates and their log q (candidate 0, the greedy block, the most probable at each
    first position); best-first draws nothing, fills the width, and grows the same trees in the draft graph's tail
    as eagerly (no noise: the steps, all greedy, are the same)."""
    import flashtree.patches.decode as decode

    trees, real_pad = [], decode.pad_tree

    def pad_tree(tree, w, n):
        trees.append((tree.tokens.clone(), tree.parents.clone(), tree.valid.clone()))
        return real_pad(tree, w, n)

    built, real_build = [], decode.build_tree

    def spy_build(candidates, width, policy=None, scores=None):
        built.append((candidates.clone(), None if scores.logp is None else scores.logp.clone()))
        return real_build(candidates, width, policy=policy, scores=scores)

    monkeypatch.setattr(decode, "pad_tree", pad_tree)
    monkeypatch.setattr(decode, "build_tree", spy_build)
    accepts, state, _generated, _world = run(n=4, steps=24, graph_max_bs=graph_max_bs, policy=policy, fused=fused)
    assert state.draw_paths == {expected_draw_path(graph_max_bs, BS): state.steps} and state.steps > 0
    assert sum(v for d, v in accepts.items() if d >= 2) > 0, sorted(accepts.items())
    if policy == "prob":
        assert len(built) == state.steps
        for candidates, logp in built:
            assert logp.shape == candidates.shape and (logp <= 0).all() and (logp > -40).all()
            assert (logp[:, :, 0] <= logp[:, :1, 0]).all()
        return
    assert built == [] and len(trees) == state.steps  # no candidates: the tree grew from the head
    assert all(v.all() for _t, _p, v in trees), "a best-first tree of W - 1 nodes fills the width"
    if graph_max_bs is not None:
        graph_trees = list(trees)
        trees.clear()
        run(n=4, steps=24, policy=policy)
        assert len(trees) == len(graph_trees)
        assert all(all(torch.equal(a, b) for a, b in zip(x, y)) for x, y in zip(trees, graph_trees))


@pytest.mark.parametrize("fused", [False, True])
def test_eager_draws_keep_log_q_for_prob(fused):
    """The eager draws with FLASHTREE_TREE_POLICY=prob return each drawn token's log q at temperature 1 under the
    head (a real bigram bias here), through the head's torch steps and through the fused Markov draws."""
    import flashtree.patches.decode as decode
    from flashtree.patches.state import TreePlan, TreeRun
    from flashtree.sampler.markov import new_state
    from flashtree.sampler.reference import sample_rows

    head = real_markov_head()
    torch.nn.init.normal_(head.markov_w2.weight, std=0.5)
    bs, n = 3, 5
    base = torch.randn(bs, GAMMA, V) * 2
    anchor = torch.randint(0, V, (bs,))
    toggles = TreeToggles(tree_n=n, draft_temperature=1.0, tree_policy="prob")
    plan = TreePlan(adapter=adapters.select_adapter(), toggles=toggles, gamma=GAMMA, depth=GAMMA, width=W,
                    page_size=1, tree_width=W, policy="prob", sampler=sample_rows, forward_rows=GAMMA)
    state = TreeRun(plan=plan, generator=torch.Generator().manual_seed(1), noise=new_state(1, "cpu") if fused else None)
    worker = types.SimpleNamespace(_proposer=types.SimpleNamespace(draft_model=types.SimpleNamespace(markov_head=head)))
    cands, logp = decode.draw_candidates(state, worker, base, anchor, None, n, with_logp=True)
    prev, want = anchor.repeat_interleave(n), []
    for j in range(GAMMA):
        logits = base[:, j].repeat_interleave(n, dim=0) + head.markov_w2(head.markov_w1(prev))
        prev = cands.view(bs * n, GAMMA)[:, j]
        want.append(logits.log_softmax(-1).gather(1, prev.view(-1, 1)).view(-1))
    torch.testing.assert_close(logp, torch.stack(want, dim=1).view(bs, n, GAMMA), rtol=0, atol=1e-5)
    assert (cands[:, 1:] != cands[:, :1]).any()


def test_policies_a_draft_cannot_feed_stop_the_server_at_start():
    """One message at worker start: prob / best-first with a FlashMap draft (noise draws, no probabilities),
    best-first with a Markov head other than sglang's vanilla one (here its gated head)."""
    from sglang.srt.models.dspark import GatedMarkovHead

    from flashtree.patches.toggles import ToggleError

    def worker(draft_model):
        return types.SimpleNamespace(verify_num_draft_tokens=W, device="cpu",
                                     model_runner=types.SimpleNamespace(page_size=1),
                                     _proposer=types.SimpleNamespace(draft_model=draft_model))

    adapter = adapters.select_adapter()
    flashmap = types.SimpleNamespace(flashmap=True, markov_head=real_markov_head())
    for policy in ("prob", "best-first"):
        with pytest.raises(ToggleError) as exc:
            create_state(adapter, TreeToggles(tree_n=4, tree_policy=policy), worker(flashmap))
        assert str(exc.value) == (
            f"flashtree: FLASHTREE_TREE_POLICY={policy} reads the draft's Markov-head probabilities, and this "
            "server's draft is a FlashMap draft (its candidates are noise draws, with no probabilities); use "
            "FLASHTREE_TREE_POLICY=vote")
    gated = types.SimpleNamespace(markov_head=GatedMarkovHead(vocab_size=V, markov_rank=4, hidden_size=8))
    with pytest.raises(ToggleError, match="^flashtree: FLASHTREE_TREE_POLICY=best-first grows its tree from sglang's "
                                          r"vanilla Markov head .* this draft's head is GatedMarkovHead"):
        create_state(adapter, TreeToggles(tree_n=4, tree_policy="best-first"), worker(gated))
    assert create_state(adapter, TreeToggles(tree_n=4, tree_policy="prob"), worker(gated)).grown is None
    plain = types.SimpleNamespace(markov_head=real_markov_head())
    assert create_state(adapter, TreeToggles(tree_n=4, tree_policy="best-first"), worker(plain)).grown is not None
