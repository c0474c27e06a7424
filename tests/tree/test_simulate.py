"""Simulated acceptance commits along one path of the tree: its first children, capped by the wanted length and the
path's depth, with the target's token after the last node; the commit plan takes it like a verified walk."""

import torch

from flashtree.tree import build_vote_tree, commit_plan
from flashtree.tree.simulate import simulated_walk


def test_the_path_follows_first_children_up_to_the_wanted_length():
    cands = torch.tensor([[[5, 6, 7, 8], [5, 6, 9, 9], [4, 1, 1, 1]]])
    tree = build_vote_tree(cands, 6)  # nodes: 5, 4, 6 (under 5), 7 or 9 (under 6) ...
    target = torch.arange(100, 106).view(1, 6)
    for want, expect_tokens in [(0, []), (1, [5]), (2, [5, 6]), (9, None)]:
        res = simulated_walk(tree, target, torch.tensor([want]))
        path = [p for p in res.path[0].tolist() if p >= 0]
        got = [int(tree.tokens[0, p - 1]) for p in path[1:]]
        if expect_tokens is not None:
            assert got == expect_tokens
        depth = len(path) - 1
        assert int(res.accept_len[0]) == depth <= min(want, tree.k)
        for a, b in zip(path, path[1:]):  # each step takes the parent's first valid child
            kids = [i + 1 for i in range(tree.width - 1) if tree.valid[0, i] and int(tree.parents[0, i]) == a]
            assert b == min(kids)
        assert int(res.bonus[0]) == int(target[0, path[-1]])
        assert [t for t in res.tokens[0].tolist() if t >= 0] == got + [int(res.bonus[0])]
        plan = commit_plan(tree, res)
        assert plan.permutation[0, : depth + 1].tolist() == path  # committed slots first, in path order


def test_wanted_lengths_are_per_request_and_capped_by_the_tree():
    g = torch.Generator().manual_seed(0)
    cands = torch.randint(0, 3, (4, 6, 5), generator=g)
    tree = build_vote_tree(cands, 9)
    want = torch.tensor([0, 2, 5, 50])
    res = simulated_walk(tree, torch.zeros(4, 9, dtype=torch.long), want)
    assert (res.accept_len <= want).all() and (res.accept_len <= tree.k).all()
    assert res.accept_len[0] == 0 and res.accept_len[1] == 2


def test_the_guided_walk_commits_what_the_reference_commits():
    """The server's simulated step (the greedy walk, led down the first-child path, cut at the drawn length) gives the
    reference's path, tokens and bonus, on random trees of both server policies and targets that sometimes match."""
    from flashtree.tree import build_tree
    from flashtree.tree.simulate import simulated_walk_and_commit

    g = torch.Generator().manual_seed(3)
    for trial in range(40):
        bs, n, k, w = 3, int(torch.randint(1, 9, (1,), generator=g)), int(torch.randint(1, 7, (1,), generator=g)), 8
        cands = torch.randint(0, 3, (bs, n, k), generator=g)
        tree = build_tree(cands, w, "vote")
        target = torch.randint(0, 3, (bs, w), generator=g)  # small vocabulary: the cut node's target often matches
        want = torch.randint(0, k + 2, (bs,), generator=g)
        ref = simulated_walk(tree, target, want)
        table = torch.arange(bs * 20).view(bs, 20)
        starts = torch.tensor([1, 2, 3])
        got, plan, _ = simulated_walk_and_commit(tree, target, want, table, torch.arange(bs), starts)
        assert torch.equal(got.accept_len, ref.accept_len), trial
        assert torch.equal(got.path, ref.path), trial
        assert torch.equal(got.bonus, ref.bonus), trial
        assert torch.equal(got.tokens, ref.tokens), trial
        assert torch.equal(plan.kv_len, ref.accept_len + 1)
        # paged KV copies nothing past the cut: masked-off entries copy a slot onto itself
        assert torch.equal(plan.copy_src[~plan.copy_mask], plan.copy_dst[~plan.copy_mask]), trial
        for b in range(bs):  # the committed slots lead the rewritten window, in path order
            d = int(ref.accept_len[b])
            window = table[b, int(starts[b]):][: d + 1] - (b * 20 + int(starts[b]))
            assert window.tolist() == ref.path[b, : d + 1].tolist(), trial
