"""Tokens/s of `tree_generate` against the target's own `generate` on the same prompts, machine and run.

    .venv/bin/python benchmarks/engine_speed.py --target smollm2-135m --prompts 6 --new 64
Greedy; also checks that every tree output equals the plain greedy output.
"""

from __future__ import annotations

import argparse
import time

import torch
from tqdm import tqdm

from flashtree.datasets import encode_prompts, load_prompts
from flashtree.drafters import load_drafter
from flashtree.engine import tree_generate
from flashtree.models import load_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--drafter", default="default")
    ap.add_argument("--datasets", default="gsm8k,humaneval,mtbench")
    ap.add_argument("--prompts", type=int, default=6, help="prompts per dataset")
    ap.add_argument("--new", type=int, default=64, help="new tokens per prompt")
    ap.add_argument("--configs", default="1x4,1x16,4x4,4x16,8x4,8x16", help="NxW pairs")
    args = ap.parse_args()

    torch.manual_seed(0)
    model, tok = load_target(args.target)
    prompts = [p for name in args.datasets.split(",") for p in encode_prompts(tok, load_prompts(name, limit=args.prompts))]
    stop = [tok.eos_token_id] if tok.eos_token_id is not None else None

    t0, refs, plain_tokens = time.perf_counter(), [], 0
    for p in tqdm(prompts, desc="generate"):
        out = model.generate(torch.tensor([p]), max_new_tokens=args.new, do_sample=False)[0]
        refs.append(out)
        plain_tokens += out.numel() - len(p)
    plain = plain_tokens / (time.perf_counter() - t0)
    print(f"{'config':>8} {'tau':>6} {'tok/s':>8} {'vs generate':>11} {'identical':>9}")
    print(f"{'generate':>8} {'':>6} {plain:8.1f} {1.0:11.2f} {'':>9}")
    for cfg in args.configs.split(","):
        n, w = (int(x) for x in cfg.split("x"))
        t0, toks, steps, committed, same = time.perf_counter(), 0, 0, 0, True
        for p, ref in zip(tqdm(prompts, desc=f"tree N={n} W={w}", leave=False), refs):
            res = tree_generate(model, load_drafter(args.drafter, model), [p], n=n, width=w, max_new_tokens=args.new,
                                stop_token_ids=stop)
            toks += res.new_tokens[0]
            steps += len(res.steps)
            committed += sum(s.accept_len + 1 for s in res.steps)
            same &= res.sequences[0].tolist() == ref.tolist()
        rate = toks / (time.perf_counter() - t0)
        print(f"{cfg:>8} {committed / steps:6.2f} {rate:8.1f} {rate / plain:11.2f} {str(same):>9}")


if __name__ == "__main__":
    main()
