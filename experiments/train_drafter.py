#!/usr/bin/env python
"""Train a DSPARK block drafter for a flashtree target (flashtree.dspark), exported in sglang's DSPARK layout.

    python experiments/train_drafter.py                                   # SmolLM2-135M on CUDA (flashtree/configs/train/default.yaml)
    python experiments/train_drafter.py --config-name tiny                # tiny random target on CPU, seconds
    python experiments/train_drafter.py optim.steps=5000 out_dir=results/dspark-long logger.wandb.mode=disabled
    python experiments/train_drafter.py prepare_only=true target.device=cpu   # select the prompts, write prompts.json.gz

Reruns resume from out_dir/state.pt (and reuse out_dir/data.pt) unless resume=false. The draft lands in
out_dir/draft/ and loads with load_drafter("dspark", target, path=out_dir/draft) or sglang's
--speculative-algorithm DSPARK --speculative-draft-model-path out_dir/draft.

The same app as `flashtree train-drafter ...` (flashtree/cli.py).
"""

from flashtree.cli import run_app

if __name__ == "__main__":
    run_app("train-drafter")
