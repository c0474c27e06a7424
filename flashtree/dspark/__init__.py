"""DSPARK block drafters trained by flashtree: the draft network (plain PyTorch, sglang's DSparkDraftModel math),
its config and checkpoints in sglang's layout, the training data, loss and loop.

    from flashtree.dspark import DSparkConfig, DSparkDraftModel, load_checkpoint, save_checkpoint
    drafter = flashtree.drafters.load_drafter("dspark", target, path="results/dspark-smollm2/draft", temperature=1.0)
"""

from .checkpoint import load_checkpoint, read_tensors, save_checkpoint
from .config import DSparkConfig, spread_layers
from .model import DSparkDraftModel, block_ids

__all__ = ["DSparkConfig", "DSparkDraftModel", "block_ids", "load_checkpoint", "read_tensors", "save_checkpoint",
           "spread_layers"]
