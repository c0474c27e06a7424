"""A torch stand-in for FlashInfer's BatchDecodeWithPagedKVCacheWrapper, for CPU tests (FlashInfer is CUDA only).

It keeps the wrapper's contract as flashtree uses it: the constructor's buffers (fixed in CUDA-graph mode, replaced at
each plan otherwise), `plan` copying indptr / indices / last-page lengths into them, and `forward` reading the device
buffers as they are when it runs (so offsets written after the plan count, as they do for FlashInfer's kernel). Each
row attends to its keys in list order; the arithmetic is plain torch, so equal rows give equal outputs. FlashInfer's
own numbers are a GPU matter.
"""

from __future__ import annotations

import torch


class StandInDecodeWrapper:
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto"):
        assert kv_layout == "NHD"
        self.device = float_workspace_buffer.device
        self.backend, self.use_tensor_cores = backend, use_tensor_cores
        self.is_cuda_graph_enabled = use_cuda_graph
        if use_cuda_graph:
            assert len(paged_kv_indptr_buffer) == len(paged_kv_last_page_len_buffer) + 1
            self._fixed_batch_size = len(paged_kv_last_page_len_buffer)
        self._paged_kv_indptr_buf = paged_kv_indptr_buffer
        self._paged_kv_indices_buf = paged_kv_indices_buffer
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buffer
        self.plans: list[dict] = []

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, **kwargs):
        assert page_size == 1 and indptr.dtype == torch.int32 and indices.dtype == torch.int32
        if self.is_cuda_graph_enabled:
            assert len(last_page_len) == self._fixed_batch_size
            assert len(indices) <= len(self._paged_kv_indices_buf), "indices overflow the graph buffer"
            self._paged_kv_indptr_buf.copy_(indptr)
            self._paged_kv_last_page_len_buf.copy_(last_page_len)
            self._paged_kv_indices_buf[: len(indices)].copy_(indices)
        else:
            self._paged_kv_indptr_buf = indptr.to(self.device)
            self._paged_kv_indices_buf = indices.to(self.device)
            self._paged_kv_last_page_len_buf = last_page_len.to(self.device)
        self.plans.append(dict(rows=len(last_page_len), heads=(num_qo_heads, num_kv_heads, head_dim), **kwargs))

    begin_forward = plan

    def forward(self, q, kv_cache, sm_scale=None, logits_soft_cap=None, k_scale=None, v_scale=None):
        k_cache, v_cache = kv_cache
        rows, hq, d = q.shape
        group = hq // k_cache.shape[1]
        indptr = self._paged_kv_indptr_buf.tolist()
        assert torch.all(self._paged_kv_last_page_len_buf[:rows] == 1)
        out = torch.empty_like(q)
        for r in range(rows):
            slots = self._paged_kv_indices_buf[indptr[r] : indptr[r + 1]].to(torch.int64)
            k = k_cache[slots].repeat_interleave(group, dim=1)  # (n, hq, d)
            v = v_cache[slots].repeat_interleave(group, dim=1)
            scores = torch.einsum("hd,nhd->hn", q[r], k) * (sm_scale if sm_scale is not None else d**-0.5)
            out[r] = torch.einsum("hn,nhd->hd", scores.softmax(-1), v)
        return out
