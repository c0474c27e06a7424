import pytest
import torch

from flashtree.tree import to_eagle
from flashtree.tree.build import build_vote_tree
from flashtree.tree.triton_build import build_vote_tree_eagle_triton, build_vote_tree_triton

from .common import CUDA, DEV, anchor_candidates

FIELDS = ["tokens", "parents", "depth", "votes", "valid", "first_candidate"]


def check(cands, width):
    ref = build_vote_tree(cands, width)
    enc = to_eagle(ref)
    tree, tenc = build_vote_tree_eagle_triton(cands.to(DEV), width)
    for f in FIELDS:
        assert torch.equal(getattr(tree, f).cpu(), getattr(ref, f)), f
    assert tree.k == ref.k
    assert torch.equal(tenc.top_scores_index.cpu(), enc.top_scores_index)
    assert torch.equal(tenc.parent_list.cpu(), enc.parent_list)
    assert (tenc.topk, tenc.spec_steps, tenc.num_verify_tokens) == (enc.topk, enc.spec_steps, enc.num_verify_tokens)
    plain = build_vote_tree_triton(cands.to(DEV), width)
    assert all(torch.equal(getattr(plain, f), getattr(tree, f)) for f in FIELDS)
    return ref


# (bs, N, K, W, vocab): heavy sharing, duplicates, N=1, K=1, W=2, W larger than the trie, odd sizes
SMALL = [(3, 6, 5, 10, 3), (2, 1, 1, 2, 5), (2, 3, 1, 8, 2), (2, 4, 3, 40, 2), (2, 5, 7, 3, 4), (2, 7, 4, 2, 2),
         (3, 8, 6, 17, 2)]


@pytest.mark.parametrize("bs,n,k,w,vocab", SMALL)
def test_builder_matches_reference_small(bs, n, k, w, vocab):
    g = torch.Generator().manual_seed(hash((bs, n, k, w, vocab)) % 2**31)
    for _ in range(2):
        check(torch.randint(0, vocab, (bs, n, k), generator=g), w)


# N = 32 fills a 32-bit candidate mask, N > 32 takes the 64-bit one; vocab 2 shares deep prefixes, vocab 50 leaves
# mostly 1-vote nodes, whose ties the slot order breaks
WIDE = [(2, 32, 15, 32, 2), (2, 32, 15, 32, 50), (2, 32, 16, 32, 4), (1, 33, 6, 32, 2), (1, 64, 4, 40, 3)]


@pytest.mark.parametrize("bs,n,k,w,vocab", WIDE)
def test_builder_matches_reference_wide(bs, n, k, w, vocab):
    g = torch.Generator().manual_seed(hash((bs, n, k, w, vocab)) % 2**31)
    check(torch.randint(0, vocab, (bs, n, k), generator=g), w)


def test_builder_large_tokens_and_too_many_candidates():
    # tokens differing only in their high 32 bits must not match
    c = torch.tensor([[[1, 2], [1 + (1 << 32), 2], [1, 2 - (1 << 40)]]])
    check(c, 6)
    with pytest.raises(ValueError, match="too large"):
        build_vote_tree_triton(torch.zeros(1, 65, 2, dtype=torch.long, device=DEV), 4)


def test_builder_all_identical_candidates():
    c = torch.tensor([[[1, 2, 3]] * 4, [[0, 0, 0]] * 4])
    ref = check(c, 8)
    assert ref.valid.sum(1).tolist() == [3, 3]


def test_builder_anchor_mix():
    g = torch.Generator().manual_seed(7)
    shapes = [(1, 8, 15, 16), (16, 8, 15, 16), (64, 32, 15, 32), (256, 16, 15, 16)] if CUDA else [(2, 8, 15, 16),
                                                                                                    (1, 32, 15, 32)]
    for bs, n, k, w in shapes:
        check(anchor_candidates(bs, n, k, g), w)


@pytest.mark.skipif(not CUDA, reason="graph capture needs a CUDA device")
def test_builder_graph_capture():
    g = torch.Generator().manual_seed(3)
    c = anchor_candidates(64, 32, 15, g).cuda()
    static = c.clone()
    build_vote_tree_eagle_triton(static, 32)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tree, enc = build_vote_tree_eagle_triton(static, 32)
    for _ in range(3):
        static.copy_(anchor_candidates(64, 32, 15, g).cuda())
        graph.replay()
        ref = build_vote_tree(static.cpu(), 32)
        assert torch.equal(tree.tokens.cpu(), ref.tokens) and torch.equal(tree.parents.cpu(), ref.parents)


# ---- the prob policy's build: the same trie ranked by path log-probability (build_scored_tree) -----------------
def path_logq(cands, g, levels: int):
    """Per-position log q (bs, N, K) consistent over shared prefixes, as a draft's is: a function of (depth, token,
    previous token) from a random table of values <= 0 on a grid of `levels` values (so path scores tie, sum exactly
    on any device and probability-1 steps keep a score; levels 0: continuous values, which differ in every byte of
    their bits), with a few -inf (probability 0)."""
    vocab = int(cands.max()) + 1
    k = cands.shape[2]
    shape = (k, vocab + 1, vocab)
    table = -torch.randint(0, levels, shape, generator=g).float() / 4 if levels else -3 * torch.rand(shape, generator=g)
    table[torch.rand(table.shape, generator=g) < 0.03] = float("-inf")
    prev = torch.cat([torch.full_like(cands[:, :, :1], vocab), cands[:, :, :-1]], dim=2)
    depth = torch.arange(k).view(1, 1, k).expand_as(cands)
    return table[depth, prev, cands]


# the kernel's selections of the W - 1 best-scored nodes (auto: rank or radix by size), one tree; radix-fused (radix-span's
# passes on the plain keys) runs in TUNES
SELECTS = ("radix", "rank", "auto", "radix-span")
SCORED = [(3, 6, 5, 10, 3), (2, 1, 1, 2, 5), (2, 4, 3, 40, 2), (2, 7, 4, 2, 2), (2, 32, 8, 32, 4), (1, 40, 6, 32, 3)]


@pytest.mark.parametrize("bs,n,k,w,vocab", SCORED)
def test_scored_builder_matches_reference(bs, n, k, w, vocab):
    from flashtree.tree.build import build_scored_tree
    from flashtree.tree.triton_build import build_scored_tree_triton

    g = torch.Generator().manual_seed(hash((bs, n, k, w, vocab, 7)) % 2**31)
    for levels in (3, 1000, 0):  # many ties, nearly none, none
        cands = torch.randint(0, vocab, (bs, n, k), generator=g)
        scores = path_logq(cands, g, levels).cumsum(dim=2)
        ref = build_scored_tree(cands, w, scores)
        for select in SELECTS:
            tree = build_scored_tree_triton(cands.to(DEV), w, scores.to(DEV), select=select)
            for f in FIELDS:
                assert torch.equal(getattr(tree, f).cpu(), getattr(ref, f)), (levels, select, f)
    if 2 < w <= n * k and n > 1:  # a choice to make: not the vote tree, the ranking is the scores'
        votes = build_vote_tree(cands, w)
        assert any(not torch.equal(getattr(ref, f), getattr(votes, f)) for f in ("tokens", "parents"))


@pytest.mark.skipif(not CUDA, reason="graph capture needs a CUDA device")
def test_policy_builds_graph_capture():
    """The server's policy builds replay from a CUDA graph: prob's (the fused launch) and best-first's tree
    grown from a vanilla head's conditionals (the registered torch builder, as the draft graph's tail runs it); each
    replay equals the torch reference on the new inputs."""
    import torch.nn.functional as F

    from flashtree.patches.policy_draws import grow
    from flashtree.tree import DraftScores, build_tree, get_policy

    g = torch.Generator().manual_seed(5)
    cands = anchor_candidates(64, 32, 15, g, vocab=4)
    static_c, scores = cands.cuda(), DraftScores(logp=path_logq(cands, g, 3).cuda())
    bs, k, v, w = 8, 6, 500, 16
    base = torch.randn(bs, k, v, generator=g).cuda()
    w1, w2 = torch.randn(v, 4, generator=g).cuda(), torch.randn(v, 4, generator=g).cuda()
    anchor = torch.randint(0, v, (bs,), generator=g).cuda()
    get_policy("prob").build(static_c, 32, scores), grow(base, anchor, w1, w2, width=w)  # compile / warm up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tree = get_policy("prob").build(static_c, 32, scores)
        grown = grow(base, anchor, w1, w2, width=w)
    for _ in range(2):
        cands = anchor_candidates(64, 32, 15, g, vocab=4)
        static_c.copy_(cands.cuda())
        scores.logp.copy_(path_logq(cands, g, 3).cuda())
        base.copy_(torch.randn(bs, k, v, generator=g).cuda())
        graph.replay()
        ref = build_tree(cands, 32, policy="prob", scores=DraftScores(logp=scores.logp.cpu()))
        assert all(torch.equal(getattr(tree, f).cpu(), getattr(ref, f)) for f in FIELDS)
        cpu_base, cpu_w1, cpu_w2 = base.cpu(), w1.cpu(), w2.cpu()
        want = build_tree(torch.zeros(bs, 1, k, dtype=torch.long), w, policy="best-first", scores=DraftScores(
            anchor=anchor.cpu(), step_logprobs=lambda r, p, t: (
                cpu_base[r, p.clamp(max=k - 1)] + F.linear(F.embedding(t, cpu_w1), cpu_w2)).log_softmax(-1)))
        assert torch.equal(grown.tokens.cpu(), want.tokens) and torch.equal(grown.parents.cpu(), want.parents)


def test_scored_builder_selects_on_every_key_byte():
    """Scores one float step apart (they differ in the lowest byte of their bits only), ±0 (equal scores), -inf
    nodes kept only where room is left and NaN (as -inf): both selections keep the reference's nodes."""
    from flashtree.tree.build import build_scored_tree
    from flashtree.tree.triton_build import build_scored_tree_triton

    n = 40
    cands = torch.arange(n).view(1, n, 1).repeat(4, 1, 1)  # n depth-1 nodes per request
    steps = torch.full((n,), -1.0)
    for i in range(1, n):
        steps[i] = torch.nextafter(steps[i - 1], torch.tensor(-2.0))
    nan_or_inf = torch.where(torch.arange(n) % 3 == 0, float("nan"), float("-inf"))
    scores = torch.stack([steps[torch.randperm(n, generator=torch.Generator().manual_seed(1))],
                          torch.where(torch.arange(n) % 2 == 0, 0.0, -0.0),
                          torch.where(torch.arange(n) < 5, -1.0, float("-inf")),
                          torch.where(torch.arange(n) < 5, -1.0, nan_or_inf)]).view(4, n, 1)
    for w in (2, 7, 21, 40):
        ref = build_scored_tree(cands, w, scores)
        for select in SELECTS:
            tree = build_scored_tree_triton(cands.to(DEV), w, scores.to(DEV), select=select)
            for f in FIELDS:
                assert torch.equal(getattr(tree, f).cpu(), getattr(ref, f)), (w, select, f)


# ---- the prob policy's build fused: the kernel reads the per-position log q and forms the path sums itself ----------
# (bs, N, K, W, vocab): as SCORED, plus the anchor's shape (N 32, K 15) and N 64; W 40 with N 4, K 3: fewer nodes
# than W - 1, padding after them
PROB = [(3, 6, 5, 10, 3), (2, 1, 1, 2, 5), (2, 4, 3, 40, 2), (2, 7, 4, 2, 2), (2, 32, 15, 32, 4), (1, 40, 6, 32, 3),
        (1, 64, 8, 64, 3)]


def check_prob(cands, w, logp):
    """Both selections of the fused build against the reference, `build_scored_tree` of `logp.float().cumsum(2)`."""
    from flashtree.tree.build import build_prob_tree
    from flashtree.tree.triton_build import build_prob_tree_triton

    ref = build_prob_tree(cands, w, logp)
    for select in SELECTS:
        tree = build_prob_tree_triton(cands.to(DEV), w, logp.to(DEV), select=select)
        for f in FIELDS:
            assert torch.equal(getattr(tree, f).cpu(), getattr(ref, f)), (logp.dtype, select, f)
    return ref


@pytest.mark.parametrize("bs,n,k,w,vocab", PROB)
def test_prob_builder_matches_reference(bs, n, k, w, vocab):
    g = torch.Generator().manual_seed(hash((bs, n, k, w, vocab, 11)) % 2**31)
    # grid values in bfloat16 (exact: tied path scores, probability-1 steps), continuous ones in float32
    for levels, dtype in ((3, torch.bfloat16), (0, torch.float32)):
        cands = torch.randint(0, vocab, (bs, n, k), generator=g)
        ref = check_prob(cands, w, path_logq(cands, g, levels).to(dtype))
        if w - 1 > n * k:
            assert not ref.valid.all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_prob_builder_reads_any_float_dtype(dtype):
    g = torch.Generator().manual_seed(13)
    cands = anchor_candidates(2, 16, 7, g, vocab=4)
    check_prob(cands, 16, path_logq(cands, g, 0).to(dtype))


def test_prob_builder_sums_as_torch_cumsum():
    """The path sums are torch's CPU cumsum's bit for bit (float32 summed in float64, then rounded): node (2, 1)'s path
    sum ties node (0, 0)'s score where a float32 running sum would come out above it, so only the exact sum leaves the
    last place to (0, 0), the earlier slot."""
    g = torch.Generator().manual_seed(11)
    steps = -3 * torch.rand(4096, 3, generator=g)
    exact = steps.cumsum(dim=1)[:, 2]
    pick = int(((steps[:, 0] + steps[:, 1]) + steps[:, 2] > exact).nonzero()[0])
    logp = torch.full((1, 2, 3), -50.0)
    logp[0, 0, 0], logp[0, 1] = exact[pick], steps[pick]
    cands = torch.tensor([[[0, 0, 0], [1, 1, 1]]])
    ref = check_prob(cands, 4, logp)  # (0, 1) and (1, 1) above the tie
    assert (ref.depth[0].tolist(), ref.first_candidate[0].tolist()) == ([1, 1, 2], [0, 1, 1])


def test_an_unknown_selection_is_refused():
    from flashtree.tree.triton_build import build_scored_tree_triton

    cands = torch.zeros((1, 2, 3), dtype=torch.int64, device=DEV)
    with pytest.raises(ValueError, match="select must be one of 'auto', 'radix', 'rank'"):
        build_scored_tree_triton(cands, 4, torch.zeros((1, 2, 3), device=DEV), select="sort")
    for tune in ({"warps": 4}, {"digit": 12}, {"parent": "gather"}):
        with pytest.raises(ValueError, match="tune"):
            build_scored_tree_triton(cands, 4, torch.zeros((1, 2, 3), device=DEV), tune=tune)


# ---- launch knobs (`tune`): the parent from the exclusive scan, the equality loop's blocks, radix-fused / radix-span
# digits and pass loop, warps, rank chunks --------------------------------------------------------------------------
# each the same tree. (bs, N, K, W, vocab): small, the anchor's N 32 / K 15, N 64
TUNED = [(3, 6, 5, 10, 3), (1, 32, 15, 32, 4), (1, 64, 8, 64, 3)]
TUNES = [("radix", dict(parent="scan", eq_unroll=4)), ("radix-fused", {}),
         ("radix-fused", dict(digit=5, passes="loop")),
         ("radix-span", dict(parent="scan")), ("radix-span", dict(passes="loop", eq_unroll=8)),
         ("radix-span", dict(digit=4, num_warps=2)), ("radix-span", dict(digit=11, passes="loop")),
         ("rank", dict(parent="scan", rank_chunk=128, num_warps=8))]


@pytest.mark.parametrize("bs,n,k,w,vocab", TUNED)
def test_prob_builder_tuned_launches(bs, n, k, w, vocab):
    """Every knob's launch against the reference: tied path scores (a grid of log q, bfloat16) and continuous ones
    with -inf and NaN log q, whose spans differ in every key byte."""
    from flashtree.tree.build import build_prob_tree
    from flashtree.tree.triton_build import build_prob_tree_triton

    g = torch.Generator().manual_seed(hash((bs, n, k, w, vocab, 17)) % 2**31)
    for levels, dtype in ((3, torch.bfloat16), (0, torch.float32)):
        cands = torch.randint(0, vocab, (bs, n, k), generator=g)
        logp = path_logq(cands, g, levels).to(dtype)
        if levels == 0:  # NaN (ranked as -inf) in place of half the -inf, as a function of the node
            logp[(logp == float("-inf")) & (cands % 2 == 0)] = float("nan")
        ref = build_prob_tree(cands, w, logp)
        for select, tune in TUNES:
            tree = build_prob_tree_triton(cands.to(DEV), w, logp.to(DEV), select=select, tune=tune)
            for f in FIELDS:
                assert torch.equal(getattr(tree, f).cpu(), getattr(ref, f)), (levels, select, tune, f)


def test_span_select_edge_cases():
    """radix-span's key span: no finite node (all -inf / NaN: span 0, no pass), one finite node among -inf ones, all
    scores equal (ties in slot order), +inf, -0 and -3e38 beside -inf (a span above 2^31), a score one float step
    below another."""
    from flashtree.tree.build import build_scored_tree
    from flashtree.tree.triton_build import build_scored_tree_triton

    n = 24
    cands = torch.arange(n).view(1, n, 1).repeat(5, 1, 1)  # n depth-1 nodes per request
    inf, nan = float("inf"), float("nan")
    lone = torch.full((n,), -inf)
    lone[7] = -2.0
    wide = torch.tensor([inf, -0.0, -3e38, -inf]).repeat(n // 4)  # a span above 2^31
    step = torch.full((n,), -1.0)
    step[::2] = torch.nextafter(torch.tensor(-1.0), torch.tensor(-2.0))
    scores = torch.stack([torch.where(torch.arange(n) % 2 == 0, -inf, nan), lone, torch.full((n,), -0.5), wide,
                          step]).view(5, n, 1)
    for w in (2, 13, 25):
        ref = build_scored_tree(cands, w, scores)
        for tune in (dict(digit=4), dict(passes="loop"), dict(digit=11)):
            tree = build_scored_tree_triton(cands.to(DEV), w, scores.to(DEV), select="radix-span", tune=tune)
            for f in FIELDS:
                assert torch.equal(getattr(tree, f).cpu(), getattr(ref, f)), (w, tune, f)


def test_vote_builder_parent_by_scan():
    """The trie-vote build with its parents from the exclusive scan (PARENT "scan") and the equality masks from a loop
    over blocks of 4 candidates (N 6 and 5: a last block part past N), and its EAGLE encoding."""
    from flashtree.tree.triton_build import _launch

    g = torch.Generator().manual_seed(19)
    for bs, n, k, w, vocab in [(3, 6, 5, 10, 3), (2, 5, 4, 8, 2), (2, 32, 15, 32, 2), (1, 40, 6, 32, 3)]:
        cands = torch.randint(0, vocab, (bs, n, k), generator=g)
        ref = build_vote_tree(cands, w)
        enc = to_eagle(ref)
        tree, tenc = _launch(cands.to(DEV), w, eagle=True, tune=dict(parent="scan", eq_unroll=4))
        for f in FIELDS:
            assert torch.equal(getattr(tree, f).cpu(), getattr(ref, f)), f
        assert torch.equal(tenc.parent_list.cpu(), enc.parent_list)
        assert torch.equal(tenc.top_scores_index.cpu(), enc.top_scores_index)


def test_auto_launch_tunes_scored_builds_only():
    """select="auto" above the rank range: scored builds take AUTO_RADIX's measured launch, trie-vote keeps its own."""
    from flashtree.tree.triton_build import AUTO_RADIX, launch_choice

    scored = launch_choice(32, 15)
    assert scored["select"] == "radix-span" and all(scored[key] == value for key, value in AUTO_RADIX.items())
    vote = launch_choice(32, 15, scored=False)
    assert (vote["num_warps"], vote["parent"], vote["passes"], vote["eq_unroll"]) == (4, "max", "unroll", 0)
    assert launch_choice(8, 15)["select"] == "rank" and launch_choice(32, 15, tune={"num_warps": 4})["num_warps"] == 4
