"""FLASHTREE_TREE_N=auto on CPU: the planner on the patched `_forward_decode` over each release's real classes (tree
kernel, Markov head, draft config parser, draft input, batch result) with the stand-in draft, target and DSPARK chain
step of test_decode_cpu; cost tables injected (the GPU's StepProbe replays captured graphs, stood in here)."""

from __future__ import annotations

import types

import pytest
import torch

import sglang_cpu
from flashtree.patches import adapters, planning, verify_widths
from flashtree.patches.decode import create_state, make_forward_decode
from flashtree.patches.toggles import AUTO_N, ToggleError, TreeToggles, read_toggles
from flashtree.planner import Shape
from test_decode_cpu import (MAX_LEN, W, ChainStep, StandInAdapter, StandInAttnBackend, StandIns, StandInGraphRunner,
                             decode_batch, graph_sampler, reference, standin_proposer, standin_worker, target_logits)

BLOCK = 3  # the stand-in draft checkpoint's block size: trees of depth 3 in DSPARK's 5-token block
PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9]]


@pytest.fixture(scope="module", autouse=True)
def tree_kernels():
    sglang_cpu.force_triton_tree_kernels()


@pytest.fixture(autouse=True)
def _cpu_torch_capture_query(monkeypatch):
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)


def planned_server(graph_max_bs=None, simulate_acc="", capture_bs=(1, 2, 3)):
    """A planned worker as after init_cuda_graphs: its verify graph runners at every menu width (stand-ins)."""
    world = StandIns(PROMPTS, [reference(p, MAX_LEN - len(p) - 2 * W) for p in PROMPTS])
    adapter = StandInAdapter(adapters.select_adapter(), world)
    worker = standin_worker(world)
    if graph_max_bs is not None:
        standin_proposer(world, worker, graph_max_bs)
    else:
        worker.draft_model_runner = types.SimpleNamespace()
    worker.draft_model_runner.model_config = types.SimpleNamespace(hf_config={"dspark_block_size": BLOCK})
    toggles = TreeToggles(tree_n=AUTO_N, seed=5, graph_draws=graph_max_bs is not None, simulate_acc=simulate_acc)
    worker._flashtree = state = create_state(adapter, toggles, worker)
    state.planner.retime_after = 0  # injected cost tables stay (test_served_step_times_move_the_whole_table)
    if graph_max_bs is not None:
        torch.manual_seed(7)
        graph_sampler(worker, state, graph_max_bs)
        if state.draft_rows is not None:
            from flashtree.patches import draft_rows

            draft_rows.capture(state, worker)
    worker.model_runner.attn_backend = StandInAttnBackend(worker.model_runner)
    worker.model_runner.decode_cuda_graph_runner = StandInGraphRunner(worker.model_runner, capture_bs=list(capture_bs))
    verify_widths.capture(state, worker)
    return world, adapter, worker, state


def decode(world, adapter, worker, state, schedule, steps, greedy=True, sampling_info=None):
    """Decode through the patched `_forward_decode` over the stand-in DSPARK chain step, each step on the subset of
    requests `schedule` names (cycled). Every commit keeps the sequential req_to_token / KV / draft-context layout;
    with `greedy` it is also checked against the stand-in target's sequential greedy decode (with `sampling_info`:
    its top_k = 1 rows; the others commit tokens the target can sample). Returns (the shape
    label of each step, committed tokens per step and path, tree statistics rows, the chain stand-in)."""

    refs = world.refs
    chain = ChainStep(adapter)
    forward = make_forward_decode(chain, adapter, TreeToggles(tree_n=AUTO_N))
    seq = [len(p) for p in PROMPTS]
    bonus = [refs[i][len(p)] for i, p in enumerate(PROMPTS)]
    generated = [[bonus[i]] for i in range(len(PROMPTS))]
    labels, commits, rows = [], {"tree": [], "chain": []}, []
    chosen = []
    real_choose = state.planner.choose
    state.planner.choose = lambda bs: chosen.append(real_choose(bs)) or chosen[-1]
    for step in range(steps):
        idx = schedule[step % len(schedule)]
        if max(seq) + 2 * W >= MAX_LEN - 2 * W:
            break
        batch = decode_batch(world, idx, seq, bonus, sampling_info)
        tree_steps = state.steps
        res = forward(worker, batch, None)
        path = "tree" if state.steps == tree_steps + 1 else "chain"
        assert (path == "chain") == chosen[-1].is_chain
        labels.append(chosen[-1].label())
        if path == "tree":
            rows.append(res.logits_output.customized_info["flashtree"])
        commit = res.accept_lens.to(torch.int64)
        commits[path].append(commit)
        out = res.next_token_ids.view(len(idx), W)
        for j, i in enumerate(idx):
            L, c = seq[i], int(commit[j])
            ctx = world.context(i, L + c)
            assert ctx == PROMPTS[i] + generated[i] + out[j, : c - 1].tolist()
            if greedy and (sampling_info is None or int(sampling_info.top_ks[j]) <= 1):
                assert out[j, :c].tolist() == refs[i][L + 1 : L + 1 + c], f"step {step} ({labels[-1]}) request {i}"
            elif greedy:  # a sampled row: each committed token one the target can sample after what precedes it
                after = ctx + [int(out[j, c - 1])]  # the anchor at position L, then the committed tokens
                assert all(target_logits(after[: L + 1 + t])[int(out[j, t])] > -10 for t in range(c))
            slots = world.req_to_token[world.rows[i], L : L + c]
            assert world.draft_kv[slots, 0].tolist() == list(range(L, L + c))
            seq[i], bonus[i] = L + c, int(res.next_draft_input.bonus_tokens[j])
            generated[i].extend(out[j, :c].tolist())
    return labels, commits, rows, chain


def table(fn):
    """An injected time_step: fn(shape, bs) -> ms."""
    return lambda shape, bs: fn(shape, bs) / 1e3


def test_the_menu_comes_from_the_draft_block_and_the_window():
    """The draft checkpoint's block size (3) sets the depth, DSPARK's window (6) the widest tree; the chain is on the
    menu, every tree step draws the menu's largest N, and verify graphs are captured at every narrower menu width.
    N = 1 (the draft's greedy block: 4 nodes) comes at the narrowest width only: at W = 6 it is the same tree."""
    _world, _adapter, _worker, state = planned_server()
    plan = state.plan
    assert plan.depth == BLOCK and plan.width == W and plan.toggles.tree_n == 4
    rows = BLOCK if adapters.select_adapter().draft_rows_release else 0  # 0.5.17: the draft forward over the depth
    assert state.planner.shapes == [Shape(0, W), Shape(1, 4, rows), Shape(4, 4, rows), Shape(4, W, rows)]
    assert sorted(state.verify_runners) == [4] and state.verify_runners[4].width == 4


@pytest.mark.parametrize("graph_max_bs", [None, 8], ids=["eager-draws", "graph-draws"])
def test_auto_serves_trees_or_the_chain_per_batch_size_and_commits_the_greedy_decode(graph_max_bs):
    """Trees pay at 1-2 requests (N=4, W=4 cheapest), not at 3 (the chain's step is 100x cheaper): 3-request batches
    run DSPARK's chain, smaller ones the chosen tree; requests cross between them and every commit of either path
    is the sequential greedy decode. Each step's credits reach the estimates: the tree that ran is credited with
    exactly what it committed; statistics rows carry the chosen shape (N, verify width)."""
    world, adapter, worker, state = planned_server(graph_max_bs)
    planner = state.planner
    planner.credit_every = {"tree": 1, "chain": 1}
    best = Shape(4, 4, state.planner.trees[0].rows)

    def ms(shape, bs):
        if shape.is_chain:
            return 1.0
        if bs == 3:
            return 100.0
        return 0.1 if shape == best else 0.5

    planning.measure(state, worker, table(ms))
    assert planner.planner.costs.sizes(best) == [1, 2, 3]
    prior_total = dict(planner.planner.acceptance.total)
    schedule = [[0, 1, 2], [2, 0], [1], [0, 1, 2], [1, 2], [0]]
    labels, commits, rows, chain = decode(world, adapter, worker, state, schedule, 24)
    want = [Shape(0, W).label() if len(schedule[s % len(schedule)]) == 3 else best.label() for s in range(24)]
    assert labels == want
    n_chain = want.count(Shape(0, W).label())
    assert state.fallbacks == {"planned-chain": n_chain} and chain.calls == [3] * n_chain
    assert state.steps == 24 - n_chain
    assert all(r[0] == 4 and r[4] == 4 and r[6:] == [best.n, best.width] for step in rows for r in step)
    assert sum(int((c > 2).sum()) for c in commits["tree"]) > 0  # trees accepted deep
    credited = planner.planner.acceptance
    assert planner.credited == 23  # every step but the last: applied at the next decision
    applied = commits["tree"] if want[-1] == Shape(0, W).label() else commits["tree"][:-1]
    assert credited.total[best] - prior_total[best] == pytest.approx(sum(int(c.sum()) for c in applied))
    assert credited.count[best] == credited.prior_weight + sum(len(c) for c in applied)
    # the chain: its own steps (the last one's credit is applied after the run) and the trees' counterfactual credit
    chain_credit = 3 * n_chain - (3 if want[-1] == Shape(0, W).label() else 0)
    tree_credit = sum(len(c) for c in applied)
    assert credited.count[Shape(0, W)] == credited.prior_weight + chain_credit + tree_credit
    if graph_max_bs is not None:
        draws = state.graph_draws
        assert state.draw_paths == {"graph": state.steps} and draws.lean_bs == 0 and chain.graph_blocks == n_chain
        # with draft-row graphs (0.5.17) only the tree steps' replays draw; else DSPARK's graphs draw for both paths
        assert draws.calls == state.steps + (0 if state.draft_rows is not None else n_chain)


@pytest.mark.parametrize("graph_max_bs", [None, 8], ids=["eager-draws", "graph-draws"])
def test_a_batch_is_offered_only_the_shapes_whose_candidates_it_draws(monkeypatch, graph_max_bs):
    """Under a cap of 4 candidates per batch (planning.draw_cap): one request draws N = 4, two draw 2, three draw 1, so the
    4-candidate trees are timed and offered at one request only and larger batches take the N = 1 tree though N = 4
    is cheaper; each step draws its batch's N and commits the greedy decode."""
    monkeypatch.setattr(planning, "draw_cap", lambda worker: 4)
    monkeypatch.setattr(planning, "DRAW_FLOOR", 1)
    world, adapter, worker, state = planned_server(graph_max_bs)
    assert [state.plan.draws_for(bs) for bs in (1, 2, 3, 9)] == [4, 2, 1, 1]
    rows = state.planner.trees[0].rows
    single, best = Shape(1, 4, rows), Shape(4, 4, rows)
    planning.measure(state, worker, table(lambda shape, bs: 1.0 if shape.is_chain else 0.1 if shape.n == 4 else 0.2))
    costs = state.planner.planner.costs
    assert costs.sizes(best) == [1] and costs.sizes(single) == [1, 2, 3]
    drawn = []
    real_after = state.planner.after_tree_step
    state.planner.after_tree_step = lambda shape, cands, *a: drawn.append(cands.shape[1]) or real_after(shape, cands, *a)
    labels, _commits, _rows, _chain = decode(world, adapter, worker, state, [[0, 1, 2], [0], [1, 2]], 9)
    assert labels == [single.label(), best.label(), single.label()] * 3
    assert drawn == [1, 4, 2] * 3


def test_sampled_rows_take_the_planned_tree_walk():
    """A batch with a temperature-0.7 row between two greedy ones under auto: the planned tree's sampled walk serves
    it (committing tokens the target samples), the greedy rows stay the greedy decode, and sampled steps credit too."""
    world, adapter, worker, state = planned_server()
    state.planner.credit_every = {"tree": 1, "chain": 1}
    narrow = Shape(4, 4, state.planner.trees[0].rows)
    planning.measure(state, worker, table(lambda shape, bs: 0.1 if shape == narrow else 5.0))
    greedy = torch.tensor([True, False, True])
    info = types.SimpleNamespace(is_all_greedy=False, temperatures=torch.where(greedy, 1.0, 0.7).view(-1, 1),
                                 top_ks=torch.where(greedy, 1, 1 << 30).to(torch.int32), top_ps=torch.ones(3))
    labels, commits, _rows, _chain = decode(world, adapter, worker, state, [[0, 1, 2]], 12, sampling_info=info)
    assert set(labels) == {narrow.label()} and state.planner.credited == 11
    assert sum(int(c[1]) for c in commits["tree"]) > 12  # the sampled row accepted drafts too


def test_auto_runs_the_chain_when_trees_do_not_pay():
    """A cost table in which every tree step takes 10x the chain's: every batch runs DSPARK's chain step, and the
    periodic summary says so."""
    world, adapter, worker, state = planned_server()
    planning.measure(state, worker, table(lambda shape, bs: 1.0 if shape.is_chain else 10.0))
    state.planner.log_every = 5
    labels, commits, _rows, chain = decode(world, adapter, worker, state, [[0, 1, 2], [1]], 10)
    assert set(labels) == {Shape(0, W).label()} and state.steps == 0 and len(chain.calls) == 10
    assert state.planner.planner.summary() == [{"bs": 1, "shape": "chain(W=6)", "steps": 5},
                                               {"bs": 3, "shape": "chain(W=6)", "steps": 5}]


def test_online_estimates_move_the_choice():
    """The choice follows the estimates: a prior that overrates the W = 6 tree of 4 candidates makes it the first
    choice, and what the steps credit (this draft's trees of depth 3 accept about as much at W = 4, whose step is
    cheaper here) moves the planner to the W = 4 tree; the first estimate falls, the second rises."""
    world, adapter, worker, state = planned_server()
    planner = state.planner
    planner.credit_every = {"tree": 1, "chain": 1}
    acceptance = planner.planner.acceptance
    rows = planner.trees[0].rows
    wide, narrow = Shape(4, W, rows), Shape(4, 4, rows)
    for s in planner.shapes:  # a prior of 8 steps: the wide tree 5 tokens per step, every other shape 1.5
        acceptance.count[s] = 8.0
        acceptance.total[s] = (5.0 if s == wide else 1.5) * 8.0
    costs = {wide: 1.0, narrow: 0.6}
    planning.measure(state, worker, table(lambda shape, bs: costs.get(shape, 10.0)))
    labels, _commits, _rows, _chain = decode(world, adapter, worker, state, [[0, 1, 2]], 30)
    assert labels[0] == wide.label() and labels[-5:] == [narrow.label()] * 5, labels
    assert acceptance.tau(wide) < 3.0 and acceptance.tau(narrow) > 1.5


def test_served_step_times_move_the_whole_table():
    """Timed served steps replace the start-up estimates and shift every other shape's by the same excess: a table
    that prices the W = 4 tree at 0.1 ms and the chain at 1 ms (a CPU step of the stand-ins takes far longer) gets
    the tree's measured mean after 4 timed steps, the chain's entry rises by the tree's excess, and the planner keeps
    the tree (the start-up table said it is cheaper by 0.9 ms, and nothing served says otherwise). Replacing only
    the served entry would send the planner to each shape not yet served in turn."""
    world, adapter, worker, state = planned_server()
    planner = state.planner
    planner.time_every, planner.retime_after = 1, 4
    planner.credit_every = {"tree": 1000, "chain": 1000}  # credited steps are never timed
    narrow, chain = Shape(4, 4, planner.trees[0].rows), Shape(0, W)
    planning.measure(state, worker, table(lambda shape, bs: {narrow: 0.1}.get(shape, 1.0 if shape.is_chain else 50.0)))
    labels, _commits, _rows, _chain = decode(world, adapter, worker, state, [[0, 1, 2]], 8)
    assert labels == [narrow.label()] * 8, labels
    seconds, steps = planner._timed[(narrow, 3)]
    costs = planner.planner.costs
    served = costs.served[(narrow, 3)]
    assert steps >= 4 and served > 1e-3 and costs.seconds[(narrow, 3)] == 1e-4
    assert costs.time(chain, 3) == pytest.approx(1e-3 + served - 1e-4)


def test_credited_steps_are_never_timed():
    """A credited step's time would hold its credit's work: every other step is credited here, the others timed."""
    chain, tree = Shape(0, W), Shape(4, W)
    planner = planning.ServerPlanner([chain, tree], credit_every={"tree": 2, "chain": 2}, time_every=1)
    planner.planner.costs.add(tree, 1, 1e-3)
    planner.planner.costs.add(chain, 1, 1e-2)
    credited = []
    for _ in range(6):
        shape = planner.choose(1)
        with planner.timing(shape, 1):
            credited.append(planner._credit_now)
    assert credited == [False, True] * 3 and len(planner._times) == 0 and planner._timed[(tree, 1)][1] == 3


def test_simulated_acceptance_credits_each_step_its_drawn_lengths(tmp_path):
    """FLASHTREE_SIMULATE_ACC: the planner's prior is the table's τ per shape and its estimates take the lengths the
    steps drew (what a user profiling sees) for the shape that ran, and for every other shape lengths drawn from its
    own table row (a drawn length says nothing of the others; a verified step credits them all)."""
    from flashtree.planner.accept_table import AcceptTable

    path = tmp_path / "accept.json"
    AcceptTable({(1, W): (1, 1, 1, 1), (4, 4): (0, 0, 0, 1), (4, W): (2, 1, 1, 0)}).save(path)
    world, adapter, worker, state = planned_server(simulate_acc=str(path))
    planner = state.planner
    planner.credit_every = {"tree": 1, "chain": 1}
    acceptance = planner.planner.acceptance
    rows = planner.trees[0].rows
    assert acceptance.tau(Shape(4, 4, rows)) == pytest.approx(4.0) and acceptance.tau(Shape(0, W)) == pytest.approx(2.5)
    before = dict(acceptance.count)
    planning.measure(state, worker, table(lambda shape, bs: 1.0 if shape == Shape(4, W, rows) else 50.0))
    labels, commits, _rows, _chain = decode(world, adapter, worker, state, [[0, 1, 2]], 12, greedy=False)
    ran = Shape(4, W, rows)
    assert set(labels) == {ran.label()}
    assert all(acceptance.count[s] == before[s] + 3 * 11 for s in planner.shapes)
    drawn = torch.cat(commits["tree"][:11])
    assert set(drawn.tolist()) <= {1, 2, 3}  # the table's N = 4, W = 6 lengths (accepted 0-2, + 1)
    # N = 4 in W = 4 drew 3 accepted every time (capped by nothing: depth 3); the chain over W from its own row
    assert acceptance.total[Shape(4, 4, rows)] == pytest.approx(before[Shape(4, 4, rows)] * 4.0 + 3 * 11 * 4)
    chain = acceptance.total[Shape(0, W)] - 2.5 * before[Shape(0, W)]
    assert 3 * 11 <= chain <= 3 * 11 * 4 and chain != 3 * 11 * 4


def test_simulated_credits_of_the_shapes_a_step_did_not_run():
    """`commits`: a tree's drawn lengths capped by the tree's depth, the chain's from the recorded chain nearest its
    window capped by that window, plus the bonus; SGLANG_SIMULATE_ACC_LEN's one length for every shape alike."""
    from flashtree.patches import simulate
    from flashtree.planner.accept_table import AcceptTable

    table = AcceptTable({(1, 8): (0, 0, 0, 0, 0, 0, 1), (8, 8): (0, 0, 0, 0, 0, 0, 0, 1)})
    recorded = simulate.RecordedLength(table, "t.json", torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    assert recorded.commits(Shape(8, 8), 5, g, depth=4).tolist() == [5] * 5  # 7 accepted, capped at depth 4
    assert recorded.commits(Shape(8, 8), 3, g, depth=7).tolist() == [8] * 3
    assert recorded.commits(Shape(0, 64), 2, g, depth=4).tolist() == [7] * 2  # the W = 8 chain's 6, not the depth
    assert recorded.commits(Shape(0, 5), 2, g, depth=4).tolist() == [5] * 2  # capped by a 5-token window
    constant = simulate.SglangLength(types.SimpleNamespace(simulated_correct_len=lambda length, gamma: 3), 4.0, 7,
                                     torch.device("cpu"))
    assert constant.commits(Shape(8, 16), 2, None, depth=2).tolist() == [3, 3]
    assert constant.commits(Shape(0, 16), 2, None, depth=2).tolist() == [4, 4]


def test_auto_toggle_values():
    """'auto' or an integer; auto's own defaults for the draws (0.7, the fused sampler) and every tree's split-KV
    verify only where those are unset, split-KV verify not beside exact verify; the defaulted ones are recorded."""
    auto = read_toggles({"FLASHTREE_TREE_N": "auto"})
    assert auto.planned and auto.tree_enabled and (auto.draft_temperature, auto.fused_sampler) == (0.7, True)
    assert auto.splitkv_verify and not auto.exact_verify
    mine = read_toggles({"FLASHTREE_TREE_N": "auto", "FLASHTREE_FUSED_SAMPLER": "0", "FLASHTREE_DRAFT_TEMPERATURE": "1",
                         "FLASHTREE_SPLITKV_VERIFY": "0"})
    assert (mine.draft_temperature, mine.fused_sampler, mine.splitkv_verify) == (1.0, False, False)
    exact = read_toggles({"FLASHTREE_TREE_N": "auto", "FLASHTREE_EXACT_VERIFY": "1"})
    assert exact.exact_verify and not exact.splitkv_verify
    fixed = read_toggles({"FLASHTREE_TREE_N": "8"})  # a fixed tree: the split-KV default, not auto's draws
    assert not fixed.planned and (fixed.draft_temperature, fixed.fused_sampler, fixed.splitkv_verify) == (1.0, False,
                                                                                                        True)
    assert fixed.defaulted == {"FLASHTREE_SPLITKV_VERIFY"} and auto.defaulted == {
        "FLASHTREE_SPLITKV_VERIFY", "FLASHTREE_DRAFT_TEMPERATURE", "FLASHTREE_FUSED_SAMPLER"}
    assert mine.defaulted == frozenset() and exact.defaulted == {"FLASHTREE_DRAFT_TEMPERATURE", "FLASHTREE_FUSED_SAMPLER"}
    assert not read_toggles({"FLASHTREE_SPLITKV_VERIFY": "1"}).defaulted  # no tree: no tree defaults
    assert not read_toggles({"FLASHTREE_TREE_N": "8", "FLASHTREE_EXACT_VERIFY": "1"}).splitkv_verify
    with pytest.raises(ToggleError) as err:
        read_toggles({"FLASHTREE_TREE_N": "automatic"})
    assert str(err.value) == ("flashtree: FLASHTREE_TREE_N='automatic' is invalid; allowed: 'auto' (the planner picks "
                              "each decode batch's tree or DSPARK's chain) or an integer from 0 to 256")
    with pytest.raises(ToggleError, match="FLASHTREE_TREE_N=auto chooses each batch's tree width itself"):
        read_toggles({"FLASHTREE_TREE_N": "auto", "FLASHTREE_TREE_BUDGET": "64"})
    with pytest.raises(ToggleError, match="FLASHTREE_TREE_N=auto with FLASHTREE_TP=1: each tensor-parallel rank"):
        read_toggles({"FLASHTREE_TREE_N": "auto", "FLASHTREE_TP": "1"})
    with pytest.raises(ToggleError) as err:
        read_toggles({"FLASHTREE_TREE_N": "auto", "FLASHTREE_TREE_POLICY": "prob"})
    assert str(err.value) == (
        "flashtree: FLASHTREE_TREE_N=auto credits every shape from each step's own tree (trie-vote trees from the same "
        "candidates, best-first trees as the first nodes of the widest), which FLASHTREE_TREE_POLICY=prob trees are "
        "not; allowed: FLASHTREE_TREE_POLICY=vote or best-first (unset: vote) with auto, or an integer "
        "FLASHTREE_TREE_N with prob")
    for policy in ("vote", "best-first"):
        assert read_toggles({"FLASHTREE_TREE_N": "auto", "FLASHTREE_TREE_POLICY": policy}).planned


def test_auto_with_best_first_is_refused_on_dspark():
    """best-first under auto plans DFLASH only: on DSPARK its steps grow from the Markov head and draw no greedy
    block to credit DSPARK's chain by; the worker start says so and what is allowed (vote there: the control)."""
    world = StandIns(PROMPTS, [reference(p, MAX_LEN - len(p) - 2 * W) for p in PROMPTS])
    adapter = StandInAdapter(adapters.select_adapter(), world)
    worker = standin_worker(world)
    worker.draft_model_runner = types.SimpleNamespace(
        model_config=types.SimpleNamespace(hf_config={"dspark_block_size": BLOCK}))
    with pytest.raises(ToggleError) as err:
        create_state(adapter, TreeToggles(tree_n=AUTO_N, tree_policy="best-first"), worker)
    assert str(err.value) == (
        "flashtree: FLASHTREE_TREE_N=auto with FLASHTREE_TREE_POLICY=best-first plans DFLASH servers only: a "
        "best-first step on DSPARK grows its tree from the Markov head and draws no greedy block, so nothing would "
        "credit DSPARK's chain; allowed: FLASHTREE_TREE_POLICY=vote (or unset) with auto, an integer FLASHTREE_TREE_N "
        "with best-first, or a DFLASH server")
    assert create_state(adapter, TreeToggles(tree_n=AUTO_N), worker).planner is not None


class FakeGraph:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def replay(self):
        self.log.append(self.name)


def graphs(runner, log, name, sizes):
    from sglang.srt.model_executor.runner.shape_key import ShapeKey

    runner.backend = types.SimpleNamespace(_graphs={ShapeKey(size=b): FakeGraph(log, f"{name}{b}") for b in sizes})
    runner.backend._graphs[ShapeKey(size=1, stream_idx=0)] = FakeGraph(log, "pdmux")  # not a plain decode graph


def test_step_probe_times_each_shape_over_its_own_graphs():
    """StepProbe (the GPU's time_step) on the captured graphs as sglang's runner backends keep them (the release's
    real ShapeKey): a chain step replays DSPARK's draft graph and the verify graph at the window, a tree step the
    tree steps' draft graph, the tree kernels and the verify graph at its width, each at the batch's size; a shape
    whose graph is missing at a size is not timed there, and a server with no graphs at all refuses auto."""
    _world, _adapter, worker, state = planned_server(graph_max_bs=8, capture_bs=(1, 2))
    log = []
    graphs(worker.model_runner.decode_cuda_graph_runner, log, "verify6@", [1, 2])
    graphs(state.verify_runners[4], log, "verify4@", [1])
    draft = state.draft_rows.runner if state.draft_rows is not None else None
    graphs(worker.draft_model_runner.decode_cuda_graph_runner, log, "dspark-draft@", [1, 2])
    if draft is not None:
        graphs(draft, log, "rows-draft@", [1, 2])
    tree_draft = "rows-draft@" if draft is not None else "dspark-draft@"
    probe = planning.StepProbe(state, worker, repeats=2)
    for shape, bs, want in [(Shape(0, W), 2, ["dspark-draft@2", "verify6@2"]),
                            (state.planner.trees[1], 1, [f"{tree_draft}1", "verify4@1"])]:
        log.clear()
        assert probe(shape, bs) > 0
        assert log == want * 3, (shape, log)
    assert probe(state.planner.trees[1], 2) is None  # no verify graph at width 4 for 2 requests
    ragged = types.SimpleNamespace(ragged_verify_mode=True, **vars(worker.model_runner.decode_cuda_graph_runner))
    assert adapters.select_adapter().graph_replays(ragged) == {}  # keyed by tokens there, not requests
    costs = planning.measure(state, worker, probe)
    assert {(s.label(), bs) for s, bs in costs.seconds} == (
        {(s.label(), bs) for s in state.planner.shapes for bs in (1, 2)} - {(s.label(), 2) for s in state.planner.trees
                                                                          if s.width == 4})
    _world, _adapter, worker, state = planned_server()
    with pytest.raises(ToggleError, match="FLASHTREE_TREE_N=auto could not time any step shape at server start"):
        planning.measure(state, worker)  # stand-in runners without graphs


def test_the_draw_cap_comes_from_the_vocabulary():
    """512 candidates per batch at SmolLM2's vocabulary, 165 at Qwen3's; none where the model config has no size."""
    def worker(vocab):
        return types.SimpleNamespace(model_runner=types.SimpleNamespace(model_config=types.SimpleNamespace(
            vocab_size=vocab)))

    assert [planning.draw_cap(worker(v)) for v in (49152, 151936, 10**9)] == [512, 165, 1]
    assert planning.draw_cap(types.SimpleNamespace()) == 0


def test_a_planned_batch_draws_at_least_the_floor_per_request():
    """A 64-candidate menu at Qwen3's vocabulary (a cap of 165 per batch): one request draws 64, 8 draw 16, and 16 to 64
    requests still draw DRAW_FLOOR = 8 each (the best fixed tree there); the floor never raises N above the menu's."""
    import dataclasses

    _world, _adapter, _worker, state = planned_server()
    plan = dataclasses.replace(state.plan, toggles=dataclasses.replace(state.plan.toggles, tree_n=64), draw_cap=165)
    assert plan.draw_floor == planning.DRAW_FLOOR == 8
    assert [plan.draws_for(bs) for bs in (1, 2, 8, 16, 32, 64)] == [64, 64, 16, 8, 8, 8]
    small = dataclasses.replace(plan, toggles=dataclasses.replace(plan.toggles, tree_n=4))
    assert [small.draws_for(bs) for bs in (1, 64)] == [4, 4]


def test_the_probe_grows_a_headless_best_first_tree_as_the_step_does(monkeypatch):
    """The start-up probe's tree step for a best-first draft with independent positions (DFLASH) grows its tree from
    the positions' top k (one launch on a GPU), as the served step does, not by the registered builder's W - 1 rounds
    (milliseconds eager: live run 36's table priced such a step twice its served time); a Markov head's best-first
    step still goes through the builder."""
    from flashtree.patches import warmup
    from flashtree.tree import build_tree

    built = []
    monkeypatch.setattr(warmup, "build_tree", lambda *a, **kw: built.append(kw["policy"]) or build_tree(*a, **kw))
    plan = types.SimpleNamespace(depth=4, width=8, policy="best-first")
    warmup.dummy_step(plan, torch.device("cpu"), None, 2, 1, 8, 8, grown=())
    assert built == []
    head = (torch.zeros(3, 2), torch.zeros(5, 2))  # a vanilla head's (w1, w2): the builder's rounds
    warmup.dummy_step(plan, torch.device("cpu"), None, 2, 1, 8, 8, grown=head)
    assert built == ["best-first"]
