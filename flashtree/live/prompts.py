"""The prompts of a live run: held-out GSM8K in the target's chat template (token ids, and the texts for
bench_serving's `custom` dataset), random token ids (dummy-weight models have no tokenizer), or token ids from a file."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

from flashtree.live.config import LiveConfig


@dataclass
class Prompts:
    ids: list[list[int]]
    texts: Optional[list[str]]  # None for random ids
    source: str


def random_ids(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(count)]


def load(cfg: LiveConfig) -> Prompts:
    p = cfg.prompts
    if p.source == "file":
        import json
        from pathlib import Path

        ids = json.loads(Path(p.path).read_text())["prompts"][: p.count]
        return Prompts([list(map(int, x)) for x in ids], None, f"{p.path}[:{p.count}]")
    if p.source == "random":
        vocab = cfg.model.dummy.vocab_size if cfg.model.dummy else _vocab_of(cfg.model.target)
        return Prompts(random_ids(p.count, p.input_len, vocab, p.seed), None,
                       f"random ids: {p.count} x {p.input_len}, seed {p.seed}")
    from transformers import AutoTokenizer

    from flashtree.datasets import encode_prompts, load_prompts

    texts = load_prompts("gsm8k", limit=p.count, split=p.split)
    ids = [list(map(int, x)) for x in encode_prompts(AutoTokenizer.from_pretrained(cfg.model.target), texts)]
    return Prompts(ids, texts, f"gsm8k {p.split}[:{p.count}]")


def _vocab_of(target: str) -> int:
    import json
    from pathlib import Path

    return int(json.loads((Path(target) / "config.json").read_text())["vocab_size"])
