"""Tree-verify attention: W verify tokens per request attend to the request's KV prefix and to their tree ancestors.

`reference` holds the plain torch version; `triton_verify` the split-KV Triton kernel (GQA packing, log-sum-exp merge,
tree mask on each request's W x W block only), in sglang's layout and in a paged layout.
"""

from .reference import tree_attention_paged_reference, tree_attention_reference
from .triton_verify import tree_attention_paged_triton, tree_attention_triton

__all__ = [
    "tree_attention_paged_reference",
    "tree_attention_paged_triton",
    "tree_attention_reference",
    "tree_attention_triton",
]
