"""Checks of a trained DSPARK drafter in the reference engine.

    python -m flashtree.dspark.evaluate identity --draft results/dspark-smollm2/draft --prompts 20 --device cpu
        the engine's greedy output with this drafter (N, W, draft temperature) against the target's own greedy
        decoding (`generate`), prompt by prompt, on the held-out GSM8K half; writes a JSON report.
    python -m flashtree.dspark.evaluate grid outputs/replay/<name>/gsm8k
        the τ grid over N and W and the per-depth acceptance of a replay run (experiments/replay.py), as Markdown.

τ grids come from experiments/replay.py (record once, replay any N <= N_max and W at temperature 0).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def engine_identity(target, drafter, prompts: list[list[int]], *, n: int, width: int, max_new_tokens: int,
                    stop_ids, seed: int = 0, progress: bool = True) -> dict:
    """Run the engine (greedy verify) on each prompt and compare with the target's own greedy decoding."""
    from tqdm.auto import tqdm

    from flashtree.engine import tree_generate
    from flashtree.engine.target import greedy_reference

    device = next(target.parameters()).device
    rows, steps, committed = [], 0, 0
    t_engine = t_ref = 0.0
    for i, ids in enumerate(tqdm(prompts, desc="identity", unit="prompt", disable=not progress)):
        x = torch.tensor([ids], dtype=torch.long, device=device)
        t0 = time.perf_counter()
        ref = greedy_reference(target, x, max_new_tokens, list(stop_ids) or None)[0]
        t1 = time.perf_counter()
        res = tree_generate(target, drafter, x, n=n, width=width, max_new_tokens=max_new_tokens,
                            generator=torch.Generator(device=device).manual_seed(seed * 1_000_003 + i),
                            stop_token_ids=list(stop_ids) or None)
        t2 = time.perf_counter()
        t_ref, t_engine = t_ref + t1 - t0, t_engine + t2 - t1
        out = res.sequences[0, : len(ids) + res.new_tokens[0]]
        ref = ref[: len(ids) + max_new_tokens]
        # both stop at the first stop token or at max_new_tokens (batch of one: generate adds no padding)
        same = out.numel() == ref.numel() and torch.equal(out, ref)
        mismatch = None
        if not same:
            m = min(out.numel(), ref.numel())
            diff = (out[:m] != ref[:m]).nonzero()
            mismatch = int(diff[0]) if diff.numel() else m
        rows.append({"prompt": i, "prompt_tokens": len(ids), "new_tokens": int(res.new_tokens[0]),
                     "identical": bool(same), "first_mismatch": mismatch, "tau": res.acceptance_length})
        steps += len(res.steps)
        committed += sum(s.accept_len + 1 for s in res.steps)
    return {
        "prompts": len(rows),
        "identical": sum(r["identical"] for r in rows),
        "tau": committed / max(steps, 1),
        "engine_time_s": t_engine,
        "reference_time_s": t_ref,
        "rows": rows,
    }


def grid_markdown(run_dir) -> str:
    """The collected replay table of `run_dir` (experiments/replay.py output) as Markdown: τ over N x W, and the
    per-depth acceptance of each configuration."""
    from flashtree.results.collect import collect

    df = collect(Path(run_dir))
    ns = sorted(df["tree.n"].unique())
    ws = sorted(df["tree.width"].unique())
    lines = ["| N \\ W | " + " | ".join(str(w) for w in ws) + " |", "|---" * (len(ws) + 1) + "|"]
    for n in ns:
        cells = []
        for w in ws:
            row = df[(df["tree.n"] == n) & (df["tree.width"] == w)]
            cells.append(f"{row['tau'].iloc[0]:.3f}" if len(row) else "")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += ["", "| N | W | τ (95% CI) | τ oracle | acceptance per depth 1..K |", "|---|---|---|---|---|"]
    for _, r in df.sort_values(["tree.n", "tree.width"]).iterrows():
        acc = " ".join("-" if a is None else f"{a:.2f}" for a in r["accept_per_depth"])
        lines.append(f"| {r['tree.n']} | {r['tree.width']} | {r['tau']:.3f} ({r['tau_ci_lo']:.3f}-{r['tau_ci_hi']:.3f}) "
                     f"| {r['tau_oracle']:.3f} | {acc} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashtree.dspark.evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    ident = sub.add_parser("identity", help="engine greedy output == the target's greedy decoding")
    ident.add_argument("--draft", required=True)
    ident.add_argument("--target", default="smollm2-135m")
    ident.add_argument("--device", default="cpu")
    ident.add_argument("--prompts", type=int, default=20)
    ident.add_argument("--offset", type=int, default=0, help="first held-out GSM8K prompt used")
    ident.add_argument("--max-new-tokens", type=int, default=64)
    ident.add_argument("--n", type=int, default=8)
    ident.add_argument("--width", type=int, default=8)
    ident.add_argument("--temperature", type=float, default=1.0, help="draft temperature of the N candidates")
    ident.add_argument("--out", default=None)
    grid = sub.add_parser("grid", help="Markdown tables of a replay run directory")
    grid.add_argument("run_dir")
    args = parser.parse_args(argv)

    if args.cmd == "grid":
        print(grid_markdown(args.run_dir))
        return 0

    from flashtree.datasets import encode_prompts, load_prompts
    from flashtree.drafters import load_drafter
    from flashtree.engine.stopping import stop_ids
    from flashtree.models import load_target

    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    target, tokenizer = load_target(args.target, dtype=torch.float32)
    target = target.to(args.device).eval()
    drafter = load_drafter("dspark", target, path=args.draft, temperature=args.temperature)
    texts = load_prompts("gsm8k", split="second_half")[args.offset : args.offset + args.prompts]
    report = engine_identity(target, drafter, encode_prompts(tokenizer, texts), n=args.n, width=args.width,
                             max_new_tokens=args.max_new_tokens, stop_ids=stop_ids(target, tokenizer))
    report.update({"draft": args.draft, "device": args.device, "dtype": "float32", "n": args.n, "width": args.width,
                   "temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
                   "dataset": f"gsm8k second_half[{args.offset}:{args.offset + args.prompts}]"})
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(f"identical {report['identical']}/{report['prompts']}, tau {report['tau']:.3f}, "
          f"engine {report['engine_time_s']:.1f}s, reference {report['reference_time_s']:.1f}s")
    return 0 if report["identical"] == report["prompts"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
