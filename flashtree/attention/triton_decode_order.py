"""Split-KV tree verify in decode order: each verify token's output bit-equal to a plain decode at its position.

Greedy speculative decoding is lossless only if the verify forward's argmax equals the decode forward's. In float32
that needs the same arithmetic, not just the same maths: under sglang's `--enable-deterministic-inference` a decode
row of length n is cut into `ceil(n / tile)` splits of `ceil(ceil(n / splits) / 32) * 32` keys, each split is an
online softmax over 32-key blocks (one `tl.dot` per block for a 16-row tile of query heads, 4 warps), and a second
kernel merges the splits in order by their log-sum-exp. This kernel does the same per verify token — its row is the
request's prefix, then its tree path root first — with the same tile shapes and the same operations in the same
order, so every row's numbers are the decode's. A dot's output row depends on its own input row only, so the 16 rows
of a tile need not be one token's heads: the tile packs W tokens x G heads of one KV head (row r = token r // G, head
r % G), and a block of keys that lies wholly in the prefix is read once for all of them (the split-KV saving). Blocks
that reach a path differ per token: each token in the tile gets its own dot there, and keeps only its rows.

The constants mirror sglang's grouped decode kernel (`_fwd_grouped_kernel_stage1` / `_fwd_kernel_stage2`; 0.5.20 and
0.5.23 keep the same constants and operations on the deterministic, non-MLA CUDA path; bit equality was measured on
0.5.17, benchmarks/HISTORY.md): BLOCK_N 32, BLOCK_H 16, MIN_BLOCK_KV 32, 4 warps, and the split tile of the
backend (`SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE`). MHA (G = 1) runs sglang's other decode kernel, which this one does
not mirror. `decode_order_verify_reference` in reference.py is the plain torch statement of the same arithmetic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_verify import gqa_program

BLOCK_N = 32  # sglang's BLOCK for Lk < 576 on CUDA
BLOCK_H = 16  # sglang's BLOCK_H: rows per tile
MIN_BLOCK_KV = 32  # sglang's _MIN_BLOCK_KV: split lengths are multiples of it
NUM_WARPS = 4


@triton.jit
def _split_range(seq, s, TILE, MIN_KV: tl.constexpr):
    """Keys [lo, hi) of split s of a decode row of length seq (sglang's deterministic split rule)."""
    n_splits = tl.maximum((seq + TILE - 1) // TILE, 1)
    chunk = tl.cdiv(tl.cdiv(seq, n_splits), MIN_KV) * MIN_KV
    lo = chunk * s
    return lo, tl.minimum(lo + chunk, seq)


@triton.jit
def _stage1(
    q_ptr, kb_ptr, vb_ptr, kv_indptr, kv_indices, path_slots, path_lens, att_out, att_lse, sm_scale, tile,
    s_qt, s_qh, s_kbt, s_kbh, s_vbt, s_vbh, s_pt, s_ot, s_oh, s_os, s_lt, s_lh,
    G: tl.constexpr, W: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, DV: tl.constexpr, BDV: tl.constexpr,
    BM: tl.constexpr, RB: tl.constexpr, BN: tl.constexpr, MIN_KV: tl.constexpr,
):
    b, h, rb, s, rows, row_ok, t, hq = gqa_program(RB, BM, G, W)
    tok = (b * W + t).to(tl.int64)
    kv_start = tl.load(kv_indptr + b).to(tl.int64)
    prefix = (tl.load(kv_indptr + b + 1) - kv_start).to(tl.int32)
    plen = tl.load(path_lens + tok, mask=row_ok, other=0)
    lo_r, hi_r = _split_range(prefix + plen, s, tile, MIN_KV)
    act = row_ok & (hi_r > lo_r)
    if tl.max(act.to(tl.int32), 0) > 0:
        lo = tl.min(tl.where(act, lo_r, 2147483647), 0)
        hi = tl.max(tl.where(act, hi_r, 0), 0)
        d = tl.arange(0, BD)
        dv = tl.arange(0, BDV)
        q = tl.load(q_ptr + tok[:, None] * s_qt + hq[:, None] * s_qh + d[None, :],
                    mask=row_ok[:, None] & (d[None, :] < D), other=0.0)
        q_k = q.to(kb_ptr.dtype.element_ty)
        kb_h = kb_ptr + h * s_kbh + d[:, None]
        vb_h = vb_ptr + h * s_vbh + dv[None, :]
        t_first = (rb * BM) // G
        t_last = tl.minimum((rb * BM + BM - 1) // G, W - 1)
        e_max = tl.zeros([BM], dtype=tl.float32) - float("inf")
        e_sum = tl.zeros([BM], dtype=tl.float32)
        acc = tl.zeros([BM, BDV], dtype=tl.float32)
        for start_n in tl.range(lo, hi, BN):
            offs_n = start_n + tl.arange(0, BN)
            inb = act & (start_n >= lo_r) & (start_n < hi_r)  # the rows whose split holds this block
            shared = start_n + BN <= prefix
            kv_loc = tl.load(kv_indices + kv_start + offs_n, mask=offs_n < prefix, other=0)
            if shared:  # prefix keys only: one read and one dot for the whole tile
                k = tl.load(kb_h + kv_loc[None, :].to(tl.int64) * s_kbt, mask=d[:, None] < D, other=0.0)
                qk = tl.dot(q_k, k)
            else:  # the block reaches the tree paths: each token its own keys
                qk = tl.zeros([BM, BN], dtype=tl.float32)
                for tt in range(t_first, t_last + 1):
                    slot, ok = _slots(kv_loc, prefix, path_slots, path_lens, b * W + tt, s_pt, offs_n)
                    k = tl.load(kb_h + slot[None, :] * s_kbt, mask=ok[None, :] & (d[:, None] < D), other=0.0)
                    qk = tl.where(t[:, None] == tt, tl.dot(q_k, k), qk)
            qk *= sm_scale
            qk = tl.where(inb[:, None] & (offs_n[None, :] < hi_r[:, None]), qk, float("-inf"))
            n_e_max = tl.maximum(tl.max(qk, 1), e_max)
            re_scale = tl.exp(e_max - n_e_max)
            p = tl.exp(qk - n_e_max[:, None])
            p = tl.where(inb[:, None], p, 0.0)  # rows outside the block are all -inf here (nan above)
            acc_new = acc * re_scale[:, None]
            if shared:
                v = tl.load(vb_h + kv_loc[:, None].to(tl.int64) * s_vbt, mask=dv[None, :] < DV, other=0.0)
                acc_new = acc_new + tl.dot(p.to(v.dtype), v)
            else:
                acc_scaled = acc_new
                for tt in range(t_first, t_last + 1):
                    slot, ok = _slots(kv_loc, prefix, path_slots, path_lens, b * W + tt, s_pt, offs_n)
                    v = tl.load(vb_h + slot[:, None] * s_vbt, mask=ok[:, None] & (dv[None, :] < DV), other=0.0)
                    acc_new = tl.where(t[:, None] == tt, acc_scaled + tl.dot(p.to(v.dtype), v), acc_new)
            acc = tl.where(inb[:, None], acc_new, acc)
            e_sum = tl.where(inb, e_sum * re_scale + tl.sum(p, 1), e_sum)
            e_max = tl.where(inb, n_e_max, e_max)
        tl.store(att_out + tok[:, None] * s_ot + hq[:, None] * s_oh + s * s_os + dv[None, :], acc / e_sum[:, None],
                 mask=act[:, None] & (dv[None, :] < DV))
        tl.store(att_lse + tok * s_lt + hq * s_lh + s, e_max + tl.log(e_sum), mask=act)


@triton.jit
def _slots(prefix_slots, prefix, path_slots, path_lens, row, s_pt, offs_n):
    """KV slots of positions offs_n in one token's decode row (its prefix's, then its path's) and which exist."""
    plen = tl.load(path_lens + row)
    j = offs_n - prefix
    from_path = tl.load(path_slots + row.to(tl.int64) * s_pt + j, mask=(j >= 0) & (j < plen), other=0)
    slot = tl.where(offs_n < prefix, prefix_slots, from_path).to(tl.int64)
    return slot, offs_n < prefix + plen


@triton.jit
def _stage2(
    att_out, att_lse, o_ptr, kv_indptr, path_lens, tile,
    s_ot, s_oh, s_os, s_lt, s_lh, s_t, s_h,
    W: tl.constexpr, DV: tl.constexpr, BDV: tl.constexpr, MAX_SPLITS: tl.constexpr, MIN_KV: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    hq = tl.program_id(1)
    b = tok // W
    seq = tl.load(kv_indptr + b + 1) - tl.load(kv_indptr + b) + tl.load(path_lens + tok)
    offs_d = tl.arange(0, BDV)
    mask_d = offs_d < DV
    e_sum = 0.0
    e_max = -float("inf")
    acc = tl.zeros([BDV], dtype=tl.float32)
    for s in tl.range(0, MAX_SPLITS, num_stages=2):
        lo, hi = _split_range(seq, s, tile, MIN_KV)
        if hi > lo:
            tv = tl.load(att_out + tok * s_ot + hq * s_oh + s * s_os + offs_d, mask=mask_d, other=0.0)
            tlogic = tl.load(att_lse + tok * s_lt + hq * s_lh + s)
            n_e_max = tl.maximum(tlogic, e_max)
            old_scale = tl.exp(e_max - n_e_max)
            acc *= old_scale
            exp_logic = tl.exp(tlogic - n_e_max)
            acc += exp_logic * tv
            e_sum = e_sum * old_scale + exp_logic
            e_max = n_e_max
    tl.store(o_ptr + tok * s_t + hq * s_h + offs_d, (acc / e_sum).to(o_ptr.dtype.element_ty), mask=mask_d)


def decode_order_verify_triton(q, k_buffer, v_buffer, kv_indptr, kv_indices, path_slots, path_lens, W, sm_scale,
                               split_tile, max_splits, out=None):
    """q (bs*W, Hq, D); k_buffer/v_buffer (slots, Hkv, D) holding the prefix and the verify tokens' own keys;
    kv_indptr (bs+1,), kv_indices: each request's prefix slots; path_slots (bs*W, >= W) int64: token i's path slots,
    root first, itself last; path_lens (bs*W,) int32. split_tile: the backend's decode split tile; max_splits: at
    least the most splits of any row. Returns out (bs*W, Hq, Dv). Only shapes are read on the host."""
    tokens, hq, d = q.shape
    hkv, dv = k_buffer.shape[1], v_buffer.shape[2]
    if hq % hkv or hq == hkv:
        raise ValueError(f"decode order is sglang's grouped kernel: query heads ({hq}) must be a multiple > 1 of KV "
                         f"heads ({hkv})")
    if tokens % W:
        raise ValueError(f"q has {tokens} tokens, not a multiple of W = {W}")
    g = hq // hkv
    if out is None:
        out = torch.empty(tokens, hq, dv, dtype=q.dtype, device=q.device)
    if tokens == 0:
        return out
    bs = tokens // W
    att_out = torch.empty(tokens, hq, max_splits, dv, dtype=torch.float32, device=q.device)
    att_lse = torch.empty(tokens, hq, max_splits, dtype=torch.float32, device=q.device)
    rb = triton.cdiv(g * W, BLOCK_H)
    bd, bdv = triton.next_power_of_2(d), triton.next_power_of_2(dv)
    _stage1[(bs, hkv * rb, max_splits)](
        q, k_buffer, v_buffer, kv_indptr, kv_indices, path_slots, path_lens, att_out, att_lse, sm_scale, split_tile,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        path_slots.stride(0), att_out.stride(0), att_out.stride(1), att_out.stride(2), att_lse.stride(0),
        att_lse.stride(1),
        G=g, W=W, D=d, BD=bd, DV=dv, BDV=bdv, BM=BLOCK_H, RB=rb, BN=BLOCK_N, MIN_KV=MIN_BLOCK_KV,
        num_warps=NUM_WARPS, num_stages=2,
    )
    _stage2[(tokens, hq)](
        att_out, att_lse, out, kv_indptr, path_lens, split_tile,
        att_out.stride(0), att_out.stride(1), att_out.stride(2), att_lse.stride(0), att_lse.stride(1),
        out.stride(0), out.stride(1),
        W=W, DV=dv, BDV=bdv, MAX_SPLITS=max_splits, MIN_KV=MIN_BLOCK_KV, num_warps=NUM_WARPS, num_stages=2,
    )
    return out
