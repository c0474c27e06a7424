"""tree.n=auto in the engine and the replay: every planned step is lossless, the planner learns from every step, the
steps say what it chose, and on the shipped recording it does about as well as the best fixed shape."""

from pathlib import Path

import pytest
import torch

from flashtree.drafters.oracle import OracleDrafter
from flashtree.engine import planning, tree_generate
from flashtree.engine.replay import Recording, replay, replay_planned
from flashtree.models import load_target
from flashtree.planner import Shape

RECORDING = Path(__file__).resolve().parents[2] / "benchmarks" / "recordings" / "smollm2-dspark-gsm8k.pt"
NEW = 40


def tau(steps) -> float:
    return sum(s.accept_len + 1 for s in steps) / len(steps)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_planned_generation_equals_the_targets_greedy_output_and_reports_its_shapes(temperature):
    model, tok = load_target("tiny-llama")
    prompt = torch.tensor(tok.encode("1, 2, 3, 4,"))
    ref = model.generate(prompt.view(1, -1), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)[0]
    shapes = planning.menu(window=16, depth=4)
    # widths priced so that the choice moves (W = 16 first, then W = 5 as its estimates settle); a run measures its own
    planner = planning.make_planner(shapes, planning.modelled_costs(shapes, {5: 1.0, 16: 1.1}))
    before = dict(planner.acceptance.count)
    drafter = OracleDrafter([ref.tolist()], model.config.vocab_size, k=4, rate=0.3, seed=1, strict=temperature == 0)
    gen = torch.Generator().manual_seed(0)
    res = tree_generate(model, drafter, prompt, n=planning.draws(planner), width=16, max_new_tokens=NEW,
                        temperature=temperature, generator=gen, planner=planner)
    if temperature == 0:
        assert torch.equal(res.sequences[0], ref)
        assert len({(s.plan_n, s.plan_width) for s in res.steps}) >= 2  # more than one shape was lossless
    assert res.new_tokens == [NEW]
    chosen = {(s.plan_n, s.plan_width) for s in res.steps}
    assert chosen <= {(s.n, s.width) for s in shapes} and None not in chosen
    assert all(s.candidates == s.plan_n for s in res.steps)  # the tree was built from the chosen N
    # every shape learnt from every step, not only the one that ran
    assert all(planner.acceptance.count[s] == before[s] + len(res.steps) for s in shapes)
    assert sum(planner.chosen.values()) == len(res.steps)


def test_a_planner_outside_the_runs_limits_or_with_a_scored_policy_is_refused():
    model, tok = load_target("tiny-llama")
    drafter = OracleDrafter([list(range(30))], model.config.vocab_size, k=4)
    shapes = [Shape(4, 8)]
    planner = planning.make_planner(shapes, planning.modelled_costs(shapes))
    with pytest.raises(ValueError, match="within n=2 and width=8"):
        tree_generate(model, drafter, torch.arange(5), n=2, width=8, max_new_tokens=4, planner=planner)
    with pytest.raises(ValueError, match="allowed: tree.policy=vote or best-first with tree.n=auto"):
        tree_generate(model, drafter, torch.arange(5), n=4, width=8, max_new_tokens=4, planner=planner, policy="prob")
    with pytest.raises(ValueError, match="best-first trees within n=4 and width=8 on the target walk; .* N=4,W=8"):
        tree_generate(model, drafter, torch.arange(5), n=4, width=8, max_new_tokens=4, planner=planner,
                      policy="best-first")  # a menu of trie-vote shapes


def test_a_prob_policy_with_auto_is_one_config_error_naming_the_planned_policies():
    from flashtree.experiments.config import ConfigError, TreeConfig

    with pytest.raises(ConfigError, match=r"tree.policy='prob' with tree.n=auto: .* allowed: tree.policy=vote or "
                                          r"best-first with tree.n=auto, or an integer tree.n with prob"):
        TreeConfig(n="auto", policy="prob")
    TreeConfig(n="auto", policy="best-first")


@pytest.fixture(scope="module")
def scored():
    """A tiny target and a DSPARK drafter of random weights: its proposals carry what best-first grows from."""
    from flashtree.drafters import load_drafter
    from tests.test_dspark import random_model, small_config

    model = load_target("tiny-llama")[0]
    drafter = load_drafter("dspark", model, model=random_model(small_config(model), std=0.05), temperature=0.0)
    return model, drafter


def test_planned_best_first_equals_the_targets_greedy_output_and_its_replay(scored):
    from flashtree import metrics
    from flashtree.engine.replay import record
    from flashtree.experiments.config import RunConfig, TreeConfig
    from flashtree.experiments.run import make_planner

    model, drafter = scored
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    ref = model.generate(torch.tensor([prompt]), max_new_tokens=24, min_new_tokens=24, do_sample=False)[0]
    # the sweep's planner, priced so that the choice moves (W = 16 first, then W = 5 as its estimates settle)
    tree = TreeConfig(n="auto", width=16, policy="best-first", costs={5: 1.0, 16: 1.1})
    planner = lambda: make_planner(RunConfig(tree=tree), model, drafter.k, prompt)  # noqa: E731
    direct = planner()
    shapes = direct.acceptance.shapes
    assert [s.label() for s in shapes] == ["best-first,W=5", "best-first,W=8", "best-first,W=16"]  # the server's
    res = tree_generate(model, drafter, torch.tensor(prompt), n=planning.draws(direct), width=16, max_new_tokens=24,
                        policy="best-first", planner=direct)
    assert torch.equal(res.sequences[0], ref)
    assert {s.plan_width for s in res.steps} == {5, 16}
    assert all(direct.acceptance.count[s] == direct.acceptance.prior_weight + len(res.steps) for s in shapes)  # every width, every step
    replayed = planner()
    steps = replay_planned(record(model, drafter, prompt, n_max=1, max_new_tokens=24, grown_width=16), replayed,
                           "best-first")
    key = lambda steps: [(s.position, s.plan_n, s.plan_width, s.accept_len, s.accepted_path)  # noqa: E731
                         for s in steps]
    assert key(steps) == key(res.steps)
    assert replayed.acceptance.total == direct.acceptance.total
    report = planning.report(direct, metrics.steps_frame(metrics.step_rows(res.steps, prompt=0)))
    assert set(report["plan_choices"]) == {"best-first,W=5", "best-first,W=16"}
    assert sum(report["plan_choices"].values()) == len(res.steps)
    assert set(report["plan_tau"]) == {s.label() for s in shapes}
    assert set(report["plan_costs_ms"]) == {"best-first,W=5", "best-first,W=16"}  # the widths tree.costs prices


def test_replayed_best_first_planner_verifies_and_credits_each_width_as_its_own_tree():
    from flashtree.engine.replay import replay_tree
    from flashtree.tree import verify_greedy

    saved = torch.load(RECORDING, weights_only=False)
    recs = [Recording(**r) for r in saved["recordings"][:3]]
    shapes = planning.menu(window=64, depth=recs[0].k, max_n=recs[0].n_max, policy="best-first")
    planner = planning.make_planner(shapes, planning.modelled_costs(shapes))
    expected = {s: planner.acceptance.total[s] for s in shapes}
    steps = []
    for rec in recs:
        for step in replay_planned(rec, planner, "best-first"):
            steps.append(step)
            g, i = rec.sequence, step.position - rec.prompt_len

            def committed(width):  # the fixed best-first tree of `width` at this step, read from the recording
                tree = replay_tree(rec, i, 1, width, "best-first")
                depth = torch.cat([tree.depth.new_zeros(1, 1), tree.depth], dim=1)
                return int(verify_greedy(tree, g[step.position + depth]).accept_len[0]) + 1

            chosen = committed(step.plan_width)
            assert chosen == step.accept_len + 1
            for s in shapes:  # exact up to the chosen width; a wider tree is credited at most one token past it
                expected[s] += min(committed(s.width), chosen + (s.width > step.plan_width))
    assert expected == planner.acceptance.total
    assert len({s.plan_width for s in steps}) >= 2 and all(s.plan_n == 1 == s.candidates for s in steps)


def test_measured_costs_price_every_shape_of_the_menu():
    model, tok = load_target("tiny-llama")
    shapes = planning.menu(window=16, depth=4)
    costs = planning.measure_costs(model, shapes, torch.tensor(tok.encode("hello world")), repeats=1)
    assert all(costs.time(s, 1) > 0 for s in shapes)
    assert costs.time(Shape(1, 5), 8) == costs.time(Shape(4, 5), 1)  # one forward per width, any batch


def test_replayed_planner_lands_between_the_fixed_shapes_and_near_the_best_one():
    saved = torch.load(RECORDING, weights_only=False)
    recs = [Recording(**r) for r in saved["recordings"][:5]]
    shapes = planning.menu(window=64, depth=recs[0].k, max_n=recs[0].n_max)
    costs = planning.modelled_costs(shapes)
    planner = planning.make_planner(shapes, costs)
    planned = [s for r in recs for s in replay_planned(r, planner)]
    fixed = {s: tau([step for r in recs for step in replay(r, s.n, s.width)]) for s in shapes}
    narrow, wide = fixed[Shape(1, recs[0].k + 1)], fixed[Shape(recs[0].n_max, 64)]
    assert narrow < tau(planned) <= wide
    # what it maximises, expected tokens per modelled second: within 5% of the best fixed shape in hindsight
    best = max(t / costs.time(s, 1) for s, t in fixed.items())
    seconds = sum(costs.time(Shape(s.plan_n, s.plan_width), 1) for s in planned)
    speed = sum(s.accept_len + 1 for s in planned) / seconds
    assert speed >= 0.95 * best
    assert all((s.plan_n, s.plan_width) in {(x.n, x.width) for x in shapes} for s in planned)
