"""τ of the sampled walks (issue 6): chain rejection sampling against the draft's probabilities vs target-only walks.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/walk_gap.py --out benchmarks/data/walk-gap/walk_gap_cpu.json
SmolLM2-135M (fp32) with a DSPARK draft on held-out GSM8K (second half), one prompt per engine call. Configurations
(W = 9 holds the root and a block of 8; "draft T" is the DSPARK drafter's sampling temperature):
  rejection          N = 1, walk="rejection", the block drawn at draft T (greedy_first=False, return_probs=True)
  rejection-match    the same with draft T = the request's temperature
  target-greedy      N = 1, target-only walk, the greedy block (the engine's default chain)
  target-sampled     N = 1, target-only walk, the block drawn at draft T (the same proposals as `rejection`)
  tree               N = --tree-n, target-only walk, candidate 0 greedy and the others drawn at draft T
τ = tokens committed per verify step (bonus included), pooled over prompts; 95% CIs across prompts
(flashtree.metrics.summarize).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import datetime, timezone

import pandas as pd
import torch

from flashtree import metrics
from flashtree.datasets import encode_prompts, load_prompts
from flashtree.drafters import load_drafter
from flashtree.engine import tree_generate
from flashtree.models import load_target


def configurations(args) -> dict[str, dict]:
    sampled = dict(greedy_first=False)
    return {
        "rejection": dict(n=1, walk="rejection", drafter=dict(temperature=args.draft_temperature, return_probs=True,
                                                              **sampled)),
        "rejection-match": dict(n=1, walk="rejection", drafter=dict(temperature=args.temperature, return_probs=True,
                                                                    **sampled)),
        "target-greedy": dict(n=1, walk="target", drafter=dict(temperature=args.draft_temperature)),
        "target-sampled": dict(n=1, walk="target", drafter=dict(temperature=args.draft_temperature, **sampled)),
        "tree": dict(n=args.tree_n, walk="target", drafter=dict(temperature=args.draft_temperature)),
    }


def run(name, cfg, target, prompts, stop, args) -> dict:
    rows, per_prompt = [], []
    t0 = time.perf_counter()
    for i, ids in enumerate(prompts):
        drafter = load_drafter("dspark", target, path=args.draft, **cfg["drafter"])
        res = tree_generate(target, drafter, [ids], n=cfg["n"], width=args.width, max_new_tokens=args.new,
                            temperature=args.temperature, walk=cfg["walk"], stop_token_ids=stop,
                            generator=torch.Generator().manual_seed(args.seed * 1_000_003 + i))
        rows += metrics.step_rows(res.steps, prompt=i)
        per_prompt.append(dict(prompt=i, prompt_tokens=len(ids), new_tokens=res.new_tokens[0], steps=len(res.steps),
                               wall_time_s=res.wall_time_s))
        print(f"  {name} prompt {i}: {len(res.steps)} steps, tau {res.acceptance_length:.3f}", flush=True)
    summary = metrics.summarize(metrics.steps_frame(rows), pd.DataFrame(per_prompt), k=args.width - 1)
    return dict(config=dict(cfg, width=args.width), summary=summary, prompts=per_prompt,
                time_s=time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default="results/dspark-smollm2/draft", help="DSPARK draft checkpoint folder")
    ap.add_argument("--prompts", type=int, default=16, help="first prompts of held-out GSM8K (second half)")
    ap.add_argument("--new", type=int, default=64, help="new tokens per prompt")
    ap.add_argument("--temperature", type=float, default=0.7, help="the request's (target) temperature")
    ap.add_argument("--draft-temperature", type=float, default=1.0)
    ap.add_argument("--width", type=int, default=9, help="W, the root included")
    ap.add_argument("--tree-n", type=int, default=8, help="N of the `tree` configuration")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--configs", default="rejection,rejection-match,target-greedy,target-sampled,tree")
    ap.add_argument("--out", required=True, help="JSON file to write")
    args = ap.parse_args()

    started = datetime.now(timezone.utc)
    target, tok = load_target(args.target)  # fp32 on CPU
    prompts = encode_prompts(tok, load_prompts("gsm8k", limit=args.prompts, split="second_half"))
    stop = [tok.eos_token_id] if tok.eos_token_id is not None else None
    table = configurations(args)
    results = {}
    for name in args.configs.split(","):
        results[name] = run(name, table[name], target, prompts, stop, args)

    print(f"\n{'config':<16} {'N':>2} {'walk':<9} {'draft T':>7} {'tau':>6} {'95% CI':>13} {'steps':>6} "
          f"{'accept d1':>9}")
    for name, r in results.items():
        c, s = r["config"], r["summary"]
        draft_t = "greedy" if c["drafter"].get("greedy_first", True) and c["n"] == 1 else c["drafter"]["temperature"]
        print(f"{name:<16} {c['n']:>2} {c['walk']:<9} {draft_t:>7} {s['tau']:6.3f} "
              f"{s['tau_ci_lo']:6.3f}-{s['tau_ci_hi']:.3f} {s['steps']:>6} {s['accept_per_depth'][0]:9.3f}")
    meta = dict(args=vars(args), started_utc=started.isoformat(timespec="seconds"),
                finished_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                machine=dict(platform=platform.platform(), processor=platform.processor(), cpus=os.cpu_count(),
                             torch=torch.__version__, torch_threads=torch.get_num_threads()))
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, results=results), f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
