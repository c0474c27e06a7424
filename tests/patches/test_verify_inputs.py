"""Contract: flashtree's `verify_inputs` reference builds the FULL_MASK tree mask and positions that sglang's own
`build_tree_kernel_efficient` (its Triton tree kernel, interpreted) builds from the vote tree's EAGLE encoding."""

from __future__ import annotations

import pytest
import torch

import sglang_cpu
from flashtree.tree import build_vote_tree, to_eagle
from flashtree.tree.encode import verify_inputs


@pytest.fixture(scope="module", autouse=True)
def tree_kernels():
    sglang_cpu.force_triton_tree_kernels()


# (N, K, W, vocab): shared prefixes, padding nodes (W - 1 above the trie's size), N = 1 (a chain), K = 1
@pytest.mark.parametrize("n,k,w,vocab", [(6, 5, 8, 3), (4, 3, 16, 2), (1, 4, 5, 5), (3, 1, 4, 3)])
def test_verify_inputs_matches_sglang_build_tree(n, k, w, vocab):
    from sglang.srt.speculative import eagle_utils

    g = torch.Generator().manual_seed(n * 100 + k * 10 + w)
    cands = torch.randint(0, vocab, (2, n, k), generator=g)
    tree = build_vote_tree(cands, w)
    anchor = torch.randint(0, 100, (2,), generator=g)
    seq_lens = torch.tensor([0, int(torch.randint(1, 9, (1,), generator=g))])
    enc = to_eagle(tree)
    mask, positions = eagle_utils.build_tree_kernel_efficient(
        anchor, enc.parent_list, enc.top_scores_index, enc.draft_tokens, seq_lens, int(seq_lens.sum()),
        enc.topk, enc.spec_steps, enc.num_verify_tokens, tree_mask_mode=eagle_utils.TreeMaskMode.FULL_MASK,
    )[:2]
    mine = verify_inputs(tree, anchor, seq_lens, int(seq_lens.sum()))
    assert torch.equal(mine.mask, mask)
    assert torch.equal(mine.positions, positions)
