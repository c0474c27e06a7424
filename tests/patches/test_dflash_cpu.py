"""The tree step on sglang's DFLASH worker, on CPU: a real `DFlashWorkerV2` object (its own block buffers, mask
token, draft-KV writer `_append_target_hidden_to_draft_kv_by_loc` with its validation and prefix-valid commit), the
DFLASH family's real primitives (window, ForwardBatch of the draft forward, target LM head, N draws per position,
DFLASH's DFlashVerifyInput carrying the tree mask; 0.5.23: the step's real KV-location plan over a real
`KVIndexTranslator`; FLASHTREE_GRAPH_DRAWS: the real init_cuda_graphs, `_maybe_build_draft_sampler`,
`_DflashDraftSampler` and capture hook), flashtree's walk and commit; stand-ins only for the model forwards (the
stand-in target and draft of test_decode_cpu), the KV pools and what a one-GPU server publishes."""

from __future__ import annotations

import contextlib
import logging
import types
from collections import Counter

import pytest
import torch

import sglang_cpu
from test_decode_cpu import MAX_LEN, V, StandIns, chi2_critical_001, reference, standin_base_logits, target_logits

from flashtree.patches import adapters, block_draws, dflash_step, graph_draws, policy_draws
from flashtree.patches.adapters.dflash import DFLASH_WORKER
from flashtree.patches.adapters.probe import resolve
from flashtree.patches.decode import create_state
from flashtree.patches.toggles import ToggleError, TreeToggles
from flashtree.tree import DraftScores, build_tree

W = 6  # DFLASH's block_size: the anchor and K = 5 mask positions (test_decode_cpu's window)
K = W - 1
MASK = V - 1


@pytest.fixture(scope="module", autouse=True)
def tree_kernels():
    sglang_cpu.force_triton_tree_kernels()


@contextlib.contextmanager
def one_gpu_server():
    """What a one-GPU server publishes before its workers run (0.5.20's DFLASH decode reads the MoE EP width)."""
    try:
        from sglang.srt.runtime_context import get_parallel
    except ImportError:  # 0.5.17 publishes none
        yield
        return
    with get_parallel().override(moe_ep_size=1):
        yield


@pytest.fixture(autouse=True)
def _one_gpu_server():
    with one_gpu_server():
        yield


@pytest.fixture(scope="module")
def family():
    return stand_in_family()


def stand_in_family():
    """The release's real DFLASH family, its verify input handing the stand-in target what it reads."""
    real = adapters.dflash_adapter(adapters.select_adapter())
    assert real.mismatches() == []
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    class PreparedVerify(DFlashVerifyInput):
        """DFLASH's verify input; prepare_for_verify hands the stand-in target what ForwardBatch.init_new would read."""

        def prepare_for_verify(self, batch, target_worker):
            prepared = types.SimpleNamespace(verify=self, out_cache_loc=batch.out_cache_loc, seq_lens=batch.seq_lens,
                                             seq_lens_cpu=batch.seq_lens_cpu, req_pool_indices=batch.req_pool_indices,
                                             kv_loc_plan=None)
            plan = getattr(self, "kv_loc_plan", None)
            if plan is not None:  # ForwardBatch.init_new binds the verify's plan (0.5.23)
                plan.bind(prepared, target_worker.model_runner.kv_index_translator, cols=self.kv_loc_cols)
            return prepared, False

    class Family(type(real)):
        def verify_input_cls(self):
            return PreparedVerify

    return Family()


def kv_translator(world: StandIns, pool, page_size: int):
    """The runner's real KVIndexTranslator over an untranslated stand-in pool (None: a release whose DFLASH worker
    plans no KV ids); sets `world.plans`, which the stand-in forwards check."""
    try:
        import sglang.srt.mem_cache.kv_loc_plan  # noqa: F401
        from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    except ImportError:  # 0.5.17, 0.5.20
        world.plans = False
        return None
    world.plans = True
    return KVIndexTranslator(req_to_token=world.req_to_token, token_to_kv_pool_allocator=None, token_to_kv_pool=pool,
                             page_size=page_size, device="cpu")


def dflash_worker(world: StandIns, bs: int, page_size: int = 1, graph_max_bs: int = 0, prepare_kernel: bool = True):
    """A DFlashWorkerV2 as its __init__ leaves it for a plain DFLASH draft on one GPU (object.__new__: the real class
    and methods, the attributes its decode reads), over the stand-in models; its draft runner "replays a graph" for
    batches of at most graph_max_bs requests (capture_draft_graphs gives it the tail). prepare_kernel: DFLASH runs its
    Triton prepare-block kernel (a GPU server; here the Triton interpreter), else its eager block ops."""
    from sglang.srt.speculative.draft_worker_common import make_draft_block_spec_info

    head = torch.nn.Linear(V, V, bias=False)
    embed = torch.nn.Embedding(V, V)
    with torch.no_grad():
        head.weight.copy_(torch.eye(V))  # the draft's hidden states are its logits
        embed.weight.copy_(torch.eye(V))
    target_model = types.SimpleNamespace(lm_head=head, get_input_embeddings=lambda: embed)
    target_runner = types.SimpleNamespace(
        model=target_model, device="cpu", page_size=page_size, token_to_kv_pool=world,
        kv_index_translator=kv_translator(world, world, page_size),
        req_to_token_pool=types.SimpleNamespace(req_to_token=world.req_to_token),
        attn_backend=types.SimpleNamespace(verify_mask=types.SimpleNamespace(buffer=world.verify_mask)))
    attn = types.SimpleNamespace(kv_proj_only=lambda h: (h, h), apply_k_norm=lambda k: k,
                                 apply_k_rope=lambda pos, k: k, num_kv_heads=1, head_dim=2,
                                 attn=types.SimpleNamespace(k_scale=None, v_scale=None))
    draft_pool = DraftPool(world)
    draft_runner = types.SimpleNamespace(tp_group=None, token_to_kv_pool=draft_pool, capture_tail_hooks=[],
                                         graph_max_bs=graph_max_bs,
                                         kv_index_translator=kv_translator(world, draft_pool, page_size))
    draft_runner.forward = lambda fb: draft_forward(world, fb, draft_runner)
    worker = object.__new__(resolve(DFLASH_WORKER))
    worker.__dict__.update(
        block_size=W, device="cpu", page_size=page_size, _mask_token_id=MASK, _block_pos_offsets=torch.arange(W),
        _draft_block_spec_info=make_draft_block_spec_info(draft_token_num=W, device="cpu"),
        _draft_block_ids_buf=None, _use_triton_prepare_block=prepare_kernel, use_compact_draft_cache=False, _need_mamba_verify_commit=False,
        _use_fused_kv_materialize=False, _fused_kv_helper=None, selector=None, lilicorr=None, _is_domino=False,
        _full_embed_gpu=None, _noise_embed_scale=1.0, draft_tp_context=lambda group: torch.enable_grad(),
        draft_parallel_layout=types.SimpleNamespace(tp_group=None, disable_cp=False),
        server_args=types.SimpleNamespace(tp_size=1, pp_size=1, enable_dp_attention=False, attention_backend="triton"),
        model_runner=target_runner,
        _target_worker=types.SimpleNamespace(model_runner=target_runner,
                                             forward_batch_generation=lambda **kw: target_forward(world, **kw)),
        draft_model=types.SimpleNamespace(project_target_hidden=lambda h: h, layers=[types.SimpleNamespace(self_attn=attn)],
                                          prepare_context_hidden_for_kv=lambda layer, h: h),
        draft_model_runner=draft_runner,
    )
    return worker


class DraftPool:
    """The draft KV pool's prefix-valid writer: per request, the first commit_lens[b] columns of cache_loc_2d."""

    def __init__(self, world):
        self.world = world

    def set_kv_buffer_prefix_valid(self, layer, cache_loc_2d, commit_lens, k, v, k_scale, v_scale):
        bs, w = cache_loc_2d.shape
        k = k.view(bs, w, -1)
        for b in range(bs):
            c = int(commit_lens[b])
            self.world.draft_kv[cache_loc_2d[b, :c]] = k[b, :c]


def draft_forward(world, fb, runner):
    """The stand-in DFLASH draft: [anchor, mask x K] in, each position's logits (independent marginals around the
    target's greedy block) out as hidden states; checks the ForwardBatch DFLASH's draft model runner gets. Batches
    of at most runner.graph_max_bs requests "replay a graph": the captured tail (sglang's capture hooks, appended by
    init_cuda_graphs) runs on the output, as sglang's graph runner runs it."""
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

    bs = fb.batch_size
    ids = fb.input_ids.view(bs, W)
    assert fb.forward_mode.is_target_verify() and fb.spec_algorithm.is_dflash()
    assert (ids[:, 1:] == MASK).all() and torch.equal(fb.input_embeds.argmax(-1), fb.input_ids)
    assert torch.equal(fb.positions.view(bs, W), fb.seq_lens.view(-1, 1) + torch.arange(W))
    assert torch.equal(fb.out_cache_loc.view(bs, W), world.req_to_token[fb.req_pool_indices.view(-1, 1),
                                                                         fb.positions.view(bs, W)])
    assert fb.seq_lens_sum == int(fb.seq_lens_cpu.sum()) and torch.equal(fb.seq_lens_cpu, fb.seq_lens + W)
    plan = getattr(fb, "kv_loc_plan", None)
    assert (plan is not None) == world.plans, "0.5.23: the draft forward carries the step's KV-location plan"
    if plan is not None:  # the window, planned once, its reads one block past the committed prefixes
        assert torch.equal(plan.write_virtual, fb.out_cache_loc) and plan.read_extent == W
        assert torch.equal(plan.seq_lens, fb.seq_lens) and fb.out_cache_loc_is_physical
    world.last_plan = plan
    hidden = torch.zeros(bs, W, V)
    hidden[:, 1:] = standin_base_logits(world, fb, ids[:, 0], bs, K)
    out = LogitsProcessorOutput(next_token_logits=None, hidden_states=hidden.view(bs * W, V))
    graph = bs <= runner.graph_max_bs
    if graph:
        for hook in runner.capture_tail_hooks:
            hook(runner, out, fb, bs * W)
    return types.SimpleNamespace(logits_output=out, can_run_graph=graph)


GRAPH_BS = (1, 2, 4)  # the draft graphs' configured batch sizes (--cuda-graph-bs)


def capture_draft_graphs(worker, monkeypatch) -> list:
    """sglang's real DFlashWorkerV2.init_cuda_graphs, on CPU: it builds DFLASH's `_DflashDraftSampler` through the
    worker's `_maybe_build_draft_sampler` (flashtree's wrapper around the real one) and appends sglang's capture hook
    for it to the draft runner's capture_tail_hooks; the draft worker's capture is recorded, not run. Stand-ins only
    for what a one-GPU server publishes (the graph config, the TP group)."""
    from sglang.srt import runtime_context
    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang.srt.speculative import dflash_worker_v2 as mod

    config = types.SimpleNamespace(decode=types.SimpleNamespace(backend=Backend.FULL, bs=list(GRAPH_BS)))
    for module in (mod, runtime_context):  # the worker's import, and what flashtree's adapter resolves
        monkeypatch.setattr(module, "get_exec", lambda: types.SimpleNamespace(
            graph=types.SimpleNamespace(cuda_graph_config=config)))
    one_rank = types.SimpleNamespace(world_size=1)
    monkeypatch.setattr(mod, "get_tp_group", lambda: one_rank, raising=False)  # 0.5.17, 0.5.20
    monkeypatch.setattr(mod, "get_parallel", lambda: types.SimpleNamespace(  # 0.5.20, 0.5.23
        enable_dp_attention=False, attn_dp_enabled=False, tp_group=one_rank, tp_rank=0), raising=False)
    for name in ("draft_pp_context", "draft_tp_context"):  # 0.5.23's module-level draft scopes
        if hasattr(mod, name):
            monkeypatch.setattr(mod, name, lambda *a: contextlib.nullcontext())
    captured = []
    worker.__dict__.update(ps=types.SimpleNamespace(tp_rank=0), _target_tp_rank=0, _draft_sampler=None,
                           _draft_worker=types.SimpleNamespace(init_cuda_graphs=lambda **kw: captured.append(kw)))
    resolve(DFLASH_WORKER).init_cuda_graphs(worker)
    assert captured == [{"capture_decode_cuda_graph": True}]
    return captured


def target_forward(world, *, batch, forward_batch, is_verify, skip_attn_backend_init):
    """The stand-in target's verify under DFlashVerifyInput's FULL_MASK tree mask; writes KV at every window slot."""
    assert batch is None and is_verify and skip_attn_backend_init
    vi, fb = forward_batch.verify, forward_batch
    w = vi.draft_token_num
    ids, positions = vi.draft_token.view(-1, w), vi.positions.view(-1, w)
    bs = ids.shape[0]
    assert torch.equal(fb.seq_lens_cpu, fb.seq_lens + w), "the host lengths cover the verify block"
    assert (fb.kv_loc_plan is not None) == world.plans, "0.5.23: the verify writes through the draft forward's plan"
    if fb.kv_loc_plan is not None:
        assert world.last_plan is fb.kv_loc_plan
    world.kv[fb.out_cache_loc, 0] = positions.reshape(-1)
    world.kv[fb.out_cache_loc, 1] = ids.reshape(-1)
    mask, offset = vi.custom_mask.bool(), 0
    logits = torch.full((bs, w, V), -30.0)
    for b in range(bs):
        L = int(fb.seq_lens[b])
        rows = mask[offset: offset + w * (L + w)].view(w, L + w)
        offset += w * (L + w)
        assert rows[:, :L].all()
        prefix = world.context(world.request(fb, b), L)
        for i in range(w):
            seen = rows[i, L:].nonzero().flatten()
            assert positions[b, i] == L + len(seen) - 1
            logits[b, i] = target_logits(prefix + ids[b, seen].tolist())
    hidden = torch.stack([positions.reshape(-1).float(), ids.reshape(-1).float()], dim=1)
    out = types.SimpleNamespace(next_token_logits=logits.view(bs * w, V), hidden_states=hidden, customized_info=None)
    return types.SimpleNamespace(logits_output=out, can_run_cuda_graph=False)


def run(family, n: int, steps: int, prompts=None, sampling_info=None, policy: str = "vote", page_size: int = 1,
        fused: bool = False, simulate_acc: str | None = None, graphs=None, depth: int = 0, costs=None, width: int = 0,
        prepare_kernel: bool = True):
    """`steps` tree steps through flashtree's DFlashWorkerV2.forward_batch_generation; greedy rows are checked
    token for token against the sequential greedy decode (not with `simulate_acc`: simulated lengths are not the
    model's), every row's req_to_token / target KV / draft KV layout. graphs = (graph_max_bs, monkeypatch):
    FLASHTREE_GRAPH_DRAWS on, with DFLASH's draft graphs "captured" (sglang's real init_cuda_graphs) and replayed for
    batches of at most graph_max_bs requests. depth: FLASHTREE_TREE_DEPTH (0 = the block), width: FLASHTREE_TREE_WIDTH
    (0 = the block). prepare_kernel: dflash_worker's. costs (with n = AUTO_N,
    FLASHTREE_TREE_N=auto): the planner's cost table, ms per (shape, bs), injected as its start-up measurement."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.draft_worker_common import make_draft_input_v2

    prompts = prompts or [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9]]
    bs = len(prompts)
    refs = [reference(p, MAX_LEN - len(p) - 2 * W) for p in prompts]
    world = StandIns(prompts, refs, page_size)
    worker = dflash_worker(world, bs, page_size, graph_max_bs=graphs[0] if graphs else 0,
                           prepare_kernel=prepare_kernel)
    table = world.req_to_token.clone()
    toggles = TreeToggles(tree_n=n, seed=5, tree_policy=policy, fused_sampler=fused, simulate_acc=simulate_acc,
                          graph_draws=graphs is not None, tree_depth=depth, tree_width=width)
    dflash_step.make_worker_init(lambda self: None, family, toggles)(worker)
    if costs is not None:
        from flashtree.patches import planning

        planning.measure(worker._flashtree, worker, lambda shape, b: costs(shape, b) / 1e3, sizes=[bs])
    if graphs:
        capture_draft_graphs(worker, graphs[1])
        torch.manual_seed(5)  # the server's --random-seed: the tail draws on torch's default generator
    step = dflash_step.make_forward_batch_generation(resolve(DFLASH_WORKER).forward_batch_generation, family, toggles)
    greedy_rows = [True] * bs if sampling_info is None else (sampling_info.top_ks <= 1).tolist()
    seq_lens = torch.tensor([len(p) for p in prompts])
    bonus = torch.tensor([r[len(p)] for r, p in zip(refs, prompts)])
    generated = [[int(b)] for b in bonus]
    draft_input = make_draft_input_v2(bonus_tokens=bonus, new_seq_lens=seq_lens)
    accepts = Counter()
    for _ in range(steps):
        batch = types.SimpleNamespace(
            seq_lens=seq_lens.clone(), seq_lens_cpu=seq_lens.clone(), seq_lens_sum=int(seq_lens.sum()),
            req_pool_indices=world.rows.clone(), forward_mode=ForwardMode.DECODE, is_extend_in_batch=False,
            sampling_info=sampling_info, spec_info=draft_input, has_grammar=False, return_logprob=False,
            out_cache_loc=None, can_run_decode_cuda_graph=False)
        res = step(worker, batch, None)
        commit = res.accept_lens.to(torch.int64)
        out = res.next_token_ids.view(bs, W)
        assert torch.equal(res.new_seq_lens, seq_lens + commit) and res.speculative_num_draft_tokens == W
        for b in range(bs):
            L, c = int(seq_lens[b]), int(commit[b])
            ctx = world.context(b, L + c)
            assert ctx == prompts[b] + generated[b] + out[b, : c - 1].tolist()
            if greedy_rows[b] and simulate_acc is None:
                assert out[b, :c].tolist() == refs[b][L + 1: L + 1 + c]
            slots = world.req_to_token[world.rows[b], L: L + c]  # the draft context: the committed path only
            assert world.draft_kv[slots, 0].tolist() == list(range(L, L + c))
            assert world.draft_kv[slots, 1].tolist() == ctx[L: L + c]
            generated[b].extend(out[b, :c].tolist())
            accepts[c - 1] += 1
        if page_size > 1:  # the copy commit: the table stays, the accepted KV moved
            assert torch.equal(world.req_to_token, table) and world.moves > 0
        seq_lens, draft_input = res.new_seq_lens, res.next_draft_input
    return accepts, worker._flashtree, generated


@pytest.mark.parametrize("policy", ["vote", "prob", "best-first"])
def test_dflash_tree_matches_sequential_greedy_decode(family, policy):
    accepts, state, _gen = run(family, n=4, steps=10, policy=policy)
    assert state.steps == 10 and state.draw_paths == {"eager": 10}
    assert max(accepts) >= 2, f"the steps must accept deep: {accepts}"
    if policy != "best-first":  # sampled trees also miss the target's first token (best-first keeps the best ones)
        assert 0 in accepts, f"the steps must reject too: {accepts}"


def test_dflash_block_without_the_prepare_kernel_commits_the_same(family, monkeypatch, caplog):
    """The window and the block [anchor, mask x K] come from DFLASH's prepare-block kernel where DFLASH runs it, else
    from its eager ops, and a kernel that fails turns itself off for good as DFLASH's own step does: every way gives
    the same commits (the sequential greedy decode: run checks them, and the stand-in draft checks the block)."""
    from sglang.srt.speculative import dflash_worker_v2

    kernel = run(family, n=4, steps=6)
    eager = run(family, n=4, steps=6, prepare_kernel=False)
    assert kernel[2] == eager[2] and kernel[0] == eager[0]

    def broken(**kw):
        raise RuntimeError("no Triton here")

    monkeypatch.setattr(dflash_worker_v2, "_prepare_dflash_draft_block_unchecked", broken)
    with caplog.at_level(logging.WARNING, logger="flashtree.patches"):
        failed = run(family, n=4, steps=6)
    assert failed[2] == kernel[2]
    assert [r.getMessage() for r in caplog.records if "prepare-block" in r.getMessage()] == [
        "flashtree: DFLASH's prepare-block kernel failed; the eager path from now on: no Triton here"]


@pytest.mark.parametrize("graph", [False, True], ids=["eager-draws", "graph-draws"])
@pytest.mark.parametrize("policy", ["vote", "best-first"])
def test_dflash_simulated_trees_draw_their_shape_lengths_to_full_depth(family, policy, graph, tmp_path, monkeypatch):
    """FLASHTREE_SIMULATE_ACC on a DFLASH tree server: lengths drawn from the row of the server's own (N, W), best-first
    included (its grown tree draws no candidates, and a grown tree of random marginals would be all depth-1 nodes: the
    simulated step verifies the same width built from copies of the greedy block, which a graph tail writes beside
    its tree, so the drawn lengths reach full depth). The KV layout stays exact (run checks it)."""
    from flashtree.planner.accept_table import AcceptTable

    table = tmp_path / "accept.json"
    deep = (0,) * K + (1,)  # every step accepts the whole block
    AcceptTable({(1, W): (1,), (4, W): deep}, policy=policy).save(table)
    accepts, state, _gen = run(family, n=4, steps=3, simulate_acc=str(table), policy=policy,
                               graphs=(4, monkeypatch) if graph else None)
    assert state.simulate is not None and set(accepts) == {K}, sorted(accepts.items())
    assert state.draw_paths == {"graph" if graph else "eager": 3}


def test_dflash_fused_sampler_draws_commit_the_sequential_greedy_decode(family):
    """FLASHTREE_FUSED_SAMPLER=1: the N draws of each position come from one read of its logits (candidate_draws);
    the commits are still the sequential greedy decode, token for token (run checks them)."""
    accepts, state, _gen = run(family, n=4, steps=8, fused=True)
    assert state.steps == 8 and max(accepts) >= 2 and 0 in accepts, accepts


def test_dflash_paged_kv_commit_copies_accepted_kv(family):
    accepts, _state, _gen = run(family, n=4, steps=6, page_size=4)
    assert max(accepts) >= 2


def test_dflash_n1_equals_dflash_chain_accept(family, monkeypatch):
    """N = 1: the tree is DFLASH's own chain (candidate 0 = each position's argmax), and each step commits what
    DFLASH's chain accept (compute_dflash_correct_drafts_and_bonus, as the worker imports it: 0.5.23 moved it to
    sglang.kernels) commits."""
    import flashtree.patches.decode as decode
    from sglang.srt.speculative.dflash_worker_v2 import compute_dflash_correct_drafts_and_bonus

    real_walk, checked = decode.walk, []

    def walk(state, tree, logits, sampling_info, *commit_args, **step):
        result, plan, out = real_walk(state, tree, logits, sampling_info, *commit_args, **step)
        bs = tree.batch_size
        assert torch.equal(tree.parents, torch.arange(W - 1).expand(bs, W - 1)), "N = 1 must give the chain"
        chain = torch.cat([torch.zeros(bs, 1, dtype=torch.int64), tree.tokens], dim=1)
        accept, bonus = compute_dflash_correct_drafts_and_bonus(
            candidates=chain, target_predict=logits.view(bs, W, V).argmax(-1))
        assert accept.tolist() == result.accept_len.tolist() and bonus.tolist() == result.bonus.tolist()
        checked.append(bs)
        return result, plan, out

    monkeypatch.setattr(decode, "walk", walk)
    accepts, state, _gen = run(family, n=1, steps=8)
    assert len(checked) == state.steps == 8 and max(accepts) >= 1


def test_dflash_draws_candidate_zero_is_the_argmax_block(family):
    logits = torch.randn(2, K, V)
    from flashtree.sampler.reference import sample_rows
    from flashtree.sampler import candidate_rows

    def sampler(rows):
        _inv, greedy = candidate_rows(rows.shape[0] // 3, 3, 0.8, rows.device)
        return sample_rows(rows, torch.where(greedy, 0.0, 0.8), generator=torch.Generator().manual_seed(0))

    drawn = family.sample_blocks(None, logits, None, None, 3, sampler)
    assert drawn.shape == (2, 3, K) and torch.equal(drawn[:, 0], logits.argmax(-1))
    logp = family.candidate_logp(logits, drawn)
    assert torch.allclose(logp, logits.log_softmax(-1).gather(2, drawn.transpose(1, 2)).transpose(1, 2))
    # the fused sampler's form: all N of a position from one read of its row, laid out (request, candidate, position)
    calls = []

    def row_draws(rows):
        calls.append(rows.shape)
        return torch.arange(rows.shape[0] * 3).view(-1, 3)

    laid = family.sample_blocks(None, logits, None, None, 3, sampler, row_draws=row_draws)
    assert calls == [(2 * K, V)] and laid.shape == (2, 3, K)
    assert laid[1, 2, 4].item() == (1 * K + 4) * 3 + 2


SAMPLED_T = 0.7


class SamplingInfo(types.SimpleNamespace):
    """sglang's SamplingBatchInfo as DFLASH's verify adjustments and flashtree's walk read it (no penalties, bias or
    logit processors: admission refuses those)."""

    def __init__(self, bs: int, temperature: float):
        super().__init__(is_all_greedy=False, temperatures=torch.full((bs, 1), temperature),
                         top_ks=torch.full((bs,), 1 << 30, dtype=torch.int32), top_ps=torch.ones(bs),
                         has_custom_logit_processor=False)

    def __len__(self) -> int:
        return self.top_ks.shape[0]


def first_sampled_tokens(family, monkeypatch, wrong_temperature: float | None):
    """The first token after the anchor on 1200 sampled rows of one prompt (N = 4, one step); with
    `wrong_temperature` the walk samples the target at that temperature instead of the request's (the negative
    control)."""
    import flashtree.patches.decode as decode

    bs = 1200
    info = SamplingInfo(bs, SAMPLED_T)
    if wrong_temperature is not None:
        real_walk = decode.walk
        wrong = SamplingInfo(bs, wrong_temperature)
        monkeypatch.setattr(decode, "walk", lambda state, tree, logits, _info, *a, **step: real_walk(
                            state, tree, logits, wrong, *a, **step))
    prompt = [4, 4, 2, 7]
    _acc, _state, generated = run(family, n=4, steps=1, prompts=[prompt] * bs, sampling_info=info)
    return prompt + [generated[0][0]], Counter(g[1] for g in generated)


def chi_square(ctx, counts) -> tuple[float, float]:
    p = (target_logits(ctx) / SAMPLED_T).softmax(-1)
    cells = [t for t in range(V) if p[t] > 1e-6]
    assert set(counts) <= set(cells), "a token outside the target's support"
    n = sum(counts.values())
    stat = sum((counts.get(t, 0) - n * float(p[t])) ** 2 / (n * float(p[t])) for t in cells)
    return stat, chi2_critical_001(max(len(cells) - 1, 3))


def test_dflash_sampled_walk_is_lossless_and_a_wrong_one_is_caught(family, monkeypatch):
    ctx, counts = first_sampled_tokens(family, monkeypatch, None)
    stat, critical = chi_square(ctx, counts)
    assert stat < critical, f"chi-square {stat:.1f} >= {critical:.1f}: {counts}"
    ctx, counts = first_sampled_tokens(family, monkeypatch, 1.0)
    stat, critical = chi_square(ctx, counts)
    assert stat > critical, f"the wrong-temperature walk passed (chi-square {stat:.1f}): the test cannot fail"


def test_each_worker_scores_every_registered_policy():
    """A DFLASH draft has marginals but no Markov head: best-first grows from each position's own distribution (its
    rounds read every position's top k, taken once; the DFLASH greedy test serves it), a DSPARK worker's from its
    vanilla head: both workers give every registered policy's scores."""
    from flashtree.patches import policy_draws
    from flashtree.tree.policies import POLICIES

    dspark = adapters.select_adapter()
    dflash = adapters.dflash_adapter(dspark)
    for policy in POLICIES.values():
        assert set(policy.needs_scores) <= set(dspark.draft_scores) & set(dflash.draft_scores), policy.name
    assert dflash.independent_positions and not dspark.independent_positions
    # headless growth: the tree of the positions' marginals, the same as the full log-softmax rounds give
    g = torch.Generator().manual_seed(4)
    base, anchor = torch.randn(2, 3, 40, generator=g), torch.tensor([1, 2])
    grown = policy_draws.grow(base, anchor, width=9)
    full = build_tree(torch.zeros((2, 1, 3), dtype=torch.long), 9, "best-first", DraftScores(
        anchor=anchor, step_logprobs=lambda r, p, t: base[r, p.clamp(max=2)].log_softmax(-1)))
    assert torch.equal(grown.tokens, full.tokens) and torch.equal(grown.parents, full.parents)


def worker_methods(cls) -> dict:
    return {name: cls.__dict__[name] for name in ("__init__", "init_cuda_graphs", "forward_batch_generation")}


def replaced(cls, before: dict) -> set:
    return {name for name, fn in before.items() if cls.__dict__[name] is not fn}


def test_dflash_install_patches_and_restores(monkeypatch):
    """With FLASHTREE_TREE_N the plugin replaces DFlashWorkerV2's __init__, init_cuda_graphs and
    forward_batch_generation on every adapted release and restores them; without toggles DFLASH is untouched."""
    import flashtree.patches as patches

    cls = resolve(DFLASH_WORKER)
    before = worker_methods(cls)
    patches.install()
    assert replaced(cls, before) == set(), "no toggles: DFLASH must stay untouched"
    monkeypatch.setenv("FLASHTREE_TREE_N", "4")
    patches.install()
    assert replaced(cls, before) == set(before)
    patches.uninstall()
    assert replaced(cls, before) == set()


def test_dflash_worker_whose_probes_fail_is_refused_at_start(sglang_release, monkeypatch):
    """A DFlashWorkerV2 lacking what the family calls: only __init__ is patched, and it refuses with the gaps."""
    import flashtree.patches as patches

    family_cls = type(adapters.dflash_adapter(adapters.select_adapter()))
    gap = "DFlashWorkerV2._ensure_draft_block_buffers: gone"
    monkeypatch.setattr(family_cls, "mismatches", lambda self: [gap])
    cls = resolve(DFLASH_WORKER)
    before = worker_methods(cls)
    monkeypatch.setenv("FLASHTREE_TREE_N", "4")
    patches.install()
    assert replaced(cls, before) == {"__init__"}
    with pytest.raises(ToggleError, match=rf"sglang {sglang_release}'s DFlashWorkerV2 is not one .*\({gap}\)"):
        cls(types.SimpleNamespace())


def test_dflash_narrow_verify_writes_the_window_first_columns(family):
    """0.5.23: a verify graph narrower than the block (FLASHTREE_TREE_BUDGET / WIDTH) writes the plan's first w
    columns, the narrowed window's slots; the full verify writes the whole plan."""
    from sglang.srt.speculative.draft_worker_common import make_draft_input_v2

    prompts = [[3, 1, 4], [9, 2, 6, 5]]
    world = StandIns(prompts, [reference(p, 8) for p in prompts])
    worker = dflash_worker(world, 2)
    if not world.plans:
        pytest.skip("this release's DFLASH worker plans no KV ids")
    seq_lens = torch.tensor([3, 4])
    batch = types.SimpleNamespace(seq_lens=seq_lens, seq_lens_cpu=seq_lens.clone(), req_pool_indices=world.rows)
    draft_input = make_draft_input_v2(bonus_tokens=torch.tensor([1, 2]), new_seq_lens=seq_lens)
    window = family.alloc_window(worker, batch, 2, draft_input)
    translator = worker.model_runner.kv_index_translator
    for w in (W, W - 2):
        extra = family.verify_window_extra(worker, window, w)
        assert extra["kv_loc_plan"] is window.native
        ids = window.native.write_ids(translator, cols=extra["kv_loc_cols"])
        assert torch.equal(ids, window.narrowed(w).cache_loc)


@pytest.mark.parametrize("runner", ["model_runner", "draft_model_runner"])
def test_dflash_translated_kv_ids_are_refused(family, runner):
    """0.5.23: a target or draft runner whose KV ids are translated (unified / fused draft pools: virtual ids in
    req_to_token) is refused once the pools exist (init_cuda_graphs: sglang builds the runners' translators with the
    pools, after the workers); the tree commit permutes req_to_token."""
    from flashtree.patches import checks

    prompts = [[3, 1, 4]]
    world = StandIns(prompts, [reference(p, 8) for p in prompts])
    worker = dflash_worker(world, 1)
    if getattr(getattr(worker, runner), "kv_index_translator", None) is None:
        pytest.skip("this release's DFLASH worker plans no KV ids")
    checks.at_init_cuda_graphs(family, worker, page_size=1)  # untranslated: served
    translator = getattr(worker, runner).kv_index_translator
    for attr in ("model_runner", "draft_model_runner"):  # at worker start no runner has a translator yet
        delattr(getattr(worker, attr), "kv_index_translator")
    create_state(family, TreeToggles(tree_n=4), worker)
    worker.model_runner.kv_index_translator = worker.draft_model_runner.kv_index_translator = translator
    getattr(worker, runner).kv_index_translator = types.SimpleNamespace(is_translating=True)
    which = "target" if runner == "model_runner" else "draft"
    with pytest.raises(ToggleError, match=f"FLASHTREE_TREE_N is set but the DFLASH {which}'s KV ids are translated"):
        checks.at_init_cuda_graphs(family, worker, page_size=1)


def test_dflash_chain_steps_draw_simulated_lengths_from_the_table(family, tmp_path, monkeypatch):
    """FLASHTREE_SIMULATE_ACC on DFLASH's own chain: per request a length from the table's chain row (N = 1), the
    tokens laid out as DFLASH's own forced acceptance lays out that length (its real function, one row at a time)."""
    from sglang.srt.speculative import dflash_utils

    from flashtree.patches import simulate
    from flashtree.planner.accept_table import AcceptTable

    table = AcceptTable({(1, W): (1, 0, 0, 3)})
    ours = simulate.make_dflash_chain_acceptance(table, "t.json", seed=3)
    bs = 64
    candidates = torch.randint(0, V, (bs, W))
    predict = torch.randint(0, V, (bs, W))

    def buffers():
        return (torch.zeros(bs, dtype=torch.int32), torch.zeros(bs, dtype=torch.int32),
                torch.zeros(bs, dtype=torch.int64), torch.zeros(bs, W, dtype=torch.int64))

    accept, commit, bonus, out = buffers()
    ours(candidates=candidates, target_predict=predict, accept_len=accept, commit_lens=commit, bonus=bonus,
         out_tokens=out, simulate_acc_len=1.0, simulate_acc_method="match-expected",
         simulate_acc_token_mode="real-draft-token")
    counts = Counter(accept.tolist())
    assert set(counts) == {0, 3} and counts[3] > counts[0] > 0 and torch.equal(commit, accept + 1)
    # 0.5.23's sampled verify hands the target's logits instead of their argmax: the same tokens from them
    sampled = simulate.make_dflash_chain_acceptance(table, "t.json", seed=3)
    a1, c1, b1, o1 = buffers()
    sampled(candidates=candidates, target_predict=None, accept_len=a1, commit_lens=c1, bonus=b1, out_tokens=o1,
            simulate_acc_len=1.0, simulate_acc_method="match-expected", simulate_acc_token_mode="real-draft-token",
            next_token_logits=torch.nn.functional.one_hot(predict, V).float().view(bs * W, V))
    assert all(torch.equal(x, y) for x, y in ((a1, accept), (c1, commit), (b1, bonus), (o1, out)))
    draw = "sample_simulated_acc_len" if hasattr(dflash_utils, "sample_simulated_acc_len") else "_sample_simulated_acc_len"
    for b in range(bs):
        monkeypatch.setattr(dflash_utils, draw, lambda *a, n=int(commit[b]): n)
        a2, c2, b2, o2 = (t[:1].clone() for t in buffers())
        dflash_utils.apply_dflash_simulated_acceptance(
            candidates=candidates[b:b + 1], target_predict=predict[b:b + 1], accept_len=a2, commit_lens=c2, bonus=b2,
            out_tokens=o2, simulate_acc_len=1.0, simulate_acc_method="x", simulate_acc_token_mode="real-draft-token")
        assert (a2.item(), c2.item(), b2.item()) == (accept[b].item(), commit[b].item(), bonus[b].item())
        assert torch.equal(o2[0], out[b])


# ---- FLASHTREE_GRAPH_DRAWS: the N draws in DFLASH's draft graph tail (graph_draws.MarginalSamplerMixin) ----------
@pytest.mark.parametrize("fused", [False, True], ids=["row-sampler", "fused"])
@pytest.mark.parametrize("policy", ["vote", "prob", "best-first"])
def test_dflash_graph_draws_commit_the_sequential_greedy_decode(family, policy, fused, monkeypatch):
    """Draft graphs captured through sglang's real init_cuda_graphs: every tree step reads its candidates (prob: and
    their log q; best-first: its grown tree) from the buffers the replayed tail filled, computes no logits of its
    own, and commits exactly the sequential greedy decode (run checks every commit and the KV layout)."""
    def no_eager_logits(*a, **k):
        raise AssertionError("a tree step after a graph replay computed the block's logits again")

    monkeypatch.setattr(type(family), "lm_logits", no_eager_logits)
    accepts, state, _gen = run(family, n=4, steps=10, policy=policy, fused=fused, graphs=(4, monkeypatch))
    assert state.graph_draws is not None and state.graph_draws_off is None
    assert state.draw_paths == {"graph": 10} and state.graph_draws.calls == 10
    assert max(accepts) >= 2, f"the steps must accept deep: {accepts}"
    if policy != "best-first":
        assert 0 in accepts, f"the steps must reject too: {accepts}"


def test_dflash_graph_draws_at_n1_and_below_the_block(family, monkeypatch):
    """N = 1 (DFLASH's own chain block from the tail) and trees keeping 3 of the block's 5 positions (the tail draws
    only those, lean) still commit the sequential greedy decode."""
    accepts, state, _gen = run(family, n=1, steps=6, graphs=(4, monkeypatch))
    assert state.draw_paths == {"graph": 6} and state.graph_draws.lean_bs == 0 and max(accepts) >= 1
    accepts, state, _gen = run(family, n=4, steps=8, depth=3, graphs=(4, monkeypatch))
    assert state.draw_paths == {"graph": 8} and state.graph_draws.out.shape == (max(GRAPH_BS), 4, 3)
    assert max(accepts) == 3, sorted(accepts.items())


def test_dflash_graph_draws_fall_back_to_eager_draws_and_say_so_once(family, monkeypatch, caplog):
    """Batches above the captured draft graphs (3 requests, graphs up to 2): the forward runs eagerly, its tail never
    runs, and the step draws eagerly as without graph draws; one warning, however many steps."""
    with caplog.at_level(logging.WARNING, logger="flashtree.patches"):
        accepts, state, _gen = run(family, n=4, steps=5, graphs=(2, monkeypatch))
    assert state.graph_draws is not None and state.graph_draws.calls == 0
    assert state.draw_paths == {"eager": 5} and max(accepts) >= 2
    said = [r.getMessage() for r in caplog.records if "drawn eagerly" in r.getMessage()]
    assert len(said) == 1 and "a batch of 3 requests ran its draft forward eagerly" in said[0]


def real_tail(family, monkeypatch, n: int = 4, **toggles):
    """A DFLASH worker after flashtree's __init__ and sglang's real init_cuda_graphs: (worker, its flashtree sampler,
    sglang's capture hook for it, the GraphDraws)."""
    world = StandIns([[3, 1, 4]], [reference([3, 1, 4], 8)])
    worker = dflash_worker(world, 1)
    dflash_step.make_worker_init(lambda self: None, family, TreeToggles(tree_n=n, seed=5, **toggles))(worker)
    capture_draft_graphs(worker, monkeypatch)
    (hook,) = worker.draft_model_runner.capture_tail_hooks
    sampler = graph_draws.sampler_of(worker)
    assert sampler is worker._draft_sampler and sampler.flashtree_draws is worker._flashtree.graph_draws
    return worker, sampler, hook, sampler.flashtree_draws


def tail_inputs(bs: int, seed: int = 0):
    """(hidden states, ForwardBatch stand-in, block logits (bs, K, V), anchor): the stand-in LM head is the identity,
    so the draft positions' hidden states are their logits."""
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

    g = torch.Generator().manual_seed(seed)
    base = torch.randn(bs, K, V, generator=g) * 2
    anchor = torch.randint(0, V - 1, (bs,), generator=g)
    hidden = torch.full((bs, W, V), 1e4)  # the anchor's row: would show if it leaked into the logits
    hidden[:, 1:] = base
    ids = torch.full((bs, W), MASK)
    ids[:, 0] = anchor
    out = LogitsProcessorOutput(next_token_logits=None, hidden_states=hidden.view(bs * W, V))
    return out, types.SimpleNamespace(input_ids=ids.view(-1)), base, anchor


@pytest.mark.parametrize("fused", [False, True], ids=["row-sampler", "fused"])
def test_dflash_tail_draws_equal_the_eager_draws(family, monkeypatch, fused):
    """The tail, called as sglang's graph runner calls it (eagerly on CPU): DFLASH's own `out` equals its stock
    sampler's on the same hidden states (its steps still read it), and the N candidates equal the eager draws' for
    the same generator state (the tail draws on torch's default generator, the eager draws on FLASHTREE_SEED's:
    both seeded alike here), candidate 0 each position's argmax."""
    from sglang.srt.speculative.dflash_worker_v2 import _DflashDraftSampler

    worker, sampler, hook, draws = real_tail(family, monkeypatch, n=4, fused_sampler=fused, tree_max_bs=3)
    assert isinstance(sampler, _DflashDraftSampler) and type(sampler) is not _DflashDraftSampler
    assert draws.lean_bs == 3 and draws.max_bs == 4  # lean up to the limit; the graph of 4 is DFLASH's own too
    stock = _DflashDraftSampler(weight=sampler.weight, block_size=W, num_org=V, org_vocab_start=0, max_bs=4)
    bs = 4  # not lean: DFLASH's block is computed from the same logits
    out, fb, base, anchor = tail_inputs(bs)
    stock(out.hidden_states, fb.input_ids)
    torch.manual_seed(11)
    hook(None, out, fb, bs * W)
    assert torch.equal(sampler.out[: bs * K], stock.out[: bs * K])
    state = worker._flashtree
    state.generator.manual_seed(11)
    eager = block_draws.draw_candidates(state, worker, base, anchor, None, 4)
    cands = draws.read(bs)
    assert cands.shape == (bs, 4, K) and torch.equal(cands[:, 0], base.argmax(-1))
    assert (cands[:, 1:] != cands[:, :1]).any(), "the draws are not all the argmax block"
    assert torch.equal(cands, eager)
    # a lean tail (a graph only tree steps replay): the same candidates, DFLASH's block left as it was
    sampler.out.fill_(-1)
    out, fb, base, anchor = tail_inputs(2, seed=1)
    torch.manual_seed(12)
    hook(None, out, fb, 2 * W)
    state.generator.manual_seed(12)
    assert torch.equal(draws.read(2), block_draws.draw_candidates(state, worker, base, anchor, None, 4))
    assert (sampler.out == -1).all() and draws.drawn_sizes == {4: 4, 2: 4}


def test_dflash_tail_keeps_log_q_and_grows_best_first(family, monkeypatch):
    """prob: the tail keeps each candidate token's log q under its position's marginal (what the eager step computes
    after its draws); best-first: the tail grows the tree the eager step grows from the same logits."""
    _worker, _sampler, hook, draws = real_tail(family, monkeypatch, tree_policy="prob")
    out, fb, base, anchor = tail_inputs(3)
    hook(None, out, fb, 3 * W)
    cands = draws.read(3)
    assert torch.allclose(draws.logp[:3], family.candidate_logp(base, cands))
    _worker, _sampler, hook, draws = real_tail(family, monkeypatch, tree_policy="best-first")
    assert draws.n == 1 and draws.grown == ()
    hook(None, out, fb, 3 * W)
    grown, eager = draws.read_tree(3), policy_draws.grow(base, anchor, width=W)
    for field in ("tokens", "parents", "depth", "valid"):
        assert torch.equal(getattr(grown, field), getattr(eager, field)), field


def test_dflash_own_steps_over_lean_graphs_take_their_block_eagerly(family, monkeypatch):
    """DFLASH's own steps (the tree step's fallbacks) over a batch a lean graph serves run with the sampler detached
    from the worker, so DFLASH takes its greedy block from the replayed hidden states; larger ones keep it."""
    worker, sampler, _hook, draws = real_tail(family, monkeypatch, tree_max_bs=2)
    assert draws.lean_bs == 2
    with graph_draws.dspark_proposes_eagerly(worker, 2):
        assert worker._draft_sampler is None
    assert worker._draft_sampler is sampler
    with graph_draws.dspark_proposes_eagerly(worker, 3):
        assert worker._draft_sampler is sampler


def test_dflash_graph_draws_stay_eager_with_one_reason(family, monkeypatch, caplog):
    """Where the tail cannot draw, DFLASH keeps its own sampler and the draws stay eager, logged once at
    init_cuda_graphs: a release whose tail sampler is not the one flashtree adapts, DFLASH keeping its head eager,
    too little free memory."""
    from flashtree.patches.adapters import dflash as dflash_family

    gap = "_DflashDraftSampler.__call__: gone"
    monkeypatch.setattr(dflash_family, "DFLASH_GRAPH_DRAW_PROBES", (types.SimpleNamespace(check=lambda: gap),))
    with caplog.at_level(logging.WARNING, logger="flashtree.patches"):
        worker, *_ = real_tail_or_none(family, monkeypatch)
    assert type(worker._draft_sampler).__name__ == "_DflashDraftSampler" and worker._flashtree.graph_draws is None
    said = [r.getMessage() for r in caplog.records if "stay eager" in r.getMessage()]
    assert said == [f"flashtree: FLASHTREE_GRAPH_DRAWS=1 but the N draft draws stay eager: sglang "
                    f"{family.release}'s DFLASH draft graph tail is not one flashtree adapts ({gap})"]
    monkeypatch.undo()
    monkeypatch.setenv("SGLANG_DFLASH_EAGER_DRAFT_SAMPLER", "1")
    worker, *_ = real_tail_or_none(family, monkeypatch)
    assert worker._draft_sampler is None and "DFLASH built no graph-folded" in worker._flashtree.graph_draws_off
    from sglang.srt.speculative.dflash_worker_v2 import _DflashDraftSampler

    stock = _DflashDraftSampler(weight=torch.eye(V), block_size=W, num_org=V, org_vocab_start=0, max_bs=4)
    state = worker._flashtree
    assert graph_draws.build(state, worker, stock, free=lambda device: 1 << 30) is stock
    assert "GiB GPU memory is free" in state.graph_draws_off
    assert graph_draws.sampler_of(types.SimpleNamespace(
        _draft_sampler=graph_draws.build(state, worker, stock, free=lambda device: 8 << 30))) is not None


def real_tail_or_none(family, monkeypatch):
    world = StandIns([[3, 1, 4]], [reference([3, 1, 4], 8)])
    worker = dflash_worker(world, 1)
    dflash_step.make_worker_init(lambda self: None, family, TreeToggles(tree_n=4))(worker)
    capture_draft_graphs(worker, monkeypatch)
    return worker, graph_draws.sampler_of(worker)


def test_dflash_tail_memory_estimate():
    """The tail's graph-pool estimate on a DFLASH worker (independent positions: every position's rows at once):
    the row sampler over rows repeated N times does not fit at 8B shapes, the one-read fused draws do."""
    family = adapters.dflash_adapter(adapters.select_adapter())
    shapes = dict(n=16, depth=15, max_bs=32, vocab=151936, logits_bytes=2)
    assert graph_draws.need_bytes(family, **shapes) > 16 * 32 * 15 * 151936 * 2  # > the repeated rows alone
    assert graph_draws.need_bytes(family, **shapes, fused=True) < (128 << 20)  # per-tile maxima, nothing rows x V
    assert graph_draws.need_bytes(family, **shapes, grown=True) >= 4 * 32 * 15 * 151936 * 4


@pytest.mark.parametrize("env, expected", [
    ({"FLASHTREE_TREE_N": "auto"}, ["DFLASH graphs", "verify graphs", "warm-up", "cost table"]),
    ({"FLASHTREE_TREE_N": "8", "FLASHTREE_TREE_BUDGET": "64"}, ["DFLASH graphs", "verify graphs", "warm-up"]),
    ({"FLASHTREE_TREE_N": "8"}, ["DFLASH graphs"]),
], ids=["auto", "budget", "fixed"])
def test_dflash_start_captures_what_narrower_trees_and_the_planner_need(env, expected, monkeypatch):
    """DFLASH's init_cuda_graphs as the plugin wraps it, as DSPARK's: after DFLASH's own graphs, trees narrower than
    the block (the planner's menu, a budget) get their target verify graphs and the kernels' warm-up, and the planner
    its measured cost table; trees at the block's width need none of them."""
    from flashtree.patches import checks, planning, verify_widths, warmup
    from flashtree.patches.toggles import read_toggles

    calls = []
    monkeypatch.setattr(checks, "at_init_cuda_graphs", lambda *a: None)
    monkeypatch.setattr(verify_widths, "capture", lambda run, worker: calls.append("verify graphs"))
    monkeypatch.setattr(warmup, "limits", lambda run, worker: ())
    monkeypatch.setattr(warmup, "warm", lambda run, worker: calls.append("warm-up") or [])
    monkeypatch.setattr(planning, "measure", lambda run, worker: calls.append("cost table"))
    toggles = read_toggles(env)
    patch = next(p for p in dflash_step.patches(adapters.select_adapter(), toggles) if p.name == "init_cuda_graphs")
    init_cuda_graphs = patch.make(lambda worker: calls.append("DFLASH graphs"))
    run = types.SimpleNamespace(plan=types.SimpleNamespace(adapter=None, page_size=1), draft_rows=None,
                                planner=object() if toggles.planned else None)
    init_cuda_graphs(types.SimpleNamespace(_flashtree=run))
    assert calls == expected


@pytest.mark.parametrize("block", [4, W])
def test_dflash_auto_depth_is_the_block_the_draft_proposes(family, block):
    """FLASHTREE_TREE_N=auto takes the tree depth from the DFLASH draft checkpoint: its `block_size` counts the anchor,
    so a draft trained on 4-token blocks plans trees of depth 3 in the 6-token window (a depth-4 tree would grow into
    a mask position the draft never learnt), and one trained on the window's own block the window's K."""
    from flashtree.patches.toggles import AUTO_N

    world = StandIns([[3, 1, 4]], [reference([3, 1, 4], 4)], 1)
    worker = dflash_worker(world, bs=1)
    worker.draft_model_runner.model_config = types.SimpleNamespace(hf_config={
        "num_hidden_layers": 1, "block_size": block, "dflash_config": {"block_size": block, "num_target_layers": 2}})
    assert family.draft_block_size(worker) == block - 1
    dflash_step.make_worker_init(lambda self: None, family, TreeToggles(tree_n=AUTO_N, tree_policy="best-first"))(worker)
    assert worker._flashtree.plan.depth == block - 1


def test_dflash_planned_trees_commit_the_sequential_greedy_decode(family):
    """FLASHTREE_TREE_N=auto on a DFLASH server: the planner's menu comes from DFLASH's block, and the shape a cost
    table makes cheapest (here a tree of the first of the step's N draws) serves every step; its commits are the
    sequential greedy decode token for token (run checks them)."""
    from flashtree.patches.toggles import AUTO_N

    def costs(shape, bs):  # the chain dearest, then the smallest tree (fewest candidates, narrowest) cheapest
        return 100.0 if shape.is_chain else shape.n + shape.width / 100

    accepts, state, _gen = run(family, n=AUTO_N, steps=8, costs=costs)
    cheapest = min((s for s in state.planner.shapes if not s.is_chain), key=lambda s: costs(s, 3))
    assert cheapest.n < state.plan.toggles.tree_n or cheapest.width < W, state.planner.shapes
    assert state.steps == 8 and state.planner.planner.summary()[0]["shape"] == cheapest.label()
    assert sum(accepts.values()) == 8 * 3 and max(accepts) >= 2, accepts  # every request committed, some deep


def planned_best_first(family, monkeypatch, cheapest: str, steps: int, credits: list | None = None, prompts=None,
                       graph: bool = False):
    """run() under FLASHTREE_TREE_N=auto with best-first, depth 3 in the 6-token block (the menu: the chain, best-first
    W = 4 and 6), the shape labelled `cheapest` made cheapest, every step credited (into `credits`, if given), graph:
    with FLASHTREE_GRAPH_DRAWS (the tail grows the widest tree and writes the greedy block). DFLASH's
    own step (the planner's chain) runs as its greedy block, N = 1 (test_dflash_n1_equals_dflash_chain_accept): its
    real decode needs a GPU server's state."""
    from flashtree.patches import decode, planning
    from flashtree.patches.toggles import AUTO_N

    monkeypatch.setattr(planning, "CREDIT_EVERY", {"tree": 1, "chain": 1})
    if credits is not None:
        defer = planning.ServerPlanner._defer
        monkeypatch.setattr(planning.ServerPlanner, "_defer", lambda self, c: credits.append(c) or defer(self, c))
    chain: dict = {}

    def dflash_chain(self, batch, on_publish, *args, **kwargs):
        state = chain.setdefault("state", create_state(family, TreeToggles(tree_n=1, seed=5), self))
        return decode.tree_step(state, self, batch, on_publish)

    monkeypatch.setattr(resolve(DFLASH_WORKER), "forward_batch_generation", dflash_chain)
    return run(family, n=AUTO_N, steps=steps, policy="best-first", depth=3, prompts=prompts,
               costs=lambda shape, bs: 1.0 if shape.label() == cheapest else 50.0,
               graphs=(4, monkeypatch) if graph else None)


@pytest.mark.parametrize("cheapest, graph", [("best-first,W=4", False), ("best-first,W=4", True),
                                             ("chain(W=6)", False)], ids=["tree", "tree-graph-draws", "chain"])
def test_dflash_planned_best_first_commits_the_sequential_greedy_decode(family, monkeypatch, cheapest, graph):
    """FLASHTREE_TREE_N=auto with FLASHTREE_TREE_POLICY=best-first on DFLASH: the menu is the chain and best-first
    widths; the shape a cost table makes cheapest serves every step (a tree: the first 3 nodes of the widest tree,
    which every credited step credits every width from; the chain: DFLASH's own step), and the commits are the
    sequential greedy decode token for token (run checks them)."""
    accepts, state, _gen = planned_best_first(family, monkeypatch, cheapest, steps=6, graph=graph)
    planner = state.planner
    assert planner.labels() == ["chain(W=6)", "best-first,W=4", "best-first,W=6"]
    assert planner.planner.summary() == [{"bs": 3, "shape": cheapest, "steps": 6}]
    assert sum(accepts.values()) == 6 * 3 and max(accepts) >= 2, accepts
    counts = planner.planner.acceptance.count
    assert planner.credited >= 4
    if cheapest.startswith("chain"):
        assert state.steps == 0 and state.fallbacks == {"planned-chain": 6}
        assert counts[planner.chain] > counts[planner.trees[0]] == counts[planner.trees[1]]  # the chain alone
    else:
        assert state.steps == 6 and state.draw_paths == {"graph" if graph else "eager": 6} and not state.fallbacks
        # a W = 4 step verifies the widest tree's first 3 nodes: exact credits for W = 4 and the chain, none for the
        # W = 6 tree it does not hold (its commit would be only a lower bound there)
        prior = planner.planner.acceptance.prior_weight
        assert counts[planner.chain] == counts[planner.trees[0]] > counts[planner.trees[1]] == prior, counts


def test_dflash_planner_explores_the_widest_tree_and_credits_every_width(family, monkeypatch):
    """Every EXPLORE_EVERY-th decision runs the menu's widest tree (best-first W = 6) instead of the choice (W = 4), and
    its credit reaches every width; the commits stay the sequential greedy decode (run checks them)."""
    from flashtree.patches import planning

    monkeypatch.setattr(planning, "EXPLORE_EVERY", 2)
    accepts, state, _gen = planned_best_first(family, monkeypatch, "best-first,W=4", steps=6)
    planner = state.planner
    assert planner.explored == 3 and planner.planner.summary() == [{"bs": 3, "shape": "best-first,W=4", "steps": 3}]
    assert sum(accepts.values()) == 6 * 3 and state.steps == 6
    counts, prior = planner.planner.acceptance.count, planner.planner.acceptance.prior_weight
    # the last step's credit is applied at the next decision: two of the three exploring steps' credits have landed
    assert counts[planner.trees[1]] == prior + 2 * 3, counts
    assert counts[planner.chain] == counts[planner.trees[0]] == prior + 5 * 3, counts


def test_dflash_best_first_credits_are_what_each_width_commits(family, monkeypatch):
    """One planned best-first step at W = 6 credits every width exactly what a fixed best-first server of that width
    (FLASHTREE_TREE_WIDTH) commits from the same state, and the chain what DFLASH's greedy block (N = 1) commits."""
    prompts = [[20, 26, 9], [29, 28, 22], [16, 18, 4, 12, 14]]  # the widths and the chain commit differently here
    credits: list = []
    planned_best_first(family, monkeypatch, "best-first,W=6", steps=1, credits=credits, prompts=prompts)
    [credit] = credits
    got = {s.label(): credit[s].tolist() for s in credit}

    def commits(**kw):  # per request, the tokens one step committed
        return [len(g) - 1 for g in run(family, steps=1, depth=3, prompts=prompts, **kw)[2]]

    want = {"best-first,W=6": commits(n=4, policy="best-first"), "chain(W=6)": commits(n=1),
            "best-first,W=4": commits(n=4, policy="best-first", width=4)}
    assert got == want
    assert len({tuple(v) for v in want.values()}) == 3, want  # not vacuous: each shape commits its own
