"""What verifiers need from a VoteTree: ancestor mask, positions, child links, sglang's verify inputs (`verify_inputs`)
and EAGLE's encoding."""

from __future__ import annotations

import torch

from .types import EagleEncoding, VerifyInputs, VoteTree


def with_root(x: torch.Tensor, root_value: int) -> torch.Tensor:
    """Prepend the root's column so node i sits at column i."""
    return torch.cat([x.new_full((x.shape[0], 1), root_value), x], dim=1)


def ancestor_mask(tree: VoteTree) -> torch.Tensor:
    """(bs, W, W) bool: mask[b, i, j] is True when j is i itself or an ancestor of i (row and column 0 = root)."""
    bs, w = tree.batch_size, tree.width
    parents = with_root(tree.parents, 0)
    eye = torch.eye(w, dtype=torch.bool, device=parents.device).expand(bs, w, w)
    # Node i's row = its own bit OR its parent's row; parents come first, so one pass in index order settles it.
    mask = eye.clone()
    for i in range(1, w):
        mask[:, i] |= mask.gather(1, parents[:, i].view(bs, 1, 1).expand(bs, 1, w)).squeeze(1)
    return mask


def tree_positions(tree: VoteTree, prefix_len: torch.Tensor) -> torch.Tensor:
    """(bs, W) absolute positions: the root (anchor) at prefix_len, node i at prefix_len + depth."""
    return prefix_len.view(-1, 1).to(torch.long) + with_root(tree.depth, 0)


def verify_inputs(tree: VoteTree, anchor: torch.Tensor, seq_lens: torch.Tensor, seq_lens_sum: int,
                  candidates: torch.Tensor | None = None) -> VerifyInputs:
    """The verify forward's token ids, positions and FULL_MASK tree mask (the layout of sglang's
    `build_tree_kernel_efficient`), and the step's statistics rows when `candidates` (bs, N, K) are given.

    `seq_lens_sum` is a host int >= `seq_lens.sum()` (a serving step knows a bound, not the sum, without a host
    synchronisation): it sizes the mask. The blocks sit at offsets from `seq_lens` itself, as the attention reads
    them; cells past the last block are unused (False here, unspecified in the Triton kernel).
    """
    bs, w = tree.batch_size, tree.width
    device = tree.tokens.device
    ids = torch.cat([anchor.view(bs, 1).to(tree.tokens.dtype), tree.tokens], dim=1)
    lens = seq_lens.to(torch.long)
    # Request b's block: W rows of lens[b] + W bits, the prefix all True, then node i's ancestor row.
    row_len = lens + w
    ends = torch.cumsum(row_len * w, dim=0)
    e = torch.arange(seq_lens_sum * w + bs * w * w, device=device)
    b = torch.searchsorted(ends, e, right=True).clamp(max=max(bs - 1, 0))
    local = e - (ends - row_len * w)[b]
    row, col = local // row_len[b], local % row_len[b] - lens[b]
    mask = ((col < 0) | ancestor_mask(tree)[b, row.clamp(max=w - 1), col.clamp(min=0)]) & (e < ends[-1:])
    stats = None
    if candidates is not None:
        n = candidates.shape[1]
        same = (candidates.unsqueeze(2) == candidates.unsqueeze(1)).all(dim=-1)  # (bs, N, N)
        earlier = torch.ones(n, n, dtype=torch.bool, device=device).tril(-1)
        distinct = (~(same & earlier).any(dim=-1)).sum(dim=-1)
        size = tree.valid.sum(dim=-1)
        stats = torch.stack([torch.full_like(size, n), distinct, size, torch.zeros_like(size)], dim=1)
        stats = stats.to(torch.int32)
    return VerifyInputs(ids=ids, positions=tree_positions(tree, seq_lens).reshape(-1), mask=mask, stats=stats)


def child_links(tree: VoteTree) -> tuple[torch.Tensor, torch.Tensor]:
    """First-child and next-sibling links over valid nodes, (bs, W) each, -1 where none; siblings by node index."""
    w = tree.width
    device = tree.tokens.device
    parents = with_root(tree.parents, -1)
    valid = with_root(tree.valid, 0).bool()
    idx = torch.arange(w, device=device)
    # child[b, p, c]: c is a valid child of p.
    child = (parents.unsqueeze(1) == idx.view(1, w, 1)) & valid.unsqueeze(1)
    big = w
    first_child = torch.where(child, idx.view(1, 1, w), big).amin(dim=2)
    # Next sibling of c: the smallest valid c' > c with the same parent.
    same_parent = (parents.unsqueeze(2) == parents.unsqueeze(1)) & valid.unsqueeze(1) & valid.unsqueeze(2)
    later = idx.view(1, 1, w) > idx.view(1, w, 1)
    next_sibling = torch.where(same_parent & later, idx.view(1, 1, w), big).amin(dim=2)
    none = torch.full_like(first_child, -1)
    return torch.where(first_child < big, first_child, none), torch.where(next_sibling < big, next_sibling, none)


def chain_tree(bs: int, width: int, device=None) -> VoteTree:
    """The chain as a tree: node i's parent is node i - 1 (a single candidate of W - 1 tokens; tokens are zeros). Its
    ancestor mask is causal, so its `verify_inputs` mask is a chain verify's FULL_MASK."""
    m = width - 1
    line = torch.arange(m, dtype=torch.long, device=device).expand(bs, m)
    return VoteTree(
        tokens=torch.zeros(bs, m, dtype=torch.long, device=device),
        parents=line.contiguous(),
        depth=(line + 1).contiguous(),
        votes=torch.ones(bs, m, dtype=torch.long, device=device),
        valid=torch.ones(bs, m, dtype=torch.bool, device=device),
        first_candidate=torch.zeros(bs, m, dtype=torch.long, device=device),
        k=m,
    )


def pad_tree(tree: VoteTree, width: int, n: int) -> VoteTree:
    """Append padding nodes up to `width` (root children carrying node 1's token, invalid, so never accepted): a tree
    narrower than the verify width it is verified at. `n`: the candidate count (the padding's first_candidate)."""
    extra = width - tree.width
    if extra <= 0:
        return tree
    bs = tree.batch_size

    def pad(x, value):
        return torch.cat([x, x.new_full((bs, extra), value)], dim=1)

    return VoteTree(
        tokens=torch.cat([tree.tokens, tree.tokens[:, :1].expand(bs, extra)], dim=1),
        parents=pad(tree.parents, 0),
        depth=pad(tree.depth, 1),
        votes=pad(tree.votes, 0),
        valid=pad(tree.valid, False),
        first_candidate=pad(tree.first_candidate, n),
        k=tree.k,
    )


def to_eagle(tree: VoteTree) -> EagleEncoding:
    """EAGLE's tree ABI with topk = W: node i's id is parent * W + i, so `id // W` names the parent's slot in
    `parent_list`, and `parent_list[:, p]` holds node p's own id. Padding nodes hang off the root and repeat node 1's
    token, so sglang's first-match walk never takes them."""
    bs, w, k = tree.batch_size, tree.width, tree.k
    device = tree.tokens.device
    idx = torch.arange(1, w, device=device).expand(bs, w - 1)
    ids = tree.parents * w + idx
    parent_list = torch.full((bs, w * (k - 1) + 1), -1, dtype=torch.long, device=device)
    cols = min(w - 1, parent_list.shape[1] - 1)
    parent_list[:, 1 : cols + 1] = ids[:, :cols]
    return EagleEncoding(
        draft_tokens=tree.tokens,
        top_scores_index=ids,
        parent_list=parent_list,
        topk=w,
        spec_steps=k,
        num_verify_tokens=w,
    )
