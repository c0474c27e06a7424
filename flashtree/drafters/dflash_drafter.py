"""DFLASH drafter: an sglang-DFLASH-format draft (flashtree.dspark.dflash_format) in the reference engine.

The same network and context handling as the DSPARK drafter, with DFLASH's two differences: the block is [anchor,
mask x K] of K + 1 rows whose rows 1..K propose the tokens after the anchor, and there is no Markov head (its bias
is zero), so the positions are independent given the context and the N candidates are N draws from the
per-position marginals (candidate 0 the argmax block, DFLASH's own chain). Everything the DSPARK drafter offers
(temperature, greedy_first, k, window, return_probs, the probability policies' scores) carries over.
"""

from __future__ import annotations

import torch

from ..dspark.dflash_format import load_dflash_checkpoint
from ..dspark.model import DSparkDraftModel
from .dspark_drafter import DSparkDrafter, draft_network


class DFlashDrafter(DSparkDrafter):
    first_row = 1

    def __init__(self, model: DSparkDraftModel, target, **options):
        if bool(model.markov_head.markov_w2.weight.detach().any()):
            raise ValueError("a DFLASH draft has no Markov head, but this model's is nonzero: load a DFLASH checkpoint "
                             "(flashtree.dspark.dflash_format.load_dflash_checkpoint) or use the dspark drafter")
        super().__init__(model, target, **options)


def build_dflash_drafter(target, *, path=None, model=None, dtype: torch.dtype | None = None, **options) -> DFlashDrafter:
    """A DFlashDrafter from a DFLASH checkpoint folder `path` or a DSparkDraftModel `model` with a zero Markov head."""
    from ..dspark.dflash_format import load_dflash_config

    model = draft_network(target, path=path, model=model, dtype=dtype, name="dflash",
                          hint="train one with `python experiments/train_drafter.py format=dflash` or convert weights "
                               "with `python -m flashtree.dspark.dflash_format`",
                          load_config=load_dflash_config, load_weights=load_dflash_checkpoint)
    return DFlashDrafter(model, target, **options)
