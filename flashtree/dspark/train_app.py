"""The job function of `experiments/train_drafter.py`."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from omegaconf import DictConfig

from .train_config import TrainConfigError, to_train_config


log = logging.getLogger(__name__)  # Hydra's job logging: the console and <output dir>/<job>.log

def run(cfg: DictConfig) -> float:
    """Validate the config, then train (or only select the prompts); returns the last logged loss."""
    from hydra.core.hydra_config import HydraConfig

    try:
        tc = to_train_config(cfg, HydraConfig.get().overrides.task)
    except TrainConfigError as exc:
        print(f"flashtree: bad config: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if tc.prepare_only:
        return float(prepare_prompts(tc))
    from .train import train

    summary = train(tc)
    return float(summary["last"].get("loss", float("nan")))


def prepare_prompts(tc) -> int:
    """Select the training prompts with the target's tokenizer and write out_dir/prompts.json.gz (for a machine that
    lacks the prompt-set packages: point data.prompts_file at it there)."""
    from flashtree.models import load_target

    from .data import select_prompts, write_prompts_file

    _, tokenizer = load_target(tc.target.name, cache_dir=tc.target.cache_dir, seed=tc.target.seed)
    prompts, counts = select_prompts(tc.data.sources, tokenizer, max_prompt_tokens=tc.data.max_prompt_tokens,
                                     seed=tc.seed)
    path = write_prompts_file(Path(tc.out_dir) / "prompts.json.gz", prompts, counts)
    log.info(f"[dspark] {len(prompts)} prompts -> {path}: {counts}")
    return len(prompts)
