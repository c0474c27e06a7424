"""Fused row sampler in Triton: argmax for greedy rows, Gumbel-max with in-kernel Philox for sampled rows.

Sampled rows use a two-level (hierarchical) Gumbel-max that reads the logits once:

* pass 1, grid (rows, splits): the vocabulary is cut into tiles of BLOCK tokens; for each tile the program computes the
  tile's log-mass lse_t = log sum_i exp(l_i / T) and keeps it; after the loop it adds one Gumbel per (tile, draw)
  (Philox counter = (tile, row, draw, 0)) and keeps the best (lse_t + g_t) of its tiles. Greedy rows keep the tile
  maximum and its first index instead. A tile's sum is taken against a reference c, the maximum of the split's first
  tile, with no maximum of its own: one reduction per tile, as cheap as a plain read-and-sum. A tile whose maximum
  lies ~2^7 (log2 units) above c overflows the sum, redoes it against its own maximum and makes that c. Terms more
  than 2^7 below c flush to zero, but the tile that set c holds at least exp2(c) of mass and the 24-bit uniforms'
  Gumbels span < 21 nats, so a tile that can still be drawn loses < 2^-100 of its mass that way.
* pass 2, grid (rows, draws): the best split's tile is the drawn tile, chosen with probability mass_t / total (the
  Gumbel-max theorem over tiles). A Gumbel-max over the tile's G groups of BLOCK / G tokens by log-mass (counter =
  (group, row, draw, 2)) draws a group, and one over that group's logits (counter = (token, row, draw, 1)) picks token
  i with probability p_i / mass_group. The product is p_i: exact categorical sampling with G + BLOCK / G Philox draws
  per draw (G ~ sqrt(BLOCK)), not one per vocabulary entry, so the kernels run at the logits-read rate.

Greedy rows (temperature <= 0) take the argmax, ties to the lowest token id, bit-identical to the reference. When the
caller passes the temperature as a Python number <= 0 (every row greedy, known on the host), one launch does it all:
grid (rows, tiles), one 4096-token tile per program (many independent loads in flight), and the last tile program of a
row to finish (a per-row ticket counter) merges the row's tile maxima; the counters live in a persistent zeroed buffer
that the merging program resets, so calls must not overlap on two streams. The
N-candidate form draws N independent tokens per row from one read of the logits (N Gumbels per tile in pass 1).
Top-k: the k-th largest scaled logit per row is found with `torch.topk` (fixed shapes) and applied as a threshold
inside the kernels. Top-p falls back to the torch reference. bf16, fp16 and fp32 logits; no host synchronisation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..gpu import sm_count, zeroed_counters

BLOCK = 4096  # tile of the greedy-only launch
SAMPLED_BLOCK = 2048  # tile of the sampled passes (2 warps a program: 960 x 151936 runs at ~1.5x the read floor)
SUBG = 4  # groups per tile in the greedy-only launch (a [SUBG, BLOCK / SUBG] tile keeps the reductions short)
MAX_TPS = 256  # tiles per pass-1 program: their log-masses live in registers until the Gumbels are drawn


@triton.jit
def _uniform(seed, c0, c1, c2, c3):
    r, _, _, _ = tl.philox(seed, c0, c1, c2, c3)
    # 24 high bits, centred: u in (0, 1) strictly, so -log(-log(u)) is finite
    return ((r >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)


@triton.jit
def _load_tile(x_ptr, stride_r, r, t, V, BLOCK: tl.constexpr, SUBG: tl.constexpr):
    """Tile t of row r as [SUBG, GROUP] float32, -inf past V."""
    idx = t * BLOCK + tl.arange(0, SUBG)[:, None] * (BLOCK // SUBG) + tl.arange(0, BLOCK // SUBG)[None, :]
    raw = tl.load(x_ptr + r.to(tl.int64) * stride_r + idx, mask=idx < V, other=-float("inf")).to(tl.float32)
    return raw


@triton.jit
def _tile_argmax(raw, t, BLOCK: tl.constexpr, SUBG: tl.constexpr):
    """The tile's maximum and its lowest token id (groups hold increasing ids)."""
    gmax, garg = tl.max(raw, axis=1, return_indices=True)
    best = tl.max(gmax, axis=0)
    g = tl.arange(0, SUBG)
    first = tl.min(tl.where(gmax == best, g, SUBG), axis=0)
    return best, t * BLOCK + first * (BLOCK // SUBG) + tl.sum(tl.where(g == first, garg, 0), axis=0)


@triton.jit
def _merge_argmax(gmax_ptr, garg_ptr, r, NT, NTP: tl.constexpr):
    """Row r's argmax from its NT partial maxima (tiles or splits: increasing token ranges), so the first partial at the
    maximum holds the lowest id. The loads skip L1 (.cg): in the one-launch path other programs wrote these partials
    during this launch."""
    t = tl.arange(0, NTP)
    gm = tl.load(gmax_ptr + r * NT + t, mask=t < NT, other=-float("inf"), cache_modifier=".cg")
    ga = tl.load(garg_ptr + r * NT + t, mask=t < NT, other=0, cache_modifier=".cg")
    best = tl.max(gm, axis=0)
    first = tl.min(tl.where(gm == best, t, NTP), axis=0)
    return tl.sum(tl.where(t == first, ga, 0), axis=0)


@triton.jit
def _greedy_kernel(
    x_ptr, stride_r, gmax_ptr, garg_ptr, ticket_ptr, out_ptr, V, NT,
    NDRAW: tl.constexpr, NDP: tl.constexpr, NTP: tl.constexpr, BLOCK: tl.constexpr, SUBG: tl.constexpr,
):
    # every row greedy, one launch: program (r, t) reduces tile t; the row's last program to finish merges
    r = tl.program_id(0)
    t = tl.program_id(1)
    raw = _load_tile(x_ptr, stride_r, r, t, V, BLOCK, SUBG)
    best, arg = _tile_argmax(raw, t, BLOCK, SUBG)
    tl.store(gmax_ptr + r * NT + t, best)
    tl.store(garg_ptr + r * NT + t, arg)
    tl.debug_barrier()  # the partial's store happens-before this program's release below
    ticket = tl.atomic_add(ticket_ptr + r, 1, sem="acq_rel")
    if ticket == NT - 1:
        tl.store(ticket_ptr + r, 0)  # zero again for the next call (and the next graph replay)
        tok = _merge_argmax(gmax_ptr, garg_ptr, r, NT, NTP)
        j = tl.arange(0, NDP)
        tl.store(out_ptr + r * NDRAW + j, tok.to(tl.int64) + j * 0, mask=j < NDRAW)


@triton.jit
def _pass1_kernel(
    x_ptr, stride_r, temp_ptr, thr_ptr, seed_ptr,
    gmax_ptr, garg_ptr, score_ptr, tile_ptr,
    V, NT, TPS, S,
    NDRAW: tl.constexpr, NDP: tl.constexpr, BLOCK: tl.constexpr, HAS_THR: tl.constexpr, TPP: tl.constexpr,
):
    # program (r, s): tiles t0 .. t1 of row r (TPP: TPS rounded up to a power of two)
    r = tl.program_id(0)
    s = tl.program_id(1)
    row = x_ptr + r.to(tl.int64) * stride_r
    temp = tl.load(temp_ptr + r).to(tl.float32)
    t0 = s * TPS
    t1 = tl.minimum(t0 + TPS, NT)
    offs = tl.arange(0, BLOCK)
    out = r * S + s
    if temp <= 0:
        best = -float("inf")
        barg = 0
        for tg in range(t0, t1):
            gidx = tg * BLOCK + offs
            gx = tl.load(row + gidx, mask=gidx < V, other=-float("inf")).to(tl.float32)
            gmx, gam = tl.max(gx, axis=0, return_indices=True)
            gupd = gmx > best
            barg = tl.where(gupd, tg * BLOCK + gam, barg)
            best = tl.where(gupd, gmx, best)
        tl.store(gmax_ptr + out, best)
        tl.store(garg_ptr + out, barg)
    else:
        seed = tl.load(seed_ptr)
        scale = 1.4426950408889634 / temp
        if HAS_THR:
            thr = tl.load(thr_ptr + r)
        kt = tl.arange(0, TPP)
        lses = tl.full([TPP], -float("inf"), tl.float32)
        c = -float("inf")  # the reference the sums are taken against (scaled, log2 units): an earlier tile's max
        for t in range(t0, t1):
            idx = t * BLOCK + offs
            raw = tl.load(row + idx, mask=idx < V, other=-float("inf")).to(tl.float32)
            if HAS_THR:
                raw = tl.where(raw / temp >= thr, raw, -float("inf"))
            x = raw * scale
            # a sum against c alone, no max: c changes only when the sum overflows, i.e. on the first tile with a
            # finite max (c = -inf: inf or nan) and where a tile's max is ~2^7 above c; those redo the sum against
            # their own max and make it c
            ssum = tl.sum(tl.exp2(x - c), axis=0)
            ref = c
            if not (ssum < float("inf")):
                mx = tl.max(x, axis=0)
                ref = tl.where(mx == -float("inf"), 0.0, mx)
                ssum = tl.sum(tl.exp2(x - ref), axis=0)
                c = tl.where(mx == -float("inf"), c, mx)
            lse = tl.where(ssum > 0, (ref + tl.log2(ssum)) * 0.6931471805599453, -float("inf"))
            lses = tl.where(kt == t - t0, lse, lses)
        # the tile Gumbels once per (tile, draw) after the loop, not by every thread in every tile
        dr = tl.arange(0, NDP)
        z = tl.zeros([TPP, NDP], tl.uint32)
        u = _uniform(seed, z + (t0 + kt)[:, None].to(tl.uint32), z + r.to(tl.uint32), z + dr[None, :].to(tl.uint32), z)
        bests, bk = tl.max(lses[:, None] - tl.log(-tl.log(u)), axis=0, return_indices=True)
        base = out * NDRAW
        tl.store(score_ptr + base + dr, bests, mask=dr < NDRAW)
        tl.store(tile_ptr + base + dr, t0 + bk, mask=dr < NDRAW)


@triton.jit
def _pass2_kernel(
    x_ptr, stride_r, temp_ptr, thr_ptr, seed_ptr,
    gmax_ptr, garg_ptr, score_ptr, tile_ptr, out_ptr,
    V, S,
    NDRAW: tl.constexpr, DPP: tl.constexpr, SP: tl.constexpr, BLOCK: tl.constexpr, HAS_THR: tl.constexpr,
    GROUPS: tl.constexpr,
):
    # program (r, c): draws c * DPP .. + DPP of row r, one per row of a [DPP, GROUPS, W] tile
    r = tl.program_id(0)
    j = tl.program_id(1) * DPP + tl.arange(0, DPP)
    jm = j < NDRAW
    temp = tl.load(temp_ptr + r).to(tl.float32)
    sp = tl.arange(0, SP)
    if temp <= 0:
        tok = _merge_argmax(gmax_ptr, garg_ptr, r, S, SP) + j * 0
    else:
        off2 = (r * S + sp[None, :]) * NDRAW + j[:, None]
        m2 = (sp[None, :] < S) & jm[:, None]
        sc = tl.load(score_ptr + off2, mask=m2, other=-float("inf"))
        tt = tl.load(tile_ptr + off2, mask=m2, other=0)
        sbest = tl.max(sc, axis=1)
        sfirst = tl.min(tl.where(sc == sbest[:, None], sp[None, :], SP), axis=1)
        t = tl.sum(tl.where(sp[None, :] == sfirst[:, None], tt, 0), axis=1)
        seed = tl.load(seed_ptr)
        if HAS_THR:
            thr = tl.load(thr_ptr + r)
        W: tl.constexpr = BLOCK // GROUPS
        row = x_ptr + r.to(tl.int64) * stride_r
        # the drawn tile's group by log-mass
        g = tl.arange(0, GROUPS)
        idx3 = t[:, None, None] * BLOCK + g[None, :, None] * W + tl.arange(0, W)[None, None, :]
        x3 = tl.load(row + idx3, mask=(idx3 < V) & jm[:, None, None], other=-float("inf")).to(tl.float32) / temp
        if HAS_THR:
            x3 = tl.where(x3 >= thr, x3, -float("inf"))
        gm = tl.max(x3, axis=2)
        ref = tl.where(gm == -float("inf"), 0.0, gm)
        gs = tl.sum(tl.exp(x3 - ref[:, :, None]), axis=2)
        glse = tl.where(gs > 0, ref + tl.log(gs), -float("inf"))
        zg = (g[None, :] * 0 + j[:, None] * 0).to(tl.uint32)
        u = _uniform(seed, zg + (t[:, None] * GROUPS + g[None, :]).to(tl.uint32), zg + r.to(tl.uint32),
                     zg + j[:, None].to(tl.uint32), zg + 2)
        base = t * BLOCK + tl.argmax(glse - tl.log(-tl.log(u)), axis=1) * W
        # then the token inside the drawn group
        idx = base[:, None] + tl.arange(0, W)[None, :]
        x = tl.load(row + idx, mask=(idx < V) & jm[:, None], other=-float("inf")).to(tl.float32) / temp
        if HAS_THR:
            x = tl.where(x >= thr, x, -float("inf"))
        z = idx * 0
        u = _uniform(seed, idx.to(tl.uint32), (z + r).to(tl.uint32), (z + j[:, None]).to(tl.uint32),
                     (z + 1).to(tl.uint32))
        tok = base + tl.argmax(x - tl.log(-tl.log(u)), axis=1)
    tl.store(out_ptr + r * NDRAW + j, tok.to(tl.int64), mask=jm)


def _ticket_buffer(rows: int, dev: torch.device) -> torch.Tensor:
    return zeroed_counters("sampler-tickets", rows, dev)


def _threshold(logits, temperature, top_k, max_top_k):
    """(R,) float32 k-th largest scaled logit per row (-inf where top-k is off)."""
    r, v = logits.shape
    t = torch.where(temperature > 0, temperature.float(), 1.0).view(-1, 1)
    scaled = logits.float() / t
    if isinstance(top_k, int):
        k = torch.full((r,), top_k, dtype=torch.long, device=logits.device)
        kmax = min(max(top_k, 1), v)
    else:
        k = top_k.to(device=logits.device, dtype=torch.long).expand(r)
        kmax = v if max_top_k is None else min(max_top_k, v)
    k = k.clamp(max=v)
    on = k > 0
    vals = scaled.topk(kmax, dim=-1, sorted=True).values
    kth = vals.gather(1, (torch.where(on, k, 1).clamp(max=kmax) - 1).view(-1, 1)).squeeze(1)
    return torch.where(on, kth, float("-inf")).contiguous()


def _sample(logits, temperature, ndraw, generator, top_k, max_top_k, block=None):
    if logits.dim() != 2:
        raise ValueError(f"logits must be (R, V), got {tuple(logits.shape)}")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    r, v = logits.shape
    dev = logits.device
    out = torch.empty(r, ndraw, dtype=torch.int64, device=dev)
    if r == 0:
        return out
    greedy_only = isinstance(temperature, (int, float)) and temperature <= 0
    blk = block or min(BLOCK if greedy_only else SAMPLED_BLOCK, max(16, triton.next_power_of_2(v)))
    if blk < 16 or blk & (blk - 1):
        raise ValueError(f"block must be a power of two >= 16, got {blk}")
    nt = triton.cdiv(v, blk)
    if greedy_only:
        gmax = torch.empty(r * nt, dtype=torch.float32, device=dev)
        garg = torch.empty(r * nt, dtype=torch.int32, device=dev)
        _greedy_kernel[(r, nt)](logits, logits.stride(0), gmax, garg, _ticket_buffer(r, dev), out, v, nt,
                                NDRAW=ndraw, NDP=max(2, triton.next_power_of_2(ndraw)),
                                NTP=max(2, triton.next_power_of_2(nt)), BLOCK=blk, SUBG=SUBG, num_warps=4)
        return out
    temperature = torch.as_tensor(temperature, device=dev, dtype=torch.float32).expand(r).contiguous()
    want = max(1, (8 * sm_count(dev, 4) + r - 1) // r)  # about 8 pass-1 programs (of 2 warps) per SM
    tps = min(triton.cdiv(nt, min(want, nt)), MAX_TPS)
    s = triton.cdiv(nt, tps)
    gmax = torch.empty(r * s, dtype=torch.float32, device=dev)
    garg = torch.empty(r * s, dtype=torch.int32, device=dev)
    score = torch.empty(r * s * ndraw, dtype=torch.float32, device=dev)
    tile = torch.empty(r * s * ndraw, dtype=torch.int32, device=dev)
    seed = torch.randint(0, 2**62, (1,), device=dev, generator=generator, dtype=torch.int64)
    has_thr = top_k is not None
    thr = _threshold(logits, temperature, top_k, max_top_k) if has_thr else temperature
    _pass1_kernel[(r, s)](logits, logits.stride(0), temperature, thr, seed, gmax, garg, score, tile, v, nt, tps, s,
                          NDRAW=ndraw, NDP=max(2, triton.next_power_of_2(ndraw)), BLOCK=blk, HAS_THR=has_thr,
                          TPP=max(2, triton.next_power_of_2(tps)), num_warps=2)
    dpp = min(max(1, triton.next_power_of_2(ndraw)), max(1, 4096 // blk))
    groups = 1 << (blk.bit_length() - 1) // 2  # ~sqrt(blk): the fewest Philox draws, groups + blk / groups
    _pass2_kernel[(r, triton.cdiv(ndraw, dpp))](logits, logits.stride(0), temperature, thr, seed, gmax, garg, score,
                                                tile, out, v, s, NDRAW=ndraw, DPP=dpp,
                                                SP=max(2, triton.next_power_of_2(s)), BLOCK=blk, HAS_THR=has_thr,
                                                GROUPS=groups, num_warps=8)
    return out


def sample_rows_triton(
    logits: torch.Tensor,
    temperature: torch.Tensor | float,
    generator: torch.Generator | None = None,
    top_k: torch.Tensor | int | None = None,
    top_p: torch.Tensor | float | None = None,
    max_top_k: int | None = None,
    block: int | None = None,
) -> torch.Tensor:
    """Same signature and distribution as `flashtree.sampler.reference.sample_rows`: (R, V), (R,) -> (R,) int64.

    Greedy rows are bit-identical to the reference. A Python-number `temperature` applies to every row; <= 0 (all
    greedy, known without a device read) takes the one-launch argmax. `top_k` may be an int or a per-row tensor
    (<= 0: off); with a tensor, `max_top_k` (a static bound) keeps the threshold search to a top-k of that size
    instead of a full sort. `top_p` is served by the torch reference (not fused).
    """
    if top_p is not None:
        from .reference import sample_rows

        tk = None if top_k is None else torch.as_tensor(top_k, device=logits.device).expand(logits.shape[0])
        tp = torch.as_tensor(top_p, device=logits.device, dtype=torch.float32).expand(logits.shape[0])
        return sample_rows(logits, torch.as_tensor(temperature, device=logits.device).expand(logits.shape[0]),
                           generator=generator, top_k=tk, top_p=tp)
    return _sample(logits, temperature, 1, generator, top_k, max_top_k, block).view(-1)


def sample_candidates_triton(
    logits: torch.Tensor,
    temperature: torch.Tensor | float,
    n: int,
    generator: torch.Generator | None = None,
    top_k: torch.Tensor | int | None = None,
    max_top_k: int | None = None,
    block: int | None = None,
) -> torch.Tensor:
    """N-candidate form: (R, V) logits -> (R, n) int64, n independent draws per row from one read of the logits
    (greedy rows repeat their argmax)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return _sample(logits, temperature, n, generator, top_k, max_top_k, block)


def floor_us(rows: int, vocab: int, dtype: torch.dtype, bandwidth: float = 4.25e12) -> float:
    """The logits-read floor in microseconds at `bandwidth` bytes/s."""
    return rows * vocab * torch.finfo(dtype).bits / 8 / bandwidth * 1e6


__all__ = ["sample_rows_triton", "sample_candidates_triton", "floor_us", "BLOCK", "SAMPLED_BLOCK"]
