import pytest
import torch

from flashtree.tree import verify_greedy, verify_sampled

from .brute import python_walk
from .random_trees import following_targets, random_tree


def test_greedy_equals_python_walk():
    depths = []
    for seed in range(40):
        tree, g = random_tree(seed, bs=5, n=6, k=5, width=11)
        target = following_targets(tree, g)
        res = verify_greedy(tree, target)
        for b in range(tree.batch_size):
            path, bonus = python_walk(tree.tokens[b].tolist(), tree.parents[b].tolist(), tree.valid[b].tolist(), target[b].tolist())
            a = len(path) - 1
            depths.append(a)
            assert res.path[b].tolist() == path + [-1] * (tree.k + 1 - len(path))
            assert res.accept_len[b] == a and res.bonus[b] == bonus
            drafted = [tree.tokens[b, i - 1].item() for i in path[1:]]
            assert res.tokens[b].tolist() == drafted + [bonus] + [-1] * (tree.k - a)
            assert all(tree.valid[b, i - 1] for i in path[1:])  # padding is never committed
    # the walk was exercised: rejections at the root and acceptances several levels deep
    assert depths.count(0) > 0 and max(depths) >= 3


def test_padding_is_never_accepted_even_when_its_token_matches():
    cands = torch.tensor([[[4, 1]]])  # a 2-node chain; W 6 leaves 3 padding nodes repeating token 4
    from flashtree.tree import build_vote_tree

    tree = build_vote_tree(cands, 6)
    target = torch.tensor([[4, 2, 0, 0, 0, 0]])  # the root's choice is 4: node 1 and the padding all carry it
    res = verify_greedy(tree, target)
    assert res.path[0].tolist() == [0, 1, -1] and res.tokens[0].tolist() == [4, 2, -1]


# --- lossless sampling ------------------------------------------------------------------------------------------

V = 5


def _setup():
    from flashtree.tree import build_vote_tree

    cands = torch.tensor([[[0, 1, 2], [0, 1, 3], [0, 2, 2], [1, 0, 4], [0, 1, 2]]])
    tree = build_vote_tree(cands, 7)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, tree.width, V, generator=g)
    for i in range(1, tree.width):  # the target likes the drafted children, so walks go deep
        logits[0, tree.parents[0, i - 1], tree.tokens[0, i - 1]] += 1.5
    return tree, logits


def _exact_block_distribution(tree, probs):
    """P(committed block) under the target's own sequential sampling, stopped at the first token leaving the tree."""
    out = {}

    def rec(node, prefix, p):
        for tok in range(V):
            q = p * probs[node, tok].item()
            child = [i for i in range(1, tree.width) if tree.valid[0, i - 1] and tree.parents[0, i - 1] == node and tree.tokens[0, i - 1] == tok]
            if child:
                rec(child[0], prefix + (tok,), q)
            else:
                out[prefix + (tok,)] = out.get(prefix + (tok,), 0.0) + q

    rec(0, (), 1.0)
    return out


def _chi_square_p(blocks: torch.Tensor, expected: dict) -> float:
    from scipy.stats import chisquare

    keys = list(expected)
    counts = {key: 0 for key in keys}
    for row, c in zip(*torch.unique(blocks, dim=0, return_counts=True)):
        key = tuple(t for t in row.tolist() if t >= 0)
        assert key in counts, f"committed block {key} is impossible"
        counts[key] += int(c)
    total = blocks.shape[0]
    f_obs = [counts[key] for key in keys]
    norm = sum(expected.values())  # float32 softmax: renormalise so both sides sum to the draws
    f_exp = [expected[key] / norm * total for key in keys]
    return chisquare(f_obs, f_exp).pvalue


DRAWS = 200_000


def _expand(tree, bs):
    from flashtree.tree import VoteTree

    return VoteTree(**{f: getattr(tree, f).expand(bs, -1) for f in ("tokens", "parents", "depth", "votes", "valid", "first_candidate")}, k=tree.k)


def test_sampled_verification_is_exact():
    tree, logits = _setup()
    temperature = 0.8
    probs = (logits[0] / temperature).softmax(-1)
    expected = _exact_block_distribution(tree, probs)
    big = _expand(tree, DRAWS)
    res = verify_sampled(big, logits.expand(DRAWS, -1, -1), temperature, generator=torch.Generator().manual_seed(1))
    assert res.accept_len.float().mean() > 0.5  # the tree is used, not just the bonus
    assert _chi_square_p(res.tokens, expected) > 1e-3


def test_chi_square_catches_a_biased_verifier():
    """A verifier that redraws once when the first draw leaves the tree accepts too often; the test must see it."""
    tree, logits = _setup()
    temperature = 0.8
    probs = (logits[0] / temperature).softmax(-1)
    expected = _exact_block_distribution(tree, probs)
    big = _expand(tree, DRAWS)
    g = torch.Generator().manual_seed(2)
    from flashtree.sampler.reference import sample_rows

    flat = logits.expand(DRAWS, -1, -1).reshape(-1, V)
    temp = torch.full((flat.shape[0],), temperature)
    first = sample_rows(flat, temp, generator=g).view(DRAWS, -1)
    second = sample_rows(flat, temp, generator=g).view(DRAWS, -1)
    child_tokens = torch.zeros(DRAWS, tree.width, V, dtype=torch.bool)
    parents = tree.parents[0]
    for i in range(1, tree.width):
        child_tokens[:, parents[i - 1], tree.tokens[0, i - 1]] = True
    hit = child_tokens.gather(2, first.unsqueeze(2)).squeeze(2)
    from flashtree.tree import verify_greedy

    res = verify_greedy(big, torch.where(hit, first, second))
    assert _chi_square_p(res.tokens, expected) < 1e-3


@pytest.mark.parametrize("top_k,top_p", [(3, None), (None, 0.7), (2, 0.9)])
def test_sampled_verification_with_top_k_top_p(top_k, top_p):
    from flashtree.sampler.reference import filter_logits

    tree, logits = _setup()
    temperature = 1.0
    w = tree.width
    kk = None if top_k is None else torch.full((w,), top_k)
    pp = None if top_p is None else torch.full((w,), top_p)
    probs = filter_logits(logits[0] / temperature, kk, pp).softmax(-1)
    expected = {key: p for key, p in _exact_block_distribution(tree, probs).items() if p > 0}
    big = _expand(tree, DRAWS // 2)
    res = verify_sampled(big, logits.expand(DRAWS // 2, -1, -1), temperature, torch.Generator().manual_seed(3), top_k, top_p)
    assert _chi_square_p(res.tokens, expected) > 1e-3


def test_temperature_zero_is_greedy():
    tree, g = random_tree(7, bs=3, width=9)
    logits = torch.randn(3, tree.width, 3, generator=g)
    assert torch.equal(verify_sampled(tree, logits, 0.0).tokens, verify_greedy(tree, logits.argmax(-1)).tokens)
