"""Plain data objects passed between the tree stages (build -> verify -> commit)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class VoteTree:
    """A verify tree per request: W-1 non-root nodes listed parents-first, node 0 is the root (the anchor).

    Node i (1-based) is stored at column i-1. Padding nodes (valid False) sit after every valid node, hang off the
    root, carry the first node's token (a real token, harmless to embed) and must never be accepted.
    """

    tokens: torch.Tensor  # (bs, W-1) int64 draft token of each node
    parents: torch.Tensor  # (bs, W-1) int64, 0 = root, else 1-based index < own index
    depth: torch.Tensor  # (bs, W-1) int64, 1 for children of the root
    votes: torch.Tensor  # (bs, W-1) int64, candidates passing through the node (0 for padding)
    valid: torch.Tensor  # (bs, W-1) bool
    first_candidate: torch.Tensor  # (bs, W-1) int64, index of the first candidate reaching the node (N for padding)
    k: int  # candidates' length (max depth)

    @property
    def width(self) -> int:
        """W: verify tokens per request, the root included."""
        return self.tokens.shape[1] + 1

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]


@dataclass
class VerifyResult:
    """The accepted path per request. Padded entries are -1."""

    path: torch.Tensor  # (bs, K+1) accepted node indices root-first (path[:, 0] == 0)
    accept_len: torch.Tensor  # (bs,) accepted draft tokens
    bonus: torch.Tensor  # (bs,) the target's token after the last accepted node
    tokens: torch.Tensor  # (bs, K+1) committed tokens: accepted drafts, then the bonus

    @property
    def commit_len(self) -> torch.Tensor:
        """Tokens committed this step, bonus included."""
        return self.accept_len + 1


@dataclass
class StepCommit:
    """A serving step's outputs of the walk beyond its plan (`commit.step_commit`)."""

    commit_len: torch.Tensor  # (bs,) int32 tokens committed: root + accepted nodes (the plan's kv_len)
    seq_lens: torch.Tensor  # (bs,) seq_lens + commit_len, in seq_lens' dtype
    out_tokens: torch.Tensor  # (bs, out_width) int64 committed tokens, then 0 (the walk's -1 padding too)
    slots: torch.Tensor | None  # (bs, W) the window's slots in commit order (window_slots[permutation]), if asked


@dataclass
class VerifyInputs:
    """What the target's tree verify forward takes, plus the step's statistics rows (`verify_inputs`)."""

    ids: torch.Tensor  # (bs, W) int64 verify tokens: the anchor, then the tree's nodes
    positions: torch.Tensor  # (bs*W,) int64 seq_lens + depth
    mask: torch.Tensor  # flat bool, sglang's FULL_MASK layout: per request W rows of (seq_len prefix + W tree) bits
    stats: torch.Tensor | None  # (bs, 4) int32 [N, distinct candidates, tree size, 0 (accepted depth, filled later)]


@dataclass
class EagleEncoding:
    """A VoteTree in EAGLE's tree ABI as sglang's `build_tree_kernel_efficient` takes it (topk = W)."""

    draft_tokens: torch.Tensor  # (bs, W-1)
    top_scores_index: torch.Tensor  # (bs, W-1) node id = parent * W + own index
    parent_list: torch.Tensor  # (bs, W*(K-1)+1) parent_list[:, p] = id of node p; column 0 (the root) = -1
    topk: int  # = W
    spec_steps: int  # = K
    num_verify_tokens: int  # = W


@dataclass
class CommitPlan:
    """How to make a request's verify window sequential after acceptance.

    The window holds W KV slots in node order (slot 0 = root). `permutation` (page size 1): the new window is
    old_window[permutation] (accepted path first, then the other nodes in increasing index; nothing moves).
    Copy form (paged KV): copy window slot `copy_src[:, j]` to `copy_dst[:, j]` where `copy_mask[:, j]`; every
    source is read before any destination is written, and no destination is a later source.
    """

    permutation: torch.Tensor  # (bs, W)
    copy_src: torch.Tensor  # (bs, K) window offsets
    copy_dst: torch.Tensor  # (bs, K)
    copy_mask: torch.Tensor  # (bs, K) bool
    kv_len: torch.Tensor  # (bs,) slots that hold committed KV after the step: root + accepted nodes
