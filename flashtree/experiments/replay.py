"""Counterfactual sweeps without re-running models: record once per prompt, replay any (N <= N_max, W).

Anchors move with acceptance, so one run's steps cannot answer another (N, W). At temperature 0, though, every run
commits the target's greedy sequence g, and a step at position p (p tokens committed, anchor g[p-1]) sees a drafter
fed with g[:p]. So a recording holds, per prompt:
  g          the target's greedy tokens, prompt included, K + 1 past where a run stops (the verify looks ahead);
  end        where a direct run stops: prompt + max_new_tokens, or just after the first stop token;
  candidates (positions, N_max, K): at every position p in [prompt, end), the drafter's N_max blocks given g[:p],
             drawn with a generator seeded by (seed, p), so the first N rows are what a run with N candidates draws
             there (drafters keep candidate order independent of N; see `position_seed`).
Replay walks (N, W) over it with the same builder and greedy walk the engine uses, and yields the engine's
StepRecords, so every metric comes out of the same code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from flashtree.drafters.base import DraftState
from flashtree.engine.generate import oracle_len
from flashtree.engine.records import StepRecord
from flashtree.tree import build_vote_tree, verify_greedy

RECORDING_VERSION = 1


def position_seed(seed: int, position: int) -> int:
    """Generator seed of the draft at `position`: fixed by (seed, position), independent of N, W and history."""
    return (seed * 1_000_003 + position * 7919 + 1) % (2**63)


@dataclass
class Recording:
    prompt_len: int
    end: int  # exclusive end of what a direct run commits
    sequence: torch.Tensor  # (end + K + 1,) greedy tokens, prompt included
    candidates: torch.Tensor  # (end - prompt_len, N_max, K)

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


def stop_end(sequence: torch.Tensor, prompt_len: int, max_new_tokens: int, stop_ids) -> int:
    """Where a direct run stops committing: the engine's `_truncate` rule."""
    end = prompt_len + max_new_tokens
    if stop_ids:
        hits = torch.isin(sequence[prompt_len:end], torch.tensor(list(stop_ids), device=sequence.device)).nonzero()
        if hits.numel():
            end = prompt_len + int(hits[0]) + 1
    return end


@torch.no_grad()
def record(model, drafter, prompt, *, n_max: int, max_new_tokens: int, seed: int = 0, stop_ids=None) -> Recording:
    """Record one prompt: the greedy sequence and N_max candidate blocks at every position a run can anchor at."""
    prompt = torch.as_tensor(prompt, dtype=torch.long).view(-1)
    p0 = prompt.numel()
    layers = tuple(drafter.hidden_layers)
    seq, hidden = greedy_tokens(model, prompt, max_new_tokens + drafter.k + 1, layers)
    end = stop_end(seq, p0, max_new_tokens, stop_ids)
    device = seq.device

    def state(length: int, new_from: int) -> DraftState:
        return DraftState(
            tokens=seq[:length].view(1, -1),
            lengths=torch.tensor([length], device=device),
            new_from=torch.tensor([new_from], device=device),
            hidden={i: h[: length - 1].unsqueeze(0) for i, h in hidden.items()},
        )

    drafter.start(state(p0, 0))
    blocks = []
    for pos in range(p0, end):
        if pos > p0:
            drafter.advance(state(pos, pos - 1))
        gen = torch.Generator(device=device).manual_seed(position_seed(seed, pos))
        blocks.append(drafter.propose(n_max, gen).candidates[0].to(device))
    return Recording(prompt_len=p0, end=end, sequence=seq[: end + drafter.k + 1], candidates=torch.stack(blocks))


def replay(rec: Recording, n: int, width: int) -> list[StepRecord]:
    """The steps a direct greedy run with N = n, W = width makes on the recorded prompt."""
    if not 1 <= n <= rec.n_max:
        raise ValueError(f"tree.n={n}: the recording holds N_max = {rec.n_max} candidates per position")
    g = rec.sequence
    committed = g[: rec.end]  # what the run keeps (the engine truncates at the stop / budget)
    pos, step, steps = rec.prompt_len, 0, []
    while pos < rec.end:
        cands = rec.candidates[pos - rec.prompt_len, :n]
        tree = build_vote_tree(cands.unsqueeze(0), width)
        # The target's choice after a node at depth d on the greedy path is g[pos + d]; off the path it is never
        # read (a node is accepted only if all its ancestors are), so g[pos + d] serves every node.
        depth = torch.cat([tree.depth.new_zeros(1, 1), tree.depth], dim=1)
        choice = g[pos + depth]
        res = verify_greedy(tree, choice)
        a = int(res.accept_len[0])
        path = res.path[0, 1 : a + 1]
        steps.append(StepRecord(
            request=0,
            step=step,
            position=pos,
            candidates=n,
            distinct_candidates=int(torch.unique(cands, dim=0).shape[0]),
            tree_size=int(tree.valid.sum()),
            accept_len=a,
            accepted_path=tuple(path.tolist()),
            accepted_depth_votes=tuple(tree.votes[0, path - 1].tolist()),
            oracle_len=oracle_len(cands, committed[pos:], a),
        ))
        pos += a + 1
        step += 1
    return steps


def replay_grid(recordings: list[Recording], ns, widths):
    """{(n, w): [steps per prompt]} over every recording, with the time the whole grid took."""
    start = time.perf_counter()
    out = {(n, w): [replay(r, n, w) for r in recordings] for n in ns for w in widths}
    return out, time.perf_counter() - start
