"""The planner: counterfactual credit equals what each shape's tree really commits (or a stated lower bound), the
estimates move from the prior to the observed rates, and the choice maximises expected tokens per second."""

import pytest
import torch

from flashtree.planner import CostTable, Planner, Shape, counterfactual_commits, default_shapes
from flashtree.planner.acceptance import AcceptanceModel, prior_tau, rebuilt_commits
from flashtree.planner.shapes import GROWN
from flashtree.sampler import row_topk_logprobs
from flashtree.tree import build_tree, verify_greedy
from flashtree.tree.policies.best_first import grow_marginal

V = 3


def greedy_commit(tree, table):
    """Verify `tree` against a target whose greedy next token is table[prev token]: (bs, L) committed tokens."""
    ids = torch.cat([torch.zeros(tree.batch_size, 1, dtype=torch.long), tree.tokens], dim=1)  # anchor = token 0
    res = verify_greedy(tree, table[ids])
    return res.tokens, res.accept_len + 1


@pytest.mark.parametrize("seed", range(6))
def test_credit_is_what_every_other_shape_would_commit(seed):
    g = torch.Generator().manual_seed(seed)
    bs, n, k = 16, 8, 5
    table = torch.randint(0, V, (V,), generator=g)
    cands = torch.randint(0, V, (bs, n, k), generator=g)
    cands[:, 0] = table[torch.zeros(bs, dtype=torch.long)].view(bs, 1)  # candidate 0 often on the target's path
    ran = Shape(8, 12)
    committed, ran_len = greedy_commit(build_tree(cands, ran.width), table)
    shapes = [ran, Shape(4, 6), Shape(1, 4), Shape(8, 4), Shape(0, 6)]
    credit = counterfactual_commits(cands, committed, shapes)
    assert torch.equal(credit[ran], ran_len)  # the shape that ran: exactly its own commit
    for shape in shapes[1:]:
        tree = build_tree(cands[:, : max(shape.n, 1)], shape.width if shape.n else k + 1)
        _, real = greedy_commit(tree, table)
        # exact where the other tree stops inside the committed tokens; a lower bound (all of them + 1) otherwise
        assert torch.equal(credit[shape], torch.minimum(real, ran_len + 1))


@pytest.mark.parametrize("seed", range(4))
def test_one_pass_credits_equal_every_tree_rebuilt(seed):
    """Trie-vote credits from the one trie (`counterfactual_commits`) equal each shape's tree built and walked
    (`rebuilt_commits`), on small vocabularies (shared prefixes, vote ties), short commits and widths past the trie."""
    g = torch.Generator().manual_seed(seed)
    shapes = [Shape(0, 7)] + [Shape(n, w) for n in (1, 2, 3, 5, 8, 16) for w in (2, 3, 5, 9, 17, 40)]
    for _ in range(25):
        bs, n, k = (int(torch.randint(1, hi, (), generator=g)) for hi in (5, 18, 7))
        vocab = int(torch.randint(2, 4, (), generator=g))
        cands = torch.randint(0, vocab, (bs, n, k), generator=g)
        committed = torch.randint(0, vocab, (bs, int(torch.randint(1, k + 3, (), generator=g))), generator=g)
        for b in range(bs):  # most rows follow one candidate for a while, then end (-1)
            i, d = int(torch.randint(0, n, (), generator=g)), int(torch.randint(0, k + 1, (), generator=g))
            committed[b, : min(d, committed.shape[1])] = cands[b, i, : min(d, committed.shape[1])]
            committed[b, int(torch.randint(1, committed.shape[1] + 1, (), generator=g)):] = -1
        fast, slow = counterfactual_commits(cands, committed, shapes), rebuilt_commits(cands, committed, shapes)
        for shape in shapes:
            assert torch.equal(fast[shape], slow[shape]), shape


def test_a_credit_costs_the_same_ops_whatever_the_menu():
    """A served step's credit is a fixed number of ops (rebuilding and walking every tree of SmolLM2's 15-shape menu
    took over 2,000); each shape more adds one view."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += 1
            return func(*args, **(kwargs or {}))

    cands = torch.randint(0, 3, (2, 64, 8))
    committed = torch.cat([cands[:, 0], cands[:, 0, :1]], dim=1)
    ops = {}
    for window in (9, 64):
        shapes = default_shapes(window, 8)
        counterfactual_commits(cands, committed, shapes)  # the menu's constants, once
        Count.ops = 0
        with Count():
            counterfactual_commits(cands, committed, shapes)
        ops[len(shapes)] = Count.ops
    (few, small), (many, large) = sorted(ops.items())
    assert many - few >= 10 and large - small <= many - few


def test_estimates_move_from_the_prior_to_the_observed_rate():
    shapes = [Shape(0, 9), Shape(8, 9)]
    model = AcceptanceModel(shapes, prior_weight=10)
    assert model.tau(shapes[1]) == pytest.approx(prior_tau(shapes[1]))
    for _ in range(100):
        model.update({shapes[1]: torch.full((4,), 5), shapes[0]: torch.full((4,), 2)})
    assert model.tau(shapes[1]) == pytest.approx((prior_tau(shapes[1]) * 10 + 5 * 400) / 410)
    assert abs(model.tau(shapes[0]) - 2) < 0.02


def test_the_choice_maximises_tokens_per_second_and_hands_large_batches_to_the_chain():
    chain, tree = Shape(0, 16), Shape(16, 16)
    costs = CostTable()
    for bs, (tc, tt) in {1: (8e-3, 9e-3), 8: (10e-3, 12e-3), 32: (21e-3, 36e-3)}.items():
        costs.add(chain, bs, tc)
        costs.add(tree, bs, tt)
    model = AcceptanceModel([chain, tree])
    model.total = {chain: 2.8, tree: 4.0}
    model.count = {chain: 1, tree: 1}
    planner = Planner(costs, model)
    assert planner.choose(1).shape == tree  # 4.0 / 9 ms > 2.8 / 8 ms
    assert planner.choose(5).shape == tree  # padded to the bs-8 graph's times
    assert planner.choose(32).shape == chain  # 2.8 / 21 ms > 4.0 / 36 ms
    assert planner.choose(100).shape == chain  # above every measured size: the largest
    assert {r["shape"] for r in planner.summary()} == {tree.label(), chain.label()}
    with pytest.raises(ValueError, match="> 0 s"):
        costs.add(tree, 64, 0.0)


def test_the_menu_fits_the_servers_window():
    shapes = default_shapes(window=16, depth=8)
    assert shapes[0].is_chain and shapes[0].width == 16
    assert all(2 <= s.width <= 16 and s.n <= s.width for s in shapes)
    assert {s.width for s in shapes if not s.is_chain} == {9, 16}
    assert Shape(1, 16) not in shapes and Shape(1, 9) in shapes  # N = 1 fills 9 nodes: at 16 the same tree, dearer


def test_trees_come_only_at_widths_their_candidates_can_fill():
    """N candidates of depth K hold at most N x K + 1 nodes; the narrowest width is always offered."""
    shapes = [s for s in default_shapes(window=64, depth=7) if not s.is_chain]
    assert all(s.width <= s.n * 7 + 1 or s.width == 8 for s in shapes)
    assert {s.width for s in shapes if s.n == 4} == {8, 16} and {s.width for s in shapes if s.n == 1} == {8}
    assert {s.width for s in shapes if s.n == 32} == {32, 64}


def test_a_single_candidate_is_priced_as_the_chain():
    """Candidate 0 is the draft's greedy block, so the tree of one candidate is DSPARK's chain: the same prior."""
    assert prior_tau(Shape(1, 9)) == prior_tau(Shape(0, 64)) > prior_tau(Shape(4, 9)) - 1


def test_served_times_shift_the_shapes_not_yet_served():
    """A served mean replaces its entry; the others at that size move by the served excess of their own kind (trees
    or chain), else of all; other sizes keep theirs. So an untimed shape never looks cheap beside a timed one."""
    chain, a, b = Shape(0, 64), Shape(8, 9), Shape(64, 64)
    costs = CostTable()
    for s, t in ((chain, 2.2e-3), (a, 1.6e-3), (b, 1.7e-3)):
        costs.add(s, 1, t)
        costs.add(s, 8, 2 * t)
    costs.serve(a, 1, 3.3e-3)  # the host's share of a served step: 1.7 ms
    assert costs.time(a, 1) == 3.3e-3
    assert costs.time(b, 1) == pytest.approx(3.4e-3) and costs.time(chain, 1) == pytest.approx(3.9e-3)
    assert costs.time(b, 8) == 3.4e-3  # another size: its own entry
    costs.serve(chain, 1, 2.7e-3)  # the chain's own excess (0.5 ms) now stands for the chain
    assert costs.time(chain, 1) == 2.7e-3 and costs.time(b, 1) == pytest.approx(3.4e-3)
    costs.serve(b, 1, 2.7e-3)
    assert costs.time(b, 1) == 2.7e-3
    with pytest.raises(ValueError, match="no entry"):
        costs.serve(a, 4, 1e-3)


def test_best_first_menus_are_widths_only():
    """Best-first trees draw no candidates: one shape per width (8 and the vote menu's widths), labelled by the
    policy, priced by width alone; the chain stays."""
    shapes = default_shapes(window=16, depth=15, policy=GROWN)
    assert shapes == [Shape(0, 16), Shape(1, 8, policy=GROWN), Shape(1, 16, policy=GROWN)]
    assert [s.label() for s in shapes] == ["chain(W=16)", "best-first,W=8", "best-first,W=16"]
    assert Shape(1, 16, policy=GROWN) != Shape(1, 16) and not Shape(0, 16, policy=GROWN).grown
    assert prior_tau(Shape(1, 16, policy=GROWN)) == prior_tau(Shape(16, 16)) > prior_tau(Shape(1, 16))
    assert {s.width for s in default_shapes(window=64, depth=3, policy=GROWN)[1:]} == {4, 8, 16, 32, 64}


def grown_tree(logits: torch.Tensor, width: int, later_ties: bool = False):
    """The best-first tree of `width` over independent positions (bs, K, V) from each position's top width - 1, as a
    DFLASH step grows it, and the greedy block; later_ties: ties to the higher token (the wrong rule)."""
    bs, k, v = logits.shape
    rows = (logits.flip(-1) if later_ties else logits).reshape(bs * k, v)
    top, ids = (t.view(bs, k, -1) for t in row_topk_logprobs(rows, width - 1))
    ids = v - 1 - ids if later_ties else ids
    return grow_marginal(top, ids, width), ids[:, :, 0]


def test_best_first_credits_every_narrower_width_what_its_own_step_commits():
    """A best-first tree of w' < W is the first w' - 1 picks of the W one (the same top-k table, the same tie rule),
    so one step's commit credits each narrower width exactly what a step growing that width commits, scores tied
    often (four logit levels); a table whose ties go the other way does not, nor does the wider tree itself."""
    g = torch.Generator().manual_seed(3)
    bs, k, v, wide = 64, 5, 12, 16
    logits = torch.randint(0, 4, (bs, k, v), generator=g).float()
    _, order = logits.sort(dim=-1, descending=True, stable=True)
    rank = torch.randint(0, 3, (bs, k + 1), generator=g)  # the target's tokens: among the draft's top 3
    ref = order[torch.arange(bs)[:, None], torch.arange(k + 1).clamp(max=k - 1)[None], rank]

    def commit(tree):  # the greedy walk against a target that continues ref along its own prefix
        targets = ref.gather(1, torch.cat([torch.zeros(bs, 1, dtype=torch.long), tree.depth], dim=1))
        res = verify_greedy(tree, targets)
        return res.tokens, res.accept_len + 1

    tree, greedy = grown_tree(logits, wide)
    committed, ran = commit(tree)
    shapes = default_shapes(window=wide, depth=k, policy=GROWN)
    credit = counterfactual_commits(greedy[:, None], committed, shapes, GROWN, grown=tree)
    assert torch.equal(credit[shapes[-1]], ran)
    for shape in shapes[1:-1]:
        narrow, greedy_w = grown_tree(logits, shape.width)
        assert torch.equal(greedy_w, greedy)
        assert torch.equal(credit[shape], commit(narrow)[1]), shape.label()
        assert (credit[shape] < ran).any()  # narrower trees commit less on some rows: the credit is not the step's
    chain = (greedy == ref[:, :k]).long().cumprod(dim=1).sum(dim=1) + 1
    assert torch.equal(credit[shapes[0]], torch.minimum(chain, ran + 1)) and (chain > 1).any()
    wrong, _ = grown_tree(logits, wide, later_ties=True)
    wrong_credit = counterfactual_commits(greedy[:, None], commit(wrong)[0], shapes, GROWN, grown=wrong)
    assert any(not torch.equal(wrong_credit[s], credit[s]) for s in shapes[1:-1])
    with pytest.raises(ValueError, match="best-first,W=32 needs the step's best-first tree of at least its width"):
        counterfactual_commits(greedy[:, None], committed, [Shape(1, 32, policy=GROWN)], GROWN, grown=tree)
