"""Trie-vote tree builder as one Triton launch: one program per request, bit-identical to `reference.build_vote_tree`.

Per request the program
1. loads the N x K candidate block and, for each (depth d, candidate i), builds the bit mask of the candidates j
   sharing candidate i's first d + 1 tokens: one compare per (d, i, j) sets bit j of a per-depth equality mask, a
   prefix AND over depths makes it prefix equality. The mask's popcount is the vote, its lowest bit the first
   candidate, so (d, i) is a trie node iff that bit is i: all (d, i) at once, no pairwise tensors (N <= 64);
2. selects the W-1 best nodes (votes desc, depth asc, first candidate asc) without sorting: the (W-1)-th largest
   vote v* comes from a histogram of the node votes; nodes above v* are all kept, nodes at v* are taken in
   (depth, candidate) order, which is the flat slot order, so one prefix sum gives each node's tie rank and its
   listing position (kept nodes listed by (depth, first candidate), parents before children);
3. stores every kept node straight at its listing position, its parent's index gathered from the parent slot's
   position, and fills the padding after them.

Fixed shapes, no host synchronisation: graph-capturable. The same launch fills `VoteTree` and `EagleEncoding`.

With SCORED (`build_scored_tree_triton`) step 2 ranks by a float score per node instead of the votes (score desc,
then (depth, candidate) order as the votes' ties), the scores as signed 32-bit keys of the same order. With LOGP (the
`prob` policy, `build_prob_tree_triton`) the kernel reads the per-position log q instead and forms each node's path
score itself (summed over depths in float64 and rounded, as torch's CPU cumsum of float32 accumulates: the
reference's `logp.float().cumsum(2)` bit for bit), so no cumsum launch precedes it. SELECT picks the selection, both
giving the same tree: "radix" finds k*, the (W-1)-th largest key, by a radix select (four 256-bin histograms, one per
key byte) and takes ties at k* in slot order as the votes' are; "rank" counts for every slot the slots ahead of it (a
compare per pair, in chunks) and keeps the nodes of rank < W - 1. "auto" (the default) takes rank up to RANK_MAX_SLOTS
(depth, candidate) slots and radix-span (below) above, in the launch AUTO_RADIX names: on the H200 rank built N 8 / K 15
in 7.2 µs, radix-span N 32 / K 15 in 9.6 and N 64 / K 8 in 10.4 (kernel run 11, bs 64, graphed).

Two more radix selections, the same tree again: "radix-fused" takes one reduction a pass (the chosen digit, the keys
above its bin and whether the bin holds more than are still to take, packed in one sum) and no k*: a key is above the
cut iff at some pass it matched the digits chosen before and its digit was higher, tied iff it matched every chosen
digit. "radix-span" runs those passes on each node key's offset from the least finite one, starting at the span's top
bit: path scores span a few binary exponents, whose key bytes the plain select's first pass spends itself on, so a
batch's slowest request takes 2 passes rather than 3. `tune` (`launch_choice`) sets their bits per pass (digit), the
warps, rank's chunk and PARENT, where "scan" takes node (d, i)'s parent (d - 1, first[d - 1, i]) from the AND scan
(it carries agree[d - 1]) instead of a max over depths, and PASS_LOOP / EQ_UNROLL, loops in place of unrolled code
(a smaller kernel).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .types import EagleEncoding, VoteTree


@triton.jit
def _and(a, b):
    return a & b


@triton.jit
def _and_before(a, e, b, f):
    """AND scan carrying the exclusive result: (AND of a segment, AND of all of it but its last element)."""
    return a & b, a & f


@triton.jit
def _sum_max_min(a, b, c, x, y, z):
    return a + x, tl.maximum(b, y), tl.minimum(c, z)


@triton.jit
def _popcount32(x):
    """Set bits of each uint32. SWAR because libdevice's popc does not run under TRITON_INTERPRET; LLVM turns it
    into one POPC instruction on the GPU."""
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return ((x * 0x01010101) >> 24).to(tl.int32)


@triton.jit
def _popcount(x, MASK64: tl.constexpr):
    if MASK64:
        return _popcount32(x.to(tl.uint32)) + _popcount32((x >> 32).to(tl.uint32))
    return _popcount32(x)


@triton.jit
def _take(is_above, is_tie, above, M: tl.constexpr):
    """Kept slots and their listing positions: the `above` nodes above the threshold, then the ties at it in slot
    order up to M. One prefix sum counts both classes before each slot: above-nodes in the high 16 bits, ties in the
    low."""
    flags = (is_above.to(tl.int32) << 16) | is_tie.to(tl.int32)
    before = tl.cumsum(flags, axis=0) - flags
    tie_rank = before & 0xFFFF
    rest = M - above
    kept = is_above | (is_tie & (tie_rank < rest))
    return kept, (before >> 16) + tl.minimum(tie_rank, rest)


@triton.jit
def _radix_pass(key, match, above, rem, left, shift, DIGIT: tl.constexpr):
    """One pass of the fused radix select: among the `match` keys (those sharing the digits chosen so far) take the
    digit at `shift` holding the rem-th largest. A histogram, its suffix sum and one reduction: exactly one bin has
    ge >= rem > ge - hist (ge never rises with the digit), so a sum over that bin carries the digit, whether the bin
    holds more keys than the rem - gt still to take there, and gt, the keys in the bins above it."""
    nb: tl.constexpr = 1 << DIGIT
    dig = ((key >> shift) & (nb - 1)).to(tl.int32)
    hist = tl.histogram(dig, nb, mask=match)
    ge = tl.cumsum(hist, 0, reverse=True)  # ge[v]: matching keys whose digit is >= v
    gt = ge - hist
    v = tl.arange(0, nb)
    # gt <= slots < 2^15, the digit < 2^11: one int32
    packed = tl.sum(tl.where((ge >= rem) & (gt < rem), (v << 16) | ((ge > rem).to(tl.int32) << 15) | gt, 0), axis=0)
    pick = packed >> 16
    above = above | (match & (dig > pick))
    match = match & (dig == pick)
    return match, above, rem - (packed & 0x7FFF), (packed >> 15) & 1 != 0


@triton.jit
def _put(ptr, out, value, kept, pad_out, pad_value, pad):
    """One output row: the kept nodes' values at their listing positions, then the padding's."""
    tl.store(ptr + out, value, mask=kept)
    tl.store(ptr + pad_out, pad_value, mask=pad)


@triton.jit
def _vote_tree_kernel(
    cand_ptr,  # (bs, N, K) int64, contiguous
    score_ptr,  # (bs, N, K) float32 node scores (SCORED) or any-float log q (LOGP), contiguous
    tok_ptr,  # (bs, M) int64
    par_ptr,  # (bs, M) int64
    dep_ptr,  # (bs, M) int64
    vot_ptr,  # (bs, M) int64
    val_ptr,  # (bs, M) bool
    fc_ptr,  # (bs, M) int64
    ids_ptr,  # (bs, M) int64  EAGLE node ids
    pl_ptr,  # (bs, PL) int64  EAGLE parent_list
    N: tl.constexpr,
    K: tl.constexpr,
    M: tl.constexpr,  # W - 1
    W: tl.constexpr,
    PL: tl.constexpr,  # W * (K - 1) + 1
    NP: tl.constexpr,
    KP: tl.constexpr,
    MP: tl.constexpr,
    PLP: tl.constexpr,
    WRITE_EAGLE: tl.constexpr,
    MASK64: tl.constexpr,  # candidate sets as uint64 bit masks (N > 32), else uint32
    SCORED: tl.constexpr,  # rank by the node scores (build_scored_tree) instead of the votes
    LOGP: tl.constexpr,  # SCORED from per-position log q at score_ptr: each node's score is its path's sum
    SELECT: tl.constexpr,  # SCORED: "radix", "radix-fused", "radix-span" (radix selects of the M-th key), "rank"
    RC: tl.constexpr,  # SELECT "rank": slots per chunk compared at once
    PARENT: tl.constexpr,  # "max": each node's parent from a max over depths; "scan": from an exclusive AND scan
    DIGIT: tl.constexpr,  # SELECT "radix-fused" / "radix-span": bits per pass
    PASS_LOOP: tl.constexpr,  # SELECT "radix-fused" / "radix-span": the passes as a loop, else unrolled
    EQ_UNROLL: tl.constexpr,  # the equality masks' candidates per loop block; 0: all unrolled
):
    b = tl.program_id(0).to(tl.int64)
    base = cand_ptr + b * (N * K)
    mt: tl.constexpr = tl.uint64 if MASK64 else tl.uint32
    # slot p = d * NP + i is (depth d, candidate i): (depth, candidate) order, the ranking's tie-break. Loading the
    # block in that flat order makes [d, i] views of it share one layout, lanes along i: no layout conversions.
    p = tl.arange(0, KP * NP)
    pd = p // NP
    pi = p % NP
    tok = tl.load(base + pi * K + pd, mask=(pi < N) & (pd < K), other=0)
    d = tl.arange(0, KP)[:, None]
    i = tl.arange(0, NP)[None, :]
    real = (d < K) & (i < N)
    # eq[d, i] bit j: candidate j has candidate i's token at depth d. The only N^2 K work: a compare and an OR per
    # bit, with no reduction across threads.
    blk = tl.reshape(tok, [KP, NP])
    eq = tl.zeros([KP, NP], mt)
    if EQ_UNROLL == 0:
        for j in tl.static_range(N):
            eq |= (blk == tl.load(base + j * K + d, mask=d < K, other=0)).to(mt) << j
    else:
        # a loop over blocks of EQ_UNROLL candidates: less code than the full unroll, each block's loads in flight
        for j0 in range(0, N, EQ_UNROLL):
            for u in tl.static_range(EQ_UNROLL):
                j = j0 + u
                hit = (blk == tl.load(base + j * K + d, mask=(d < K) & (j < N), other=0)) & (j < N)
                eq |= hit.to(mt) << j.to(mt)
    # agree[d, i] bit j: candidates i and j share their first d + 1 tokens. Its lowest bit is the first candidate
    # with that prefix, so (d, i) is a trie node iff that bit is i; the node's votes are the bit count.
    if PARENT == "scan":
        # node (d, i)'s parent is (d - 1, first[d - 1, i]): the scan also carries agree[d - 1], no reduction
        ones = tl.full([KP, NP], 0xFFFFFFFFFFFFFFFF if MASK64 else 0xFFFFFFFF, mt)
        agree, before = tl.associative_scan((eq, ones), 0, _and_before)
        first = _popcount(agree ^ (agree - 1), MASK64) - 1
        node = real & (first == i)
        # (& NP - 1: in range where `before` is 0, the padding's slots)
        pf = tl.reshape((_popcount(before ^ (before - 1), MASK64) - 1) & (NP - 1), [KP * NP])
    else:
        agree = tl.associative_scan(eq, 0, _and)
        first = _popcount(agree ^ (agree - 1), MASK64) - 1
        node = real & (first == i)
        # candidate i's nodes are its depths d >= L_i. first[d, i] grows with d and is < i below L_i, so the largest
        # (d + 1, first) over i's non-nodes gives L_i and P_i = first[L_i - 1, i]: node (d, i) hangs off (d - 1, i)
        # above L_i and off (L_i - 1, P_i) at L_i.
        lp = tl.max(tl.where(real & ~node, (d + 1) * NP + first, 0), axis=0)
        pf = tl.reshape(tl.where(d > lp // NP, i, lp % NP), [KP * NP])
    nv = tl.reshape(tl.where(node, _popcount(agree, MASK64), 0), [KP * NP])  # 0 votes = not a node

    if SCORED:
        if LOGP:
            # node (d, i)'s score: candidate i's log q (as float32) summed over depths 0..d in order, in float64 and
            # rounded, as torch's CPU cumsum accumulates float32: the reference's `logp.float().cumsum(2)` bit for bit
            acc = tl.zeros([1, NP], tl.float64)
            s2 = tl.zeros([KP, NP], tl.float32)
            for e in tl.static_range(K):
                lq = tl.load(score_ptr + b * (N * K) + i * K + e, mask=i < N, other=0.0)
                acc += lq.to(tl.float32).to(tl.float64)
                s2 = tl.where(d == e, acc.to(tl.float32), s2)
            sc = tl.reshape(s2, [KP * NP])
        else:
            sc = tl.load(score_ptr + b * (N * K) + pi * K + pd, mask=(pi < N) & (pd < K), other=0.0)
        # the score as a signed 32-bit key of the same order (-0 as +0, NaN as -inf)
        sc = tl.where(sc != sc, float("-inf"), sc) + 0.0
        bits = sc.to(tl.int32, bitcast=True)
        skey = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
        isn = nv > 0
    if SCORED and SELECT == "rank":
        # a node's rank: the slots ahead of it in (score desc, slot asc) order, counted on a key unique per slot (the
        # score's key, then the slot reversed), against RC slots at a time; non-nodes sort below every node (-inf's
        # key is above INT32_MIN). A loop, not unrolled: unrolled, every chunk's gather is hoisted and spills.
        ck = tl.where(isn, skey, -(2**31)).to(tl.int64) * 65536 + (KP * NP - 1 - p)
        ahead = tl.zeros([KP * NP], tl.int32)
        for c in range(0, K * NP, RC):  # slots past depth K - 1 are no nodes
            chunk = tl.gather(ck, c + tl.arange(0, RC), 0)
            # ahead iff the difference (below 2^48: no overflow) is negative: its sign bit added, fewer instructions
            # a pair than a compare and a select
            ahead += tl.sum(((ck[None, :] - chunk[:, None]).to(tl.uint64, bitcast=True) >> 63).to(tl.int32), axis=0)
        kept = isn & (ahead < M)
        pos = tl.cumsum(kept.to(tl.int32), axis=0) - kept.to(tl.int32)
    elif SCORED and SELECT != "radix":
        # radix-fused / radix-span: a key is above the M-th largest iff at some pass it matched the digits chosen
        # before and its digit was above the chosen one, tied iff it matches them all; rem, the keys still to take
        # among the matching ones, is the ties' room. On uint32 keys.
        key = skey.to(tl.uint32, bitcast=True) ^ 0x80000000
        if SELECT == "radix-span":
            # the digits start at the top bit of the node keys' span: key - (least finite node key) + 1, and 0 for
            # -inf (NaN's key too), kept out of the span: the same order and ties
            fin = isn & (sc > float("-inf"))
            total, kmax, kmin = tl.reduce((isn.to(tl.int32), tl.where(isn, key, 0), tl.where(fin, key, 0xFFFFFFFF)),
                                          0, _sum_max_min)
            key = tl.where(fin, key - kmin + 1, 0)
            span = tl.where(kmax >= kmin, kmax - kmin + 1, 0)
            # the span's bit length, from the exponent of its exact float64 value
            bits_left = tl.where(span > 0, (span.to(tl.float64).to(tl.int64, bitcast=True) >> 52) - 1022, 0)
            bits_left = bits_left.to(tl.int32)
        else:
            total = tl.sum(isn.to(tl.int32), axis=0)
            bits_left = total * 0 + 32
        rem = tl.minimum(total, M)
        left = total > rem
        match = isn
        above = isn & False
        if PASS_LOOP:
            # one copy of the pass's code, run while it still decides something: a quarter of the unrolled code
            done = bits_left * 0
            while left & (bits_left > done):
                shift = tl.maximum(bits_left - done - DIGIT, 0)
                match, above, rem, left = _radix_pass(key, match, above, rem, left, shift, DIGIT)
                done += DIGIT
        else:
            for step in tl.static_range((32 + DIGIT - 1) // DIGIT):
                if left & (bits_left > DIGIT * step):
                    # past the low end the digit overlaps decided bits, which every matching key shares
                    shift = tl.maximum(bits_left - DIGIT * (step + 1), 0)
                    match, above, rem, left = _radix_pass(key, match, above, rem, left, shift, DIGIT)
        kept, pos = _take(above, match, M - rem, M)
        nkept = tl.minimum(total, M)
    elif SCORED:
        # k*: the M-th largest node key (as unsigned), a radix select over its four bytes (a 256-bin histogram each,
        # highest byte first, among the keys that match the bytes chosen so far); every node kept when <= M. Once
        # the keys matching the chosen bytes are exactly those still to take, the passes stop: k*'s lower bytes stay
        # 0, so those keys are above k* or tied at it, and all taken (on path log-probabilities, usually after 2)
        key = skey.to(tl.int64) + (1 << 31)
        match = isn
        rem = tl.minimum(tl.sum(isn.to(tl.int32), axis=0), M)  # keys still to take at or above k*
        kstar = rem.to(tl.int64) * 0
        byte = tl.arange(0, 256)
        left = tl.sum(match.to(tl.int32), axis=0) > rem  # a pass still decides something
        for step in tl.static_range(4):
            if left:
                dig = ((key >> (24 - 8 * step)) & 255).to(tl.int32)
                hist = tl.histogram(dig, 256, mask=match)
                ge = tl.cumsum(hist, 0, reverse=True)  # ge[v]: matching keys whose byte is >= v
                pick = tl.max(tl.where(ge >= rem, byte, 0), axis=0)
                rem -= tl.sum(tl.where(byte == pick, ge - hist, 0), axis=0)
                match = match & (dig == pick)
                kstar = kstar | (pick.to(tl.int64) << (24 - 8 * step))
                left = tl.sum(match.to(tl.int32), axis=0) > rem
        kstar = tl.where(tl.sum(isn.to(tl.int32), axis=0) > M, kstar, -1)
        is_above = isn & (key > kstar)
        kept, pos = _take(is_above, isn & (key == kstar), tl.sum(is_above.to(tl.int32), axis=0), M)
    else:
        # v*: the largest v with at least M nodes of >= v votes (0 when the trie has fewer than M nodes)
        t = tl.arange(0, NP)
        more = tl.cumsum(tl.histogram(nv - 1, NP, mask=nv > 0), 0, reverse=True)  # more[t]: nodes with votes > t
        vstar = tl.max(tl.where(more >= M, t + 1, 0), axis=0)
        above = tl.sum(tl.where(t == vstar, more, 0), axis=0)
        kept, pos = _take(nv > vstar, (nv == vstar) & (nv > 0), above, M)
    if not SCORED or SELECT == "radix" or SELECT == "rank":
        nkept = tl.minimum(tl.sum((nv > 0).to(tl.int32), axis=0), M)

    # pos is a kept slot's listing position; its parent (pd - 1, pf) is kept too (every top set is prefix-closed),
    # so the parent's node index is that slot's pos + 1
    up = tl.gather(pos, tl.where(pd > 0, (pd - 1) * NP + pf, 0), 0)
    parent = tl.where(pd > 0, up + 1, 0).to(tl.int64)
    # padding repeats node 1's token; there is padding only when every node is kept, and node 1 is then (0, 0)
    tok_pad = tl.load(base)
    # kept slots go straight to their listing positions; positions nkept..M-1 are padding
    row = b * M
    out = row + pos
    q = tl.arange(0, MP)
    pad = (q >= nkept) & (q < M)
    _put(tok_ptr, out, tok, kept, row + q, tok_pad, pad)
    _put(par_ptr, out, parent, kept, row + q, 0, pad)
    _put(dep_ptr, out, pd + 1, kept, row + q, 1, pad)
    _put(vot_ptr, out, nv, kept, row + q, 0, pad)
    _put(val_ptr, out, kept, kept, row + q, False, pad)
    _put(fc_ptr, out, pi, kept, row + q, N, pad)
    if WRITE_EAGLE:
        ids = parent * W + pos + 1
        _put(ids_ptr, out, ids, kept, row + q, q + 1, pad)
        pl_row = pl_ptr + b * PL
        _put(pl_row + 1, pos, ids, kept & (pos + 1 < PL), q, q + 1, pad & (q + 1 < PL))
        c = tl.arange(0, PLP)
        tl.store(pl_row + c, tl.full([PLP], -1, tl.int64), mask=(c < PL) & ((c == 0) | (c >= W)))


# SELECT "rank": slots per chunk (the [RANK_CHUNK, slots] compare tile's height)
RANK_CHUNK = 32
RANK_MAX_SLOTS = 128  # select="auto": rank up to this many (depth, candidate) slots (N 8, K 16), radix above


def _np2(x: int) -> int:
    return max(2, triton.next_power_of_2(x))


SELECTS = ("auto", "radix", "rank", "radix-fused", "radix-span")
# select="auto" above RANK_MAX_SLOTS: the fastest launch of kernel run 11's sweep (H200, bs 64, graphed) at N 32 / K 15
# / W 32 (9.60 µs against the old radix's 11.20) and at N 64 / K 8 / W 64 (10.43 against 12.54)
AUTO_RADIX = {"num_warps": 8, "parent": "scan", "digit": 5, "passes": "loop", "eq_unroll": 8}
TUNE_KEYS = {"num_warps": (1, 2, 4, 8, 16), "parent": ("max", "scan"), "digit": (4, 5, 6, 7, 8, 9, 10, 11),
             "rank_chunk": (8, 16, 32, 64, 128, 256), "passes": ("unroll", "loop"), "eq_unroll": (0, 2, 4, 8, 16)}


def launch_choice(n: int, k: int, select: str = "auto", tune: dict | None = None, scored: bool = True) -> dict:
    """The launch of N candidates of K tokens: the selection ("auto" resolved) and the TUNE_KEYS, `tune`'s overrides
    (each a choice of TUNE_KEYS) over the defaults. AUTO_RADIX's launch is a scored build's (trie-vote's keeps its
    own, measured defaults)."""
    if select not in SELECTS:
        raise ValueError(f"select must be one of {', '.join(map(repr, SELECTS))}, got {select!r}")
    tune = dict(tune or {})
    for key, value in tune.items():
        if key not in TUNE_KEYS or value not in TUNE_KEYS[key]:
            raise ValueError(f"tune {key}={value!r}: the keys and their values are {TUNE_KEYS}")
    slots = _np2(n) * _np2(k)
    base = {}
    if select == "auto":
        select = "rank" if slots <= RANK_MAX_SLOTS else "radix-span"
        if select == "radix-span" and scored:
            base = dict(AUTO_RADIX)
    base.update(tune)
    eq_unroll = base.get("eq_unroll", 0)
    # the (depth, candidate) tensors: 4 warps hold up to 512 slots at 4 per thread (N 32, K 16), 8 warps above
    return dict(select=select, num_warps=base.get("num_warps", 4 if slots <= 512 else 8),
                parent=base.get("parent", "max"), digit=base.get("digit", 8),
                rank_chunk=min(base.get("rank_chunk", RANK_CHUNK), slots), passes=base.get("passes", "unroll"),
                eq_unroll=eq_unroll if eq_unroll < n else 0)


def _launch(candidates: torch.Tensor, width: int, eagle: bool, scores: torch.Tensor | None = None,
            logp: bool = False, select: str = "auto", tune: dict | None = None):
    if candidates.dim() != 3:
        raise ValueError(f"candidates must be (bs, N, K), got shape {tuple(candidates.shape)}")
    if width < 2:
        raise ValueError(f"width must be >= 2 (the root plus at least one node), got {width}")
    bs, n, k = candidates.shape
    np_, kp = _np2(n), _np2(k)
    if n > 64 or np_ * kp >= 1 << 15:
        raise ValueError(f"N = {n}, K = {k} are too large: N must fit a 64-bit mask, the slot counts 15 bits")
    if scores is not None and scores.shape != candidates.shape:
        raise ValueError(f"scores must be (bs, N, K) = {tuple(candidates.shape)}, got {tuple(scores.shape)}")
    choice = launch_choice(n, k, select, tune, scored=scores is not None)
    cand = candidates.to(torch.int64).contiguous()
    if scores is None:
        src = cand  # never read
    elif logp:
        src = scores.contiguous()  # read in its own dtype
    else:
        src = scores.to(torch.float32).contiguous()
    m = width - 1
    dev = cand.device
    out = [torch.empty(bs, m, dtype=torch.int64, device=dev) for _ in range(4)]
    valid = torch.empty(bs, m, dtype=torch.bool, device=dev)
    fc = torch.empty(bs, m, dtype=torch.int64, device=dev)
    pl_w = width * (k - 1) + 1
    if eagle:
        ids = torch.empty(bs, m, dtype=torch.int64, device=dev)
        pl = torch.empty(bs, pl_w, dtype=torch.int64, device=dev)
    else:
        ids = pl = fc  # never written
    if bs > 0:
        _vote_tree_kernel[(bs,)](
            cand, src, out[0], out[1], out[2], out[3], valid, fc, ids, pl,
            N=n, K=k, M=m, W=width, PL=pl_w, NP=np_, KP=kp, MP=_np2(m), PLP=_np2(pl_w),
            WRITE_EAGLE=eagle, MASK64=np_ > 32, SCORED=scores is not None, LOGP=logp, SELECT=choice["select"],
            RC=choice["rank_chunk"], PARENT=choice["parent"], DIGIT=choice["digit"],
            PASS_LOOP=choice["passes"] == "loop", EQ_UNROLL=choice["eq_unroll"], num_warps=choice["num_warps"],
        )
    tree = VoteTree(tokens=out[0], parents=out[1], depth=out[2], votes=out[3], valid=valid, first_candidate=fc, k=k)
    if not eagle:
        return tree, None
    enc = EagleEncoding(draft_tokens=tree.tokens, top_scores_index=ids, parent_list=pl, topk=width, spec_steps=k,
                        num_verify_tokens=width)
    return tree, enc


def build_vote_tree_triton(candidates: torch.Tensor, width: int) -> VoteTree:
    """Same signature and result as `flashtree.tree.build_vote_tree`, one launch."""
    return _launch(candidates, width, eagle=False)[0]


def build_scored_tree_triton(candidates: torch.Tensor, width: int, node_scores: torch.Tensor,
                             select: str = "auto", tune: dict | None = None) -> VoteTree:
    """Same signature and result as `flashtree.tree.build.build_scored_tree`, one launch: the trie as trie-vote's,
    its W - 1 nodes ranked by score desc, depth asc, first candidate asc. `select`: the selection (one of SELECTS;
    the same tree). `tune`: launch overrides for timing them (TUNE_KEYS: num_warps, parent "max" / "scan", digit:
    the radix-fused / radix-span bits per pass), the same tree too."""
    return _launch(candidates, width, eagle=False, scores=node_scores, select=select, tune=tune)[0]


def build_prob_tree_triton(candidates: torch.Tensor, width: int, logp: torch.Tensor, select: str = "auto",
                           tune: dict | None = None) -> VoteTree:
    """Same result as `flashtree.tree.build.build_prob_tree` (the `prob` policy's build) from the per-position log q
    (bs, N, K) in any float dtype, one launch: the path sums are formed in the kernel. `select` and `tune` as
    `build_scored_tree_triton`'s."""
    return _launch(candidates, width, eagle=False, scores=logp, logp=True, select=select, tune=tune)[0]


def build_vote_tree_eagle_triton(candidates: torch.Tensor, width: int) -> tuple[VoteTree, EagleEncoding]:
    """The VoteTree and its EAGLE encoding (`to_eagle`) from the same single launch."""
    return _launch(candidates, width, eagle=True)
