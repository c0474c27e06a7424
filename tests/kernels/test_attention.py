import pytest
import torch

from flashtree.attention import tree_attention_paged_reference, tree_attention_reference
from flashtree.attention.triton_verify import (MAX_SPLITS, MIN_SPLIT_KEYS, choose_splits, launch_choice,
                                               tree_attention_paged_triton, tree_attention_triton)
from flashtree.gpu import zeroed_counters

from .common import CUDA, DEV, tree_mask


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def make(bs, hq, hkv, d, L, lens, dtype, g, full=False):
    total = int(lens.sum()) + 16
    kb = torch.randn(total, hkv, d, generator=g).to(dtype)
    vb = torch.randn(total, hkv, d, generator=g).to(dtype)
    indptr = torch.zeros(bs + 1, dtype=torch.int32)
    indptr[1:] = lens.cumsum(0)
    idx = (torch.randperm(total - 16, generator=g)[: int(lens.sum())] + 16).to(torch.int64)
    q = torch.randn(bs * L, hq, d, generator=g).to(dtype)
    k = torch.randn(bs * L, hkv, d, generator=g).to(dtype)
    v = torch.randn(bs * L, hkv, d, generator=g).to(dtype)
    allowed = tree_mask(bs, L, g)
    if full:
        rows, mip = [], torch.zeros(bs + 1, dtype=torch.int64)
        for b in range(bs):
            m = torch.ones(L, int(lens[b]) + L, dtype=torch.bool)
            m[:, int(lens[b]):] = allowed[b]
            rows.append(m.flatten())
            mip[b + 1] = mip[b] + m.numel()
        mask = torch.cat(rows)
    else:
        mask, mip = allowed.flatten().to(torch.uint8), None
    return q, k, v, kb, vb, indptr, idx, mask, mip


def make_paged(bs, hq, hkv, d, L, lens, page, g):
    """Paged-layout inputs: random pages of bf16 K / V, a random page table, QLEN tree masks."""
    maxpages = (int(lens.max()) + page - 1) // page
    npages = bs * maxpages + 3
    kc = torch.randn(npages, page, hkv, d, generator=g).to(torch.bfloat16)
    vc = torch.randn(npages, page, hkv, d, generator=g).to(torch.bfloat16)
    pt = torch.randperm(npages, generator=g)[: bs * maxpages].view(bs, maxpages).to(torch.int32)
    q = torch.randn(bs * L, hq, d, generator=g).to(torch.bfloat16)
    k = torch.randn(bs * L, hkv, d, generator=g).to(torch.bfloat16)
    v = torch.randn(bs * L, hkv, d, generator=g).to(torch.bfloat16)
    return [x.to(DEV) for x in (q, k, v, kc, vc, pt, lens)], tree_mask(bs, L, g).flatten().to(DEV)


CASES = [
    # bs, hq, hkv, d, L, max prefix, dtype, splits, full mask
    (2, 4, 2, 64, 4, 50, torch.bfloat16, None, False),
    (3, 8, 2, 128, 5, 70, torch.float16, 3, True),
    (1, 6, 1, 64, 3, 0, torch.bfloat16, 2, False),  # empty prefix, G = 6 (not a power of two)
    (2, 16, 1, 64, 8, 40, torch.bfloat16, 1, False),  # G = 16
    (2, 2, 2, 256, 4, 33, torch.bfloat16, 2, True),  # G = 1, head dim 256
]
if CUDA:
    CASES += [
        (1, 32, 8, 128, 16, 4096, torch.bfloat16, None, False),
        (8, 32, 8, 128, 16, 4096, torch.bfloat16, None, True),
        (4, 32, 8, 128, 32, 2000, torch.float16, None, False),
        (3, 16, 1, 256, 16, 1500, torch.bfloat16, None, False),
        (5, 64, 4, 64, 16, 3000, torch.bfloat16, None, True),
    ]


@pytest.mark.parametrize("bs,hq,hkv,d,L,maxp,dtype,splits,full", CASES)
def test_attention_sglang_layout(bs, hq, hkv, d, L, maxp, dtype, splits, full):
    g = torch.Generator().manual_seed(bs * 31 + d + L)
    lens = torch.randint(0, maxp + 1, (bs,), generator=g)
    lens[0] = maxp
    q, k, v, kb, vb, indptr, idx, mask, mip = make(bs, hq, hkv, d, L, lens, dtype, g, full)
    args = [x.to(DEV) for x in (q, k, v, kb, vb, indptr, idx, mask)]
    mipd = None if mip is None else mip.to(DEV)
    ref = tree_attention_reference(q.to(DEV).float(), k.to(DEV).float(), v.to(DEV).float(), kb.to(DEV).float(),
                                   vb.to(DEV).float(), args[5], args[6], args[7], L, mask_indptr=mipd)
    out = tree_attention_triton(*args, L, mask_indptr=mipd, num_splits=splits)
    assert out.dtype == dtype and out.shape == q.shape
    assert rel_err(out, ref) <= 1e-2


@pytest.mark.parametrize("page", [16, 64])
def test_attention_paged_layout(page):
    g = torch.Generator().manual_seed(page)
    bs, hq, hkv, d, L = (3, 8, 2, 64, 4) if not CUDA else (16, 32, 8, 128, 16)
    lens = torch.tensor([37, 5, 64]) if not CUDA else torch.randint(1, 3000, (bs,), generator=g)
    dq, mask = make_paged(bs, hq, hkv, d, L, lens, page, g)
    ref = tree_attention_paged_reference(*[x.float() for x in dq[:5]], dq[5], dq[6], page, mask, L)
    for splits in (1, 3):
        out = tree_attention_paged_triton(*dq, page, mask, L, num_splits=splits)
        assert rel_err(out, ref) <= 1e-2


def test_tree_mask_is_applied():
    """A key the mask hides must not move the output: change a hidden fresh value, the row stays put."""
    g = torch.Generator().manual_seed(0)
    bs, hq, hkv, d, L = 1, 2, 1, 64, 4
    lens = torch.tensor([8])
    q, k, v, kb, vb, indptr, idx, mask, _ = make(bs, hq, hkv, d, L, lens, torch.float16, g)
    chain = torch.tril(torch.ones(L, L, dtype=torch.uint8)).flatten()
    a = tree_attention_triton(*[x.to(DEV) for x in (q, k, v, kb, vb, indptr, idx, chain)], L)
    v2 = v.clone()
    v2[L - 1] += 10  # the last token is visible only to itself under a causal chain
    b = tree_attention_triton(*[x.to(DEV) for x in (q, k, v2, kb, vb, indptr, idx, chain)], L)
    assert torch.equal(a[: (L - 1) * 1].cpu(), b[: (L - 1) * 1].cpu())
    assert not torch.equal(a[L - 1].cpu(), b[L - 1].cpu())


def test_split_choice():
    # a batch that fills the GPU alone runs unsplit (bs 64 / 8K: one part per (request, KV head))
    assert choose_splits(64 * 8, 8192, 132) == 1 and choose_splits(106, 4096, 132) == 1
    # bs 1 (8 KV heads): the power of two below one wave of 2 programs per SM, at least MIN_SPLIT_KEYS keys each
    assert choose_splits(8, 32768, 132) == 32 and choose_splits(8, 4096, 132) == 4096 // MIN_SPLIT_KEYS == 16
    assert choose_splits(64, 4096, 132) == 4 and choose_splits(8, 100, 132) == 1
    assert choose_splits(1, 1 << 20, 132) == MAX_SPLITS
    one = launch_choice(1, 32, 8, 128, 128, 16, 4096, torch.device("cuda"), None) if CUDA else None
    assert one is None or (one.splits, one.parts, one.block_m, one.row_blocks) == (16, 17, 64, 1)
    cpu = launch_choice(2, 8, 2, 64, 64, 4, 50, torch.device("cpu"), 3)
    assert (cpu.splits, cpu.parts) == (3, 4)  # the tree gets a part of its own
    assert launch_choice(2, 8, 2, 64, 64, 4, 50, torch.device("cpu"), 1).parts == 1
    for bad in (0, -2, 2.5):
        with pytest.raises(ValueError, match="num_splits"):
            launch_choice(2, 8, 2, 64, 64, 4, 50, torch.device("cpu"), bad)


def test_long_prefixes_at_tiny_batches_take_half_the_splits_in_wider_tiles(monkeypatch):
    """On an H200's 132 SMs, bs 1 over 32K keys (Qwen3-8B heads) runs 16 splits of 128-key tiles, not the fill
    rule's 32 of 64-key tiles; 4K keeps 16 splits of 64-key tiles, and an explicit split count is taken as given.
    The partials follow the queries' 16-bit dtype; float32 calls keep float32 partials."""
    from flashtree.attention import triton_verify

    monkeypatch.setattr(triton_verify, "sm_count", lambda device, default: 132)
    cpu = torch.device("cpu")
    long = launch_choice(1, 32, 8, 128, 128, 16, 32768, cpu, dtype=torch.bfloat16)
    assert (long.splits, long.block_n, long.partials) == (16, 128, "bf16")
    assert choose_splits(8, 32768, 132) == 32  # what the fill rule alone gives
    short = launch_choice(1, 32, 8, 128, 128, 16, 4096, cpu, dtype=torch.float16)
    assert (short.splits, short.block_n, short.partials) == (16, 64, "fp16")
    given = launch_choice(1, 32, 8, 128, 128, 16, 32768, cpu, 32, dtype=torch.float32)
    assert (given.splits, given.block_n, given.partials) == (32, 64, "fp32")
    assert launch_choice(1, 32, 8, 128, 128, 16, 32768, cpu, tune=dict(partials="fp32")).partials == "fp32"


@pytest.mark.parametrize("splits", [2, 4, 9])
@pytest.mark.parametrize("fused", [False, True], ids=["merge-launch", "fused-merge"])
def test_any_split_count_matches_the_reference(splits, fused, monkeypatch):
    """Every split count gives the reference's output, splits left empty by a short prefix included (9 splits of
    one key block over prefixes of 0-130 keys); fresh random inputs per count. Every buffer the call allocates
    starts as NaN, so an empty split's partial, which is never written, is NaN too: the merge must leave it out."""
    g = torch.Generator().manual_seed(100 + splits)
    bs, hq, hkv, d, L = 3, 8, 2, 64, 5
    lens = torch.tensor([130, 0, int(torch.randint(1, 70, (1,), generator=g))])
    q, k, v, kb, vb, indptr, idx, mask, _ = make(bs, hq, hkv, d, L, lens, torch.bfloat16, g)
    args = [x.to(DEV) for x in (q, k, v, kb, vb, indptr, idx, mask)]
    ref = tree_attention_reference(*[x.float() for x in args[:5]], *args[5:], L)
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))
    out = tree_attention_triton(*args, L, num_splits=splits, tune=dict(fused_merge=fused, block_n=16))
    monkeypatch.undo()
    assert rel_err(out, ref) <= 1e-2


def test_the_heuristic_on_an_index_buffer_longer_than_the_prefixes():
    """sglang's graphs pass a `kv_indices` buffer sized for the longest context: the heuristic then splits by its
    length, and prefixes much shorter than it fill only their first splits (the rest load nothing)."""
    g = torch.Generator().manual_seed(7)
    bs, hq, hkv, d, L = 2, 4, 1, 64, 4
    lens = torch.tensor([600, 37])
    q, k, v, kb, vb, indptr, idx, mask, _ = make(bs, hq, hkv, d, L, lens, torch.bfloat16, g)
    padded = torch.cat([idx, torch.zeros(8192, dtype=idx.dtype)])  # the buffer's tail is never read
    c = launch_choice(bs, hq, hkv, d, d, L, len(padded) // bs, torch.device(DEV), None)
    by_prefix = launch_choice(bs, hq, hkv, d, d, L, int(lens.max()), torch.device(DEV), None)
    # split by the buffer (8 splits on the CPU's 8 stand-in SMs, 18 on an H200): the short prefixes leave most empty
    assert c.splits > by_prefix.splits
    args = [x.to(DEV) for x in (q, k, v, kb, vb, indptr, padded, mask)]
    ref = tree_attention_reference(*[x.float() for x in args[:5]], *args[5:], L)
    assert rel_err(tree_attention_triton(*args, L), ref) <= 1e-2


TUNED = [
    dict(partials="bf16"),
    dict(partials="fp16"),
    dict(fused_merge=True),
    dict(fused_merge=True, partials="bf16", merge_unroll=3),
    dict(tree_part=False),
    dict(tree_part=False, fused_merge=True, partials="bf16"),
    dict(block_n=16, num_warps=2, num_stages=2, merge_rows=4),
    dict(prefetch=False),
    dict(prefetch=False, block_n=16, partials="bf16"),
    dict(block_m=16),  # 20 rows (G 4 x L 5) in 2 blocks on the CPU, 64 (G 4 x L 16) in 4 on the GPU
    dict(block_m=16, fused_merge=True, partials="bf16"),
    dict(pdl=True),  # on the GPU a programmatic dependent launch of both kernels; on the CPU the plain launch
    dict(pdl=True, fused_merge=True, partials="bf16"),
]


@pytest.mark.parametrize("tune", TUNED, ids=lambda t: ",".join(f"{k}={v}" for k, v in t.items()))
def test_tuned_launches_match_the_reference(tune):
    """Every launch override gives the reference's output in sglang's layout (QLEN and FULL masks) and the paged
    one, on fresh random inputs per variant: an empty prefix and splits left empty by short prefixes included."""
    g = torch.Generator().manual_seed(sum(map(ord, str(tune))))
    if CUDA:  # Qwen3-8B heads at bs 2 / 4K: the fused merge's ticket ordering across real concurrent programs
        bs, hq, hkv, d, L, lens, splits = 2, 32, 8, 128, 16, torch.tensor([4096, 900]), 16
    else:
        bs, hq, hkv, d, L, lens, splits = 3, 8, 2, 64, 5, torch.tensor([130, 0, 41]), 5
    for full in (False, True):
        q, k, v, kb, vb, indptr, idx, mask, mip = make(bs, hq, hkv, d, L, lens, torch.bfloat16, g, full)
        args = [x.to(DEV) for x in (q, k, v, kb, vb, indptr, idx, mask)]
        mipd = None if mip is None else mip.to(DEV)
        ref = tree_attention_reference(*[x.float() for x in args[:5]], *args[5:], L, mask_indptr=mipd)
        out = tree_attention_triton(*args, L, mask_indptr=mipd, num_splits=splits, tune=tune)
        assert out.dtype == torch.bfloat16 and rel_err(out, ref) <= 1e-2
    dq, mask = make_paged(bs, hq, hkv, d, L, lens.clamp(min=1), 16, g)
    ref = tree_attention_paged_reference(*[x.float() for x in dq[:5]], dq[5], dq[6], 16, mask, L)
    assert rel_err(tree_attention_paged_triton(*dq, 16, mask, L, num_splits=splits, tune=tune), ref) <= 1e-2


def test_the_fused_merge_leaves_its_counters_at_zero():
    """After a fused call every ticket counter is zero again, so the next call (or graph replay) merges too: a
    second call, and one of another split count, give the reference's output."""
    g = torch.Generator().manual_seed(11)
    bs, hq, hkv, d, L = 2, 4, 2, 64, 4
    q, k, v, kb, vb, indptr, idx, mask, _ = make(bs, hq, hkv, d, L, torch.tensor([90, 33]), torch.bfloat16, g)
    args = [x.to(DEV) for x in (q, k, v, kb, vb, indptr, idx, mask)]
    ref = tree_attention_reference(*[x.float() for x in args[:5]], *args[5:], L)
    tune = dict(fused_merge=True, block_n=16)
    outs = [tree_attention_triton(*args, L, num_splits=n, tune=tune) for n in (3, 3, 6)]
    assert not zeroed_counters("verify-merge", 1, torch.device(DEV)).any()
    for out in outs:
        assert rel_err(out, ref) <= 1e-2
    assert torch.equal(outs[1], outs[0])  # whichever part finished last, the merge reads every part in part order


def test_tune_overrides_the_launch():
    cpu = torch.device("cpu")
    base = launch_choice(2, 8, 2, 64, 64, 4, 50, cpu, 3)
    assert (base.partials, base.fused, base.parts) == ("fp32", False, 4)  # the defaults: fp32, two launches
    c = launch_choice(2, 8, 2, 64, 64, 4, 50, cpu, 3, dict(block_n=128, num_warps=8, num_stages=4, partials="bf16",
                                                          fused_merge=True, tree_part=False, merge_rows=8))
    assert (c.block_n, c.warps, c.stages, c.partials, c.fused, c.parts, c.merge_rows) == (128, 8, 4, "bf16", True, 3, 8)
    assert not launch_choice(2, 8, 2, 64, 64, 4, 50, cpu, 1, dict(fused_merge=True)).fused  # one part: no merge


@pytest.mark.parametrize("tune", [
    dict(block_n=48), dict(block_n=8), dict(block_n=512), dict(block_n=True), dict(num_warps=3), dict(num_stages=0),
    dict(num_stages=2.0), dict(partials="fp8"), dict(partials=torch.bfloat16), dict(fused_merge=1),
    dict(tree_part="no"), dict(merge_rows=1), dict(merge_unroll=0), dict(splits=4), [("block_n", 64)],
    dict(prefetch=1), dict(pdl="yes"), dict(block_m=8), dict(block_m=48), dict(early=3), dict(early=True),
])
def test_bad_overrides_raise(tune):
    with pytest.raises(ValueError, match="tune"):
        launch_choice(2, 8, 2, 64, 64, 4, 50, torch.device("cpu"), 3, tune)


@pytest.mark.parametrize("early, prefetch", [(1, True), (2, True), (2, False)])
def test_a_prefix_ready_call_matches_the_reference(early, prefetch):
    """prefix_ready (the prefix's index written before the kernel just before: read before the launch's wait) gives
    the plain call's output bit for bit and the reference's, in both layouts: `early` 2 walks the first key tile
    before the loop (on the CPU too; only the wait needs a GPU), over prefixes of one partial tile, none, and splits
    left empty, with a tree part and without."""
    g = torch.Generator().manual_seed(60 + early + 3 * prefetch)
    bs, hq, hkv, d, L, lens = 3, 8, 2, 64, 5, torch.tensor([130, 0, 7])
    for full, splits, tree_part in ((False, 5, True), (True, 1, True), (False, 3, False)):
        tune = dict(early=early, prefetch=prefetch, tree_part=tree_part, block_n=16)
        q, k, v, kb, vb, indptr, idx, mask, mip = make(bs, hq, hkv, d, L, lens, torch.bfloat16, g, full)
        args = [x.to(DEV) for x in (q, k, v, kb, vb, indptr, idx, mask)]
        mipd = None if mip is None else mip.to(DEV)
        ref = tree_attention_reference(*[x.float() for x in args[:5]], *args[5:], L, mask_indptr=mipd)
        ready = tree_attention_triton(*args, L, mask_indptr=mipd, num_splits=splits, tune=tune, prefix_ready=True)
        plain = tree_attention_triton(*args, L, mask_indptr=mipd, num_splits=splits, tune=tune)
        assert rel_err(ready, ref) <= 1e-2
        assert torch.equal(ready, plain)
    dq, mask = make_paged(bs, hq, hkv, d, L, lens.clamp(min=1), 16, g)
    ref = tree_attention_paged_reference(*[x.float() for x in dq[:5]], dq[5], dq[6], 16, mask, L)
    out = tree_attention_paged_triton(*dq, 16, mask, L, num_splits=3, tune=dict(early=early), prefix_ready=True)
    assert rel_err(out, ref) <= 1e-2


@pytest.mark.parametrize("splits", [1, 3])
def test_a_causal_chain_needs_no_mask(splits):
    """causal=True (a chain verify, its mask computed in the kernel) gives exactly what the explicit lower-triangular
    QLEN mask gives, and the reference's causal output; a mask with causal=True, or neither, is refused."""
    g = torch.Generator().manual_seed(40 + splits)
    bs, hq, hkv, d, L = 2, 8, 2, 64, 5
    q, k, v, kb, vb, indptr, idx, _, _ = make(bs, hq, hkv, d, L, torch.tensor([70, 9]), torch.bfloat16, g)
    args = [x.to(DEV) for x in (q, k, v, kb, vb, indptr, idx)]
    tril = torch.ones(L, L, dtype=torch.uint8).tril().repeat(bs, 1).flatten().to(DEV)
    chain = tree_attention_triton(*args, None, L, num_splits=splits, causal=True)
    assert torch.equal(chain, tree_attention_triton(*args, tril, L, num_splits=splits))
    ref = tree_attention_reference(*[x.float() for x in args[:5]], *args[5:], None, L, causal=True)
    assert rel_err(chain, ref) <= 1e-2
    assert torch.equal(ref, tree_attention_reference(*[x.float() for x in args[:5]], *args[5:], tril, L))
    with pytest.raises(ValueError, match="causal=True"):
        tree_attention_triton(*args, tril, L, causal=True)
    with pytest.raises(ValueError, match="needs the tree mask"):
        tree_attention_triton(*args, None, L)
