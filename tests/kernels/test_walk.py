import pytest
import torch

from flashtree.tree import apply_permutation
from flashtree.tree.build import build_vote_tree
from flashtree.tree.commit import commit_plan, step_commit
from flashtree.tree.verify import cut_walk, verify_greedy
from flashtree.tree.triton_walk import commit_plan_triton, verify_greedy_triton, walk_and_commit_triton

from .common import CUDA, DEV, anchor_candidates

RES = ["path", "accept_len", "bonus", "tokens"]
PLAN = ["permutation", "copy_src", "copy_dst", "copy_mask", "kv_len"]
STEP = ["commit_len", "seq_lens", "out_tokens", "slots"]


def following_targets(tree, g, vocab, follow=0.8):
    """Target choices per node: with probability `follow` the token of the node's first valid child (vectorised)."""
    bs, w = tree.batch_size, tree.width
    target = torch.randint(0, vocab, (bs, w), generator=g)
    parents = tree.parents.masked_fill(~tree.valid, w)  # padding hangs nowhere
    child_tok = torch.full((bs, w + 1), -1, dtype=torch.long)
    # scatter in reverse index order so the first child wins
    cols = torch.arange(w - 1, 0, -1)
    for c in cols.tolist():
        child_tok[torch.arange(bs), parents[:, c - 1]] = tree.tokens[:, c - 1]
    take = (torch.rand(bs, w, generator=g) < follow) & (child_tok[:, :w] >= 0)
    return torch.where(take, child_tok[:, :w], target)


def run_case(bs, n, k, w, vocab, g, capped=False):
    """The fused kernel against the references: the walk (cut at a random cap with `capped`), its plan, the window
    rewrite and the step's outputs (window slots of a wider row, output tokens wider than K + 1)."""
    cands = torch.randint(0, vocab, (bs, n, k), generator=g) if vocab < 50 else anchor_candidates(bs, n, k, g)
    tree = build_vote_tree(cands, w)
    target = following_targets(tree, g, vocab)
    cap = torch.randint(-1, k + 2, (bs,), generator=g) if capped else None
    ref = verify_greedy(tree, target)
    if capped:
        ref = cut_walk(ref, cap)
    plan = commit_plan(tree, ref)
    seq = torch.randint(0, 1000, (bs,), generator=g)
    r2t = torch.randint(0, 10**6, (bs + 3, 2000), generator=g).to(torch.int32)
    rows = torch.randperm(bs + 3, generator=g)[:bs]
    starts = torch.randint(0, 2000 - w, (bs,), generator=g)
    r2t_ref = r2t.clone()
    apply_permutation(r2t_ref, rows, starts, plan)
    window = torch.randint(0, 10**6, (bs, w + 3), generator=g)[:, :w]
    out_width = k + 1 + int(torch.randint(0, 3, (1,), generator=g))
    stats = torch.randint(0, 9, (bs, 4), generator=g, dtype=torch.int32)
    stats_ref = stats.clone()
    step = step_commit(ref, plan, seq, out_width, window, stats_ref)

    dtree = type(tree)(**{f: getattr(tree, f).to(DEV) if torch.is_tensor(getattr(tree, f)) else getattr(tree, f)
                          for f in tree.__dataclass_fields__})
    r2t_d, stats_d = r2t.to(DEV), stats.to(DEV)
    res, tplan, tstep = walk_and_commit_triton(dtree, target.to(DEV), seq.to(DEV), r2t_d, rows.to(DEV),
                                               starts.to(DEV), out_width=out_width, window_slots=window.to(DEV),
                                               stats=stats_d, cap=None if cap is None else cap.to(DEV))
    for f in RES:
        assert torch.equal(getattr(res, f).cpu(), getattr(ref, f)), f
    for f in PLAN:
        assert torch.equal(getattr(tplan, f).cpu(), getattr(plan, f)), f
    for f in STEP:
        assert torch.equal(getattr(tstep, f).cpu(), getattr(step, f)), f
    assert torch.equal(step.seq_lens, seq + ref.accept_len + 1)
    assert torch.equal(stats_d.cpu(), stats_ref) and torch.equal(stats_ref[:, 3], ref.accept_len.to(torch.int32))
    assert torch.equal(r2t_d.cpu(), r2t_ref)
    assert capped or all(torch.equal(getattr(verify_greedy_triton(dtree, target.to(DEV)), f).cpu(), getattr(ref, f))
                         for f in RES)
    dres = type(ref)(**{f: getattr(ref, f).to(DEV) for f in RES})
    plan2 = commit_plan_triton(dtree, dres)
    for f in PLAN:
        assert torch.equal(getattr(plan2, f).cpu(), getattr(plan, f)), f
    return ref


# (2, 64, 8, 64, 3): the widest live server's shape (b_tree64w: N = W = 64, depth 8)
@pytest.mark.parametrize("bs,n,k,w,vocab", [(6, 6, 5, 11, 3), (2, 1, 1, 2, 3), (3, 4, 3, 40, 2), (4, 8, 15, 16, 4),
                                           (2, 64, 8, 64, 3)])
def test_walk_commit_matches_reference(bs, n, k, w, vocab):
    g = torch.Generator().manual_seed(bs * 1000 + n * 100 + k * 10 + w)
    depths = []
    for _ in range(3):
        depths += run_case(bs, n, k, w, vocab, g).accept_len.tolist()
    if k > 2:
        assert max(depths) >= 2  # the walk went deep, not only root rejections


@pytest.mark.parametrize("bs,n,k,w,vocab", [(6, 6, 5, 11, 3), (2, 1, 1, 2, 3), (4, 8, 15, 16, 4)])
def test_capped_walk_matches_the_cut_reference(bs, n, k, w, vocab):
    """Simulated acceptance's walk: at most cap[b] nodes accepted (`verify.cut_walk`), plan and outputs of the cut."""
    g = torch.Generator().manual_seed(bs * 1000 + n * 100 + k * 10 + w + 7)
    for _ in range(4):
        run_case(bs, n, k, w, vocab, g, capped=True)


def test_padding_never_accepted():
    tree = build_vote_tree(torch.tensor([[[4, 1]]]), 6)
    target = torch.tensor([[4, 2, 0, 0, 0, 0]])
    dtree = type(tree)(**{f: getattr(tree, f).to(DEV) if torch.is_tensor(getattr(tree, f)) else getattr(tree, f)
                          for f in tree.__dataclass_fields__})
    res = verify_greedy_triton(dtree, target.to(DEV))
    assert res.path[0].tolist() == [0, 1, -1] and res.tokens[0].tolist() == [4, 2, -1]


@pytest.mark.skipif(not CUDA, reason="real batch shapes on the GPU")
def test_walk_commit_real_shapes():
    g = torch.Generator().manual_seed(11)
    for bs, n, k, w in [(1, 8, 15, 16), (64, 32, 15, 32), (256, 16, 15, 16)]:
        run_case(bs, n, k, w, 50, g)
