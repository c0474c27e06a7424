"""FLASHTREE_GRAPH_DRAWS: the N draft draws in DSPARK's draft graph tail (flashtree/patches/graph_draws.py), run
eagerly on CPU with the release's real DsparkDraftSampler, the real VanillaMarkov head, sglang's real capture-hook
factory and the real DSparkWorkerV2.init_cuda_graphs; the tree step's use of them is in test_decode_cpu.py."""

from __future__ import annotations

import contextlib
import logging
import types
from collections import Counter

import pytest
import torch

from draft_sampler_cpu import TinyDraft, dspark_outputs, sampling_info, stock_sampler, tail_args
from flashtree.patches import adapters, graph_draws
from flashtree.patches.decode import create_state, make_worker_init
from flashtree.patches.toggles import TreeToggles

V, K = 12, 3


@pytest.fixture(autouse=True)
def _cpu_torch_capture_query(monkeypatch):
    # DSPARK 0.5.23's sampler asks torch.cuda whether a capture is running before it sizes its step logits; a CPU
    # torch build raises there instead of answering False.
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)


def head(std: float = 0.7, vocab: int = V, seed: int = 0):
    from sglang.srt.models.dspark import VanillaMarkov

    torch.manual_seed(seed)
    h = VanillaMarkov(vocab_size=vocab, markov_rank=4)
    torch.nn.init.normal_(h.markov_w2.weight, std=std)  # a real bigram bias: each step depends on the token before
    return h


def flashtree_sampler(model, *, n: int, max_bs: int, temperature: float = 1.0, confidence_fn=None, fused=False):
    adapter = adapters.select_adapter()
    stock = stock_sampler(model, gamma=K, max_bs=max_bs, confidence_fn=confidence_fn)
    weights = adapter.vanilla_markov_weights(model.markov_head) if fused else None
    assert (weights is not None) == fused
    draws = graph_draws.GraphDraws(
        adapter=adapter, n=n, depth=K, max_bs=max_bs, vocab=V, temperature=temperature, device="cpu", fused=weights
    )
    return graph_draws.wrap(stock, draws), draws


def confidence_fn(*, draft_hidden, anchor_tokens, draft_tokens, confidence_tap):
    return draft_hidden.float().mean(-1) + draft_tokens.float() + anchor_tokens.float().view(-1, 1)


def greedy_blocks(markov_head, base, anchor):
    argmax = lambda logits: logits.argmax(dim=-1)  # noqa: E731
    return adapters.select_adapter().markov_draws(markov_head, base, anchor, None, 1, argmax)[:, 0]


@pytest.mark.parametrize("fused", [False, True])
def test_dspark_outputs_unchanged_and_candidate_zero_is_greedy(sglang_release, fused):
    """(a) Everything DSPARK's own decode reads after the tail equals the stock sampler's on the same inputs and the
    same noise (DSPARK draws first); the base logits are computed once. (b) Candidate 0 of each request is the greedy
    block; DSPARK's own greedy rows (top_k = 1) drew the same block. Both with the Markov head's torch steps and with
    the fused Markov draws (FLASHTREE_FUSED_SAMPLER)."""
    bs, n, max_bs = 5, 4, 8
    h = head()
    base = torch.randn(bs, K, V) * 2
    anchor = torch.randint(0, V, (bs,))
    greedy = torch.tensor([True, False, True, False, False])
    info = sampling_info(greedy)
    conf = confidence_fn if sglang_release != "0.5.23" else None

    stock_model, ours_model = TinyDraft(h, V), TinyDraft(h, V)
    stock = stock_sampler(stock_model, gamma=K, max_bs=max_bs, confidence_fn=conf)
    ours, draws = flashtree_sampler(ours_model, n=n, max_bs=max_bs, confidence_fn=conf, fused=fused)
    from sglang.srt.speculative.dspark_components.dspark_draft_sampler import DsparkDraftSampler

    assert isinstance(ours, DsparkDraftSampler) and type(ours) is not DsparkDraftSampler
    hidden, ids = tail_args(stock, base, anchor)
    for sampler, model in ((stock, stock_model), (ours, ours_model)):
        sampler.stage_sampling_params(bs=bs, sampling_info=info)
        torch.manual_seed(7)
        sampler(hidden, ids)
    want, got = dspark_outputs(stock, bs), dspark_outputs(ours, bs)
    assert set(want) == set(got) and "out" in want
    for name in want:
        assert torch.equal(want[name], got[name]), name
    assert stock_model.base_logits_calls == ours_model.base_logits_calls == 1
    assert ours.model is ours_model  # the tap is gone after the call

    cands = draws.read(bs)
    assert cands.shape == (bs, n, K) and cands.dtype == torch.int64
    assert torch.equal(cands[:, 0], greedy_blocks(h, base, anchor))
    dspark_block = got["out"].view(bs, K)
    assert torch.equal(dspark_block[greedy], cands[greedy, 0])
    assert (cands[:, 1:] != cands[:, :1]).any(dim=-1).any()  # the draws are not all the greedy block


@pytest.mark.parametrize("fused", [False, True])
def test_each_graph_size_draws_its_own_candidate_count(fused):
    """With a per-batch-size candidate count (FLASHTREE_TREE_BUDGET), the tail captured for bs requests draws n_for(bs)
    candidates (candidate 0 still the greedy block), and a batch replaying a larger graph reads what that graph drew."""
    h = head()
    adapter = adapters.select_adapter()
    stock = stock_sampler(TinyDraft(h, V), gamma=K, max_bs=4)
    draws = graph_draws.GraphDraws(
        adapter=adapter, n=6, depth=K, max_bs=4, vocab=V, temperature=1.0, device="cpu",
        fused=adapter.vanilla_markov_weights(h) if fused else None, n_for=lambda bs: 6 if bs <= 2 else 3,
    )
    ours = graph_draws.wrap(stock, draws)
    torch.manual_seed(3)
    for bs in (4, 2):  # "capture" at sizes 2 and 4
        base, anchor = torch.randn(bs, K, V) * 2, torch.randint(0, V, (bs,))
        ours.stage_sampling_params(bs=bs, sampling_info=None)
        ours(*tail_args(ours, base, anchor))
        cands = draws.read(bs)
        assert cands.shape == (bs, 6 if bs == 2 else 3, K)
        assert torch.equal(cands[:, 0], greedy_blocks(h, base, anchor))
    assert draws.drawn_sizes == {4: 3, 2: 6}
    assert draws.read(3).shape == (3, 3, K)  # 3 requests replay the graph of 4


def chi2_critical_001(dof: int) -> float:
    z = 3.0902
    return dof * (1 - 2 / (9 * dof) + z * (2 / (9 * dof)) ** 0.5) ** 3


def chi2(counts: Counter, expected: dict, total: int) -> tuple[float, int]:
    cells = [c for c, p in expected.items() if p * total >= 5]
    rest = 1.0 - sum(expected[c] for c in cells)
    stat = sum((counts.get(c, 0) - total * expected[c]) ** 2 / (total * expected[c]) for c in cells)
    other = total - sum(counts.get(c, 0) for c in cells)
    if rest * total > 0:
        stat += (other - total * rest) ** 2 / (total * rest)
    return stat, len(cells)


@pytest.mark.parametrize("fused", [False, True])
def test_draws_follow_the_markov_heads_softmax_at_the_draft_temperature(fused):
    """(c) Draws 1..N-1 of the first two steps follow the Markov head's joint two-step distribution at the draft
    temperature, softmax((base_0 + bias(anchor)) / T) x softmax((base_1 + bias(t_0)) / T) (chi-square, p = 0.001),
    independently across the N - 1 draws of a request; every replay redraws."""
    bs, n, temp = 300, 8, 0.7
    h = head(std=0.8)
    ours, draws = flashtree_sampler(TinyDraft(h, V), n=n, max_bs=bs, temperature=temp, fused=fused)
    base = torch.randn(1, K, V).expand(bs, K, V).contiguous()
    anchor = torch.full((bs,), 3, dtype=torch.int64)
    hidden, ids = tail_args(ours, base, anchor)
    ours.stage_sampling_params(bs=bs, sampling_info=None)
    torch.manual_seed(11)
    ours(hidden, ids)
    first = draws.read(bs).clone()  # a view of the buffer the next replay rewrites
    ours(hidden, ids)  # a second replay redraws
    assert not torch.equal(first, draws.read(bs))

    with torch.no_grad():
        bias = lambda prev: h.markov_w2(h.markov_w1(torch.tensor([prev]))).view(-1)  # noqa: E731
        p0 = ((base[0, 0] + bias(3)) / temp).softmax(-1)
        expected = {}
        for t0 in range(V):
            p1 = ((base[0, 1] + bias(t0)) / temp).softmax(-1)
            for t1 in range(V):
                expected[(t0, t1)] = float(p0[t0] * p1[t1])
    samples = first[:, 1:, :2].reshape(-1, 2).tolist()
    counts = Counter(map(tuple, samples))
    stat, cells = chi2(counts, expected, len(samples))
    assert cells >= 10 and stat < chi2_critical_001(cells), (stat, cells)

    # Independence across the draws of one request: (draw 1, draw 2) first tokens against the product.
    pairs = Counter(zip(first[:, 1, 0].tolist(), first[:, 2, 0].tolist()))
    joint = {(a, b): float(p0[a] * p0[b]) for a in range(V) for b in range(V)}
    stat, cells = chi2(pairs, joint, bs)
    assert stat < chi2_critical_001(cells), (stat, cells)
    # Distinct draws: most requests' N - 1 draws are not one block repeated.
    distinct = torch.tensor([len({tuple(r) for r in first[b, 1:].tolist()}) for b in range(bs)])
    assert (distinct > 1).float().mean() > 0.95


def test_buffer_layout_the_tree_step_reads():
    """(d) `out` is (max_bs, N, K) int64, request-major (request b's candidates in out[b]); a padded replay writes
    rows [:bs] only, `read` is a view of rows [:bs] of the last tail run (no copy per step)."""
    bs, n, max_bs = 3, 5, 6
    h = head()
    ours, draws = flashtree_sampler(TinyDraft(h, V), n=n, max_bs=max_bs, temperature=1e-3)
    assert draws.out.shape == (max_bs, n, K) and draws.out.dtype == torch.int64
    assert draws.noise.shape == (max_bs * n, V) and draws.noise.dtype == torch.float32
    base = torch.randn(bs, K, V) * 4
    anchor = torch.tensor([1, 5, 9])
    hidden, ids = tail_args(ours, base, anchor)
    ours.stage_sampling_params(bs=bs, sampling_info=None)
    draws.out.fill_(-7)
    ours(hidden, ids)
    assert (draws.out[bs:] == -7).all()
    want = greedy_blocks(h, base, anchor)
    read = draws.read(bs)
    for b in range(bs):  # at T = 1e-3 every draw is the request's greedy block: the rows belong to request b
        assert (read[b] == want[b]).all()
    assert read.data_ptr() == draws.out.data_ptr() and read.shape == (bs, n, K)


def test_release_markov_draws_equal_sample_block_on_repeated_rows():
    """The release's Markov draw (0.5.23: init_state / step_bias per step) equals the head's own block sampler over
    bs*N repeated rows with the same step sampler (0.5.17 / 0.5.20: it is that call)."""
    from sglang.srt.models import dspark

    adapter = adapters.select_adapter()
    h = head()
    bs, n = 3, 4
    base = torch.randn(bs, K, V)
    anchor = torch.randint(0, V, (bs,))
    g = torch.Generator().manual_seed(2)
    noise = torch.rand(K, bs * n, V, generator=g)
    calls = []

    def sampler(step_logits):
        calls.append(step_logits)
        return (step_logits + noise[len(calls) - 1] * 3).argmax(-1)

    got = adapter.markov_draws(h, base, anchor, None, n, sampler)
    seen = list(calls)
    calls.clear()
    if hasattr(h, "sample_block"):
        want, _ = h.sample_block(base.repeat_interleave(n, 0), first_prev_tokens=anchor.repeat_interleave(n, 0),
                                 hidden_states=None, sampler=lambda logits, j: sampler(logits))
    else:  # 0.5.23: DSPARK's own eager markov block with our sampler per step
        prev, out = anchor.repeat_interleave(n, 0), []
        for j in range(K):
            bias, _ = h.step_bias(prev, hidden_states=None, state=None)
            prev = sampler(base.repeat_interleave(n, 0)[:, j] + bias)
            out.append(prev)
        want = torch.stack(out, 1)
    assert torch.equal(got, want.view(bs, n, K))
    assert all(torch.allclose(a, b) for a, b in zip(seen, calls))
    del dspark


# ---- building the sampler at init_cuda_graphs -----------------------------------------------------------------
def tree_state(n: int = 4, **toggles):
    worker = types.SimpleNamespace(verify_num_draft_tokens=K + 1, device="cpu",
                                   model_runner=types.SimpleNamespace(page_size=1, token_to_kv_pool=None))
    return create_state(adapters.select_adapter(), TreeToggles(tree_n=n, graph_draws=True, **toggles), worker)


def draft_worker(model):
    return types.SimpleNamespace(device="cpu", _proposer=types.SimpleNamespace(draft_model=model))


def test_build_wraps_dspark_sampler_or_keeps_it_with_a_reason(caplog):
    h = head()
    state = tree_state(n=4, draft_temperature=0.5)
    worker = draft_worker(TinyDraft(h, V))
    stock = stock_sampler(worker._proposer.draft_model, gamma=K, max_bs=8)
    built = graph_draws.build(state, worker, stock)
    assert graph_draws.sampler_of(types.SimpleNamespace(_draft_sampler=built)) is built
    assert state.graph_draws is built.flashtree_draws and state.graph_draws_off is None
    assert built.out is stock.out  # DSPARK's buffers are shared, not copied
    d = state.graph_draws
    assert d.out.shape == (8, 4, K) and torch.allclose(d.inv_temperature, torch.tensor(2.0))
    assert d.greedy.view(8, 4)[:, 0].all() and not d.greedy.view(8, 4)[:, 1:].any()

    assert d.fused is None  # FLASHTREE_FUSED_SAMPLER off: the head's torch steps
    fused = graph_draws.build(tree_state(fused_sampler=True), worker, stock).flashtree_draws
    assert fused.fused is not None and fused.fused[1] is h.markov_w2.weight and not hasattr(fused, "noise")

    # Not enough free memory: DSPARK's sampler is kept, the draws stay eager, the reason is logged.
    state = tree_state()
    with caplog.at_level(logging.WARNING, logger="flashtree.patches"):
        kept = graph_draws.build(state, worker, stock, free=lambda device: 1 << 30)
    assert kept is stock and state.graph_draws is None
    assert "GiB GPU memory is free" in state.graph_draws_off
    assert any("stay eager" in r.getMessage() and "GiB" in r.getMessage() for r in caplog.records)
    # Enough: wrapped.
    assert graph_draws.sampler_of(types.SimpleNamespace(_draft_sampler=graph_draws.build(
        tree_state(), worker, stock, free=lambda device: 8 << 30))) is not None
    # DSPARK built none (no draft graph / no Markov head / folded proposal off): nothing to fold into.
    state = tree_state()
    assert graph_draws.build(state, worker, None) is None and "built no graph-folded" in state.graph_draws_off


def test_memory_estimate_scales_with_the_release_draw():
    adapter = adapters.select_adapter()
    small = graph_draws.need_bytes(adapter, n=8, depth=8, max_bs=32, vocab=49152, logits_bytes=2)
    big = graph_draws.need_bytes(adapter, n=8, depth=8, max_bs=512, vocab=151936, logits_bytes=2)
    assert small < (1 << 30) < big  # SmolLM2 at max_bs 32 fits easily; a 150k vocabulary at 512 requests does not
    assert small >= 32 * 8 * 49152 * 4  # at least the noise buffer
    fused = graph_draws.need_bytes(adapter, n=8, depth=8, max_bs=512, vocab=151936, logits_bytes=2, fused=True)
    assert fused < (64 << 20)  # the fused draws keep nothing rows x V


def test_fused_draws_only_for_the_vanilla_bias():
    """The fused Markov draws compute w2 @ w1[prev]: sglang's VanillaMarkov qualifies; a head whose step bias
    differs (the gated head, a subclass overriding the projection) keeps the head's own torch steps."""
    from sglang.srt.models import dspark

    adapter = adapters.select_adapter()
    assert adapter.vanilla_markov_weights(head()) is not None
    gated = dspark.GatedMarkovHead(vocab_size=V, markov_rank=4, hidden_size=8)
    assert adapter.vanilla_markov_weights(gated) is None

    class Scaled(dspark.VanillaMarkov):
        def project_bias(self, latent):
            return 2 * super().project_bias(latent)

    assert adapter.vanilla_markov_weights(Scaled(vocab_size=V, markov_rank=4)) is None


def fake_worker_for_init_cuda_graphs(stock, monkeypatch):
    """What DSparkWorkerV2.init_cuda_graphs touches, around flashtree's wrapped `_maybe_build_draft_sampler`."""
    from sglang.srt.speculative.dspark_components import dspark_worker_v2 as mod

    if hasattr(mod, "draft_pp_context"):
        monkeypatch.setattr(mod, "draft_pp_context", contextlib.nullcontext)
    attached, graphs = [], []
    w = types.SimpleNamespace(
        _decode_graph_allowed=True,
        _hosts_draft=True,
        device="cpu",
        gpu_id=0,
        _draft_sampler=None,
        _draft_context=contextlib.nullcontext,
        _draft_graph_group=None,
        _tp_sync=types.SimpleNamespace(available_memory_gb=lambda *a, **k: 100.0),
        _deferred_commit=lambda: None,
        draft_model_runner=types.SimpleNamespace(capture_tail_hooks=[]),
        _proposer=types.SimpleNamespace(attach_draft_sampler=attached.append, draft_model=stock.model),
        _draft_worker=types.SimpleNamespace(init_cuda_graphs=lambda **kw: graphs.append(kw)),
        _maybe_build_draft_sampler=lambda **kw: graphs.append(("build", kw)) or stock,  # 0.5.20 passes kwargs
    )
    return w, attached, graphs


def test_real_init_cuda_graphs_captures_flashtree_sampler_as_the_tail_hook(monkeypatch):
    """flashtree's worker __init__ wraps `_maybe_build_draft_sampler`; sglang's own init_cuda_graphs then attaches
    flashtree's sampler to the proposer and appends it as the draft graph's tail hook (sglang's hook factory), which
    draws the candidates when the runner calls it with the draft forward's output."""
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

    adapter = adapters.select_adapter()
    h = head()
    stock = stock_sampler(TinyDraft(h, V), gamma=K, max_bs=4)
    stock.out.fill_(-1)
    worker, attached, graphs = fake_worker_for_init_cuda_graphs(stock, monkeypatch)
    worker.verify_num_draft_tokens = K + 1
    worker.model_runner = types.SimpleNamespace(page_size=1, token_to_kv_pool=None)
    init = make_worker_init(lambda self: None, adapter, TreeToggles(tree_n=3, graph_draws=True))
    init(worker)
    state = worker._flashtree
    assert state.graph_draws is None and "not built" in state.graph_draws_off
    DSparkWorkerV2.init_cuda_graphs(worker)
    sampler = worker._draft_sampler
    assert graph_draws.sampler_of(worker) is sampler and attached == [sampler]
    assert [g[0] for g in graphs[:1]] == ["build"] and len(graphs) == 2  # built (release kwargs passed), then captured
    assert state.graph_draws is sampler.flashtree_draws
    (hook,) = worker.draft_model_runner.capture_tail_hooks

    bs = 2
    base, anchor = torch.randn(bs, K, V), torch.tensor([4, 7])
    hidden, ids = tail_args(sampler, base, anchor)
    sampler.stage_sampling_params(bs=bs, sampling_info=None)
    out = LogitsProcessorOutput(next_token_logits=None, hidden_states=hidden)
    hook(None, out, types.SimpleNamespace(input_ids=ids), ids.numel())
    assert state.graph_draws.calls == 1
    assert torch.equal(state.graph_draws.read(bs)[:, 0], greedy_blocks(h, base, anchor))
    # N = 3 without a limit: a lean tail, DSPARK's proposal left out (its buffer keeps what it held)
    assert state.graph_draws.lean_bs == 4 and (sampler.out == -1).all()


def test_draft_forward_reads_the_buffer_after_a_replay_and_computes_base_logits_otherwise():
    """The adapter's draft forward hands flashtree's sampler to `_run_forward`: after a graph replay it returns the
    tail's candidates (no base logits computed); after an eager forward (the tail never ran) base logits and hidden
    for the eager draws."""
    adapter = adapters.select_adapter()
    h = head()
    model = TinyDraft(h, V, sample_from_anchor=True)
    sampler, draws = flashtree_sampler(model, n=3, max_bs=4)
    bs = 2
    base, anchor = torch.randn(bs, K, V), torch.tensor([2, 8])
    seen = []

    def _run_forward(*, draft_sampler, bs, draft_input, **kw):
        seen.append(draft_sampler)
        hidden, ids = tail_args(sampler, base[:bs], anchor[:bs])
        graph = bs <= 1  # stand-in: graphs captured for one request only
        if graph:
            if draft_sampler is not None:
                draft_sampler.stage_sampling_params(bs=bs, sampling_info=None)
            worker._draft_sampler(hidden, ids)  # the replay runs the tail captured at init_cuda_graphs
        block = ids.view(bs, -1)
        return types.SimpleNamespace(draft_block_ids=block, raw_hidden=hidden, draft_hidden_3d=hidden.view(bs, K, -1),
                                     can_run_graph=graph)

    worker = standin_worker(sampler, model, _run_forward)
    window = types.SimpleNamespace(native=None)
    batch = types.SimpleNamespace(sampling_info=None)
    draft_input = types.SimpleNamespace(bonus_tokens=anchor)

    eager = adapter.draft_forward(worker, batch, draft_input, window, bs, sampler=sampler, graph_candidates=draws.drawn)
    assert seen == [sampler] and eager.candidates is None and draws.calls == 0
    assert torch.allclose(eager.base_logits, base) and torch.equal(eager.anchor, anchor)
    calls = model.base_logits_calls
    one = adapter.draft_forward(worker, batch, draft_input, window, 1, sampler=sampler, graph_candidates=draws.drawn)
    assert draws.calls == 1 and one.base_logits is None and one.candidates.shape == (1, 3, K)
    assert model.base_logits_calls == calls + 1  # DSPARK's tail's only: the tree step computed none
    assert torch.equal(one.anchor, anchor[:1])

    worker._draft_sampler = stock_sampler(model, gamma=K, max_bs=4)  # graph draws off: DSPARK's sampler is not passed
    off = adapter.draft_forward(worker, batch, draft_input, window, 1, sampler=graph_draws.sampler_of(worker))
    assert seen[-1] is None and off.candidates is None and off.base_logits is not None


def test_flashmap_draft_keeps_its_own_draws():
    state = tree_state()
    model = TinyDraft(head(), V)
    from flashtree.patches import flashmap_draft

    model._draft_tree = flashmap_draft.NoiseDraws.__new__(flashmap_draft.NoiseDraws)
    stock = stock_sampler(model, gamma=K, max_bs=2)
    assert graph_draws.build(state, draft_worker(model), stock) is stock
    assert "FlashMap" in state.graph_draws_off


@pytest.mark.parametrize("value,want", [("1", True), ("0", False), ("off", False)])
def test_toggle(value, want):
    from flashtree.patches import read_toggles

    assert read_toggles({"FLASHTREE_TREE_N": "4", "FLASHTREE_GRAPH_DRAWS": value}).graph_draws is want
    assert read_toggles({"FLASHTREE_TREE_N": "4"}).graph_draws is True  # on by default
    with pytest.raises(SystemExit, match="FLASHTREE_GRAPH_DRAWS is set but FLASHTREE_TREE_N"):
        read_toggles({"FLASHTREE_GRAPH_DRAWS": value})
    with pytest.raises(SystemExit, match="unknown toggle FLASHTREE_GRAPH_DRAW"):
        read_toggles({"FLASHTREE_TREE_N": "4", "FLASHTREE_GRAPH_DRAW": "1"})


# ---- FLASHTREE_TREE_MAX_BS: no draws for the graphs only chain steps replay ------------------------------------
SIZES = [1, 2, 4, 8, 12, 16]  # configured decode graph sizes (--cuda-graph-bs)


def test_max_bs_sizes_the_draw_buffers_to_the_limit():
    """Buffers for the graph size a batch of FLASHTREE_TREE_MAX_BS requests replays (the smallest configured size >=
    the limit; the limit itself when the sizes are unknown), at most DSPARK's max graph bs; without a limit, or with
    one at or above the max, for every graph as before. The smaller buffers are what the memory check counts: with
    free memory between the two estimates, the limited build folds the draws and the unlimited one stays eager."""
    worker = draft_worker(TinyDraft(head(), V))
    stock = stock_sampler(worker._proposer.draft_model, gamma=K, max_bs=16)

    def built(limit, sizes=SIZES, free=graph_draws.free_bytes):
        state = tree_state(n=4, tree_max_bs=limit)
        sampler = graph_draws.build(state, worker, stock, free=free, graph_sizes=lambda: sizes)
        return state.graph_draws, sampler

    for limit, rows in [(5, 8), (8, 8), (9, 12), (12, 12), (1, 1)]:
        d, _ = built(limit)
        assert (d.max_bs, d.limit) == (rows, limit), limit
        assert d.out.shape == (rows, 4, K) and d.noise.shape == (rows * 4, V) and d.greedy.shape == (rows * 4,)
    assert built(5, sizes=None)[0].max_bs == 5  # sizes unknown (no server context): the limit itself
    for limit in (0, 13, 16, 65536):  # no limit, or every graph a tree step can replay is the max: all, as before
        d, _ = built(limit)
        assert (d.max_bs, d.limit) == (16, 0), limit

    adapter = adapters.select_adapter()
    need = {bs: graph_draws.need_bytes(adapter, n=4, depth=K, max_bs=bs, vocab=V, logits_bytes=4) for bs in (8, 16)}
    assert need[8] < need[16]
    between = lambda device: graph_draws.CAPTURE_HEADROOM_BYTES + (need[8] + need[16]) // 2  # noqa: E731
    d, sampler = built(5, free=between)
    assert d is not None and graph_draws.sampler_of(types.SimpleNamespace(_draft_sampler=sampler)) is sampler
    d, sampler = built(0, free=between)
    assert d is None and sampler is stock


@pytest.mark.parametrize("sizes,rows,covered", [(None, 3, [1, 2]), ([1, 2, 4, 8], 4, [1, 2, 3, 4])],
                         ids=["sizes-unknown", "sizes-configured"])
def test_max_bs_tail_skips_the_draws_above_the_buffer(sizes, rows, covered):
    """FLASHTREE_TREE_MAX_BS=3, graphs captured for 8, 4, 2, 1 (largest first, as sglang's runner does): a tail for
    more requests than the buffers hold runs DSPARK's part only (everything DSPARK's own decode reads equals the
    stock sampler's on the same inputs and noise) and draws nothing; smaller tails draw (candidate 0 the greedy
    block), after DSPARK's part where chain steps may replay them (4 requests), without it (lean) up to the limit. `covers(bs)`: whether the graph a batch of bs replays (the next captured size) drew: with unknown sizes a
    batch of 3 replays the graph for 4, captured without draws (the tree step draws eagerly); with the configured
    sizes the buffers hold 4 and that graph drew."""
    h = head()
    stock_model, ours_model = TinyDraft(h, V), TinyDraft(h, V)
    stock = stock_sampler(stock_model, gamma=K, max_bs=8)
    state = tree_state(n=3, tree_max_bs=3)
    ours = graph_draws.build(state, draft_worker(ours_model), stock_sampler(ours_model, gamma=K, max_bs=8),
                             graph_sizes=lambda: sizes)
    draws = state.graph_draws
    assert draws.max_bs == rows and draws.limit == 3 and draws.lean_bs == 3
    for bs in (8, 4, 2, 1):
        base, anchor = torch.randn(bs, K, V) * 2, torch.randint(0, V, (bs,))
        hidden, ids = tail_args(stock, base, anchor)
        draws.out.fill_(-7)
        ours.out.fill_(-5)
        for sampler in (stock, ours):
            sampler.stage_sampling_params(bs=bs, sampling_info=None)
            torch.manual_seed(bs)
            sampler(hidden, ids)
        want, got = dspark_outputs(stock, bs), dspark_outputs(ours, bs)
        if bs <= 3:  # lean: DSPARK's proposal left out
            assert (ours.out == -5).all(), bs
        else:
            assert set(want) == set(got) and all(torch.equal(want[k], got[k]) for k in want), bs
        if bs <= rows:
            assert torch.equal(draws.read(bs)[:, 0], greedy_blocks(h, base, anchor)), bs
        else:
            assert (draws.out == -7).all(), bs  # nothing drawn
    assert set(draws.drawn_sizes) == {s for s in (8, 4, 2, 1) if s <= rows} and draws.calls == len(draws.drawn_sizes)
    assert draws.skipped_sizes == {s for s in (8, 4, 2, 1) if s > rows} and draws.skips == len(draws.skipped_sizes)
    assert [bs for bs in range(1, 10) if draws.covers(bs)] == covered
    assert stock_model.base_logits_calls == ours_model.base_logits_calls == 4  # once per tail (DSPARK's or lean)


def test_without_a_limit_a_tail_above_the_buffer_still_fails():
    draws = graph_draws.GraphDraws(adapter=adapters.select_adapter(), n=2, depth=K, max_bs=2, vocab=V, temperature=1.0,
                                   device="cpu")
    ours = graph_draws.wrap(stock_sampler(TinyDraft(head(), V), gamma=K, max_bs=4), draws)
    assert draws.limit == 0 and all(draws.covers(bs) for bs in (1, 2, 3))
    hidden, ids = tail_args(ours, torch.randn(3, K, V), torch.tensor([1, 2, 3]))
    ours.stage_sampling_params(bs=3, sampling_info=None)
    with pytest.raises(RuntimeError, match="ran for 3 requests, above its 2-row buffer"):
        ours(hidden, ids)


def test_max_bs_draft_forward_draws_eagerly_when_the_replayed_graph_has_no_draws():
    """The adapter's draft forward with FLASHTREE_TREE_MAX_BS=3 (sizes unknown: buffers for 3) over graphs for
    1, 2, 4, 8 (a replay pads the batch to the next size and runs that graph's tail): a batch of 2 reads the tail's
    candidates; a batch of 3 replays the graph for 4, which has no draws, and gets base logits for the eager draws."""
    adapter = adapters.select_adapter()
    h = head()
    model = TinyDraft(h, V, sample_from_anchor=True)
    state = tree_state(n=3, tree_max_bs=3)
    sampler = graph_draws.build(state, draft_worker(model), stock_sampler(model, gamma=K, max_bs=8),
                                graph_sizes=lambda: None)
    draws = state.graph_draws
    graphs = [1, 2, 4, 8]
    base, anchor = torch.randn(8, K, V), torch.randint(0, V, (8,))

    def _run_forward(*, draft_sampler, bs, **kw):
        padded = min(s for s in graphs if s >= bs)
        hidden, ids = tail_args(sampler, base[:padded], anchor[:padded])
        draft_sampler.stage_sampling_params(bs=padded, sampling_info=None)
        draft_sampler(hidden, ids)  # the replay runs the tail captured for `padded` requests
        hidden, ids = hidden.view(padded, K, V)[:bs], ids.view(padded, -1)[:bs]
        return types.SimpleNamespace(draft_block_ids=ids, raw_hidden=hidden.reshape(bs * K, V), draft_hidden_3d=hidden,
                                     can_run_graph=True)

    worker = standin_worker(sampler, model, _run_forward)
    args = (types.SimpleNamespace(sampling_info=None), types.SimpleNamespace(), types.SimpleNamespace(native=None))

    for bs in sorted(graphs, reverse=True):  # capture
        _run_forward(draft_sampler=sampler, bs=bs)
    two = adapter.draft_forward(worker, *args, 2, sampler=sampler, graph_candidates=draws.drawn)
    assert two.base_logits is None and torch.equal(two.candidates[:, 0], greedy_blocks(h, base[:2], anchor[:2]))
    three = adapter.draft_forward(worker, *args, 3, sampler=sampler, graph_candidates=draws.drawn)
    assert three.candidates is None and torch.allclose(three.base_logits, base[:3])
    assert draws.skipped_sizes == {4, 8} and set(draws.drawn_sizes) == {1, 2}


def standin_worker(sampler, model, run_forward):
    """A DSparkWorkerV2 stand-in for the adapter's draft forward: the sampler, the draft model and `_run_forward`."""
    embeds = torch.nn.Embedding(V, 4)
    model.embed_tokens = embeds
    return types.SimpleNamespace(
        device="cpu", _draft_sampler=sampler, _draft_context=contextlib.nullcontext,
        _proposer=types.SimpleNamespace(_run_forward=run_forward, draft_model=model, gamma=K, sample_from_anchor=True),
        target_worker=types.SimpleNamespace(model_runner=types.SimpleNamespace(
            model=types.SimpleNamespace(get_input_embeddings=lambda: embeds))),
    )


# ---- lean tails: the draws without DSPARK's own block proposal -----------------------------------------------------
def test_lean_tails_where_only_tree_steps_replay():
    """Lean tails up to `lean_bs` requests: every graph with N > 1 and no FLASHTREE_TREE_MAX_BS, the graphs of at most
    L requests with a limit L (batches above it, DSPARK's chain steps, replay larger graphs), none with N = 1 (sampled
    batches take DSPARK's chain)."""
    worker = draft_worker(TinyDraft(head(), V))

    def lean_bs(n, **toggles):
        state = tree_state(n=n, **toggles)
        graph_draws.build(state, worker, stock_sampler(worker._proposer.draft_model, gamma=K, max_bs=8),
                          graph_sizes=lambda: [1, 2, 4, 8])
        return state.graph_draws.lean_bs

    assert [lean_bs(4), lean_bs(1), lean_bs(4, tree_max_bs=3), lean_bs(4, tree_max_bs=64)] == [8, 0, 3, 8]


@pytest.mark.parametrize("fused", [False, True])
def test_lean_tail_draws_the_same_candidates_without_dspark_proposal(fused):
    """A lean tail (depth 2 of gamma 3) leaves DSPARK's proposal buffers untouched, computes base logits once, for the
    2 kept positions only, and draws what the full tail draws: the same candidates with the fused draws (their noise
    is flashtree's own state), the greedy block as candidate 0 with the head's torch steps (whose noise DSPARK's
    draws share)."""
    h = head()
    bs, n, depth = 3, 4, 2
    adapter = adapters.select_adapter()
    base, anchor = torch.randn(bs, K, V) * 2, torch.tensor([1, 5, 9])
    rows = []

    class Recording(TinyDraft):
        def compute_base_logits(self, hidden):
            rows.append(hidden.shape[0])
            return super().compute_base_logits(hidden)

    got = {}
    for lean in (False, True):
        model = Recording(h, V)
        draws = graph_draws.GraphDraws(adapter=adapter, n=n, depth=depth, max_bs=4, vocab=V, temperature=1.0,
                                       device="cpu", fused=adapter.vanilla_markov_weights(h) if fused else None,
                                       lean_bs=4 if lean else 0)
        sampler = graph_draws.wrap(stock_sampler(model, gamma=K, max_bs=4), draws)
        sampler.out.fill_(-3)
        sampler.stage_sampling_params(bs=bs, sampling_info=None)
        rows.clear()
        sampler(*tail_args(sampler, base, anchor))
        got[lean] = draws.read(bs)
        if lean:
            assert rows == [bs * depth] and (sampler.out == -3).all()
        else:
            assert rows == [bs * K] and (sampler.out[: bs * K] != -3).all()
    assert got[True].shape == (bs, n, depth)
    assert torch.equal(got[True][:, 0], greedy_blocks(h, base[:, :depth], anchor))
    assert torch.equal(got[True], got[False]) if fused else torch.equal(got[True][:, 0], got[False][:, 0])


@pytest.mark.parametrize("limit", [0, 2])
def test_dspark_steps_propose_eagerly_with_lean_tails(limit):
    """A step that goes to DSPARK's own decode over at most `lean_bs` requests (here DP-attention batches) runs with
    the sampler detached from the worker and its proposer, so DSPARK proposes from the replayed graph's hidden states
    instead of the buffers a lean tail leaves stale; it is attached again afterwards, also when the step raises. With
    FLASHTREE_TREE_MAX_BS=2 the steps above 2 requests (chain steps, replaying graphs whose tail kept DSPARK's
    proposal) keep DSPARK's folded proposal."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from flashtree.patches import decode

    adapter = adapters.select_adapter()
    toggles = TreeToggles(tree_n=4, graph_draws=True, tree_max_bs=limit)
    worker = draft_worker(TinyDraft(head(), V))
    worker.verify_num_draft_tokens, worker.model_runner = K + 1, types.SimpleNamespace(page_size=1)
    worker.target_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(attn_backend=object()))
    worker._flashtree = create_state(adapter, toggles, worker)
    stock = stock_sampler(worker._proposer.draft_model, gamma=K, max_bs=8)
    sampler = graph_draws.build(worker._flashtree, worker, stock, graph_sizes=lambda: [1, 2, 4, 8])
    worker._draft_sampler = worker._proposer._draft_sampler = sampler
    seen = []

    def dspark_decode(self, batch, on_publish, coordination_plan=None):
        seen.append((self._draft_sampler, self._proposer._draft_sampler))
        if batch.fail:
            raise RuntimeError("step failed")
        return "dspark-result"

    forward = decode.make_forward_decode(dspark_decode, adapter, toggles)

    def fwd(worker, batch, on_publish):
        return forward(worker, batch, on_publish, **({"coordination_plan": object()} if batch.dp else {}))

    def batch(bs, dp=True, fail=False):
        return types.SimpleNamespace(forward_mode=ForwardMode.DECODE, seq_lens=torch.zeros(bs, dtype=torch.int64),
                                     sampling_info=None, has_grammar=False, return_logprob=False, fail=fail, dp=dp,
                                     spec_info=None, seq_lens_sum=0)

    assert fwd(worker, batch(1), None) == "dspark-result"
    with pytest.raises(RuntimeError, match="step failed"):
        fwd(worker, batch(1, fail=True), None)
    assert fwd(worker, batch(3), None) == "dspark-result"
    detached, attached = (None, None), (sampler, sampler)
    assert seen == [detached, detached, detached if not limit else attached]
    assert worker._draft_sampler is worker._proposer._draft_sampler is sampler
    if limit:  # a chain step above the limit
        assert fwd(worker, batch(3, dp=False), None) == "dspark-result" and seen[-1] == attached
        assert worker._flashtree.fallbacks == {"dp-attention": 3, "batch-size": 1}



def head_log_q(h, base, anchor, cands):
    """log q (temperature 1) of each candidate token under the vanilla head, recomputed step by step: (bs, N, K)."""
    bs, n, k = cands.shape
    prev = anchor.repeat_interleave(n)
    out = []
    for j in range(k):
        logits = base[:, j].repeat_interleave(n, dim=0) + h.markov_w2(h.markov_w1(prev))
        tok = cands.view(bs * n, k)[:, j]
        out.append(logits.float().log_softmax(-1).gather(1, tok.view(-1, 1)).view(-1))
        prev = tok
    return torch.stack(out, dim=1).view(bs, n, k)


@pytest.mark.parametrize("fused", [False, True])
def test_prob_tail_keeps_each_draws_log_q(fused):
    """FLASHTREE_TREE_POLICY=prob: the tail also keeps each drawn token's log q at temperature 1 under the head (the
    head's own step logits), next to the candidates, for the rows its batch drew: through the head's torch steps and
    through the fused Markov draws."""
    h = head()
    adapter = adapters.select_adapter()
    stock = stock_sampler(TinyDraft(h, V), gamma=K, max_bs=4)
    draws = graph_draws.GraphDraws(adapter=adapter, n=5, depth=K, max_bs=4, vocab=V, temperature=1.0, device="cpu",
                                   policy="prob", fused=adapter.vanilla_markov_weights(h) if fused else None)
    ours = graph_draws.wrap(stock, draws)
    torch.manual_seed(2)
    bs = 3
    base, anchor = torch.randn(bs, K, V) * 2, torch.randint(0, V, (bs,))
    ours.stage_sampling_params(bs=bs, sampling_info=None)
    ours(*tail_args(ours, base, anchor))
    cands, logp = draws.read(bs), draws.logp[:bs]
    assert logp.dtype == torch.float32 and (cands[:, 1:] != cands[:, :1]).any()
    torch.testing.assert_close(logp, head_log_q(h, base, anchor, cands), rtol=0, atol=1e-5)


def test_best_first_tail_grows_the_registered_builders_tree():
    """FLASHTREE_TREE_POLICY=best-first: the tail draws nothing and grows the registered best-first builder's tree
    over the head's conditionals (recomputed here from the head's weights, as the engine's DSPARK drafter gives
    them); the step's narrower trees (a budget) are its first nodes, which equal the builder's at that width."""
    from flashtree.tree import DraftScores, build_tree
    from flashtree.tree.policies.best_first import first_nodes

    h = head()
    adapter = adapters.select_adapter()
    stock = stock_sampler(TinyDraft(h, V), gamma=K, max_bs=4)
    width = 7
    draws = graph_draws.GraphDraws(adapter=adapter, n=1, depth=K, max_bs=4, vocab=V, temperature=1.0, device="cpu",
                                   policy="best-first", grown=adapter.vanilla_markov_weights(h), tree_width=width)
    ours = graph_draws.wrap(stock, draws)
    bs = 3
    torch.manual_seed(4)
    base, anchor = torch.randn(bs, K, V) * 2, torch.randint(0, V, (bs,))
    ours.stage_sampling_params(bs=bs, sampling_info=None)
    ours(*tail_args(ours, base, anchor))

    def step_logprobs(rows, pos, prev):
        return (base[rows, pos.clamp(max=K - 1)] + h.markov_w2(h.markov_w1(prev))).float().log_softmax(-1)

    scores = DraftScores(anchor=anchor, step_logprobs=step_logprobs)
    for w in (width, 4, 2):
        want = build_tree(torch.zeros((bs, 1, K), dtype=torch.long), w, policy="best-first", scores=scores)
        got = first_nodes(draws.read_tree(bs), w)
        for name in ("tokens", "parents", "depth", "valid"):
            assert torch.equal(getattr(got, name), getattr(want, name)), (w, name)
    assert (draws.read_tree(bs).depth > 1).any()  # the tree branches and deepens
