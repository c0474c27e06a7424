"""The tree decode step for DSparkWorkerV2 (release-agnostic; the adapter supplies the release-specific calls).

One step, per running batch of bs requests (W = tree width with the root = DSPARK's window gamma + 1, K = the draft
positions each candidate keeps = FLASHTREE_TREE_DEPTH, gamma by default; K < gamma gives trees wider than K + 1, with
the server's --speculative-num-draft-tokens W reserving and capturing the wider window):
  1. the verify window: W KV slots per request at req_to_token[req, seq_len : seq_len + W] (DSPARK's own window);
  2. one draft forward over the block (DSPARK's gamma rows, or the first FLASHTREE_DRAFT_ROWS: draft_rows.py), then N
     draws of the block through the draft's Markov head (flashtree's row sampler, over the block's first K positions;
     with FLASHTREE_FUSED_SAMPLER=1 and a vanilla head, `flashtree.sampler.markov_draws`: all steps in K launches):
     candidate 0 is the greedy block, 1..N-1 are independent draws at the draft temperature -> (bs, N, K);
     with FLASHTREE_GRAPH_DRAWS=1 the draws run in the draft's captured CUDA graph tail (graph_draws.py) and the
     step reads them from its buffer (eager as above when the draft forward ran eagerly); a FlashMap draft's N
     candidates are its noise draws instead (flashmap_draft.py);
  3. the tree policy's builder (`flashtree.tree.build_tree`, FLASHTREE_TREE_POLICY; trie-vote by default) -> W - 1
     nodes (`prob` also reads the draws' log q, `best-first` grows its tree from the head instead of drawing:
     policy_draws.py); `verify_inputs` -> the verify ids, the node positions, sglang's FULL_MASK tree mask and the
     step's statistics rows (one launch on CUDA);
  4. target verify through DSPARK's executor with that mask and those positions (with FLASHTREE_TREE_BUDGET, over
     the first w slots of the window and through a verify graph captured at width w: verify_widths.py; likewise a
     fixed FLASHTREE_TREE_WIDTH below the window);
  5. greedy walk with its commit plan, (page size 1) the req_to_token window rewrite and the step's outputs (new
     lengths, output tokens, ...: `commit.step_commit`) in one launch on CUDA (`walk_and_commit`); sampled batches
     walk greedily over one target draw per node (`sampled_draws`: the lossless target-only walk);
  6. commit: page size 1 permutes req_to_token's window so the accepted path's slots come first (no KV moves); paged
     KV copies the accepted nodes' target KV into the window's first offsets (the pool's own move_kv_cache); the
     draft's context K/V is injected for the committed path only, at sequential positions;
  7. sglang's GenerationBatchResult, with per-request tree statistics in `logits_output.customized_info["flashtree"]`
     ([candidates, distinct candidates, tree size, accepted depth, verify width, simulated] per step; they reach the
     response's meta_info; simulated: 1 when the step's length was drawn, simulate.py).
Under tensor parallelism (FLASHTREE_TP=1) the candidates, the sampled walk's draws and a simulated step's lengths are
the TP group's first rank's, and the ranks compare their commits every 64 steps (tp_sync.py).

Batches the step does not take go to DSPARK's own decode unchanged: idle batches (DSPARK's idle result), DP-attention
coordination, sampled batches when N = 1 (DSPARK's chain rejection sampling uses the draft's probabilities and
accepts more than the target-only walk can with one candidate), and batches above FLASHTREE_TREE_MAX_BS requests;
the last two stay on the tree step when a request has penalties or min_p (node_logits.py: per-node exact there) or,
on 0.5.17, return_logprob (logprobs.py: DSPARK's decode there returns none).
Under FLASHTREE_TREE_N=auto the planner (planning.py) picks each remaining batch's shape: a tree of the first N of the
step's candidates at its width (best-first: the first W - 1 nodes of the widest grown tree), or DSPARK's own decode
("planned-chain"); batches with penalties or min_p (and on
0.5.17 return_logprob, logprobs.py) skip it (the default tree). Penalties, logit_bias and custom logit processors
adjust each node's verify logits before the walk (node_logits.py); grammar requests mask every node's row by the
grammar state of its own root-to-node path (grammar_masks.py: sglang's grammar objects walk each constrained request's
tree on the host), and sglang's result processor advances each request's grammar over the committed tokens as after
DSPARK's steps; return_logprob batches get the committed path's logprobs from the adjusted rows (logprobs.py).
"""

from __future__ import annotations

import logging

import torch

from flashtree.sampler.markov import new_state
from flashtree.tree import DraftScores, build_tree, chain_tree, pad_tree, sampled_draws, verify_inputs, walk_and_commit
from flashtree.tree.policies.best_first import first_nodes
from flashtree.tree.simulate import simulated_walk_and_commit
from flashtree.tree.types import VoteTree

from . import checks, graph_draws, host_flag, logprobs, node_logits, planning, policy_draws, simulate
from .block_draws import draw_candidates
from .draft_rows import DraftRows, drafting
from .grammar_masks import TreeGrammar
from .host_copy import HostCopy
from .host_profile import HostProfile
from .stage_times import NO_TIMER, StageTimer
from .tp_sync import TpSync
from .state import TreePlan, TreeRun
from .toggles import TreeToggles, load_for_toggle
from .verify_widths import verifying_with

logger = logging.getLogger("flashtree.patches")

STATS_KEY = "flashtree"
FUSED_SAMPLER = "flashtree.sampler.triton_sampler:sample_rows_triton"


def _load_sampler(toggles: TreeToggles):
    if not toggles.fused_sampler:
        from flashtree.sampler.reference import sample_rows

        return sample_rows
    return load_for_toggle(FUSED_SAMPLER, "FLASHTREE_FUSED_SAMPLER", "flashtree's torch row sampler")


def create_state(adapter, toggles: TreeToggles, worker) -> TreeRun:
    """Check the toggles against this worker (checks.at_worker_start: ToggleError, a SystemExit), plan its tree steps
    and start their run state."""
    checks.at_worker_start(adapter, toggles, worker)
    grown = policy_draws.check(adapter, toggles, worker)
    gamma = adapter.gamma(worker)
    window = gamma + 1
    planned = toggles.planned
    if planned:  # depth, rows and N resolved for the planner's menu
        toggles = planning.resolve_toggles(adapter, toggles, worker, gamma)
    rows = toggles.draft_rows or gamma
    plan = TreePlan(
        adapter=adapter,
        toggles=toggles,
        gamma=gamma,
        depth=toggles.tree_depth or gamma,
        width=window,
        page_size=adapter.page_size(worker),
        tree_width=toggles.tree_width or window,
        policy=toggles.tree_policy,
        sampler=_load_sampler(toggles),
        forward_rows=rows,
        draw_cap=planning.draw_cap(worker) if planned else 0,
        draw_floor=planning.DRAW_FLOOR if planned else 0,
        penalty_lag=adapter.overlap_schedule(worker),
    )
    device = torch.device(getattr(worker, "device", "cpu"))
    generator = torch.Generator(device=device)
    generator.manual_seed(toggles.seed)
    run = TreeRun(
        plan=plan,
        generator=generator,
        noise=new_state(toggles.seed, device) if toggles.fused_sampler else None,
        timer=StageTimer(toggles.stage_times, device) if toggles.stage_times else None,
        host_profile=HostProfile(toggles.profile_host) if toggles.profile_host else None,
        draft_rows=DraftRows(adapter.proposer_with_rows(worker, rows)) if rows < gamma else None,
        simulate=simulate.from_server(adapter, toggles, worker, gamma, device),
        tp=TpSync(adapter.tp_group(worker)),
        grown=grown,
    )
    if planned:
        run.planner = planning.from_plan(plan, run.simulate, device, toggles.seed)
    logger.info("flashtree tree path on (sglang %s): %s, W=%d, gamma=%d, depth=%d", adapter.release, toggles.describe(),
                window, gamma, plan.depth)
    return run


def make_worker_init(original, adapter, toggles: TreeToggles):
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self._flashtree = create_state(adapter, toggles, self)
        if toggles.graph_draws:
            graph_draws.install(self._flashtree, self)  # before the scheduler's init_cuda_graphs builds the sampler

    return __init__


def make_forward_decode(original, adapter, toggles: TreeToggles):
    def _forward_decode(self, batch, on_publish, *args, **kwargs):
        run = getattr(self, "_flashtree", None)
        if run is None:
            raise RuntimeError(
                f"flashtree: {type(self).__name__} was built before flashtree patched it (no tree state); the plugin "
                "must load before the worker is constructed"
            )
        if run.host_profile is not None:
            run.host_profile.on_decode_step()
        per_node = keeps_tree(run.plan, batch)
        reason = skip_reason(run.plan, batch, args, kwargs, per_node)
        barrier = args[0] if args else kwargs.get("grammar_barrier")
        if reason is None and run.planner is not None and not per_node:  # TREE_N=auto
            bs = batch.seq_lens.shape[0]
            shape = run.planner.choose(bs)
            with run.planner.timing(shape, bs):
                if not shape.is_chain:
                    return tree_step(run, self, batch, on_publish, shape, grammar_barrier=barrier)
                result = dspark_step(run, original, self, batch, on_publish, "planned-chain", args, kwargs)
                run.planner.after_chain_step(result.accept_lens)
                return result
        if reason is not None:
            return dspark_step(run, original, self, batch, on_publish, reason, args, kwargs)
        return tree_step(run, self, batch, on_publish, grammar_barrier=barrier)

    return _forward_decode


def dspark_step(run: TreeRun, original, worker, batch, on_publish, reason: str, args, kwargs):
    """DSPARK's own decode step for a batch the tree step does not take (counted by `reason`)."""
    run.fallbacks[reason] = run.fallbacks.get(reason, 0) + 1
    if reason in CHAIN_VERIFY_FALLBACKS:
        stage_chain_mask(run, worker, batch)
    seq_lens = getattr(batch, "seq_lens", None)
    with graph_draws.dspark_proposes_eagerly(worker, 0 if seq_lens is None else seq_lens.shape[0]):
        return original(worker, batch, on_publish, *args, **kwargs)


# Fallbacks whose DSPARK chain step runs a target verify of W tokens per request.
CHAIN_VERIFY_FALLBACKS = ("batch-size", "sampled-n1", "planned-chain")


def stage_chain_mask(run: TreeRun, worker, batch) -> None:
    """Write a chain verify's causal FULL_MASK into the target backend's verify-mask buffer before DSPARK's own step.

    The tree path has the verify graphs captured with a custom mask (Triton leaves the skip-custom-mask set), and a
    replay reads that buffer; DSPARK's chain step passes no mask, so sglang copies none in and the replay would read
    the last tree step's mask (seen live: lower acceptance, and wrong target logits). Eager verifies ignore it.
    FlashInfer's replays get theirs through sglang's own plan (flashinfer_graphs.py)."""
    plan = run.plan
    buf = plan.adapter.verify_mask_buffer(worker)
    if buf is None:
        return
    bs, w = batch.seq_lens.shape[0], plan.width
    total = mask_prefix_bound(plan, worker, batch)
    if total * w + bs * w * w > buf.numel():
        return  # larger than any captured graph's buffer: the verify runs eagerly, causal without a mask
    if bs not in run.chain_trees:  # fixed per batch size: built once, not on every fallback step
        device = batch.seq_lens.device
        run.chain_trees[bs] = (chain_tree(bs, w, device), torch.zeros(bs, dtype=torch.long, device=device))
    tree, anchor = run.chain_trees[bs]
    mask = verify_inputs(tree, anchor, batch.seq_lens, total).mask
    buf[: mask.numel()].copy_(mask)


def mask_prefix_bound(plan: TreePlan, worker, batch) -> int:
    """The host int that sizes a step's verify mask: >= the sum of the batch's seq_lens. DSPARK's reserved lengths
    give one without a host sync (summing the device seq_lens was the one sync of a tree step live, where DSPARK's
    chain step has none); the exact sum only where no bound is on the host."""
    bound = plan.adapter.prefix_sum_bound(worker, batch.seq_lens.shape[0], batch.spec_info, plan.width)
    if bound is not None:
        return bound
    if isinstance(batch.seq_lens_sum, int):
        return batch.seq_lens_sum
    return int(batch.seq_lens.sum())


def keeps_tree(plan: TreePlan, batch) -> bool:
    """Whether a batch stays on the tree step whatever the fallbacks say: DSPARK's chain would apply the root's
    penalty state, ignore min_p (node_logits.py), or return no logprobs (logprobs.py)."""
    return node_logits.batch_needs_tree(batch) or logprobs.needs_tree(plan.adapter, batch)


def skip_reason(plan: TreePlan, batch, args, kwargs, per_node: bool) -> str | None:
    """Why DSPARK's own decode takes the batch (None: the tree step does); `per_node`: keeps_tree's answer."""
    if batch.forward_mode.is_idle():
        return "idle"
    if kwargs.get("coordination_plan") is not None or (len(args) > 1 and args[1] is not None):
        return "dp-attention"
    limit = plan.toggles.tree_max_bs
    if limit and batch.seq_lens.shape[0] > limit and not per_node:
        # FLASHTREE_TREE_MAX_BS: DSPARK's chain step is cheaper here. Both steps leave req_to_token (accepted slots
        # first), the KV and the next draft input (bonus, new seq_lens) in the same sequential layout, so requests
        # move between them from one step to the next.
        return "batch-size"
    info = batch.sampling_info
    all_greedy = info is None or info.is_all_greedy
    if not all_greedy and plan.toggles.tree_n == 1 and not per_node:
        return "sampled-n1"
    return None


def policy_draws_of(run: TreeRun, worker, draft, sampler, bs: int, tree_w: int):
    """What the plan's policy builds from -> (candidates (bs, n, K), their log q (bs, n, K) for `prob` else None, the
    grown tree for `best-first` else None, where the draws ran: "graph" (read from the draft graph tail's buffers) or
    "eager"). The grown tree is at least tree_w tokens wide (the graph tail's width; under the planner the menu's
    widest, which credits every width: planning.py), its first tree_w - 1 nodes the step's tree (`first_nodes`);
    candidate 0 of a headless draft's best-first step is its greedy block."""
    plan = run.plan
    n, k = plan.draws_for(bs), plan.depth
    logp = tree = None
    if draft.candidates is not None:  # drawn by the draft graph's tail (FLASHTREE_GRAPH_DRAWS)
        candidates = draft.candidates[:, :n, :k]  # the tail drew what its graph's (padded) batch size draws: <= n
        n = candidates.shape[1]
        path = "graph"
        draws = sampler.flashtree_draws
        if draws.grown is not None:
            tree = draws.read_tree(bs)
        elif draws.logp is not None:
            logp = draws.logp[:bs, :n]
    else:
        path = "eager"
        if sampler is not None:
            graph_draws.note_eager(run, sampler.flashtree_draws, bs)
        if run.grown is not None:  # best-first: no draws, the tree grows from the head
            candidates = draft.anchor.new_zeros((bs, 1, k), dtype=torch.long)
            width = plan.tree_width if run.planner is not None else tree_w
            tree = policy_draws.grow(draft.base_logits[:, :k], draft.anchor, *run.grown, width=width,
                                     greedy=None if run.grown else candidates[:, 0])
        else:
            hidden = None if draft.draft_hidden is None else draft.draft_hidden[:, :k]
            with_logp = policy_draws.needs_logp(plan.policy) and plan.adapter.logp_from_draws
            drawn = draw_candidates(run, worker, draft.base_logits[:, :k], draft.anchor, hidden, n, with_logp=with_logp)
            candidates, logp = drawn if isinstance(drawn, tuple) else (drawn, None)
    if run.simulate is not None:
        # Random weights' candidates disagree from their first token, so their tree is all depth-1 nodes and no
        # drawn length could be committed along it: a simulated step builds from N copies of candidate 0 (the same
        # shapes and kernels), whose path reaches the full depth.
        candidates = candidates[:, :1].expand_as(candidates)
        logp = None if logp is None else logp[:, :1].expand_as(logp)
        if tree is not None:
            # a grown tree of random marginals is all depth-1 nodes too: once grown (its cost paid), the step verifies
            # the tree of the same width from N copies of the greedy block instead (an argmax and a vote build more,
            # simulated steps only; a simulated server's graph tail writes the argmax block beside its tree), and
            # draws its length by the server's N
            greedy = candidates[:, :1] if draft.base_logits is None else draft.base_logits[:, :k].argmax(-1)[:, None]
            candidates = greedy.expand(bs, plan.draws_for(bs), k)
            tree = build_tree(candidates, tree_w, policy="vote")
    candidates = run.tp.from_first(candidates)  # every rank builds rank 0's tree (its draws are its own generator's)
    if logp is not None:
        logp = run.tp.from_first(logp)
    return candidates, logp, tree, path


def walk(run: TreeRun, tree: VoteTree, logits: torch.Tensor, sampling_info, req_to_token, rows, starts, **step):
    """The accepted path, its commit plan and the step's outputs (`walk_and_commit` with `step`'s arguments); with
    `req_to_token` (page size 1) the window `req_to_token[rows[b], starts[b]:][:W]` is also rewritten so the accepted
    path's slots come first. Greedy batches: one launch on CUDA.
    Here only sglang's sampling_info becomes per-request tensors (top_k = 1 rows are greedy). Sampled batches: the
    walk is greedy over the per-node target draws, which every TP rank takes from the first (run.tp)."""
    bs, w = tree.batch_size, tree.width
    logits = logits.view(bs, w, -1)
    if sampling_info is None or sampling_info.is_all_greedy:
        return walk_and_commit(tree, logits.argmax(dim=-1), req_to_token, rows, starts, **step)
    greedy = (sampling_info.top_ks.view(-1) <= 1)
    temperature = torch.where(greedy, 0.0, sampling_info.temperatures.view(-1).float())
    top_k = torch.where(greedy, 0, sampling_info.top_ks.view(-1).to(torch.long))
    top_k = torch.where(top_k >= logits.shape[-1], 0, top_k)
    top_p = sampling_info.top_ps.view(-1).float()
    if getattr(sampling_info, "need_min_p_sampling", False):
        logits = node_logits.min_p_filtered(logits, temperature, sampling_info.min_ps.view(-1))
    draws = run.tp.from_first(sampled_draws(tree, logits, temperature, run.generator, top_k, top_p))
    return walk_and_commit(tree, draws, req_to_token, rows, starts, **step)


def tree_step(run: TreeRun, worker, batch, on_publish, shape=None, grammar_barrier=None):
    """One tree step; `shape`: the planner's choice (FLASHTREE_TREE_N=auto), a tree of its first N candidates;
    `grammar_barrier`: DSPARK's (advances the previous step's grammars before this step's masks are built)."""
    plan = run.plan
    adapter = plan.adapter
    draft_input = batch.spec_info
    bs = batch.seq_lens.shape[0]
    if shape is None:
        tree_w, w = run.widths_for(bs)  # w: verify tokens per request (DSPARK's window, or a narrower verify graph's)
    else:
        tree_w, w = plan.fit_width(shape.width, run.verify_runners)
    prefix = batch.seq_lens
    timer = run.timer or NO_TIMER

    timer.start()
    window = adapter.alloc_window(worker, batch, bs, draft_input)
    sampler = graph_draws.sampler_of(worker)
    graph_candidates = None if sampler is None else sampler.flashtree_draws.drawn
    with drafting(run, worker) as proposer:
        draft = adapter.draft_forward(worker, batch, draft_input, window, bs, proposer, sampler, graph_candidates)
    anchor = draft.anchor
    timer.mark("draft")
    candidates, logp, grown, path = policy_draws_of(run, worker, draft, sampler, bs, tree_w)
    tree = None if grown is None else first_nodes(grown, tree_w)
    n = candidates.shape[1]
    run.draw_paths[path] = run.draw_paths.get(path, 0) + 1
    drawn = candidates
    if shape is not None and not shape.grown:  # the planner's tree: the first N of the batch's draws
        candidates = candidates[:, : shape.n]
        logp = None if logp is None else logp[:, : shape.n]
        n = candidates.shape[1]
    timer.mark("draws")
    if logp is None and policy_draws.needs_logp(plan.policy):  # DFLASH's eager draws: from the positions' marginals
        logp = adapter.candidate_logp(draft.base_logits, candidates)
    if tree is None:
        tree = build_tree(candidates, tree_w, policy=plan.policy, scores=DraftScores(logp=logp, anchor=anchor))
    tree = pad_tree(tree, w, n)
    if w < plan.width:  # a narrower verify graph: the first w slots of DSPARK's window
        window = window.narrowed(w)

    inputs = verify_inputs(tree, anchor, prefix, mask_prefix_bound(plan, worker, batch), candidates, run.workspace)
    grammar = None
    if getattr(batch, "has_grammar", False):  # each node's mask from its own path's grammar state (grammar_masks.py)
        grammar = TreeGrammar.start(batch.reqs, tree, inputs.ids.view(bs, w))
    timer.mark("build")
    try:  # a deferred grammar walk (FLASHTREE_GRAMMAR_OVERLAP) is owed to the stream however this exits
        with verifying_with(worker, run.verify_runners.get(w)):
            verified = adapter.target_verify(worker, batch, draft_input, window, inputs.ids,
                                             inputs.positions.view(bs, w), inputs.mask)
        logits, penalties = node_logits.adjust(run, worker, batch, tree, inputs.ids.view(bs, w), verified.logits)
        if grammar is not None:  # the bonus row too: the walk commits grammar-valid tokens only
            grammar.apply(logits, run.grammar_rows, batch.sampling_info, grammar_barrier,
                          grammar_flag(run, logits, len(grammar.constrained)))
        timer.mark("verify")

        # Page size 1: the walk also permutes the window in req_to_token so the accepted path's slots come first (no
        # KV moves). Paged KV: a slot's page offset is its position's, so the window stays put and the accepted nodes'
        # target KV is copied to offsets 1..accept_len. Then the draft context is injected for the committed tokens
        # only. The same launch writes what the step hands on (new lengths, int32 commit lengths, output tokens up to
        # DSPARK's W, the statistics rows' accepted depth and, page size 1, the window's slots in commit order).
        paged = plan.page_size > 1
        req_to_token = None if paged else adapter.req_to_token(worker)
        step = dict(seq_lens=prefix, out_width=plan.width, window_slots=None if paged else window.cache_loc_2d,
                    stats=inputs.stats, workspace=run.workspace)
        if run.simulate is not None:  # profiling: a drawn length along one path of the tree (simulate.py)
            accept = run.tp.from_first(run.simulate.draw(bs, n, tree_w, run.generator, grown=grown is not None))
            greedy = verified.logits.view(bs, w, -1).argmax(dim=-1)
            result, commit, out = simulated_walk_and_commit(tree, greedy, accept, req_to_token,
                                                            batch.req_pool_indices, prefix, **step)
        else:
            result, commit, out = walk(run, tree, logits, batch.sampling_info, req_to_token, batch.req_pool_indices,
                                       prefix, **step)
        commit_lens = out.commit_len
        if penalties is not None:
            run.counts.commit(batch.req_pool_indices, result.tokens, commit_lens)
        timer.mark("walk")

        slots = out.slots
        if paged:
            adapter.copy_committed_kv(worker, window.cache_loc_2d, commit)
            slots = window.cache_loc_2d
        hidden = verified.hidden.view(bs, w, -1)
        hidden = hidden.gather(1, commit.permutation.unsqueeze(-1).expand(bs, w, hidden.shape[-1]))
        adapter.inject_committed(worker, batch, hidden.reshape(bs * w, -1), slots, window.positions_2d, commit_lens)
        adapter.publish_req_to_token_write(worker)
        timer.mark("commit")
    finally:
        if grammar is not None:
            grammar.finish()

    new_seq_lens = out.seq_lens
    if on_publish is not None:
        on_publish(new_seq_lens)

    logits_output = verified.logits_output
    logits_output.hidden_states = None
    if getattr(batch, "return_logprob", False):
        logprobs.write(adapter, logits_output, batch, logits.view(bs, w, -1), result.path, result.tokens)
    # the step's constant columns join the rows on the host: no device op for them; the planner's shape 0, 0 when fixed
    planned = (0, 0) if shape is None else (shape.n, shape.width)
    stats = DeferredRows(inputs.stats, tail=(w, int(run.simulate is not None), *planned),
                         drawn=not policy_draws.grows(plan.policy))
    info = dict(getattr(logits_output, "customized_info", None) or {})
    info[STATS_KEY] = stats
    logits_output.customized_info = info
    run.steps += 1
    run.tp.committed(result.tokens, commit_lens, run.steps)
    if shape is not None:
        run.planner.after_tree_step(shape, drawn, result.tokens, commit_lens, grown)

    next_draft_input = adapter.make_next_draft_input(result.bonus, new_seq_lens)
    timer.mark("output")
    timer.end_step(bs, path)
    return adapter.batch_result(
        logits_output=logits_output,
        next_token_ids=out.out_tokens.reshape(-1),
        accept_lens=commit_lens,
        block_accept_lens=commit_lens,
        can_run_cuda_graph=verified.can_run_cuda_graph,
        next_draft_input=next_draft_input,
        speculative_num_draft_tokens=plan.width,
        new_seq_lens=new_seq_lens,
    )


def grammar_flag(run: TreeRun, logits: torch.Tensor, constrained: int):
    """The flag the stream waits on while the scheduler thread walks after queuing the step (FLASHTREE_GRAMMAR_OVERLAP,
    on a GPU), made at the first grammar step; None: the thread walks before queuing the masks' copy. A shape's first
    grammar step (logits rows, constrained requests) walks first too: every kernel the step launches behind the wait,
    Triton's specialisations included, is then loaded before any stream waits (host_flag.py)."""
    if not run.plan.toggles.grammar_overlap or not logits.is_cuda:
        return None
    if run.grammar_flag is None:
        run.grammar_flag = host_flag.host_flag(logits.device) or False  # False: the driver cannot wait, don't retry
    if not run.grammar_flag:
        return None
    shape = (logits.shape[0], constrained)
    if shape not in run.grammar_shapes:
        run.grammar_shapes.add(shape)
        return None
    return run.grammar_flag


def make_collect_stats(original):
    """sglang returns a request's customized_info sliced by output-token offsets (a slice [sent : len(output_ids)] per
    output chunk, i.e. one entry per token), but a tree step commits accepted depth + 1 tokens and adds one statistics
    row, so rows past the token count were cut off (seen live: 30-40% of the steps missing). Pad with None up to the
    request's token count (this step's tokens are already in output_ids here): the slices then return every row."""

    def _maybe_collect_customized_info(self, i, req, logits_output):
        original(self, i, req, logits_output)
        mine = logits_output is not None and STATS_KEY in (getattr(logits_output, "customized_info", None) or {})
        rows = (req.customized_info or {}).get(STATS_KEY) if mine else None
        if rows:
            rows.extend([None] * (len(req.output_ids) - len(rows)))

    return _maybe_collect_customized_info


class DeferredRows(HostCopy):
    """Per-request rows copied to pinned host memory without a host wait. sglang reads `rows[i]` while collecting the
    step's customized_info, after it has waited for the step's own device-to-host copies; the event wait here is then
    free. Each row gets `tail` appended, and with `drawn=False` (best-first draws no candidates) its first two
    columns (candidates, distinct candidates) read 0."""

    def __init__(self, tensor: torch.Tensor, tail: tuple = (), drawn: bool = True):
        super().__init__(tensor)
        self.tail, self.drawn = list(tail), drawn

    def __len__(self) -> int:
        return self.host.shape[0]

    def __getitem__(self, i: int) -> list:
        row = self.wait()[i].tolist()
        if not self.drawn:
            row[:2] = [0, 0]
        return row + self.tail
