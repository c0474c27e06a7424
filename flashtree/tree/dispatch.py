"""One function per tree stage, chosen by device: the fused Triton kernel on CUDA, the torch reference elsewhere.

The references (`build.py`, `verify.py`, `commit.py`, `encode.verify_inputs`) define the semantics; the kernels
reproduce them bit for bit (tests/kernels). Triton is imported only when a CUDA tensor arrives, so CPU users need no
Triton.
"""

from __future__ import annotations

import torch

from .. import sampler
from . import build, commit, encode, verify
from .checks import check_logits, check_sampling, check_tokens, check_tree_vocab, check_width
from .types import CommitPlan, VerifyInputs, VerifyResult, VoteTree
from .workspace import Workspace


def build_vote_tree(candidates: torch.Tensor, width: int) -> VoteTree:
    check_tokens("candidates", candidates, dims=3)
    check_width(width)
    # the kernel keeps each node's candidate set as a 64-bit mask: more than 64 candidates take the reference
    if candidates.is_cuda and candidates.shape[1] <= 64:
        from .triton_build import build_vote_tree_triton

        return build_vote_tree_triton(candidates, width)
    return build.build_vote_tree(candidates, width)


def build_prob_tree(candidates: torch.Tensor, width: int, logp: torch.Tensor) -> VoteTree:
    """The candidates' trie, its width - 1 nodes of the highest path log-probability (`build.build_prob_tree`; one
    Triton launch on CUDA, the path sums formed in the kernel)."""
    if candidates.is_cuda and candidates.shape[1] <= 64:
        from .triton_build import build_prob_tree_triton

        return build_prob_tree_triton(candidates, width, logp)
    return build.build_prob_tree(candidates, width, logp)


def verify_greedy(tree: VoteTree, target_tokens: torch.Tensor) -> VerifyResult:
    if target_tokens.is_cuda:
        from .triton_walk import verify_greedy_triton

        return verify_greedy_triton(tree, target_tokens)
    return verify.verify_greedy(tree, target_tokens)


def commit_plan(tree: VoteTree, result: VerifyResult) -> CommitPlan:
    if result.path.is_cuda:
        from .triton_walk import commit_plan_triton

        return commit_plan_triton(tree, result)
    return commit.commit_plan(tree, result)


def verify_inputs(tree: VoteTree, anchor: torch.Tensor, seq_lens: torch.Tensor, seq_lens_sum: int,
                  candidates: torch.Tensor | None = None, workspace: Workspace | None = None) -> VerifyInputs:
    """Verify ids, positions, sglang's FULL_MASK tree mask and the statistics rows: one launch on CUDA, its outputs
    from `workspace` when given (workspace.py)."""
    if tree.tokens.is_cuda:
        from .triton_mask import verify_inputs_triton

        return verify_inputs_triton(tree, anchor, seq_lens, seq_lens_sum, candidates, workspace)
    return encode.verify_inputs(tree, anchor, seq_lens, seq_lens_sum, candidates)


def walk_and_commit(tree: VoteTree, target_tokens: torch.Tensor, req_to_token: torch.Tensor | None = None,
                    rows: torch.Tensor | None = None, starts: torch.Tensor | None = None, *,
                    seq_lens: torch.Tensor | None = None, out_width: int = 0, window_slots: torch.Tensor | None = None,
                    stats: torch.Tensor | None = None, cap: torch.Tensor | None = None,
                    workspace: Workspace | None = None):
    """Greedy walk, its commit plan and, with `req_to_token`, the page-size-1 window rewrite (`apply_permutation`):
    (VerifyResult, CommitPlan, StepCommit or None). With `seq_lens`, a serving step's outputs after the walk
    (`commit.step_commit`, `stats` written in place); with `cap` (bs,), at most cap[b] nodes accepted
    (`verify.cut_walk`). One launch on CUDA (the fused walk + commit kernel; its step-local outputs from `workspace`
    when given), the references elsewhere."""
    if target_tokens.is_cuda:
        from .triton_walk import walk_and_commit_triton

        return walk_and_commit_triton(tree, target_tokens, seq_lens, req_to_token, rows, starts, out_width=out_width,
                                      window_slots=window_slots, stats=stats, cap=cap, workspace=workspace)
    result = verify.verify_greedy(tree, target_tokens)
    if cap is not None:
        result = verify.cut_walk(result, cap)
    plan = commit.commit_plan(tree, result)
    if req_to_token is not None:
        commit.apply_permutation(req_to_token, rows, starts, plan)
    step = None if seq_lens is None else commit.step_commit(result, plan, seq_lens, out_width, window_slots, stats)
    return result, plan, step


def sampled_draws(tree: VoteTree, target_logits: torch.Tensor, temperature, generator=None, top_k=None,
                  top_p=None) -> torch.Tensor:
    """The target-only walk's per-node draws (bs, W) (`verify.node_draws`, the row sampler on CUDA): the sampled walk
    is the greedy walk over them, so a caller can share them (tensor parallelism) before walking."""
    check_logits("target_logits", target_logits)
    check_tree_vocab(tree, target_logits.shape[-1])
    check_sampling(temperature, top_k, top_p)
    return verify.node_draws(tree, target_logits, temperature, generator, top_k, top_p, sample_rows=sampler.sample_rows)


def verify_sampled(tree: VoteTree, target_logits: torch.Tensor, temperature, generator=None, top_k=None,
                   top_p=None) -> VerifyResult:
    """`verify.verify_sampled` (the lossless target-only walk) with the row sampler and the walk kernels on CUDA."""
    return verify_greedy(tree, sampled_draws(tree, target_logits, temperature, generator, top_k, top_p))
