"""The main job's live check that trees are lossless: the engine with trees (N = 8, W = 16, the default drafter)
against the target's own greedy `generate`, token for token, on held-out GSM8K prompts (CPU, real model).

    python -m flashtree.engine.identity_check [--target smollm2-135m] [--prompts 2] [--new-tokens 32]

Exit status 1 when any prompt differs.
"""

from __future__ import annotations

import argparse
import sys

import torch


def main(argv: list[str] | None = None) -> int:
    from flashtree.datasets import encode_prompts, load_prompts
    from flashtree.drafters import load_drafter
    from flashtree.engine import tree_generate
    from flashtree.engine.stopping import stop_ids
    from flashtree.models import load_target

    parser = argparse.ArgumentParser(prog="python -m flashtree.engine.identity_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    model, tok = load_target(args.target)
    stop = stop_ids(model, tok)
    prompts = encode_prompts(tok, load_prompts("gsm8k", limit=args.prompts, split="second_half"))
    same = accepted = steps = 0
    for i, ids in enumerate(prompts):
        x = torch.tensor([ids])
        ref = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=args.new_tokens, do_sample=False,
                             eos_token_id=stop, pad_token_id=stop[0])[0].tolist()
        res = tree_generate(model, load_drafter("default", model), [ids], n=8, width=16,
                            max_new_tokens=args.new_tokens, stop_token_ids=stop)
        got = res.sequences[0].tolist()[: len(ref)]
        ok = got == ref
        same += ok
        accepted += sum(s.accept_len for s in res.steps)
        steps += len(res.steps)
        print(f"[identity] prompt {i}: {'identical' if ok else 'DIFFERS'} to greedy generate "
              f"({len(ref) - len(ids)} tokens, τ {res.acceptance_length:.2f})", flush=True)
    print(f"[identity] {same}/{len(prompts)} prompts identical token for token (trees N=8, W=16; "
          f"{accepted} draft tokens accepted over {steps} steps)")
    return 0 if same == len(prompts) else 1


if __name__ == "__main__":
    sys.exit(main())
