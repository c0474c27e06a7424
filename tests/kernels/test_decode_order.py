"""The decode-order verify kernel: each verify token's output is its decode row's (prefix, then its tree path), in
sglang's deterministic split order. Checked against the torch reference, against plain tree attention, and against
itself with every token run alone as a one-token request (its own decode): the tile packing and the shared prefix
blocks must not change any row's numbers. Against sglang's decode kernel itself: tests/patches/test_exact_verify_cpu.py
and, bit for bit on the GPU, benchmarks/decode_order_check.py."""

import pytest
import torch

from flashtree.attention import tree_attention_reference
from flashtree.attention.reference import decode_order_verify_reference
from flashtree.attention.triton_decode_order import decode_order_verify_triton

from .common import CUDA, DEV, tree_mask


def make(bs, hq, hkv, d, w, prefix, g):
    """A verify batch whose W fresh keys sit in the pool; returns the kernel's inputs and the tree mask."""
    prefix = torch.tensor(prefix)
    pool = int(prefix.sum()) + bs * w + 8
    kb = torch.randn(pool, hkv, d, generator=g)
    vb = torch.randn(pool, hkv, d, generator=g)
    slots = torch.randperm(pool - 1, generator=g)[: int(prefix.sum()) + bs * w] + 1
    kv_indices, loc = slots[: int(prefix.sum())], slots[int(prefix.sum()) :]
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32)
    kv_indptr[1:] = prefix.cumsum(0)
    allowed = tree_mask(bs, w, g)
    path_slots = torch.zeros(bs * w, w, dtype=torch.int64)
    path_lens = allowed.sum(-1).flatten().to(torch.int32)
    for b in range(bs):
        for i in range(w):
            cols = allowed[b, i].nonzero().flatten()
            path_slots[b * w + i, : len(cols)] = loc[b * w + cols]
    q = torch.randn(bs * w, hq, d, generator=g)
    return q, kb, vb, kv_indptr, kv_indices, path_slots, path_lens, loc, allowed


CASES = [
    # bs, hq, hkv, d, W, prefix lengths, split tile
    (2, 6, 2, 16, 5, [3, 75], 40),  # G = 3: tiles cut tokens' heads apart
    (3, 9, 3, 64, 8, [0, 33, 130], 64),  # an empty prefix; rows of 2-3 splits
    (1, 32, 2, 32, 4, [100], 256),  # G = 16: one token per tile, one split
    (2, 4, 1, 16, 7, [31, 64], 32),  # MQA; splits of one block
]


# On the GPU the kernel's float32 dots run in TF32, as those of sglang's decode kernel (the order it matches) do: the
# fp32 references agree to TF32's rounding there, exactly under the interpreter.
TOL = dict(atol=5e-3, rtol=5e-3) if CUDA else dict(atol=2e-5, rtol=2e-5)


def run(case, seed=0):
    bs, hq, hkv, d, w, prefix, tile = case
    g = torch.Generator().manual_seed(seed)
    q, kb, vb, indptr, indices, ps, pl, loc, allowed = make(bs, hq, hkv, d, w, prefix, g)
    longest = max(prefix) + w
    splits = -(-longest // tile)
    args = [x.to(DEV) for x in (q, kb, vb, indptr, indices, ps, pl)]
    got = decode_order_verify_triton(*args, w, d**-0.5, tile, splits + 1).cpu()
    return got, (q, kb, vb, indptr, indices, ps, pl, loc, allowed), tile, splits


@pytest.mark.parametrize("case", CASES)
def test_decode_order_matches_references(case):
    got, (q, kb, vb, indptr, indices, ps, pl, loc, allowed), tile, _ = run(case)
    bs, hq, hkv, d, w, prefix, _ = case
    ref = decode_order_verify_reference(q, kb, vb, indptr, indices, ps, pl, w, d**-0.5, tile)
    torch.testing.assert_close(got, ref, **TOL)
    mask = torch.cat([torch.cat([torch.ones(w, p, dtype=torch.bool), allowed[b]], 1).flatten()
                      for b, p in enumerate(prefix)])
    mask_indptr = torch.tensor([0] + torch.tensor([w * (p + w) for p in prefix]).cumsum(0).tolist())
    plain = tree_attention_reference(q, kb[loc], vb[loc], kb, vb, indptr, indices, mask, w, d**-0.5, mask_indptr)
    torch.testing.assert_close(got, plain, **TOL)


@pytest.mark.parametrize("case", CASES[:2])
def test_each_row_is_its_own_decode(case):
    """Token i alone: a request whose prefix is the batch's prefix plus its path's ancestors, and whose one verify
    token is i itself. Same keys in the same order, no sharing, no packing: on the GPU the numbers must not move at all
    (a dot's output row depends on its own input row only). The interpreter's dots are numpy matmuls, whose BLAS sums
    a row differently depending on the rows beside it, so there they agree to rounding only."""
    got, (q, kb, vb, indptr, indices, ps, pl, *_), tile, splits = run(case)
    w = case[4]
    for r in range(q.shape[0]):
        b, n = r // w, int(pl[r])
        prefix = torch.cat([indices[int(indptr[b]) : int(indptr[b + 1])], ps[r, : n - 1]])
        args = [x.to(DEV) for x in (q[r : r + 1], kb, vb, torch.tensor([0, len(prefix)], dtype=torch.int32), prefix,
                                    ps[r : r + 1, n - 1 : n], torch.ones(1, dtype=torch.int32))]
        alone = decode_order_verify_triton(*args, 1, case[3] ** -0.5, tile, splits + 1).cpu()
        if CUDA:
            assert torch.equal(got[r], alone[0]), f"row {r}: max |diff| {(got[r] - alone[0]).abs().max():.3g}"
        else:
            torch.testing.assert_close(got[r], alone[0], atol=1e-6, rtol=1e-6)


def test_refuses_mha():
    with pytest.raises(ValueError, match="grouped kernel"):
        z = torch.zeros(4, 2, 16)
        decode_order_verify_triton(z, z, z, None, None, None, None, 4, 1.0, 32, 2)
