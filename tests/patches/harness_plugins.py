"""Loads the live runs' harness-only sglang plugins (benchmarks/live/*.py) as modules, for their tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path

LIVE = Path(__file__).resolve().parents[2] / "benchmarks" / "live"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, LIVE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
