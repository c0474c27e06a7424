"""What the server's tree policies need of the draft beyond the N candidate blocks (FLASHTREE_TREE_POLICY).

- `vote` reads the candidates alone.
- `prob` ranks the candidates' trie by path probability, so it needs each drawn token's log q at temperature 1 under
  the draft's Markov head, (bs, N, K) float32. The draws record it as they go: the fused Markov draws return it
  (`markov_draws(..., return_logp=True)`); the head's own torch steps (any Markov head) run through a step sampler
  that also keeps log_softmax(step logits)[token] of each step, the head's own logits.
- `best-first` draws nothing: its tree grows from the head's conditionals, W - 1 rounds of one (bs, V) step each. The
  server runs the registered torch builder (`flashtree.tree.policies.best_first`) itself over a vanilla head's step
  logits base[b, pos] + w2 @ w1[prev] (rounded as the draws round them), so it builds the same tree as the engine for
  the same logits; the builder has fixed shapes and no host reads, so it also runs in the draft graph's tail
  (graph_draws.py). Other heads (gated, RNN, TP-sharded) are refused at worker start. Where the draft's positions are
  independent (DFLASH) every node at a position has the same children: each position's top W - 1 is read once, and
  one launch grows the same tree (`best_first.grow_marginal`).

Every policy's tree keeps the tree contract, so the greedy and sampled walks stay exact whatever it keeps.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from flashtree.sampler import row_topk_logprobs
from flashtree.tree import DraftScores, build_tree, get_policy
from flashtree.tree.policies.best_first import NAME as GROWN, grow_marginal
from flashtree.tree.types import VoteTree

from .toggles import ToggleError


def needs_logp(policy: str) -> bool:
    return "logp" in get_policy(policy).needs_scores


def grows(policy: str) -> bool:
    return "step_logprobs" in get_policy(policy).needs_scores


def check(adapter, toggles, worker) -> tuple | None:
    """At worker start: refuse a policy this worker's draft cannot feed (ToggleError, a SystemExit). Returns what
    best-first grows its trees from: the vanilla head's (w1, w2), or () where the draft's positions are independent
    (DFLASH); None for the other policies."""
    from . import flashmap_draft

    policy = toggles.tree_policy
    if not get_policy(policy).needs_scores:
        return None
    model = adapter.draft_model(worker)
    if flashmap_draft.is_flashmap_draft(model):
        raise ToggleError(
            f"flashtree: FLASHTREE_TREE_POLICY={policy} reads the draft's Markov-head probabilities, and this server's "
            "draft is a FlashMap draft (its candidates are noise draws, with no probabilities); use "
            "FLASHTREE_TREE_POLICY=vote")
    if not grows(policy):
        return None
    if adapter.independent_positions:
        return ()
    weights = adapter.vanilla_markov_weights(getattr(model, "markov_head", None))
    if weights is None:
        raise ToggleError(
            f"flashtree: FLASHTREE_TREE_POLICY={policy} grows its tree from sglang's vanilla Markov head (step bias "
            f"w2 @ w1[prev]), and this draft's head is {type(getattr(model, 'markov_head', None)).__name__} (gated, "
            "RNN, TP-sharded or subclassed heads are not supported); use FLASHTREE_TREE_POLICY=prob or vote")
    return weights


def recording_logp(sampler: Callable[[torch.Tensor], torch.Tensor]):
    """`sampler(step_logits) -> tokens` that also keeps each step's log q (temperature 1) of its tokens; returns
    (that sampler, taken(bs, n) -> (bs, N, K) float32 of the steps so far, which it then forgets)."""
    steps: list[torch.Tensor] = []

    def sample(step_logits: torch.Tensor) -> torch.Tensor:
        tokens = sampler(step_logits)
        steps.append(step_logits.float().log_softmax(dim=-1).gather(1, tokens.view(-1, 1)).view(-1))
        return tokens

    def taken(bs: int, n: int) -> torch.Tensor:
        logp = torch.stack(steps, dim=1).view(bs, n, -1)
        steps.clear()
        return logp

    return sample, taken


def vanilla_step_logits(base_logits: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor):
    """The logits of the next token after a node under a vanilla Markov head, over one step's base logits (bs, K, V):
    summed as the draws sum them (the bias in the weights' dtype)."""
    k = base_logits.shape[1]

    def step_logits(rows: torch.Tensor, pos: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        return base_logits[rows, pos.clamp(max=k - 1)] + F.linear(F.embedding(prev, w1), w2)

    return step_logits


def vanilla_scores(anchor: torch.Tensor, base_logits: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> DraftScores:
    """best-first's DraftScores over a vanilla head: its log q after any node, and their top k through
    `row_topk_logprobs` (the Triton kernels on CUDA) rather than a full-vocabulary log-softmax and sort."""
    logits = vanilla_step_logits(base_logits, w1, w2)
    return DraftScores(anchor=anchor.long(), step_logprobs=lambda r, p, t: logits(r, p, t).float().log_softmax(dim=-1),
                       step_topk=lambda r, p, t, k: row_topk_logprobs(logits(r, p, t), min(k, w2.shape[0])))


def grow(base_logits: torch.Tensor, anchor: torch.Tensor, *head: torch.Tensor, width: int,
         greedy: torch.Tensor | None = None) -> VoteTree:
    """The best-first tree of `width` tokens (root included) over base logits (bs, K, V) and a vanilla head's
    (w1, w2), or, with no head, the positions' own distributions. greedy (bs, K), headless drafts only: filled with
    each position's top 1, the draft's greedy block (DFLASH's chain; the planner credits the chain by it)."""
    bs, k, v = base_logits.shape
    if not head:  # each position's top W - 1 once, then one launch grows the tree from them
        top, ids = (t.view(bs, k, -1) for t in row_topk_logprobs(base_logits.reshape(bs * k, v), min(width - 1, v)))
        if greedy is not None:
            greedy.copy_(ids[:, :, 0])
        return grow_marginal(top, ids, width)
    if greedy is not None:
        raise ValueError("a Markov head's greedy block is not its base logits' top 1")
    shape = torch.zeros((bs, 1, k), dtype=torch.int64, device=base_logits.device)  # the builder reads (N, K) only
    return build_tree(shape, width, policy=GROWN, scores=vanilla_scores(anchor, base_logits, *head))


def dummy_scores(bs: int, n: int, k: int, device) -> DraftScores:
    """Scores of the right shapes for any policy (the kernels' warm-up)."""
    return DraftScores(logp=torch.zeros((bs, n, k), device=device), anchor=torch.zeros(bs, dtype=torch.int64,
                       device=device), step_logprobs=lambda rows, pos, prev: torch.zeros((rows.shape[0], 2),
                                                                                        device=device))
