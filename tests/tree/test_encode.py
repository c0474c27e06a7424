import torch

from flashtree.tree import ancestor_mask, child_links, to_eagle, tree_positions

from .random_trees import random_tree


def _ancestors(parents, i):
    out = {i}
    while i:
        i = parents[i - 1]
        out.add(i)
    return out


def test_ancestor_mask_positions_and_links():
    for seed in range(20):
        tree, _ = random_tree(seed, width=12)
        mask = ancestor_mask(tree)
        prefix = torch.arange(tree.batch_size) * 7 + 3
        pos = tree_positions(tree, prefix)
        first, nxt = child_links(tree)
        w = tree.width
        for b in range(tree.batch_size):
            par, valid = tree.parents[b].tolist(), tree.valid[b].tolist()
            for i in range(w):
                assert {j for j in range(w) if mask[b, i, j]} == _ancestors(par, i)
                assert pos[b, i] == prefix[b] + (0 if i == 0 else tree.depth[b, i - 1])
                kids = [c for c in range(1, w) if valid[c - 1] and par[c - 1] == i]
                assert first[b, i] == (kids[0] if kids else -1)
                for a, c in zip(kids, kids[1:] + [-1]):
                    assert nxt[b, a] == c
            for c in range(1, w):
                if not valid[c - 1]:
                    assert nxt[b, c] == -1 and first[b, c] == -1


def test_eagle_encoding_decodes_to_the_same_parents():
    """Decode the way sglang's build_tree_kernel_efficient does: id // topk names a slot of parent_list, whose entry
    is the parent's own id, found among the selected ids (position + 1 = node index)."""
    for seed in range(20):
        tree, _ = random_tree(seed, width=9)
        enc = to_eagle(tree)
        w = tree.width
        assert enc.topk == w and enc.num_verify_tokens == w and enc.spec_steps == tree.k
        assert enc.parent_list.shape == (tree.batch_size, w * (tree.k - 1) + 1)
        for b in range(tree.batch_size):
            sel = enc.top_scores_index[b].tolist()
            assert len(set(sel)) == w - 1
            for i in range(1, w):
                bucket = sel[i - 1] // enc.topk
                parent = 0 if bucket == 0 else sel.index(enc.parent_list[b, bucket].item()) + 1
                assert parent == tree.parents[b, i - 1]


def test_chain_tree_is_a_line_and_its_mask_is_causal():
    from flashtree.tree import chain_tree, verify_inputs

    tree = chain_tree(2, 5)
    assert tree.parents.tolist() == [[0, 1, 2, 3]] * 2 and tree.depth.tolist() == [[1, 2, 3, 4]] * 2
    assert torch.equal(ancestor_mask(tree), torch.ones(5, 5, dtype=torch.bool).tril().expand(2, 5, 5))
    seq = torch.tensor([2, 0])
    inp = verify_inputs(tree, torch.tensor([7, 8]), seq, 2)
    assert inp.positions.tolist() == [2, 3, 4, 5, 6, 0, 1, 2, 3, 4]
    assert inp.mask[:7].tolist() == [True, True, True, False, False, False, False]
