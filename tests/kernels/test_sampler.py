import pytest
import torch
from scipy.stats import chisquare

from flashtree.sampler.reference import filter_logits, sample_rows
from flashtree.sampler.triton_sampler import sample_candidates_triton, sample_rows_triton

from .common import CUDA, DEV

# the interpreter's numpy warns of the IEEE infinities the sampled pass relies on (an overflowing sum, -inf - -inf)
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_greedy_rows_bit_identical(dtype):
    g = torch.Generator().manual_seed(1)
    shapes = [(960, 151936), (15, 151936), (7, 1000)] if CUDA else [(6, 10000), (3, 37)]
    for r, v in shapes:
        x = (torch.randn(r, v, generator=g) * 4).to(dtype)
        # ties: the row maximum repeated, the lowest id must win (also across tiles and splits)
        x[0, v // 3] = 1e3
        x[0, v - 2] = 1e3
        x[1, 2] = 1e3
        x[1, 3] = 1e3
        temp = torch.zeros(r)
        temp[2::3] = 0.7  # mixed batch: sampled rows beside greedy ones
        out = sample_rows_triton(x.to(DEV), temp.to(DEV)).cpu()
        ref = sample_rows(x.to(DEV), temp.to(DEV)).cpu()
        greedy = temp <= 0
        assert torch.equal(out[greedy], ref[greedy])
        assert out[0] == v // 3 and out[1] == 2
        assert out.dtype == torch.int64 and ((out >= 0) & (out < v)).all()
        cands = sample_candidates_triton(x.to(DEV), temp.to(DEV), 3).cpu()
        assert torch.equal(cands[greedy], ref[greedy].view(-1, 1).expand(-1, 3))


def chi2_pvalue(draws, probs):
    counts = torch.bincount(draws.flatten(), minlength=probs.numel()).double()
    keep = probs > 0
    assert counts[~keep].sum() == 0, "drew a token of probability zero"
    expected = probs[keep].double() / probs[keep].double().sum() * counts.sum()
    return chisquare(counts[keep], expected).pvalue


def draws_for(logits, temp, n_samples, top_k=None, block=None, g=None):
    rows = 32 if not CUDA else 1024
    per_row = max(1, n_samples // rows)
    x = logits.expand(rows, -1).contiguous().to(DEV)
    t = torch.full((rows,), temp, device=DEV)
    return sample_candidates_triton(x, t, per_row, generator=g, top_k=top_k, block=block).cpu()


@pytest.mark.parametrize("shape", ["plain", "jump", "far"])
@pytest.mark.parametrize("top_k", [None, 5])
def test_sampled_distribution_chi_square(top_k, shape):
    g = torch.Generator(device=DEV).manual_seed(5)
    v = 40
    logits = torch.randn(v, generator=torch.Generator().manual_seed(2)) * 2
    if shape == "jump":
        # tile 0 keeps no mass; against tile 0's max, tile 1's sum overflows and is redone against its own max
        logits[16:] += 150
    if shape == "far":
        # tile 0 empty (-inf: no reference yet), the rest ~430 below zero in log2 units: tile 1 sets the reference
        logits[:16] = -float("inf")
        logits[16:] -= 300
    temp = 0.8
    probs = filter_logits((logits / temp).view(1, -1), None if top_k is None else torch.tensor([top_k])).softmax(-1)[0]
    n = 200_000 if CUDA else 8192
    # block 16 -> 3 tiles per row: exercises the tile-level, the group-level and the in-group Gumbel draws
    draws = draws_for(logits, temp, n, top_k=top_k, block=16, g=g)
    assert chi2_pvalue(draws, probs) > 1e-3
    # the test has power: the same draws are rejected against the distribution at another temperature
    wrong = filter_logits((logits / 1.3).view(1, -1), None if top_k is None else torch.tensor([top_k])).softmax(-1)[0]
    assert chi2_pvalue(draws, wrong) < 1e-6


@pytest.mark.parametrize("top_k", [None, 5])
def test_mixed_batch_eight_candidates_over_splits(top_k):
    """Eight draws per row, three pass-1 splits per row, greedy rows beside sampled ones; one seed repeats its draws."""
    x = torch.randn(6, 160, generator=torch.Generator().manual_seed(21)) * 3
    # 16-token tiles; tokens 60-99 sit 150 above the rest: against the running max, tile 3's sum overflows (the max
    # jumps past 2^7 in log2 units) and tile 7's flushes to zero (all of it far below)
    x[1, 60:100] += 150
    x[2, [70, 20]] = 1e3  # a greedy row's tie: the lowest id wins
    temp = torch.tensor([0.7, 1.0, 0.0, 0.5, 2.0, 0.0])
    draws = [sample_candidates_triton(x.to(DEV), temp.to(DEV), 8, torch.Generator(DEV).manual_seed(1), top_k,
                                      block=16).cpu() for _ in range(2)]
    assert torch.equal(draws[0], draws[1])
    d = draws[0]
    assert torch.equal(d[temp <= 0], x[temp <= 0].argmax(-1, keepdim=True).expand(-1, 8))
    assert d[2, 0] == 20
    assert ((d[1] >= 60) & (d[1] < 100)).all()
    if top_k is not None:
        allowed = x.topk(top_k, dim=-1).indices
        assert (d.unsqueeze(-1) == allowed.unsqueeze(1)).any(-1).all()


def test_single_draw_form_distribution():
    g = torch.Generator(device=DEV).manual_seed(9)
    v = 6
    logits = torch.randn(v, generator=torch.Generator().manual_seed(4))
    rows = 160 if not CUDA else 100_000  # one program per row: the interpreter pays for each
    x = logits.expand(rows, -1).contiguous().to(DEV)
    draws = sample_rows_triton(x, torch.full((rows,), 1.0, device=DEV), generator=g, block=16).cpu()
    assert chi2_pvalue(draws, logits.softmax(-1)) > 1e-3


@pytest.mark.skipif(not CUDA, reason="full vocabulary on the GPU")
def test_full_vocab_distribution_and_independence():
    g = torch.Generator(device="cuda").manual_seed(3)
    v = 151936
    logits = torch.full((v,), -30.0)
    hot = torch.tensor([5, 4100, 70000, 151935])  # tokens in different tiles
    logits[hot] = torch.tensor([1.0, 0.5, 0.0, -0.5])
    probs = (logits / 0.7).softmax(-1)
    x = logits.to(torch.bfloat16).expand(2048, -1).contiguous().cuda()
    draws = sample_candidates_triton(x, torch.full((2048,), 0.7, device="cuda"), 32, generator=g).cpu()
    p_hot = probs[hot] / probs[hot].sum()
    mapped = (draws.view(-1, 1) == hot.view(1, -1)).long().argmax(1)
    assert (draws.view(-1, 1) == hot.view(1, -1)).any(1).float().mean() > 0.999
    assert chi2_pvalue(mapped, p_hot) > 1e-3
    # two calls differ (fresh Philox seed each call)
    again = sample_candidates_triton(x, torch.full((2048,), 0.7, device="cuda"), 32, generator=g).cpu()
    assert not torch.equal(draws, again)


def test_top_p_falls_back_to_reference_exactly():
    x = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([0.0, 0.5, 1.0, 0.0])
    g1 = torch.Generator().manual_seed(1)
    g2 = torch.Generator().manual_seed(1)
    a = sample_rows_triton(x, t, generator=g1, top_p=torch.full((4,), 0.9))
    b = sample_rows(x, t, generator=g2, top_p=torch.full((4,), 0.9))
    assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_greedy_only_single_launch(dtype):
    """temperature 0 as a Python number: one launch whose last tile program per row merges (tickets reset)."""
    g = torch.Generator().manual_seed(11)
    shapes = [(15, 151936, None), (960, 32768, None), (4, 1000, 64)] if CUDA else [(5, 3000, None), (4, 37, 16)]
    for r, v, block in shapes:
        for _ in range(2):  # a second call finds the ticket counters zeroed again
            x = (torch.randn(r, v, generator=g) * 4).to(dtype)
            # ties: across tiles, across groups of one tile, inside one group; an all -inf row takes token 0
            x[0, [v // 3, v - 2]] = 1e3
            x[1, [block or 1024, 1, 2]] = 1e3
            x[2, [v - 1, v - 3]] = 1e3
            x[3] = -float("inf")
            ref = x.argmax(-1)
            assert torch.equal(sample_rows_triton(x.to(DEV), 0.0, block=block).cpu(), ref)
            cands = sample_candidates_triton(x.to(DEV), 0, 3, block=block).cpu()
            assert torch.equal(cands, ref.view(-1, 1).expand(-1, 3))


@pytest.mark.skipif(not CUDA, reason="graph capture needs a CUDA device")
def test_greedy_only_graph_replays():
    g = torch.Generator().manual_seed(12)
    static = torch.randn(15, 151936, generator=g).to(torch.bfloat16).cuda()
    sample_rows_triton(static, 0.0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sample_rows_triton(static, 0.0)
    for _ in range(3):  # each replay must find the tickets the previous one left at zero
        static.copy_(torch.randn(15, 151936, generator=g).to(torch.bfloat16).cuda())
        graph.replay()
        assert torch.equal(out, static.argmax(-1))


@pytest.mark.skipif(not CUDA, reason="graph capture needs a CUDA device")
def test_sampled_graph_replays_over_splits():
    """15 rows spread over many pass-1 splits per row: each replay draws each row's one likely token (a spike that
    moves between replays), so both passes read the replay's logits and noise state."""
    g = torch.Generator().manual_seed(13)
    rows, v = 15, 151936
    static = torch.zeros(rows, v, dtype=torch.bfloat16, device="cuda")
    temp = torch.full((rows,), 1.0, device="cuda")
    sample_candidates_triton(static, temp, 4)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sample_candidates_triton(static, temp, 4)
    for _ in range(3):
        spike = torch.randint(0, v, (rows,), generator=g)
        x = torch.randn(rows, v, generator=g) * 0.1
        x[torch.arange(rows), spike] = 60.0  # every other token together: < 1e-20 of the mass
        static.copy_(x.to(torch.bfloat16).cuda())
        graph.replay()
        assert torch.equal(out.cpu(), spike.view(-1, 1).expand(-1, 4))


@pytest.mark.skipif(not CUDA, reason="full vocabulary on the GPU")
def test_mean_logit_z_scores_at_full_shape():
    """960 x 151936 bf16, the shipped launch: over 24 calls of 8 draws per row, the drawn tokens' mean logit must
    match its expectation under softmax(logits / T): the calls' z-scores have mean ~0 and spread ~1."""
    g = torch.Generator(device="cuda").manual_seed(17)
    logits = (torch.randn(960, 151936, device="cuda", generator=g) * 2).to(torch.bfloat16)
    temp = 0.7
    x = logits.float()
    p = (x / temp).softmax(-1)
    mean = (p * x).sum(-1)
    var = (p * x**2).sum(-1) - mean**2
    zs = []
    for _ in range(24):
        d = sample_candidates_triton(logits, torch.full((960,), temp, device="cuda"), 8, generator=g)
        got = x.gather(1, d).mean(-1)
        zs.append(float(((got - mean) / (var / 8).sqrt()).mean() * 960**0.5))
    zs = torch.tensor(zs)
    assert abs(zs.mean()) < 4 / 24**0.5, zs
    assert 0.5 < zs.std() < 1.6, zs


def test_candidate_draws_column_zero_argmax_rest_at_temperature():
    """candidate_draws (DFLASH's N draws per position): column 0 the row's argmax (ties to the lowest id), the other
    columns the tempered law (chi-square; the untempered law as the negative control), one read of the rows."""
    from flashtree.sampler import candidate_draws

    logits = torch.tensor([0.5, 2.0, 2.0, -1.0, 1.0, 0.0, 1.5])
    rows = logits.expand(400, -1).contiguous().to(DEV)
    out = candidate_draws(rows, 6, 0.7, torch.Generator(DEV).manual_seed(3)).cpu()
    assert out.shape == (400, 6) and out.dtype == torch.int64 and (out[:, 0] == 1).all()
    drawn = out[:, 1:]
    assert chi2_pvalue(drawn, torch.softmax(logits / 0.7, -1)) > 1e-3
    assert chi2_pvalue(drawn, torch.softmax(logits, -1)) < 1e-3
    assert torch.equal(candidate_draws(rows, 4, 0.0).cpu(), torch.ones(400, 4, dtype=torch.int64))
    assert torch.equal(candidate_draws(rows, 1, 0.7).cpu(), torch.ones(400, 1, dtype=torch.int64))
