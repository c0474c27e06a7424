"""Tree policies: the registry, each policy's selection against a brute-force reference, the tree contract, and
lossless verification (greedy identity, sampled chi-square with a negative control) on every policy's trees."""

import itertools

import pytest
import torch

from flashtree.tree import DraftScores, build_tree, build_vote_tree, get_policy, policy_names, verify_greedy, verify_sampled
from flashtree.tree.policies import UnknownPolicy

from .brute import python_walk
from .test_verify import _chi_square_p, _exact_block_distribution, _expand

V = 5  # the vocabulary of test_verify's exact-distribution helpers


def markov_scores(bs: int, k: int, vocab: int, seed: int) -> tuple[DraftScores, torch.Tensor]:
    """A random Markov draft: log q(next | position, prev token), and candidates drawn from it."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(bs, k, vocab, vocab, generator=g).mul(2).log_softmax(-1)  # [b, pos, prev, next]
    anchor = torch.randint(0, vocab, (bs,), generator=g)

    def step_logprobs(rows, pos, prev):
        return table[rows, pos.clamp(max=k - 1), prev]

    return DraftScores(anchor=anchor, step_logprobs=step_logprobs), table


def draw(scores: DraftScores, table, n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    bs = table.shape[0]
    prev = scores.anchor.repeat_interleave(n)
    rows = torch.arange(bs).repeat_interleave(n)
    toks, logp = [], []
    for j in range(k):
        lp = table[rows, j, prev]
        t = torch.multinomial(lp.exp(), 1, generator=g)[:, 0]
        toks.append(t)
        logp.append(lp.gather(1, t[:, None])[:, 0])
        prev = t
    cands = torch.stack(toks, 1).view(bs, n, k)
    scores.logp = torch.stack(logp, 1).view(bs, n, k)
    return cands


def paths(tree, b):
    out = []
    for i in range(tree.width - 1):
        if not tree.valid[b, i]:
            continue
        path, node = [], i + 1
        while node:
            path.append(int(tree.tokens[b, node - 1]))
            node = int(tree.parents[b, node - 1])
        out.append(tuple(reversed(path)))
    return out


def assert_contract(tree):
    bs, m = tree.tokens.shape
    for b in range(bs):
        valid = tree.valid[b].tolist()
        assert valid == sorted(valid, reverse=True), "padding sits after every valid node"
        for i in range(m):
            p = int(tree.parents[b, i])
            assert 0 <= p < i + 1, "parents-first"
            if valid[i]:
                assert p == 0 or valid[p - 1], "prefix-closed"
                assert int(tree.depth[b, i]) == (1 if p == 0 else int(tree.depth[b, p - 1]) + 1)
        assert len(set(paths(tree, b))) == sum(valid), "no duplicate node"


def test_registry_lists_policies_and_refuses_unknown_names():
    assert policy_names()[0] == "vote" and {"prob", "best-first"} <= set(policy_names())
    with pytest.raises(UnknownPolicy, match="registered: vote, prob, best-first"):
        get_policy("votes")
    with pytest.raises(ValueError, match="needs the draft's logp"):
        build_tree(torch.zeros(1, 2, 3, dtype=torch.long), 4, "prob")


def test_vote_through_the_registry_is_trie_vote():
    cands = torch.randint(0, 3, (4, 6, 5), generator=torch.Generator().manual_seed(0))
    a, b = build_tree(cands, 10, "vote"), build_vote_tree(cands, 10)
    for f in ("tokens", "parents", "depth", "votes", "valid", "first_candidate"):
        assert torch.equal(getattr(a, f), getattr(b, f))


@pytest.mark.parametrize("seed", range(4))
def test_prob_keeps_the_most_probable_trie_nodes(seed):
    bs, n, k, width = 3, 8, 4, 9
    scores, table = markov_scores(bs, k, 3, seed)
    cands = draw(scores, table, n, k, seed + 10)
    tree = build_tree(cands, width, "prob", scores)
    assert_contract(tree)
    for b in range(bs):
        nodes = {}
        for m in range(n):
            for d in range(1, k + 1):
                prefix = tuple(cands[b, m, :d].tolist())
                nodes.setdefault(prefix, (float(scores.logp[b, m, :d].sum()), d, m))
        ranked = sorted(nodes, key=lambda p: (-nodes[p][0], nodes[p][1], nodes[p][2]))
        assert set(paths(tree, b)) == set(ranked[: width - 1])


@pytest.mark.parametrize("seed", range(4))
def test_best_first_keeps_the_most_probable_nodes_of_the_draft_tree(seed):
    bs, k, vocab, width = 2, 3, 3, 8
    scores, table = markov_scores(bs, k, vocab, seed)
    cands = torch.zeros(bs, 1, k, dtype=torch.long)  # best-first reads no candidates, only their depth
    tree = build_tree(cands, width, "best-first", scores)
    assert_contract(tree)
    for b in range(bs):
        logp = {}
        for d in range(1, k + 1):
            for seq in itertools.product(range(vocab), repeat=d):
                prev, s = int(scores.anchor[b]), 0.0
                for pos, t in enumerate(seq):
                    s += float(table[b, pos, prev, t])
                    prev = t
                logp[seq] = s
        best = sorted(logp, key=lambda p: -logp[p])[: width - 1]
        assert set(paths(tree, b)) == set(best)


def policy_tree(policy: str, seed: int, width: int = 7):
    k, n = 3, 6
    scores, table = markov_scores(1, k, V, seed)
    cands = draw(scores, table, n, k, seed + 1)
    return build_tree(cands, width, policy, scores)


@pytest.mark.parametrize("policy", ["vote", "prob", "best-first"])
def test_greedy_walk_on_every_policy_commits_the_targets_own_tokens(policy):
    tree = policy_tree(policy, 3)
    g = torch.Generator().manual_seed(5)
    target = torch.randint(0, V, (tree.width,), generator=g)
    for i in range(1, tree.width):  # the target agrees with some drafted children, so walks go deep
        if i % 2:
            target[int(tree.parents[0, i - 1])] = tree.tokens[0, i - 1]
    res = verify_greedy(tree, target.view(1, -1))
    path, bonus = python_walk(tree.tokens[0].tolist(), tree.parents[0].tolist(), tree.valid[0].tolist(), target.tolist())
    assert res.path[0, : len(path)].tolist() == path and int(res.bonus[0]) == bonus
    committed = [t for t in res.tokens[0].tolist() if t >= 0]
    assert committed == [int(target[p]) for p in path]  # each committed token is the target's choice at its node


DRAWS = 100_000


def _logits_for(tree):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, tree.width, V, generator=g)
    for i in range(1, tree.width):
        logits[0, tree.parents[0, i - 1], tree.tokens[0, i - 1]] += 1.5
    return logits


@pytest.mark.parametrize("policy", ["vote", "prob", "best-first"])
def test_sampled_walk_on_every_policy_is_exact(policy):
    tree = policy_tree(policy, 7)
    logits, temperature = _logits_for(tree), 0.8
    expected = _exact_block_distribution(tree, (logits[0] / temperature).softmax(-1))
    res = verify_sampled(_expand(tree, DRAWS), logits.expand(DRAWS, -1, -1), temperature,
                         generator=torch.Generator().manual_seed(1))
    assert res.accept_len.float().mean() > 0.3
    assert _chi_square_p(res.tokens, expected) > 1e-3


@pytest.mark.parametrize("policy", ["prob", "best-first"])
def test_chi_square_catches_a_walk_at_the_wrong_temperature(policy):
    """Negative control: a walk that samples at T = 1 where the law is T = 0.8 must fail the same test."""
    tree = policy_tree(policy, 7)
    logits = _logits_for(tree)
    expected = _exact_block_distribution(tree, (logits[0] / 0.8).softmax(-1))
    res = verify_sampled(_expand(tree, DRAWS), logits.expand(DRAWS, -1, -1), 1.0,
                         generator=torch.Generator().manual_seed(1))
    assert _chi_square_p(res.tokens, expected) < 1e-3
