"""Training data for the DSPARK drafter: prompts, and the target's own responses to them.

Prompts come from ShareGPT (a seeded subset of the first human turns), MT-Bench, HumanEval and the FIRST half of the
GSM8K test set; the second half of GSM8K is the held-out evaluation set and is refused here. Each prompt is wrapped in
the target's chat template; prompts longer than `max_prompt_tokens` are skipped, and any training prompt whose text
equals a held-out GSM8K question is dropped (counted in the data summary).

Responses: the target's greedy decoding (batched `generate`, left padding, stopping at the target's end tokens, the
stop token kept), at most `max_new_tokens` tokens; prompts of the sources named in `extra_samples` also get that many
responses sampled at a temperature (more in-domain data than the prompts alone give).
"""

from __future__ import annotations

import gzip
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..files import DamagedFile, load_torch

HELD_OUT = ("gsm8k", "second_half")
SOURCES = ("sharegpt", "mt-bench", "humaneval", "gsm8k-first-half", "builtin")


@dataclass
class Sequence:
    source: str
    ids: torch.Tensor  # prompt + response (int64, 1-D)
    prompt_len: int
    sampled: bool = False  # the response was sampled at a temperature, not greedy


def canonical_source(name: str) -> str:
    key = name.lower().replace("_", "-")
    key = {"mtbench": "mt-bench", "human-eval": "humaneval", "gsm8k-first": "gsm8k-first-half"}.get(key, key)
    if key in ("gsm8k", "gsm8k-second-half", "gsm8k-all"):
        raise ValueError(
            f"data source {name!r}: only the first half of GSM8K may be trained on (the second half is held out); "
            "use gsm8k-first-half"
        )
    if key not in SOURCES:
        raise ValueError(f"unknown data source {name!r}: use {', '.join(SOURCES)}")
    return key


def heldout_texts() -> set[str]:
    """The held-out GSM8K questions, which no training prompt may be. Without the GSM8K package the filter cannot
    run, and training on unfiltered prompts could put held-out questions in the data: that stops with the fix."""
    from flashtree.datasets import load_prompts

    try:
        return set(load_prompts("gsm8k", split="second_half"))
    except (ModuleNotFoundError, FileNotFoundError) as err:
        raise ModuleNotFoundError(
            f"the drafter's training data must exclude the held-out GSM8K half, and the GSM8K prompt set cannot be "
            f"loaded to check it ({err}); install it (see requirements/data.txt) on this machine"
        ) from None


def select_prompts(sources: dict, tokenizer, *, max_prompt_tokens: int, seed: int) -> tuple[list[dict], dict]:
    """[{source, text}] for `sources` ({name: how many, or null for all}) whose chat-encoded length fits, in a
    seeded order; and counts per source (kept, too long, held-out overlaps)."""
    from flashtree.datasets import encode_prompts, load_prompts

    if not sources:
        raise ValueError("data.sources is empty: name at least one prompt source "
                         f"({', '.join(SOURCES)}) with a count (null = all)")
    rng = random.Random(seed)
    heldout = heldout_texts()
    chosen, counts = [], {}
    for name, limit in sources.items():
        key = canonical_source(name)
        if key == "gsm8k-first-half":
            texts = load_prompts("gsm8k", split="first_half")
        else:
            texts = load_prompts(key)
        order = list(range(len(texts)))
        if key == "sharegpt":
            rng.shuffle(order)  # ShareGPT is large and ordered by source: take a seeded random subset
        kept = too_long = overlap = 0
        for i in order:
            if limit is not None and kept >= limit:
                break
            text = texts[i]
            if text in heldout:
                overlap += 1
                continue
            if len(text) > 8 * max_prompt_tokens:  # cheap pre-filter before tokenizing
                too_long += 1
                continue
            if len(encode_prompts(tokenizer, [text])[0]) > max_prompt_tokens:
                too_long += 1
                continue
            chosen.append({"source": key, "text": text})
            kept += 1
        counts[key] = {"kept": kept, "too_long": too_long, "heldout_overlap": overlap, "available": len(texts)}
    return chosen, counts


def write_prompts_file(path, prompts: list[dict], counts: dict, extra: dict | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump({"prompts": prompts, "counts": counts, **(extra or {})}, f)
    return path


def read_prompts_file(path) -> tuple[list[dict], dict]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, EOFError, ValueError) as err:
        raise DamagedFile(path, "the prompts file (data.prompts_file)", err) from None
    heldout = heldout_texts()
    bad = [p for p in d["prompts"] if p["text"] in heldout]
    if bad:
        raise ValueError(f"{path} holds {len(bad)} held-out GSM8K question(s); rebuild it with select_prompts")
    for p in d["prompts"]:
        canonical_source(p["source"])
    return d["prompts"], d.get("counts", {})


def expand_samples(prompts: list[dict], extra_samples: dict[str, int]) -> list[dict]:
    """The generation rows: every prompt once (greedy), then `extra_samples[source]` sampled copies of each prompt of
    that source (`sampled: True`)."""
    extra = {canonical_source(name): count for name, count in extra_samples.items()}
    rows = [dict(p, sampled=False) for p in prompts]
    for p in prompts:
        rows += [dict(p, sampled=True) for _ in range(extra.get(p["source"], 0))]
    return rows


def _batches(rows: list[int], prompt_ids, batch_size: int, seed: int) -> list[list[int]]:
    # batched by length (less padding), in a seeded order, so a cut keeps a length-balanced subset
    order = sorted(rows, key=lambda i: len(prompt_ids[i]))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    random.Random(seed).shuffle(batches)
    return batches


@torch.no_grad()
def generate_responses(target, prompt_ids: list[list[int]], *, max_new_tokens: int, batch_size: int, stop_ids,
                       pad_id: int, seed: int = 0, time_limit_s: float | None = None, max_batches: int | None = None,
                       sampled: list[bool] | None = None, temperature: float = 0.8, progress: bool = True):
    """The target's response to each prompt (a list of int lists; None where a batch limit or the time limit came
    first): greedy, or sampled at `temperature` where `sampled[i]`.

    The sampled rows run first (the config asks for them explicitly), then the greedy ones; each part is batched by
    length and its batches run in a seeded order, and `max_batches` / `time_limit_s` count both parts together.
    """
    from tqdm.auto import tqdm

    device = next(target.parameters()).device
    sampled = sampled or [False] * len(prompt_ids)
    batches = [(b, flag) for flag in (True, False)
               for b in _batches([i for i, s in enumerate(sampled) if s == flag], prompt_ids, batch_size, seed)]
    if max_batches is not None:
        batches = batches[:max_batches]  # a fixed, seeded, length-balanced subset: reproducible, unlike a time limit
    if device.type == "cpu" and batches:
        check_cache_fits(target, max(len(b) * (max(len(prompt_ids[i]) for i in b) + max_new_tokens)
                                     for b, _flag in batches), batch_size)
    stops = torch.tensor(sorted(set(stop_ids)), device=device)
    out: list[list[int] | None] = [None] * len(prompt_ids)
    start = time.perf_counter()
    bar = tqdm(batches, desc="generate", unit="batch", disable=not progress, dynamic_ncols=True)
    for b, (batch, sample) in enumerate(bar):
        if time_limit_s is not None and time.perf_counter() - start > time_limit_s:
            bar.write(f"[dspark] generation time limit {time_limit_s:.0f}s reached")
            break
        width = max(len(prompt_ids[i]) for i in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, i in enumerate(batch):
            p = prompt_ids[i]
            ids[r, width - len(p):] = torch.tensor(p)
            mask[r, width - len(p):] = 1
        draw = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if sample else dict(do_sample=False)
        # fork_rng leaves the caller's RNG as it was; a seed per (seed, batch) makes the draws reproducible
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            if sample:
                torch.manual_seed(seed * 1_000_003 + b)
            gen = target.generate(
                ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new_tokens, **draw,
                eos_token_id=list(stop_ids), pad_token_id=pad_id,
            )[:, width:]
        hit = torch.isin(gen, stops)
        first = torch.where(hit.any(1), hit.float().argmax(1) + 1, torch.full_like(hit[:, 0], gen.shape[1], dtype=torch.long))
        for r, i in enumerate(batch):
            out[i] = gen[r, : int(first[r])].tolist()
    bar.close()
    return out


def kv_bytes_per_token(target) -> int:
    """The target's K and V bytes per cached token (every layer), from its HF config."""
    c = target.config
    heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return 2 * c.num_hidden_layers * heads * head_dim * next(target.parameters()).element_size()


def available_memory() -> int:
    """Bytes of memory this machine can still hand out (Linux MemAvailable; physical free pages elsewhere)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_cache_fits(target, tokens: int, batch_size: int) -> None:
    """On the CPU, a generation batch whose KV cache does not fit in memory is killed by the kernel without a word:
    refuse it first, naming the setting that sizes it."""
    need = tokens * kv_bytes_per_token(target)
    free = available_memory()
    if need > free:
        raise ValueError(
            f"data.gen_batch_size={batch_size}: the largest generation batch's KV cache needs {need / 2**30:.1f} GiB "
            f"on the CPU and {free / 2**30:.1f} GiB are available; lower data.gen_batch_size (e.g. 32) or generate "
            "on a GPU (target.device=cuda)")


def build_sequences(prompts: list[dict], prompt_ids: list[list[int]], responses) -> list[Sequence]:
    seqs = []
    for p, ids, resp in zip(prompts, prompt_ids, responses):
        if resp:  # None (not generated) or empty
            seqs.append(Sequence(p["source"], torch.tensor(ids + resp, dtype=torch.long), len(ids),
                                 p.get("sampled", False)))
    return seqs


def save_sequences(path, seqs: list[Sequence], meta: dict) -> None:
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    torch.save({"meta": meta, "sequences": [(s.source, s.ids, s.prompt_len, s.sampled) for s in seqs]}, tmp)
    tmp.replace(path)


def load_sequences(path) -> tuple[list[Sequence], dict]:
    d = load_torch(path, "the training data")
    # older data.pt files hold (source, ids, prompt_len): greedy responses only
    return [Sequence(src, ids, int(p), bool(s and s[0])) for src, ids, p, *s in d["sequences"]], d["meta"]


def data_summary(seqs: list[Sequence]) -> dict:
    by = {}
    for s in seqs:
        e = by.setdefault(s.source, {"sequences": 0, "sampled": 0, "prompt_tokens": 0, "response_tokens": 0})
        e["sequences"] += 1
        e["sampled"] += s.sampled
        e["prompt_tokens"] += s.prompt_len
        e["response_tokens"] += s.ids.numel() - s.prompt_len
    total = {k: sum(e[k] for e in by.values()) for k in ("sequences", "sampled", "prompt_tokens", "response_tokens")}
    return {"by_source": by, "total": total}
