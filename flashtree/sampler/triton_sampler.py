"""Fused row sampler in Triton: argmax for greedy rows, Gumbel-max with in-kernel Philox for sampled rows.

Each program reads one tile of BLOCK tokens of one row (grid rows x tiles, no loop): many small independent programs
keep many loads in flight and need no block-wide reduction between two loads of the same program. A tile is cut into
SUBG groups of BLOCK / SUBG tokens, the unit of the sampled rows' two-level (hierarchical) Gumbel-max:

* pass 1, grid (rows, tiles): per group the log-mass lse_g = log sum_i exp(l_i / T) plus one Gumbel draw per group and
  draw (Philox counter = (group, row, draw, 0)); the program keeps the best (lse_g + g_g) of its groups. Greedy rows
  keep the tile maximum and its lowest index instead.
* pass 2, grid (rows, draws): the best tile's group is the drawn group, chosen with probability mass_g / total (the
  Gumbel-max theorem over groups); a Gumbel-max over that group's logits alone (Philox counter = (token, row, draw,
  1)) then picks token i with probability p_i / mass_g. The product is p_i: exact categorical sampling with Philox
  noise for one group per draw, not one per vocabulary entry, so the kernel runs at the logits-read rate.

Greedy rows (temperature <= 0) take the argmax, ties to the lowest token id, bit-identical to the reference. When the
caller passes the temperature as a Python number <= 0 (every row greedy, known on the host), one launch does it all:
the last tile program of a row to finish (a per-row ticket counter) merges the row's tile maxima; the counters live in
a persistent zeroed buffer that the merging program resets, so calls must not overlap on two streams.
The N-candidate form draws N independent tokens per row from one read of the logits (N Gumbels per group in pass 1).
Top-k: the k-th largest scaled logit per row is found with `torch.topk` (fixed shapes) and applied as a threshold
inside the kernels. Top-p falls back to the torch reference. bf16, fp16 and fp32 logits; no host synchronisation.
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl

BLOCK = 4096  # tokens per program
SUBG = 4  # Gumbel groups per tile: pass 2 draws noise for BLOCK / SUBG tokens per draw
TICKETS = 1 << 16  # rows the first ticket buffer of a device holds


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
    """Row r's argmax from its NT tile maxima: the first tile at the maximum holds the lowest id. The loads skip L1
    (.cg): in the one-launch path other programs wrote these partials during this launch."""
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
    gmax_ptr, garg_ptr, score_ptr, group_ptr,
    V, NT,
    NDRAW: tl.constexpr, NDP: tl.constexpr, BLOCK: tl.constexpr, SUBG: tl.constexpr, HAS_THR: tl.constexpr,
):
    r = tl.program_id(0)
    t = tl.program_id(1)
    raw = _load_tile(x_ptr, stride_r, r, t, V, BLOCK, SUBG)  # issued before the temperature is known
    temp = tl.load(temp_ptr + r).to(tl.float32)
    out = r * NT + t
    if temp <= 0:
        best, arg = _tile_argmax(raw, t, BLOCK, SUBG)
        tl.store(gmax_ptr + out, best)
        tl.store(garg_ptr + out, arg)
    else:
        seed = tl.load(seed_ptr)
        x = raw * (1.4426950408889634 / temp)
        if HAS_THR:
            thr = tl.load(thr_ptr + r)
            x = tl.where(raw / temp >= thr, x, -float("inf"))
        mx = tl.max(x, axis=1)
        safe = tl.where(mx == -float("inf"), 0.0, mx)
        ssum = tl.sum(tl.exp2(x - safe[:, None]), axis=1)
        lse = tl.where(ssum > 0, (safe + tl.log2(ssum)) * 0.6931471805599453, -float("inf"))
        grp = t * SUBG + tl.arange(0, SUBG)[:, None]
        dr = tl.arange(0, NDP)[None, :]
        z = grp * 0 + dr * 0
        u = _uniform(seed, (z + grp).to(tl.uint32), (z + r).to(tl.uint32), (z + dr).to(tl.uint32), z.to(tl.uint32))
        sc = lse[:, None] - tl.log(-tl.log(u))
        bests, bg = tl.max(sc, axis=0, return_indices=True)
        d = tl.arange(0, NDP)
        tl.store(score_ptr + out * NDRAW + d, bests, mask=d < NDRAW)
        tl.store(group_ptr + out * NDRAW + d, t * SUBG + bg, mask=d < NDRAW)


@triton.jit
def _pass2_kernel(
    x_ptr, stride_r, temp_ptr, thr_ptr, seed_ptr,
    gmax_ptr, garg_ptr, score_ptr, group_ptr, out_ptr,
    V, NT,
    NDRAW: tl.constexpr, DPP: tl.constexpr, NTP: tl.constexpr, GROUP: tl.constexpr, HAS_THR: tl.constexpr,
):
    # program (r, c): draws c * DPP .. + DPP of row r, one per row of a [DPP, GROUP] tile
    r = tl.program_id(0)
    j = tl.program_id(1) * DPP + tl.arange(0, DPP)
    jm = j < NDRAW
    temp = tl.load(temp_ptr + r).to(tl.float32)
    if temp <= 0:
        tok = _merge_argmax(gmax_ptr, garg_ptr, r, NT, NTP) + j * 0
    else:
        sp = tl.arange(0, NTP)
        off2 = (r * NT + sp[None, :]) * NDRAW + j[:, None]
        m2 = (sp[None, :] < NT) & jm[:, None]
        sc = tl.load(score_ptr + off2, mask=m2, other=-float("inf"))
        gg = tl.load(group_ptr + off2, mask=m2, other=0)
        sbest = tl.max(sc, axis=1)
        sfirst = tl.min(tl.where(sc == sbest[:, None], sp[None, :], NTP), axis=1)
        g = tl.sum(tl.where(sp[None, :] == sfirst[:, None], gg, 0), axis=1)
        seed = tl.load(seed_ptr)
        idx = g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
        raw = tl.load(x_ptr + r.to(tl.int64) * stride_r + idx, mask=(idx < V) & jm[:, None],
                      other=-float("inf")).to(tl.float32)
        x = raw / temp
        if HAS_THR:
            thr = tl.load(thr_ptr + r)
            x = tl.where(x >= thr, x, -float("inf"))
        z = idx * 0
        u = _uniform(seed, idx.to(tl.uint32), (z + r).to(tl.uint32), (z + j[:, None]).to(tl.uint32),
                     (z + 1).to(tl.uint32))
        y = x - tl.log(-tl.log(u))
        tok = g * GROUP + tl.argmax(y, axis=1)
    tl.store(out_ptr + r * NDRAW + j, tok.to(tl.int64), mask=jm)


_tickets: dict[torch.device, torch.Tensor] = {}
_retired: list[torch.Tensor] = []  # outgrown ticket buffers: captured graphs may still point at them


def _ticket_buffer(rows: int, dev: torch.device) -> torch.Tensor:
    buf = _tickets.get(dev)
    if buf is None or buf.numel() < rows:
        if buf is not None:
            _retired.append(buf)
        buf = _tickets[dev] = torch.zeros(max(rows, TICKETS), dtype=torch.int32, device=dev)
    return buf


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
    blk = block or min(BLOCK, max(16, triton.next_power_of_2(v)))
    if blk < SUBG or blk & (blk - 1):
        raise ValueError(f"block must be a power of two >= {SUBG}, got {blk}")
    nt = triton.cdiv(v, blk)
    ntp = max(2, triton.next_power_of_2(nt))
    ndp = max(2, triton.next_power_of_2(ndraw))
    gmax = torch.empty(r * nt, dtype=torch.float32, device=dev)
    garg = torch.empty(r * nt, dtype=torch.int32, device=dev)
    if isinstance(temperature, (int, float)) and temperature <= 0:
        _greedy_kernel[(r, nt)](logits, logits.stride(0), gmax, garg, _ticket_buffer(r, dev), out, v, nt,
                                NDRAW=ndraw, NDP=ndp, NTP=ntp, BLOCK=blk, SUBG=SUBG, num_warps=4)
        return out
    temperature = torch.as_tensor(temperature, device=dev, dtype=torch.float32).expand(r).contiguous()
    score = torch.empty(r * nt * ndraw, dtype=torch.float32, device=dev)
    group = torch.empty(r * nt * ndraw, dtype=torch.int32, device=dev)
    seed = torch.randint(0, 2**62, (1,), device=dev, generator=generator, dtype=torch.int64)
    has_thr = top_k is not None
    thr = _threshold(logits, temperature, top_k, max_top_k) if has_thr else temperature
    _pass1_kernel[(r, nt)](logits, logits.stride(0), temperature, thr, seed, gmax, garg, score, group, v, nt,
                           NDRAW=ndraw, NDP=ndp, BLOCK=blk, SUBG=SUBG, HAS_THR=has_thr, num_warps=4)
    grp = blk // SUBG
    dpp = min(triton.next_power_of_2(ndraw), max(1, 4096 // grp))
    _pass2_kernel[(r, triton.cdiv(ndraw, dpp))](logits, logits.stride(0), temperature, thr, seed, gmax, garg, score,
                                                group, out, v, nt, NDRAW=ndraw, DPP=dpp, NTP=ntp, GROUP=grp,
                                                HAS_THR=has_thr, num_warps=4)
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


__all__ = ["sample_rows_triton", "sample_candidates_triton", "floor_us", "BLOCK"]
