"""Tree-verify attention: W verify tokens per request attend to the request's KV prefix and to their tree ancestors.

`reference` holds the plain torch version; `triton_verify` the split-KV Triton kernel (GQA packing, log-sum-exp merge,
tree mask on each request's W x W block only), in sglang's layout and in a paged layout. `tree_attention` and
`tree_attention_paged` pick the kernel on CUDA and the reference elsewhere (Triton is imported only for CUDA).
"""

from .reference import tree_attention_paged_reference, tree_attention_reference


def tree_attention(q, *args, **kwargs):
    """sglang layout (see `tree_attention_reference`)."""
    if q.is_cuda:
        from .triton_verify import tree_attention_triton

        return tree_attention_triton(q, *args, **kwargs)
    return tree_attention_reference(q, *args, **kwargs)


def tree_attention_paged(q, *args, **kwargs):
    """Paged layout (see `tree_attention_paged_reference`)."""
    if q.is_cuda:
        from .triton_verify import tree_attention_paged_triton

        return tree_attention_paged_triton(q, *args, **kwargs)
    return tree_attention_paged_reference(q, *args, **kwargs)


__all__ = ["tree_attention", "tree_attention_paged", "tree_attention_paged_reference", "tree_attention_reference"]
