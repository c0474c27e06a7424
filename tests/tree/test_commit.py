import torch

from flashtree.tree import apply_copies, apply_permutation, commit_plan, verify_greedy, walk_and_commit

from .random_trees import following_targets, random_tree


def _case(seed):
    tree, g = random_tree(seed, bs=4, n=6, k=5, width=10)
    res = verify_greedy(tree, following_targets(tree, g))
    return tree, res, g


def test_permutation_gives_the_sequential_layout_in_req_to_token():
    moved = 0
    for seed in range(30):
        tree, res, g = _case(seed)
        bs, w = tree.batch_size, tree.width
        plan = commit_plan(tree, res)
        rows = torch.tensor([3, 0, 2, 1])
        starts = torch.randint(0, 20, (bs,), generator=g)
        req_to_token = torch.randperm(4 * 40, generator=g).view(4, 40)
        before = req_to_token.clone()
        apply_permutation(req_to_token, rows, starts, plan)
        for b in range(bs):
            r, s, a = rows[b].item(), starts[b].item(), res.accept_len[b].item()
            window = before[r, s : s + w].tolist()
            path = res.path[b, : a + 1].tolist()
            # the first 1 + accept_len slots are the root's and the accepted nodes', in path order
            assert req_to_token[r, s : s + a + 1].tolist() == [window[i] for i in path]
            rest = [window[i] for i in range(w) if i not in path]
            assert req_to_token[r, s + a + 1 : s + w].tolist() == rest
            assert torch.equal(req_to_token[r, :s], before[r, :s]) and torch.equal(req_to_token[r, s + w :], before[r, s + w :])
            moved += path != list(range(a + 1))
        assert torch.equal(plan.kv_len, res.accept_len + 1)
    assert moved > 0  # some accepted paths ran through branches other than the first nodes


def test_copy_plan_gives_the_sequential_kv():
    for seed in range(30):
        tree, res, g = _case(seed)
        bs, w = tree.batch_size, tree.width
        plan = commit_plan(tree, res)
        slots = torch.randperm(bs * w + 7, generator=g)[: bs * w].view(bs, w)
        kv = torch.randn(bs * w + 7, 3, generator=g)
        node_kv = kv[slots].clone()  # (bs, W, 3): the KV each node wrote
        apply_copies(kv, slots, plan)
        for b in range(bs):
            a = res.accept_len[b].item()
            path = res.path[b, : a + 1]
            assert torch.equal(kv[slots[b, : a + 1]], node_kv[b, path])


def test_walk_and_commit_is_walk_plan_and_window_rewrite():
    """The tree step's one call (one launch on CUDA) equals the three separate stages, with and without req_to_token."""
    for seed in range(10):
        tree, g = random_tree(seed, bs=4, n=6, k=5, width=10)
        targets = following_targets(tree, g)
        rows, starts = torch.tensor([3, 0, 2, 1]), torch.randint(0, 20, (4,), generator=g)
        req_to_token = torch.randperm(4 * 40, generator=g).view(4, 40).to(torch.int32)
        want = req_to_token.clone()
        res = verify_greedy(tree, targets)
        plan = commit_plan(tree, res)
        apply_permutation(want, rows, starts, plan)
        seq_lens, window = torch.randint(0, 50, (4,), generator=g), torch.randint(0, 999, (4, 10), generator=g)
        stats = torch.zeros(4, 4, dtype=torch.int32)
        got_res, got_plan, step = walk_and_commit(tree, targets, req_to_token, rows, starts, seq_lens=seq_lens,
                                                  out_width=12, window_slots=window, stats=stats)
        assert torch.equal(req_to_token, want) and torch.equal(got_res.tokens, res.tokens)
        assert torch.equal(got_plan.permutation, plan.permutation) and torch.equal(got_plan.kv_len, plan.kv_len)
        # the step's outputs: what the tree step used to compute after the walk, op by op
        assert step.commit_len.dtype == torch.int32 and torch.equal(step.commit_len, plan.kv_len.to(torch.int32))
        assert torch.equal(step.seq_lens, seq_lens + res.accept_len + 1)
        assert torch.equal(step.out_tokens, torch.cat([res.tokens.clamp(min=0), torch.zeros(4, 12 - 6, dtype=torch.long)], 1))
        assert torch.equal(step.slots, window.gather(1, plan.permutation))
        assert torch.equal(stats[:, 3], res.accept_len.to(torch.int32)) and not stats[:, :3].any()
        untouched = req_to_token.clone()
        assert walk_and_commit(tree, targets)[2] is None
        assert torch.equal(req_to_token, untouched)
