"""Plain torch tree-verify attention (fp32 math), the reference the Triton kernel is checked against.

sglang's layout: `q (bs*L, Hq, D)`, fresh `k`/`v (bs*L, Hkv, D)` of the L verify tokens, `k_buffer`/`v_buffer
(slots, Hkv, D)`, request b's prefix slots `kv_indices[kv_indptr[b] : kv_indptr[b+1]]`. Mask: QLEN layout (each
request's L x L block, flattened, row = query token, column = key token; nonzero = visible), or sglang's FULL layout
(`mask_indptr` given: request b's rows of prefix_len + L columns start at mask_indptr[b]; the prefix columns are not
read, the prefix is always visible).
"""

from __future__ import annotations

import torch


def _tree_block(mask, mask_indptr, b, L, prefix):
    if mask_indptr is None:
        return mask[b * L * L : (b + 1) * L * L].view(L, L).bool()
    start = int(mask_indptr[b])
    rows = mask[start : start + L * (prefix + L)].view(L, prefix + L)
    return rows[:, prefix:].bool()


def tree_attention_reference(q, k, v, k_buffer, v_buffer, kv_indptr, kv_indices, custom_mask, L, sm_scale=None,
                             mask_indptr=None):
    """(bs*L, Hq, D) output in q's dtype, computed in fp32."""
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
