"""Shared by tests/live: the presets composed by Hydra, stand-in servers as instances."""

from __future__ import annotations

import sys
from pathlib import Path

from flashtree.live.commands import Instance

ROOT = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).with_name("fake_server.py")


def compose(*overrides: str):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from flashtree.live.config import register

    register()
    with initialize_config_dir(config_dir=str(ROOT / "flashtree" / "configs" / "live"), version_base="1.3"):
        return hydra_compose("live", overrides=list(overrides))


def fake(name: str, mode: str, *args: str) -> Instance:
    """An instance whose process is the stand-in server in `mode`."""
    return Instance(name, name, "bf16", (sys.executable, str(FAKE), mode, *args))
