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
    with pytest.raises(ValueError, match="reads only the candidate tokens"):
        tree_generate(model, drafter, torch.arange(5), n=4, width=8, max_new_tokens=4, planner=planner, policy="prob")


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
