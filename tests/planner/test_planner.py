"""The planner: counterfactual credit equals what each shape's tree really commits (or a stated lower bound), the
estimates move from the prior to the observed rates, and the choice maximises expected tokens per second."""

import pytest
import torch

from flashtree.planner import CostTable, Planner, Shape, counterfactual_commits, default_shapes
from flashtree.planner.acceptance import AcceptanceModel, prior_tau
from flashtree.tree import build_tree, verify_greedy

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
