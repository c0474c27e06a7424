"""Harness plugin of the live float32 runs (not part of flashtree; installed next to it by scripts/live_h200.sh).

sglang 0.5.17's CUDA RMSNorm calls sgl_kernel's rmsnorm, which takes fp16/bf16 only, so a `--dtype float32` server
stops at its first layer. With FT_FP32_NATIVE=1 in a server's environment this plugin points RMSNorm's CUDA path at
sglang's own forward_native (same signature, float32 math) before the model is built. The live script sets it for
every server of a run alike (plain, chain and tree), so the greedy comparisons stay like for like.
"""

import os


def register() -> None:
    if os.environ.get("FT_FP32_NATIVE") != "1":
        return
    from sglang.srt.layers.layernorm import RMSNorm

    RMSNorm.forward_cuda = RMSNorm.forward_native
