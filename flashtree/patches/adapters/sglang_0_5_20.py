"""sglang 0.5.20: the release the public peer (flashmap 0.1.0) targets."""

from __future__ import annotations

from .base import CHAIN_ERA_PROBES, COMMON_PROBES, LIVE_LENS_PROBES, TRITON, SglangAdapter
from .probe import Has


class Adapter(SglangAdapter):
    release = "0.5.20"
    has_shared_kv = True
    probes = COMMON_PROBES + CHAIN_ERA_PROBES + LIVE_LENS_PROBES + (
        Has(f"{TRITON}:_should_use_verify_shared_kv"),
        Has("sglang.srt.model_executor.model_runner:ModelRunner"),
    )
