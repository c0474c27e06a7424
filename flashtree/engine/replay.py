"""Counterfactual sweeps without re-running models: record once per prompt, replay any (N <= N_max, W).

Anchors move with acceptance, so one run's steps cannot answer another (N, W). At temperature 0, though, every run
commits the target's greedy sequence g, and a step at position p (p tokens committed, anchor g[p-1]) sees a drafter
fed with g[:p]. So a recording holds, per prompt:
  g          the target's greedy tokens, prompt included, K + 1 past where a run stops (the verify looks ahead);
  end        where a direct run stops: prompt + max_new_tokens, or just after the first stop token;
  candidates (positions, N_max, K): at every position p in [prompt, end), the drafter's N_max blocks given g[:p],
             drawn with a generator seeded by (seed, p), so the first N rows are what a run with N candidates draws
             there (drafters keep candidate order independent of N; see `position_seed`);
  logp       (positions, N_max, K), when the drafter proposes scores: each candidate token's draft log-probability,
             what the `prob` policy ranks by;
  grown      for each policy that grows its tree from the draft's conditionals (`best-first`): its tree at every
             position at the widest replayed width; a narrower tree of such a policy is the first W - 1 of its
             nodes (it adds nodes best first), so one recording serves every width up to that one.
Replay walks (N, W) over it with the same tree policy (`flashtree.tree.build_tree`), greedy walk, stop rule and
record builder the engine uses, so every metric comes out of the same code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..drafters.base import DraftState
from ..planner import Planner, Shape
from ..tree import DEFAULT_POLICY, POLICIES, DraftScores, VoteTree, build_tree, get_policy, verify_greedy
from .planning import step_tree
from .records import StepRecord, step_record
from .stopping import stop_end

RECORDING_VERSION = 2


def position_seed(seed: int, position: int) -> int:
    """Generator seed of the draft at `position`: fixed by (seed, position), independent of N, W and history."""
    return (seed * 1_000_003 + position * 7919 + 1) % (2**63)


@dataclass
class Recording:
    prompt_len: int
    end: int  # exclusive end of what a direct run commits
    sequence: torch.Tensor  # (end + K + 1,) greedy tokens, prompt included
    candidates: torch.Tensor  # (end - prompt_len, N_max, K)
    logp: torch.Tensor | None = None  # (end - prompt_len, N_max, K) float16, when the drafter gives scores
    grown: dict | None = None  # policy -> (tokens, parents) (end - prompt_len, M): its tree at the recorded width

    @property
    def n_max(self) -> int:
        return self.candidates.shape[1]

    @property
    def k(self) -> int:
        return self.candidates.shape[2]


@torch.no_grad()
def greedy_tokens(model, prompt: torch.Tensor, new_tokens: int, hidden_layers=()) -> tuple[torch.Tensor, dict]:
    """The target's greedy continuation (no stop token: the verify looks past one), and the hidden states of the
    requested layers at every position of the result but the last, as the engine hands them to drafters."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    tokens = prompt.to(device).view(1, -1)
    cache = DynamicCache()
    out = model(tokens, past_key_values=cache, use_cache=True)
    for _ in range(new_tokens):
        nxt = out.logits[:, -1].argmax(dim=-1, keepdim=True)
        tokens = torch.cat([tokens, nxt], dim=1)
        out = model(nxt, past_key_values=cache, use_cache=True)
    hidden = {}
    if hidden_layers:
        states = model(tokens[:, :-1], output_hidden_states=True).hidden_states
        hidden = {i: states[i + 1][0] for i in hidden_layers}
    return tokens[0], hidden


def grown_policies() -> list[str]:
    """The policies a recording holds trees of: those that read the draft's conditionals, not only its tokens."""
    return [p.name for p in POLICIES.values() if "step_logprobs" in p.needs_scores]


@torch.no_grad()
def record(model, drafter, prompt, *, n_max: int, max_new_tokens: int, seed: int = 0, stop_ids=None,
           grown_width: int = 0) -> Recording:
    """Record one prompt: the greedy sequence and N_max candidate blocks at every position a run can anchor at, with
    the draft's scores and the grown policies' trees at `grown_width` tokens when the drafter proposes scores."""
    prompt = torch.as_tensor(prompt, dtype=torch.long).view(-1)
    p0 = prompt.numel()
    layers = tuple(drafter.hidden_layers)
    seq, hidden = greedy_tokens(model, prompt, max_new_tokens + drafter.k + 1, layers)
    end = stop_end(seq, prompt_len=p0, max_new_tokens=max_new_tokens,
                   stop_ids=torch.tensor(sorted(set(stop_ids or ())), dtype=torch.long))
    device = seq.device

    def state(length: int, new_from: int) -> DraftState:
        return DraftState(
            tokens=seq[:length].view(1, -1),
            lengths=torch.tensor([length], device=device),
            new_from=torch.tensor([new_from], device=device),
            hidden={i: h[: length - 1].unsqueeze(0) for i, h in hidden.items()},
        )

    drafter.start(state(p0, 0))
    blocks, logps, grown = [], [], {name: ([], []) for name in grown_policies()}
    for pos in range(p0, end):
        if pos > p0:
            drafter.advance(state(pos, pos - 1))
        gen = torch.Generator(device=device).manual_seed(position_seed(seed, pos))
        prop = drafter.propose(n_max, gen)
        blocks.append(prop.candidates[0].to(device))
        if prop.scores is None or prop.scores.logp is None:
            continue
        logps.append(prop.scores.logp[0].to(device, torch.float16))
        for name, (tokens, parents) in grown.items():
            if grown_width >= 2:
                tree = build_tree(prop.candidates, grown_width, name, prop.scores)
                tokens.append(torch.where(tree.valid, tree.tokens, -1)[0].to(device))
                parents.append(tree.parents[0].to(device))
    scored = len(logps) == len(blocks) and bool(blocks)
    trees = {name: (torch.stack(t), torch.stack(p)) for name, (t, p) in grown.items() if t} if scored else {}
    return Recording(prompt_len=p0, end=end, sequence=seq[: end + drafter.k + 1], candidates=torch.stack(blocks),
                     logp=torch.stack(logps) if scored else None, grown=trees or None)


def replay_tree(rec: Recording, i: int, n: int, width: int, policy: str) -> VoteTree:
    """The tree `policy` builds at recorded position i from the first n candidates (bs 1)."""
    return replay_trees([rec], [i], n, width, policy)


def replay_trees(recs: list[Recording], idx: list[int], n: int, width: int, policy: str) -> VoteTree:
    """The trees `policy` builds from the first n candidates, row r at position idx[r] of recs[r]."""
    chosen = get_policy(policy)
    if "step_logprobs" in chosen.needs_scores:
        held = [(rec.grown or {}).get(policy, (None, None)) for rec in recs]
        for tokens, _ in held:
            if tokens is None or tokens.shape[1] < width - 1:
                have = "none" if tokens is None else f"{tokens.shape[1] + 1} tokens"
                raise ValueError(f"tree.policy={policy!r} at W={width}: the recording holds its trees up to {have}; "
                                 "record with a drafter that proposes scores (dspark) and the widest W in "
                                 "replay.widths")
        tokens = torch.stack([t[i, : width - 1] for (t, _), i in zip(held, idx)])
        parents = torch.stack([p[i, : width - 1] for (_, p), i in zip(held, idx)])
        return grown_tree(tokens, parents, recs[0].k, n)
    unscored = any(rec.logp is None for rec in recs)
    if chosen.needs_scores and unscored:
        raise ValueError(f"tree.policy={policy!r} reads the draft's log-probabilities, which this recording lacks "
                         "(its drafter proposes no scores; dspark does)")
    cands = torch.stack([rec.candidates[i, :n] for rec, i in zip(recs, idx)])
    scores = None if unscored else DraftScores(logp=torch.stack([rec.logp[i, :n] for rec, i in zip(recs, idx)]).float())
    return build_tree(cands, width, policy, scores)


def grown_tree(tokens: torch.Tensor, parents: torch.Tensor, k: int, n: int) -> VoteTree:
    """Recorded trees (bs, M): tokens, -1 for padding, and parents of their first nodes, as a VoteTree."""
    valid = tokens >= 0
    depth = torch.ones_like(parents)
    for j in range(parents.shape[1]):  # parents-first: a parent's depth is known before its children's
        above = depth.gather(1, (parents[:, j : j + 1] - 1).clamp(min=0))[:, 0] + 1
        depth[:, j] = torch.where(parents[:, j] > 0, above, 1)
    first = tokens[:, :1].clamp(min=0).expand_as(tokens)
    return VoteTree(tokens=torch.where(valid, tokens, first), parents=torch.where(valid, parents, 0),
                    depth=torch.where(valid, depth, 1), votes=torch.zeros_like(tokens), valid=valid,
                    first_candidate=torch.full_like(tokens, n), k=k)


def replay(rec: Recording, n: int, width: int, policy: str = DEFAULT_POLICY) -> list[StepRecord]:
    """The steps a direct greedy run with N = n, W = width and tree policy `policy` makes on the recorded prompt."""
    return replay_all([rec], n, width, policy)[0]


def replay_all(recs: list[Recording], n: int, width: int, policy: str = DEFAULT_POLICY) -> list[list[StepRecord]]:
    """`replay` of every recording, their steps batched (each row its own prompt: the same steps as one by one)."""
    for rec in recs:
        if not 1 <= n <= rec.n_max:
            raise ValueError(f"tree.n={n}: the recording holds N_max = {rec.n_max} candidates per position")
    return _walk(recs, policy, lambda: Shape(n, width))


def replay_planned(rec: Recording, planner: Planner, policy: str = DEFAULT_POLICY) -> list[StepRecord]:
    """The steps a direct greedy run with tree.n=auto makes: per step the planner's shape, then its update with
    every shape's credit on the recorded candidates, or on the recorded best-first tree at the menu's widest width
    (the engine's `planner` loop, replayed)."""
    over = [s.label() for s in planner.acceptance.shapes if s.n > rec.n_max]
    if over:
        raise ValueError(f"tree.n=auto: the recording holds N_max = {rec.n_max} candidates, the menu has {over}")
    return _walk([rec], policy, lambda: planner.choose(1).shape, planner)[0]


def _walk(recs: list[Recording], policy: str, shape_of_step, planner: Planner | None = None) -> list[list[StepRecord]]:
    """Each recording's greedy run, all walked in step: one tree build and one walk per step for every prompt still
    running."""
    pos = [rec.prompt_len for rec in recs]
    steps: list[list[StepRecord]] = [[] for _ in recs]
    step = 0
    while live := [j for j, rec in enumerate(recs) if pos[j] < rec.end]:
        rows = [recs[j] for j in live]
        idx = [pos[j] - recs[j].prompt_len for j in live]
        shape = shape_of_step()
        build = lambda n, w: replay_trees(rows, idx, n, w, policy)  # noqa: E731
        tree, grown = (build(shape.n, shape.width), None) if planner is None else step_tree(planner, shape, build)
        # The target's choice after a node at depth d on the greedy path is g[pos + d]; off the path it is never
        # read (a node is accepted only if all its ancestors are), so g[pos + d] serves every node.
        depth = torch.cat([tree.depth.new_zeros(len(live), 1), tree.depth], dim=1)
        choice = torch.stack([rec.sequence[pos[j] + d] for rec, j, d in zip(rows, live, depth)])
        res = verify_greedy(tree, choice)
        for r, (rec, j, i) in enumerate(zip(rows, live, idx)):
            # what the run keeps (the engine truncates at the stop / budget) from this step on, for the oracle
            kept = rec.sequence[pos[j] : rec.end]
            steps[j].append(step_record(tree, rec.candidates[i, : shape.n], res, kept, request=0, step=step,
                                        position=pos[j], policy=policy, plan=None if planner is None else shape,
                                        row=r))
        if planner is not None:
            cands = torch.stack([rec.candidates[i] for rec, i in zip(rows, idx)])
            planner.observe(cands, res.tokens, policy, grown)
        for j in live:
            pos[j] += steps[j][-1].accept_len + 1
        step += 1
    return steps
