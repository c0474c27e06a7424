import pytest
import torch
import torch.nn.functional as F

from flashtree.sampler.markov import markov_draws_reference, new_state
from flashtree.sampler.triton_markov import markov_draws_triton

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_rows_equal_the_reference(dtype):
    # (bs, N, K, V, rank): vocabularies that are not a multiple of the tile, several row blocks on CUDA
    shapes = [(3, 4, 7, 49152, 32), (64, 8, 7, 49152, 32), (1, 8, 15, 151936, 64)] if CUDA else [(3, 2, 4, 700, 8)]
    for i, (bs, n, k, v, rank) in enumerate(shapes):
        base, anchor, w1, w2 = head_inputs(bs, k, v, rank, dtype, seed=i)
        # the anchors as DSPARK's graph tail passes them: column 0 of the (bs, q) input ids, a strided view
        anchor = torch.stack([anchor, torch.zeros_like(anchor)], dim=1)[:, 0]
        inv, greedy = row_consts(bs, n, 0.8)
        greedy[1::3] = True  # more greedy rows beside the sampled ones
        ours = markov_draws_triton(base, anchor, w1, w2, n, inv, greedy, new_state(3, DEV)).cpu()
        ref = markov_draws_reference(base, anchor, w1, w2, n, inv, greedy, new_state(3, DEV)).cpu()
        mask = greedy.view(bs, n).cpu()
        assert torch.equal(ours[mask], ref[mask])
        # programs streaming several row blocks past their w2 tile draw the same tokens
        for groups in (1, 2):
            streamed = markov_draws_triton(base, anchor, w1, w2, n, inv, greedy, new_state(3, DEV), block_rows=2,
                                           groups=groups).cpu()
            assert torch.equal(streamed, markov_draws_triton(base, anchor, w1, w2, n, inv, greedy, new_state(3, DEV),
                                                             block_rows=2).cpu())
        assert ours.dtype == torch.int64 and ((ours >= 0) & (ours < v)).all()
        # a greedy row is the Markov chain of argmaxes, step by step
        prev, chain = anchor.long(), []
        for j in range(k):
            prev = (base[:, j] + F.linear(F.embedding(prev, w1), w2)).argmax(-1)
            chain.append(prev)
        assert torch.equal(ours[:, 0], torch.stack(chain, 1).cpu())


@pytest.mark.parametrize("impl", [markov_draws_triton, markov_draws_reference])
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
def test_graph_replays_redraw():
    base, anchor, w1, w2 = head_inputs(4, 7, 49152, 32, torch.bfloat16, seed=3)
    inv, greedy = row_consts(4, 8, 1.0)
    state = new_state(5, DEV)
    markov_draws_triton(base, anchor, w1, w2, 8, inv, greedy, state)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = markov_draws_triton(base, anchor, w1, w2, 8, inv, greedy, state)
    seen = []
    for _ in range(3):
        graph.replay()
        seen.append(out.clone())
    assert not torch.equal(seen[0][:, 1:], seen[1][:, 1:])  # sampled candidates change per replay
    assert all(torch.equal(s[:, 0], seen[0][:, 0]) for s in seen)  # the greedy candidate does not


def test_a_wide_head_streams_its_row_blocks():
    """A rank-256 head (Qwen3-8B's DSPARK draft) takes the streaming launch by default: the greedy rows still equal
    the reference's, sampled rows equal the one-program-per-row-block launch's."""
    bs, n, k, v, rank = (4, 8, 3, 4096, 256) if CUDA else (3, 2, 2, 300, 128)
    base, anchor, w1, w2 = head_inputs(bs, k, v, rank, torch.float32, seed=5)
    inv, greedy = row_consts(bs, n, 0.8)
    ours = markov_draws_triton(base, anchor, w1, w2, n, inv, greedy, new_state(3, DEV), block_rows=2).cpu()
    ref = markov_draws_reference(base, anchor, w1, w2, n, inv, greedy, new_state(3, DEV)).cpu()
    assert torch.equal(ours[greedy.view(bs, n).cpu()], ref[greedy.view(bs, n).cpu()])
    blocks = -(-bs * n // 2)
    per_block = markov_draws_triton(base, anchor, w1, w2, n, inv, greedy, new_state(3, DEV), block_rows=2,
                                    groups=blocks).cpu()
    assert torch.equal(ours, per_block)
