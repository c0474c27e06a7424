"""`tree_generate`: tree speculative decoding with a Hugging Face target and a flashtree drafter.

Each step: the drafter proposes N blocks of K tokens per request -> the tree policy keeps W - 1 nodes -> one target
forward verifies root + nodes under the tree mask -> the walk accepts a path -> the cache keeps exactly the committed
tokens' KV (crop and reorder; the prefix is never recomputed). Drafting is batched over requests; the target runs
one request per forward, each with its own cache, so requests of different lengths need no padding.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from ..drafters.base import DraftState, Drafter
from ..planner import Planner, check_policy
from ..tree import (DEFAULT_POLICY, VerifyResult, VoteTree, ancestor_mask, build_tree, get_policy, tree_positions,
                    verify_greedy, verify_rejection, verify_sampled)
from ..tree.checks import check_sampling, check_tokens, check_width
from ..tree.policies.best_first import NAME as GROWN
from .planning import step_tree
from .records import GenerateResult, step_record
from .stopping import stop_end
from .target import context_limit, keep_in_cache, prefill, verify_forward


class _Stopwatch:
    """Per-stage wall time. On CUDA it synchronises, which a measuring reference engine may afford."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str):
        if self.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        yield
        if self.cuda:
            torch.cuda.synchronize()
        self.times[stage] = self.times.get(stage, 0.0) + time.perf_counter() - t0

    def take(self) -> dict[str, float]:
        out, self.times = self.times, {}
        return out


class _Request:
    """One request's decoding state: committed tokens (the anchor last), its target cache and hidden states."""

    def __init__(self, prompt: torch.Tensor):
        self.tokens = prompt.clone()
        self.prompt_len = prompt.numel()
        self.cache = None
        self.hidden: dict[int, torch.Tensor] = {}
        self.new_from = 0
        self.done = False

    @property
    def new_tokens(self) -> int:
        return self.tokens.numel() - self.prompt_len


def _as_rows(input_ids, vocab: int) -> list[torch.Tensor]:
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() not in (1, 2):
            raise ValueError(f"input_ids must be (L,) or (bs, L), got shape {tuple(input_ids.shape)}")
        rows = [input_ids] if input_ids.dim() == 1 else list(input_ids)
    else:
        rows = [torch.as_tensor(r) for r in input_ids]
    if not rows or any(r.numel() == 0 for r in rows):
        raise ValueError("input_ids must hold at least one non-empty prompt")
    for r in rows:
        check_tokens("input_ids", r, dims=1, vocab=vocab)
    return [r.to(torch.long) for r in rows]


WALKS = ("target", "rejection")


def _count(name: str, value, why: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} ({why}) must be an int >= 1, got {value!r}")


def _check(target, drafter: Drafter, rows, n, width, max_new_tokens, temperature, top_k, top_p, walk, policy,
           planner) -> None:
    get_policy(policy)  # UnknownPolicy (a ValueError) lists the registered names
    _count("n", n, "candidate blocks per step")
    check_width(width)
    if planner is not None:
        check_policy(policy)
        over = [s.label() for s in planner.acceptance.shapes
                if s.is_chain or s.n > n or s.width > width or s.grown != (policy == GROWN)]
        if over or walk == "rejection":
            raise ValueError(f"the planner's shapes must be {policy} trees within n={n} and width={width} on the "
                             f"target walk; got walk={walk!r} and {', '.join(over) or 'no shape outside them'}")
    _count("max_new_tokens", max_new_tokens, "tokens to generate per prompt")
    _count(f"{type(drafter).__name__}.k", drafter.k, "the drafter's block length K")
    check_sampling(temperature, top_k, top_p)
    if walk not in WALKS:
        raise ValueError(f"walk must be one of {WALKS}, got {walk!r}")
    if walk == "rejection" and (n != 1 or temperature <= 0):
        raise ValueError(
            f"walk='rejection' (chain speculative sampling) needs n == 1 and temperature > 0, got n={n}, "
            f"temperature={temperature}"
        )
    vocab = target.config.vocab_size
    if getattr(drafter, "vocab_size", vocab) != vocab:
        raise ValueError(f"drafter vocabulary ({drafter.vocab_size}) does not match the target's ({vocab})")
    check_context(target, max(r.numel() for r in rows), max_new_tokens, width)


def check_context(target, prompt_tokens: int, max_new_tokens: int, width: int) -> None:
    """Raise ValueError when the longest prompt plus what a run adds cannot fit the target's context."""
    limit = context_limit(target)
    if limit is not None and prompt_tokens + max_new_tokens + width > limit:
        raise ValueError(
            f"prompt of {prompt_tokens} tokens + max_new_tokens {max_new_tokens} + width {width} exceeds the target's "
            f"context of {limit} tokens; shorten the prompt or lower max_new_tokens"
        )


def _draft_state(reqs: list[_Request], layers: tuple[int, ...], device) -> DraftState:
    lengths = torch.tensor([r.tokens.numel() for r in reqs], device=device)
    longest = int(lengths.max())
    tokens = torch.full((len(reqs), longest), -1, dtype=torch.long, device=device)
    for b, r in enumerate(reqs):
        tokens[b, : r.tokens.numel()] = r.tokens
    hidden = {}
    for layer in layers:
        width = reqs[0].hidden[layer].shape[-1]
        h = torch.zeros(len(reqs), max(longest - 1, 0), width, dtype=reqs[0].hidden[layer].dtype, device=device)
        for b, r in enumerate(reqs):
            h[b, : r.hidden[layer].shape[0]] = r.hidden[layer]
        hidden[layer] = h
    new_from = torch.tensor([r.new_from for r in reqs], device=device)
    return DraftState(tokens=tokens, lengths=lengths, new_from=new_from, hidden=hidden)


@torch.no_grad()
def tree_generate(
    target,
    drafter: Drafter,
    input_ids,
    *,
    n: int,
    width: int,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    stop_token_ids=None,
    pad_token_id: int | None = None,
    walk: str = "target",
    policy: str = DEFAULT_POLICY,
    planner: Planner | None = None,
) -> GenerateResult:
    """Generate up to `max_new_tokens` per prompt. `input_ids`: (L,), (bs, L) or a list of token lists.

    Greedy (temperature 0) output equals the target's own greedy decoding token for token; sampled output is
    distributed as the target's own sampling with the same temperature / top-k / top-p. `walk` picks the sampled
    walk: "target" (the target-only tree walk, any N) or "rejection" (chain speculative sampling against the draft's
    probabilities: n == 1, temperature > 0, and a drafter whose proposals carry `probs`). `policy` names the tree
    policy (flashtree.tree.policies) that builds each step's tree; `prob` and `best-first` read the proposal's
    `scores` (the DSPARK drafter proposes them).

    `planner` (tree.n=auto, `flashtree.engine.planning`): each step draws `n` candidates, runs the tree of the
    shape the planner chooses (its first N candidates, its W; every shape within `n` and `width`; best-first: the
    first nodes of the menu's widest tree) and credits every shape with what it would have committed. Every shape
    is a tree verified as above, so the output is unchanged.
    """
    rows = _as_rows(input_ids, target.config.vocab_size)
    _check(target, drafter, rows, n, width, max_new_tokens, temperature, top_k, top_p, walk, policy, planner)
    device = next(target.parameters()).device
    stops = torch.tensor(sorted(set(stop_token_ids or ())), dtype=torch.long, device=device)
    layers = tuple(drafter.hidden_layers)
    reqs = [_Request(r.to(device)) for r in rows]
    watch = _Stopwatch(device)
    t_start = time.perf_counter()

    for r in reqs:
        r.cache, out = prefill(target, r.tokens.view(1, -1), layers)
        hidden_size = target.config.hidden_size
        r.hidden = {i: (out.hidden[i][0] if out else torch.empty(0, hidden_size, device=device)) for i in layers}
    drafter.start(_draft_state(reqs, layers, device))

    taken = []  # per request step: (request, step, position, its tree, candidates, walk result, stage times)
    step = 0
    while not all(r.done for r in reqs):
        with watch("draft"):
            proposal = drafter.propose(n, generator)
        cands = proposal.candidates
        draft_probs = proposal.probs if walk == "rejection" else None
        if walk == "rejection" and draft_probs is None:
            raise ValueError(
                f"walk='rejection' needs draft probabilities, but {type(drafter).__name__} proposed no probs (for "
                "DSPARK: load_drafter('dspark', ..., temperature=T > 0, greedy_first=False, return_probs=True))"
            )
        live = [b for b, r in enumerate(reqs) if not r.done]
        plan = None if planner is None else planner.choose(len(live)).shape
        step_n = n if plan is None else plan.n

        def build(m: int, w: int) -> VoteTree:
            return build_tree(cands[:, :m], w, policy, scores=proposal.scores)

        with watch("build"):
            tree, grown = (build(n, width), None) if plan is None else step_tree(planner, plan, build)
        shared = watch.take()
        committed = []
        for b in live:
            r = reqs[b]
            probs = None if draft_probs is None else draft_probs[b : b + 1, 0]
            row = _rows(tree, [b])
            position = r.tokens.numel()
            res = _step_one(target, r, row, probs, layers, temperature, top_k, top_p, generator, watch)
            taken.append((b, step, position, row, cands[b, :step_n], res, plan, {**shared, **watch.take()}))
            committed.append(res.tokens)
            _truncate(r, position, stops, max_new_tokens)
        if planner is not None:
            planner.observe(cands[live], torch.cat(committed), policy, None if grown is None else _rows(grown, live))
        drafter.advance(_draft_state(reqs, layers, device))
        step += 1

    # Built once the requests are done: the oracle measure reads what each request committed after the step.
    steps = [step_record(row, c, res, reqs[b].tokens[pos:], request=b, step=i, position=pos, policy=policy,
                         time_s=times, plan=plan) for b, i, pos, row, c, res, plan, times in taken]
    return GenerateResult(
        sequences=_pad_rows([r.tokens for r in reqs], pad_token_id, target),
        acceptance_length=sum(s.accept_len + 1 for s in steps) / max(len(steps), 1),
        steps=steps,
        new_tokens=[r.new_tokens for r in reqs],
        prompt_lengths=[r.prompt_len for r in reqs],
        wall_time_s=time.perf_counter() - t_start,
    )


def _rows(tree: VoteTree, rows: list[int]) -> VoteTree:
    fields = ("tokens", "parents", "depth", "votes", "valid", "first_candidate")
    return VoteTree(**{f: getattr(tree, f)[rows] for f in fields}, k=tree.k)


def _step_one(target, r: _Request, tree, draft_probs, layers, temperature, top_k, top_p, generator,
              watch) -> VerifyResult:
    """One verify step of request r, committed into its state. draft_probs (1, K, V): rejection-sample the chain
    (N = 1) against them."""
    prefix = r.cache.get_seq_length()
    with watch("verify"):
        ids = torch.cat([r.tokens[-1:], tree.tokens[0]]).view(1, -1)  # the anchor is the root
        pos = tree_positions(tree, torch.tensor([prefix], device=ids.device))
        out = verify_forward(target, r.cache, ids, pos, ancestor_mask(tree), layers)
    with watch("walk"):
        if draft_probs is not None:
            c = int(tree.valid.sum())  # the chain's nodes 1..c fill the window right after the root
            res = verify_rejection(tree.tokens[:, :c], draft_probs[:, :c], out.logits[:, : c + 1], temperature,
                                   generator, top_k, top_p)
        elif temperature > 0:
            res = verify_sampled(tree, out.logits, temperature, generator, top_k, top_p)
        else:
            res = verify_greedy(tree, out.logits.argmax(dim=-1))
    with watch("commit"):
        a = int(res.accept_len[0])
        path = res.path[0, : a + 1]  # window offsets of the root and the accepted nodes: their KV stays
        keep_in_cache(r.cache, prefix, path)
        for i in layers:
            r.hidden[i] = torch.cat([r.hidden[i], out.hidden[i][0, path]])
        r.new_from = r.tokens.numel()
        r.tokens = torch.cat([r.tokens, res.tokens[0, : a + 1]])
    return res


def _truncate(r: _Request, first_new: int, stops: torch.Tensor, max_new_tokens: int) -> None:
    """End the request by the stop rule, dropping what was committed past its end."""
    end = stop_end(r.tokens, prompt_len=r.prompt_len, max_new_tokens=max_new_tokens, stop_ids=stops, start=first_new)
    if r.tokens.numel() >= end:
        r.tokens = r.tokens[:end]
        r.hidden = {i: h[: end - 1] for i, h in r.hidden.items()}  # hidden states exist for tokens with KV
        r.done = True


def _pad_rows(rows: list[torch.Tensor], pad_token_id: int | None, target) -> torch.Tensor:
    if pad_token_id is None:
        pad_token_id = getattr(target.config, "pad_token_id", None)
        pad_token_id = 0 if pad_token_id is None else pad_token_id
    out = torch.full((len(rows), max(r.numel() for r in rows)), pad_token_id, dtype=torch.long, device=rows[0].device)
    for b, r in enumerate(rows):
        out[b, : r.numel()] = r
    return out
