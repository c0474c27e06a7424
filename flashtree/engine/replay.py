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
    chosen = get_policy(policy)
    cands = rec.candidates[i, :n].unsqueeze(0)
    if "step_logprobs" in chosen.needs_scores:
        tokens, parents = (rec.grown or {}).get(policy, (None, None))
        if tokens is None or tokens.shape[1] < width - 1:
            have = "none" if tokens is None else f"{tokens.shape[1] + 1} tokens"
            raise ValueError(f"tree.policy={policy!r} at W={width}: the recording holds its trees up to {have}; "
                             "record with a drafter that proposes scores (dspark) and the widest W in replay.widths")
        return grown_tree(tokens[i, : width - 1], parents[i, : width - 1], rec.k, n)
    if chosen.needs_scores and rec.logp is None:
        raise ValueError(f"tree.policy={policy!r} reads the draft's log-probabilities, which this recording lacks "
                         "(its drafter proposes no scores; dspark does)")
    scores = None if rec.logp is None else DraftScores(logp=rec.logp[i, :n].float().unsqueeze(0))
    return build_tree(cands, width, policy, scores)


def grown_tree(tokens: torch.Tensor, parents: torch.Tensor, k: int, n: int) -> VoteTree:
    """A recorded tree (tokens, -1 for padding, and parents of its first nodes) as a bs-1 VoteTree."""
    valid = tokens >= 0
    depth = torch.ones_like(parents)
    for j in range(parents.shape[0]):  # parents-first: a parent's depth is known before its children's
        if parents[j] > 0:
            depth[j] = depth[parents[j] - 1] + 1
    first = tokens[:1].clamp(min=0).expand_as(tokens)
    row = lambda x: x.view(1, -1)  # noqa: E731
    return VoteTree(tokens=row(torch.where(valid, tokens, first)), parents=row(torch.where(valid, parents, 0)),
                    depth=row(torch.where(valid, depth, 1)), votes=row(torch.zeros_like(tokens)), valid=row(valid),
                    first_candidate=row(torch.full_like(tokens, n)), k=k)


def replay(rec: Recording, n: int, width: int, policy: str = DEFAULT_POLICY) -> list[StepRecord]:
    """The steps a direct greedy run with N = n, W = width and tree policy `policy` makes on the recorded prompt."""
    if not 1 <= n <= rec.n_max:
        raise ValueError(f"tree.n={n}: the recording holds N_max = {rec.n_max} candidates per position")
    return _walk(rec, policy, lambda: Shape(n, width))


def replay_planned(rec: Recording, planner: Planner, policy: str = DEFAULT_POLICY) -> list[StepRecord]:
    """The steps a direct greedy run with tree.n=auto makes: per step the planner's shape, then its update with
    every shape's credit on the recorded candidates, or on the recorded best-first tree at the menu's widest width
    (the engine's `planner` loop, replayed)."""
    over = [s.label() for s in planner.acceptance.shapes if s.n > rec.n_max]
    if over:
        raise ValueError(f"tree.n=auto: the recording holds N_max = {rec.n_max} candidates, the menu has {over}")
    return _walk(rec, policy, lambda: planner.choose(1).shape, planner)


def _walk(rec: Recording, policy: str, shape_of_step, planner: Planner | None = None) -> list[StepRecord]:
    g = rec.sequence
    committed = g[: rec.end]  # what the run keeps (the engine truncates at the stop / budget)
    pos, step, steps = rec.prompt_len, 0, []
    while pos < rec.end:
        i = pos - rec.prompt_len
        shape = shape_of_step()
        cands = rec.candidates[i, : shape.n]
        build = lambda n, w: replay_tree(rec, i, n, w, policy)  # noqa: E731
        tree, grown = (build(shape.n, shape.width), None) if planner is None else step_tree(planner, shape, build)
        # The target's choice after a node at depth d on the greedy path is g[pos + d]; off the path it is never
        # read (a node is accepted only if all its ancestors are), so g[pos + d] serves every node.
        depth = torch.cat([tree.depth.new_zeros(1, 1), tree.depth], dim=1)
        choice = g[pos + depth]
        res = verify_greedy(tree, choice)
        steps.append(step_record(tree, cands, res, committed[pos:], request=0, step=step, position=pos, policy=policy,
                                 plan=None if planner is None else shape))
        if planner is not None:
            planner.observe(rec.candidates[i : i + 1], res.tokens, policy, grown)
        pos += steps[-1].accept_len + 1
        step += 1
    return steps
