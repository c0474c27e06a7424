"""FlashInfer verify graphs on tree servers: the mask of a chain verify.

The tree path has FlashInfer's verify graphs captured with a custom mask (plan.py takes FlashInferAttnBackend off
sglang's skip-custom-mask set). A FlashInfer wrapper captured with a mask buffer runs in custom-mask mode at every
replay and reads that buffer, which sglang's replay plan refills only when the verify input carries a mask. DSPARK's
own chain step (a tree server's fallbacks and the planner's chain steps) verifies with none, so its replay would read
the last tree step's mask: wrong target logits. Before such a replay's plan this hands sglang the chain's causal
FULL_MASK, as `decode.stage_chain_mask` writes it into Triton's buffer.
"""

from __future__ import annotations

import torch

from flashtree.tree import chain_tree, verify_inputs

_UNSET = object()


def prefix_total(forward_batch, prefix: torch.Tensor) -> int:
    """The host sum of a verify batch's prefixes: sglang's own where it has one (a graph replay's view has None when
    the batch carried none; then its host copy, else the device's, which waits)."""
    total = forward_batch.seq_lens_sum
    if total is None:
        cpu = getattr(forward_batch, "seq_lens_cpu", None)
        total = cpu[: prefix.shape[0]].sum() if cpu is not None else prefix.sum()
    return int(total)


def chain_mask(forward_batch) -> torch.Tensor:
    """The causal FULL_MASK of a chain verify over the batch's prefixes (padding requests included)."""
    bs, w = forward_batch.batch_size, int(forward_batch.spec_info.draft_token_num)
    prefix = forward_batch.seq_lens[:bs]
    tree = chain_tree(bs, w, prefix.device)
    return verify_inputs(tree, torch.zeros(bs, dtype=torch.long, device=prefix.device), prefix,
                         prefix_total(forward_batch, prefix)).mask


def make_init_forward_metadata_out_graph(original):
    """FlashInferAttnBackend.init_forward_metadata_out_graph (graph capture and replay only): a verify with no mask
    gets the chain's causal mask for sglang's plan (the verify input is left as it was after). On a tree server every
    verify graph is captured with a mask (sglang's `resolve_dflash_verify_mask_policy`), so every such replay needs it."""

    def init_forward_metadata_out_graph(self, forward_batch, *args, **kwargs):
        spec = forward_batch.spec_info
        if forward_batch.forward_mode.is_target_verify() and getattr(spec, "custom_mask", _UNSET) is None:
            spec.custom_mask = chain_mask(forward_batch)
            try:
                return original(self, forward_batch, *args, **kwargs)
            finally:
                spec.custom_mask = None
        return original(self, forward_batch, *args, **kwargs)

    return init_forward_metadata_out_graph
