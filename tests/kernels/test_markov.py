import pytest
import torch
import torch.nn.functional as F

from flashtree.sampler.markov import markov_draws_reference, new_state
from flashtree.sampler.triton_markov import markov_draws_fused, markov_draws_gemm, markov_draws_triton

from .common import CUDA, DEV
from .test_sampler import chi2_pvalue


def head_inputs(bs, k, v, rank, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    base = (torch.randn(bs, k, v, generator=g) * 3).to(dtype).to(DEV)
    w1 = torch.randn(v, rank, generator=g).to(dtype).to(DEV)
    w2 = (torch.randn(v, rank, generator=g) / rank**0.5).to(dtype).to(DEV)
    anchor = torch.randint(0, v, (bs,), generator=g).to(DEV)
    return base, anchor, w1, w2


def row_consts(bs, n, temperature, greedy_first=True):
    greedy = torch.zeros(bs, n, dtype=torch.bool)
    greedy[:, 0] = greedy_first
    inv = torch.full((bs * n,), 1.0 / temperature)
    return inv.to(DEV), greedy.view(-1).to(DEV)


def gemm_chunked(*args):  # the GEMM form with several vocabulary chunks and row blocks even at CPU sizes
    return markov_draws_gemm(*args, block_rows=2, block_v=64, chunks=3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("impl", [markov_draws_fused, gemm_chunked])
def test_greedy_rows_equal_the_reference(dtype, impl):
    # (bs, N, K, V, rank): vocabularies that are not a multiple of the tile, several row blocks on CUDA
    shapes = ([(3, 4, 7, 49152, 32), (64, 8, 7, 49152, 32), (1, 8, 15, 151936, 64), (8, 8, 7, 151936, 256)] if CUDA
              else [(3, 2, 4, 700, 8)])
    for i, (bs, n, k, v, rank) in enumerate(shapes):
        base, anchor, w1, w2 = head_inputs(bs, k, v, rank, dtype, seed=i)
        # the anchors as DSPARK's graph tail passes them: column 0 of the (bs, q) input ids, a strided view
        anchor = torch.stack([anchor, torch.zeros_like(anchor)], dim=1)[:, 0]
        inv, greedy = row_consts(bs, n, 0.8)
        greedy[1::3] = True  # more greedy rows beside the sampled ones
        ours = impl(base, anchor, w1, w2, n, inv, greedy, new_state(3, DEV)).cpu()
        ref = markov_draws_reference(base, anchor, w1, w2, n, inv, greedy, new_state(3, DEV)).cpu()
        mask = greedy.view(bs, n).cpu()
        assert torch.equal(ours[mask], ref[mask])
        assert ours.dtype == torch.int64 and ((ours >= 0) & (ours < v)).all()
        # a greedy row is the Markov chain of argmaxes, step by step
        prev, chain = anchor.long(), []
        for j in range(k):
            prev = (base[:, j] + F.linear(F.embedding(prev, w1), w2)).argmax(-1)
            chain.append(prev)
        assert torch.equal(ours[:, 0], torch.stack(chain, 1).cpu())


def test_the_gemm_form_returns_the_drawn_tokens_log_q():
    """log q at temperature 1 of every drawn token (greedy and sampled rows), as the reference computes it from the
    same tokens; the tokens themselves are those of the plain call (the same noise), and the fused form's too."""
    bs, n, k, v, rank = (4, 8, 7, 151936, 256) if CUDA else (3, 4, 3, 500, 16)
    base, anchor, w1, w2 = head_inputs(bs, k, v, rank, torch.float32, seed=9)
    inv, greedy = row_consts(bs, n, 0.7)
    tokens, logp = markov_draws_gemm(base, anchor, w1, w2, n, inv, greedy, new_state(4, DEV), return_logp=True,
                                     block_rows=2, block_v=64, chunks=3)
    assert torch.equal(tokens, gemm_chunked(base, anchor, w1, w2, n, inv, greedy, new_state(4, DEV)))
    assert torch.equal(tokens, markov_draws_fused(base, anchor, w1, w2, n, inv, greedy, new_state(4, DEV)))
    prev, want = anchor.long().repeat_interleave(n), []
    flat = tokens.view(bs * n, k)
    for j in range(k):
        logits = base[:, j].repeat_interleave(n, dim=0) + F.linear(F.embedding(prev, w1), w2)
        want.append(logits.log_softmax(-1).gather(1, flat[:, j : j + 1])[:, 0])
        prev = flat[:, j]
    torch.testing.assert_close(logp.view(bs * n, k), torch.stack(want, 1), rtol=0, atol=1e-4)
    _, ref_logp = markov_draws_reference(base, anchor, w1, w2, n, inv, greedy, new_state(4, DEV), return_logp=True)
    mask = greedy.view(bs, n)
    torch.testing.assert_close(logp[mask], ref_logp[mask], rtol=0, atol=1e-4)  # greedy rows: the same tokens


def test_wide_heads_take_the_gemm_form():
    bs, n, k, v = 2, 2, 2, 300
    for rank, gemm in ((8, False), (128, True)):
        base, anchor, w1, w2 = head_inputs(bs, k, v, rank, torch.float32, seed=rank)
        inv, greedy = row_consts(bs, n, 0.8)
        got = markov_draws_triton(base, anchor, w1, w2, n, inv, greedy, new_state(1, DEV))
        form = markov_draws_gemm if gemm else markov_draws_fused
        assert torch.equal(got, form(base, anchor, w1, w2, n, inv, greedy, new_state(1, DEV)))


def gemm_wide_blocks(*args):  # the GEMM form, few programs for the interpreter's 4096 rows
    return markov_draws_gemm(*args, block_rows=64)


@pytest.mark.parametrize("impl", [markov_draws_fused, gemm_wide_blocks, markov_draws_reference])
def test_sampled_rows_follow_the_heads_softmax(impl):
    v, k, n, temperature = 12, 2, 4096 if not CUDA else 65536, 0.7
    base, anchor, w1, w2 = head_inputs(1, k, v, 4, torch.float32, seed=7)
    inv, greedy = row_consts(1, n, temperature, greedy_first=False)
    state = new_state(11, DEV)
    draws = impl(base, anchor, w1, w2, n, inv, greedy, state)[0].cpu()  # (n, k)
    assert int(state[1]) == 1  # the call advanced the counter: the next call (or graph replay) redraws
    step = lambda j, prev: ((base[0, j] + F.linear(F.embedding(prev, w1), w2)) / temperature).softmax(-1).cpu()
    assert chi2_pvalue(draws[:, 0], step(0, anchor)[0]) > 1e-3
    top = int(draws[:, 0].mode().values)  # step 1 conditioned on the most frequent first token
    after = draws[draws[:, 0] == top, 1]
    assert chi2_pvalue(after, step(1, torch.tensor([top], device=DEV))[0]) > 1e-3
    assert chi2_pvalue(draws[:, 0], step(1, anchor)[0]) < 1e-6  # the test can tell the steps apart
    again = impl(base, anchor, w1, w2, n, inv, greedy, state)[0].cpu()
    assert not torch.equal(again, draws)


@pytest.mark.skipif(not CUDA, reason="graph capture needs a CUDA device")
@pytest.mark.parametrize("impl", [markov_draws_fused, markov_draws_gemm])
def test_graph_replays_redraw(impl):
    base, anchor, w1, w2 = head_inputs(4, 7, 49152, 32, torch.bfloat16, seed=3)
    inv, greedy = row_consts(4, 8, 1.0)
    state = new_state(5, DEV)
    impl(base, anchor, w1, w2, 8, inv, greedy, state)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = impl(base, anchor, w1, w2, 8, inv, greedy, state)
    seen = []
    for _ in range(3):
        graph.replay()
        seen.append(out.clone())
    assert not torch.equal(seen[0][:, 1:], seen[1][:, 1:])  # sampled candidates change per replay
    assert all(torch.equal(s[:, 0], seen[0][:, 0]) for s in seen)  # the greedy candidate does not
