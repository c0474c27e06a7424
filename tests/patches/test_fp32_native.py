"""The live float32 harness plugin (benchmarks/live/fp32_native.py) against sglang's real RMSNorm."""

from __future__ import annotations

import harness_plugins
import torch


def test_native_rmsnorm_only_when_asked(monkeypatch):
    from sglang.srt.layers.layernorm import RMSNorm

    original = RMSNorm.__dict__["forward_cuda"]
    plugin = harness_plugins.load("fp32_native")
    try:
        monkeypatch.delenv("FT_FP32_NATIVE", raising=False)
        plugin.register()
        assert RMSNorm.__dict__["forward_cuda"] is original
        monkeypatch.setenv("FT_FP32_NATIVE", "1")
        plugin.register()
        assert RMSNorm.forward_cuda is RMSNorm.forward_native
        norm = RMSNorm(8, eps=1e-6)
        x = torch.randn(3, 8, dtype=torch.float32)
        expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        torch.testing.assert_close(norm.forward_cuda(x), expected)  # float32 in, float32 math out
    finally:
        RMSNorm.forward_cuda = original
