"""Tree verification, greedy and lossless sampled, pure torch: fixed shapes, no host synchronisation.

The references only: `dispatch.verify_sampled` composes the same steps with the Triton kernels on CUDA."""

from __future__ import annotations

import torch

from ..sampler import reference
from .encode import with_root
from .types import VerifyResult, VoteTree


def verify_greedy(tree: VoteTree, target_tokens: torch.Tensor) -> VerifyResult:
    """Walk from the root, taking the child whose token equals the target's choice at the current node.

    target_tokens[b, i] is the target's token after node i (0 = root). Children of a node carry distinct tokens
    (trie), so at most one matches; padding never matches. A node is accepted when it and all its ancestors match.
    """
    bs, w, k = tree.batch_size, tree.width, tree.k
    if target_tokens.shape != (bs, w):
        raise ValueError(f"target_tokens must be (bs, W) = {(bs, w)}, got {tuple(target_tokens.shape)}")
    match = tree.valid & (tree.tokens == target_tokens.gather(1, tree.parents))
    accepted = with_root(match, 1).bool()
    parents = with_root(tree.parents, 0)
    # Depth-many passes propagate a rejection down each branch (accepted = match AND parent accepted).
    for _ in range(k - 1):
        accepted = accepted & accepted.gather(1, parents)
    depth = with_root(tree.depth, 0)
    accept_len = (accepted[:, 1:]).sum(dim=1)

    # One accepted node per depth: scatter node indices by depth; slot K+1 collects the rest.
    idx = torch.arange(w, device=tree.tokens.device).expand(bs, w)
    path = torch.full((bs, k + 2), -1, dtype=torch.long, device=idx.device)
    path.scatter_(1, torch.where(accepted, depth, k + 1), idx)
    path = path[:, : k + 1]
    last = path.gather(1, accept_len.view(bs, 1)).squeeze(1)
    bonus = target_tokens.gather(1, last.view(bs, 1)).squeeze(1)

    node_tokens = with_root(tree.tokens, -1)
    tokens = torch.where(path > 0, node_tokens.gather(1, path.clamp(min=0)), -1)[:, 1:]
    tokens = torch.cat([tokens, tokens.new_full((bs, 1), -1)], dim=1)
    tokens.scatter_(1, accept_len.view(bs, 1), bonus.view(bs, 1))
    return VerifyResult(path=path, accept_len=accept_len, bonus=bonus, tokens=tokens)


def cut_walk(result: VerifyResult, cap: torch.Tensor) -> VerifyResult:
    """The walk stopped after at most cap[b] accepted nodes (bs,): its path and tokens end there, and the bonus is
    the target's token at the last node kept (the token the walk committed after it)."""
    bs, k1 = result.tokens.shape
    taken = torch.minimum(result.accept_len, cap.to(result.accept_len.dtype).clamp(min=0))
    keep = torch.arange(k1, device=taken.device).expand(bs, k1) <= taken.view(bs, 1)
    bonus = result.tokens.gather(1, taken.view(bs, 1)).view(bs)
    return VerifyResult(path=torch.where(keep, result.path, -1), accept_len=taken, bonus=bonus,
                        tokens=torch.where(keep, result.tokens, -1))


def node_draws(tree: VoteTree, target_logits: torch.Tensor, temperature, generator=None, top_k=None, top_p=None,
               sample_rows=reference.sample_rows) -> torch.Tensor:
    """(bs, W) tokens: one draw from the target's distribution after every node (root first), with each request's
    temperature / top-k / top-p (scalars or (bs,)); temperature 0 rows take the argmax. `sample_rows`: the row
    sampler (the torch reference here; `flashtree.sampler.sample_rows` picks the kernel on CUDA)."""
    bs, w = tree.batch_size, tree.width
    if target_logits.shape[:2] != (bs, w):
        raise ValueError(f"target_logits must be (bs, W, V) with (bs, W) = {(bs, w)}, got {tuple(target_logits.shape)}")
    v = target_logits.shape[2]

    def per_node(x):  # a scalar or (bs,) setting -> one value per (request, node) row
        return None if x is None else torch.as_tensor(x, device=target_logits.device).expand(bs).repeat_interleave(w)

    draws = sample_rows(
        target_logits.reshape(bs * w, v),
        per_node(torch.as_tensor(temperature, dtype=torch.float32)),
        generator=generator,
        top_k=per_node(top_k),
        top_p=per_node(top_p),
    )
    return draws.view(bs, w)


def verify_sampled(tree: VoteTree, target_logits: torch.Tensor, temperature: torch.Tensor | float,
                   generator: torch.Generator | None = None, top_k: torch.Tensor | int | None = None,
                   top_p: torch.Tensor | float | None = None) -> VerifyResult:
    """Lossless tree sampling that needs no draft probabilities (the target-only walk).

    At the current node draw from the target's distribution; follow the child carrying that token, else stop and
    emit it. Drawing one token at every node up front and then walking greedily over those draws is the same
    process: the walk reads only the draws of the nodes it visits, and draws at distinct nodes are independent.
    Rows at temperature 0 take the argmax, so this reduces to `verify_greedy` there.
    """
    return verify_greedy(tree, node_draws(tree, target_logits, temperature, generator, top_k, top_p))
