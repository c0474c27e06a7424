"""Plain torch tree-verify attention (fp32 math), the reference the Triton kernel is checked against.

sglang's layout: `q (bs*L, Hq, D)`, fresh `k`/`v (bs*L, Hkv, D)` of the L verify tokens, `k_buffer`/`v_buffer
(slots, Hkv, D)`, request b's prefix slots `kv_indices[kv_indptr[b] : kv_indptr[b+1]]`. Mask: QLEN layout (each
request's L x L block, flattened, row = query token, column = key token; nonzero = visible), or sglang's FULL layout
(`mask_indptr` given: request b's rows of prefix_len + L columns start at mask_indptr[b]; the prefix columns are not
read, the prefix is always visible).
"""

from __future__ import annotations

import torch


def check_mask_args(custom_mask, causal: bool) -> None:
    """A tree verify has its mask; a chain verify (`causal`) has none."""
    if causal and custom_mask is not None:
        raise ValueError("causal=True is a chain verify: pass no custom_mask with it")
    if custom_mask is None and not causal:
        raise ValueError("tree verify attention needs the tree mask (custom_mask), or causal=True for a chain")


def _mask_or_chain(custom_mask, causal, L, bs, device):
    """The QLEN mask to apply: `custom_mask`, or with `causal` and no mask a chain's (each block lower-triangular)."""
    check_mask_args(custom_mask, causal)
    if custom_mask is None:
        return torch.ones(L, L, dtype=torch.bool, device=device).tril().repeat(max(bs, 0), 1).flatten()
    return custom_mask


def _tree_block(mask, mask_indptr, b, L, prefix):
    if mask_indptr is None:
        return mask[b * L * L : (b + 1) * L * L].view(L, L).bool()
    start = int(mask_indptr[b])
    rows = mask[start : start + L * (prefix + L)].view(L, prefix + L)
    return rows[:, prefix:].bool()


def tree_attention_reference(q, k, v, k_buffer, v_buffer, kv_indptr, kv_indices, custom_mask, L, sm_scale=None,
                             mask_indptr=None, causal=False):
    """(bs*L, Hq, D) output in q's dtype, computed in fp32. `causal` with no mask: a chain (token i sees 0..i)."""
    custom_mask = _mask_or_chain(custom_mask, causal, L, kv_indptr.shape[0] - 1, q.device)
    mask_indptr = None if causal else mask_indptr
    tokens, hq, d = q.shape
    hkv = k.shape[1]
    bs = tokens // L
    scale = d ** -0.5 if sm_scale is None else sm_scale
    out = torch.empty(tokens, hq, v.shape[2], dtype=torch.float32, device=q.device)
    for b in range(bs):
        lo, hi = int(kv_indptr[b]), int(kv_indptr[b + 1])
        idx = kv_indices[lo:hi].long()
        kk = torch.cat([k_buffer[idx], k[b * L : (b + 1) * L]], 0).float()  # (P+L, Hkv, D)
        vv = torch.cat([v_buffer[idx], v[b * L : (b + 1) * L]], 0).float()
        qq = q[b * L : (b + 1) * L].float()  # (L, Hq, D)
        g = hq // hkv
        kk = kk.repeat_interleave(g, dim=1)
        vv = vv.repeat_interleave(g, dim=1)
        s = torch.einsum("lhd,nhd->hln", qq, kk) * scale
        allowed = torch.ones(L, hi - lo + L, dtype=torch.bool, device=q.device)
        allowed[:, hi - lo :] = _tree_block(custom_mask, mask_indptr, b, L, hi - lo)
        s = s.masked_fill(~allowed, float("-inf"))
        out[b * L : (b + 1) * L] = torch.einsum("hln,nhd->lhd", s.softmax(-1), vv)
    return out.to(q.dtype)


def paged_indices(page_table, prefix_lens, page_size):
    """kv_indptr / kv_indices equivalent to a page table (slot = page * page_size + offset)."""
    lens = prefix_lens.long()
    indptr = torch.zeros(len(lens) + 1, dtype=torch.long, device=lens.device)
    indptr[1:] = lens.cumsum(0)
    idx = []
    for b in range(len(lens)):
        pos = torch.arange(int(lens[b]), device=lens.device)
        idx.append(page_table[b, pos // page_size].long() * page_size + pos % page_size)
    return indptr, torch.cat(idx) if idx else torch.zeros(0, dtype=torch.long, device=lens.device)


def tree_attention_paged_reference(q, k, v, k_cache, v_cache, page_table, prefix_lens, page_size, custom_mask, L,
                                   sm_scale=None, mask_indptr=None):
    """Paged layout: `k_cache`/`v_cache (pages, page_size, Hkv, D)`, `page_table (bs, max_pages)`, `prefix_lens (bs,)`."""
    hkv, d = k_cache.shape[-2], k_cache.shape[-1]
    indptr, indices = paged_indices(page_table, prefix_lens, page_size)
    return tree_attention_reference(q, k, v, k_cache.reshape(-1, hkv, d), v_cache.reshape(-1, hkv, v_cache.shape[-1]),
                                    indptr, indices, custom_mask, L, sm_scale, mask_indptr)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def decode_order_verify_reference(q, k_buffer, v_buffer, kv_indptr, kv_indices, path_slots, path_lens, W, sm_scale,
                                  split_tile, block=32, min_block_kv=32):
    """`triton_decode_order.decode_order_verify_triton` in plain torch: each verify token as a decode row (its prefix,
    then its path), cut into sglang's deterministic splits, each an online softmax over `block`-key blocks, merged in
    order by log-sum-exp. Same order of operations in fp32; equal to the kernel up to rounding of the dots."""
    tokens, hq, d = q.shape
    g = hq // k_buffer.shape[1]
    out = torch.empty(tokens, hq, v_buffer.shape[2], dtype=torch.float32, device=q.device)
    for r in range(tokens):
        b = r // W
        prefix = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
        slots = torch.cat([prefix, path_slots[r, : int(path_lens[r])].long()])
        n = len(slots)
        k = k_buffer[slots].float().repeat_interleave(g, dim=1)  # (n, Hq, D)
        v = v_buffer[slots].float().repeat_interleave(g, dim=1)
        qr = q[r].float()  # (Hq, D)
        splits = _cdiv(n, split_tile)
        chunk = _cdiv(_cdiv(n, splits), min_block_kv) * min_block_kv
        e_max = torch.full((hq,), float("-inf"), device=q.device)
        e_sum = torch.zeros(hq, device=q.device)
        acc = torch.zeros(hq, v.shape[2], device=q.device)
        for lo in range(0, n, chunk):
            m = torch.full((hq,), float("-inf"), device=q.device)
            s_ = torch.zeros(hq, device=q.device)
            a = torch.zeros(hq, v.shape[2], device=q.device)
            for start in range(lo, min(lo + chunk, n), block):
                end = min(start + block, lo + chunk, n)
                qk = torch.einsum("hd,nhd->hn", qr, k[start:end]) * sm_scale
                m_new = torch.maximum(qk.max(1).values, m)
                scale = torch.exp(m - m_new)
                p = torch.exp(qk - m_new[:, None])
                a = a * scale[:, None] + torch.einsum("hn,nhd->hd", p, v[start:end])
                s_ = s_ * scale + p.sum(1)
                m = m_new
            lse = m + torch.log(s_)
            m_new = torch.maximum(lse, e_max)
            old = torch.exp(e_max - m_new)
            w = torch.exp(lse - m_new)
            acc = acc * old[:, None] + w[:, None] * (a / s_[:, None])
            e_sum = e_sum * old + w
            e_max = m_new
        out[r] = acc / e_sum[:, None]
    return out.to(q.dtype)
