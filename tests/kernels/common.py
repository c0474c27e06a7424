import torch

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")


def anchor_candidates(bs, n, k, g, vocab=50, flip=0.25):
    """The anchors' candidate mix: a base block per request with 25% per-position substitutions."""
    base = torch.randint(0, vocab, (bs, 1, k), generator=g)
    sub = torch.rand(bs, n, k, generator=g) < flip
    return torch.where(sub, torch.randint(0, vocab, (bs, n, k), generator=g), base)


def tree_mask(bs, L, g):
    """(bs, L, L) bool ancestor-or-self mask of a random tree (parent of i drawn below i)."""
    allowed = torch.zeros(bs, L, L, dtype=torch.bool)
    idx = torch.arange(bs)
    for i in range(L):
        allowed[:, i, i] = True
        if i:
            p = torch.randint(0, i, (bs,), generator=g)
            allowed[idx, i] |= allowed[idx, p]
    return allowed
