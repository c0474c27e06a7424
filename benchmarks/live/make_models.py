"""Build the tiny target and its DSPARK draft for the live H200 check (issue 8), plus the prompts the draft predicts.

usage: python make_models.py OUT_DIR TOKENIZER_DIR [--device cuda|cpu]

* target: the example's tiny random Llama (4 layers, hidden 256, vocab 32000, same seed), saved in float32, with its
  LM head scaled by HEAD_SCALE. The unscaled random model's next-token distribution is nearly uniform over 32000
  tokens (perplexity ~29000 at temperature 0.7, greedy margins ~0.01), which leaves a sampling test no power and
  greedy ties at the mercy of kernel rounding; scaled, perplexity is ~2-80 and greedy margins ~0.1-10.
* prompts: N_PROMPTS seeded random prompts (BOS + 7 tokens) and the target's float32 greedy continuation of each.
* draft: a DSPARK checkpoint in sglang 0.5.17's layout (DSparkDraftModel, Qwen3 dims of the target, one layer) whose
  Markov head is a bigram table read off those continuations: for each previous token, bias B_RIGHT on the token that
  followed it most often and B_DECOY on a decoy. The draft's final norm is scaled down so the bias decides: a greedy
  (chain) draft proposes the table's token; N draws at temperature 1 give the table's token ~73% and the decoy ~27% of
  the time, so trees branch and the table's branch is accepted wherever the table is right.
Writes OUT_DIR/{target,draft}/ and OUT_DIR/prompts.json.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections import Counter, defaultdict

import torch

HEAD_SCALE = 10.0
N_PROMPTS, PROMPT_LEN, CONT = 64, 8, 48
GAMMA = 7  # block size; the server's --speculative-num-draft-tokens is GAMMA + 1
TARGET_LAYER_IDS = [0, 2]  # Llama captures before layer id + 1: ids <= num_layers - 2
B_RIGHT, B_DECOY = 40.0, 39.0
MAX_PREV = 256  # bigram rows kept (two Markov slots each)
MASK_ID = 31999


def build_target(out: str, tokdir: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=32000, max_position_embeddings=2048, bos_token_id=1,
                      eos_token_id=2, pad_token_id=0, tie_word_embeddings=False, rms_norm_eps=1e-5)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).float()  # the example's weights, exactly, then float32
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SCALE)
    model.config.torch_dtype = "float32"
    model.save_pretrained(out)
    for f in os.listdir(tokdir):
        shutil.copy(os.path.join(tokdir, f), out)
    return model, cfg


def greedy_continuations(model, prompts, device):
    model = model.to(device).eval()
    ids = torch.tensor(prompts, device=device)
    with torch.no_grad():
        for _ in range(CONT):
            nxt = model(ids).logits[:, -1].float().argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
    return ids[:, PROMPT_LEN:].tolist()


def build_draft(out: str, cfg, prompts, conts):
    h, v, layers = cfg.hidden_size, cfg.vocab_size, cfg.num_hidden_layers
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    hd, inter = h // nh, cfg.intermediate_size
    follow = defaultdict(Counter)
    for p, c in zip(prompts, conts):
        seq = p[-1:] + c
        for a, b in zip(seq[:-1], seq[1:]):
            follow[a][b] += 1
    prevs = sorted(follow, key=lambda a: -sum(follow[a].values()))[:MAX_PREV]
    rank = 2 * len(prevs)
    w1 = torch.zeros(v, rank)
    w2 = torch.zeros(v, rank)
    table = {}
    for slot, a in enumerate(prevs):
        right = follow[a].most_common(1)[0][0]
        decoy = (right * 7 + 13) % v
        if decoy == right:
            decoy = (right + 1) % v
        table[a] = (right, decoy)
        w1[a, 2 * slot] = B_RIGHT ** 0.5
        w2[right, 2 * slot] = B_RIGHT ** 0.5
        w1[a, 2 * slot + 1] = B_DECOY ** 0.5
        w2[decoy, 2 * slot + 1] = B_DECOY ** 0.5
    g = torch.Generator().manual_seed(1)

    def rnd(*shape):
        return torch.randn(*shape, generator=g) * 0.02

    t = {}
    p = "layers.0."
    t[p + "input_layernorm.weight"] = torch.ones(h)
    t[p + "post_attention_layernorm.weight"] = torch.ones(h)
    t[p + "self_attn.q_proj.weight"] = rnd(nh * hd, h)
    t[p + "self_attn.k_proj.weight"] = rnd(nkv * hd, h)
    t[p + "self_attn.v_proj.weight"] = rnd(nkv * hd, h)
    t[p + "self_attn.o_proj.weight"] = rnd(h, nh * hd)
    t[p + "self_attn.q_norm.weight"] = torch.ones(hd)
    t[p + "self_attn.k_norm.weight"] = torch.ones(hd)
    t[p + "mlp.gate_proj.weight"] = rnd(inter, h)
    t[p + "mlp.up_proj.weight"] = rnd(inter, h)
    t[p + "mlp.down_proj.weight"] = rnd(h, inter)
    t["norm.weight"] = torch.full((h,), 0.01)  # base logits ~0: the Markov bias decides
    t["fc.weight"] = rnd(h, len(TARGET_LAYER_IDS) * h)
    t["hidden_norm.weight"] = torch.ones(h)
    t["markov_head.markov_w1.weight"] = w1
    t["markov_head.markov_w2.weight"] = w2
    t["confidence_head.proj.weight"] = rnd(1, h + rank)
    t["confidence_head.proj.bias"] = torch.zeros(1)
    config = {
        "architectures": ["DSparkDraftModel"], "model_type": "qwen3",
        "hidden_size": h, "intermediate_size": inter, "num_hidden_layers": 1,
        "num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": hd,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "vocab_size": v, "max_position_embeddings": 4096,
        "rope_theta": 10000.0, "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "float32",
        "bos_token_id": 1, "eos_token_id": 2, "block_size": GAMMA, "num_target_layers": layers,
        "dflash_config": {"target_layer_ids": TARGET_LAYER_IDS, "mask_token_id": MASK_ID, "block_size": GAMMA,
                          "num_target_layers": layers},
        "markov_rank": rank, "markov_head_type": "vanilla",
        "enable_confidence_head": True, "confidence_head_with_markov": True,
    }
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    from safetensors.torch import save_file

    save_file({k: x.contiguous().float() for k, x in t.items()}, os.path.join(out, "model.safetensors"),
              metadata={"format": "pt"})
    return table


def main():
    out, tokdir = sys.argv[1], sys.argv[2]
    device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else ("cuda" if torch.cuda.is_available() else "cpu")
    os.makedirs(out, exist_ok=True)
    model, cfg = build_target(os.path.join(out, "target"), tokdir)
    g = torch.Generator().manual_seed(7)
    prompts = [[1] + torch.randint(3, cfg.vocab_size - 1, (PROMPT_LEN - 1,), generator=g).tolist() for _ in range(N_PROMPTS)]
    conts = greedy_continuations(model, prompts, device)
    table = build_draft(os.path.join(out, "draft"), cfg, prompts, conts)
    hits = sum(table.get(a, (None,))[0] == b for c, p in zip(conts, prompts) for a, b in zip((p[-1:] + c)[:-1], c))
    total = sum(len(c) for c in conts)
    with open(os.path.join(out, "prompts.json"), "w") as f:
        json.dump({"prompts": prompts, "greedy_hf_fp32": conts, "head_scale": HEAD_SCALE, "gamma": GAMMA,
                   "bigram_rows": len(table), "table_hit_rate": hits / total}, f)
    print(f"models in {out}: {len(prompts)} prompts, bigram rows {len(table)}, table predicts {hits}/{total} "
          f"continuation tokens")


if __name__ == "__main__":
    main()
