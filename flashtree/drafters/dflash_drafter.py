"""DFLASH drafter: an sglang-DFLASH-format draft (flashtree.dspark.dflash_format) in the reference engine.

The same network and context handling as the DSPARK drafter, with DFLASH's two differences: the block is [anchor,
mask x K] of K + 1 rows whose rows 1..K propose the tokens after the anchor, and there is no Markov head (its bias
is zero), so the positions are independent given the context and the N candidates are N draws from the
per-position marginals (candidate 0 the argmax block, DFLASH's own chain). Everything the DSPARK drafter offers
(temperature, greedy_first, k, window, return_probs, the probability policies' scores) carries over.
"""

from __future__ import annotations

import os

import torch

from ..dspark.dflash_format import load_dflash_checkpoint
from ..dspark.model import DSparkDraftModel
from .dspark_drafter import DSparkDrafter, check_dspark_target


class DFlashDrafter(DSparkDrafter):
    first_row = 1

    def __init__(self, model: DSparkDraftModel, target, **options):
        if bool(model.markov_head.markov_w2.weight.detach().any()):
            raise ValueError("a DFLASH draft has no Markov head, but this model's is nonzero: load a DFLASH checkpoint "
                             "(flashtree.dspark.dflash_format.load_dflash_checkpoint) or use the dspark drafter")
        super().__init__(model, target, **options)


def build_dflash_drafter(target, *, path=None, model=None, dtype: torch.dtype | None = None, **options) -> DFlashDrafter:
    """A DFlashDrafter from a DFLASH checkpoint folder `path` or a DSparkDraftModel `model` with a zero Markov head."""
    if (path is None) == (model is None):
        raise ValueError("the dflash drafter needs exactly one of path= (a DFLASH checkpoint folder) or model=")
    weight = target.get_output_embeddings().weight
    dtype = dtype or weight.dtype
    if path is not None:
        folder = os.path.expanduser(str(path))
        if not os.path.isdir(folder):
            raise FileNotFoundError(
                f"DFLASH draft checkpoint {folder!r} does not exist; train one with `python experiments/train_drafter.py "
                "format=dflash` or convert weights with `python -m flashtree.dspark.dflash_format`"
            )
        from ..dspark.dflash_format import load_dflash_config

        check_dspark_target(load_dflash_config(folder), target)
        model = load_dflash_checkpoint(folder, dtype=dtype, device=weight.device)
    elif not isinstance(model, DSparkDraftModel):
        raise TypeError(f"model must be a flashtree DSparkDraftModel, got {type(model).__name__}")
    return DFlashDrafter(model.to(device=weight.device, dtype=dtype), target, **options)
