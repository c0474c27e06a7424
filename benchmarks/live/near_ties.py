"""How close a call the target's greedy choice was where a live float32 server first left no-speculation's output.

    python benchmarks/live/near_ties.py benchmarks/data/live/results-2026-11-30-smollm2-run4/identity_results.json

Replays SmolLM2-135M (float32, CPU, Hugging Face's forward) greedily on the identity check's prompts (held-out GSM8K,
the live script's encoding) and prints, at each first mismatch the results file lists, the gap between the target's
top two logits and that gap's rank among all steps of all prompts. A gap among the smallest of thousands says the
mismatch is a float32 near-tie flipped by another kernel's summation order, not a wrong commit. The replay runs other
kernels than the server (CPU matmuls), so its own trajectory can leave the server's at such a tie; the first steps
before the first mismatch are what it speaks for.
"""

from __future__ import annotations

import argparse
import json

import torch
from tqdm import tqdm

from flashtree.datasets import encode_prompts, load_prompts
from flashtree.models import SMOLLM2, load_target


def greedy_gaps(model, ids: list[int], new_tokens: int, eos: int | None) -> list[float]:
    """top-1 minus top-2 logit of each greedy step."""
    out = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False, output_logits=True,
                         return_dict_in_generate=True, eos_token_id=eos, pad_token_id=eos)
    gaps = []
    for step in out.logits:
        top = step[0].float().topk(2).values
        gaps.append(float(top[0] - top[1]))
    return gaps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("identity_results")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: the results file's")
    a = ap.parse_args()
    res = json.load(open(a.identity_results))
    n, new_tokens = res["prompts"], a.max_new_tokens or res["max_new_tokens"]
    model, tok = load_target(SMOLLM2, dtype=torch.float32)
    prompts = encode_prompts(tok, load_prompts("gsm8k", split="second_half")[:n])
    torch.manual_seed(0)
    gaps = [greedy_gaps(model, p, new_tokens, tok.eos_token_id) for p in tqdm(prompts, desc="greedy replay")]
    flat = sorted(g for row in gaps for g in row)
    print(f"{len(flat)} steps; median gap {flat[len(flat) // 2]:.3f}; smallest {', '.join(f'{g:.2e}' for g in flat[:8])}")
    seen = set()
    for tag, srv in res["servers"].items():
        for prompt, token in srv.get("first_mismatches", []):
            if (prompt, token) in seen:
                continue
            seen.add((prompt, token))
            if token >= len(gaps[prompt]):
                print(f"({prompt}, {token}): the replay stopped at {len(gaps[prompt])} tokens")
                continue
            g = gaps[prompt][token]
            rank = sum(x < g for x in flat) + 1
            print(f"({prompt}, {token}) first differs on {tag}: top-2 gap {g:.2e}, rank {rank} of {len(flat)}")


if __name__ == "__main__":
    main()
