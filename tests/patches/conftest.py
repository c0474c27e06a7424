"""tests/patches run inside a per-release sglang venv (scripts/test_patches.sh); see sglang_cpu.py for the CPU recipe."""

from __future__ import annotations

import os
import sys

import pytest

import importlib.util

sys.path.insert(0, os.path.dirname(__file__))

if importlib.util.find_spec("sglang") is None:
    # Outside a .venv-sglang-* environment (e.g. the main test run) these tests cannot import sglang; they run under
    # scripts/test_patches.sh instead, once per supported release.
    collect_ignore_glob = ["test_*.py"]
else:
    import sglang_cpu  # noqa: E402

    sglang_cpu.prepare()

import flashtree.patches as patches  # noqa: E402
from flashtree.patches import installer  # noqa: E402


@pytest.fixture(autouse=True)
def _clean_env_and_patches(monkeypatch):
    for name in list(os.environ):
        if name.startswith("FLASHTREE_"):
            monkeypatch.delenv(name)
    yield
    patches.uninstall()
    assert installer.installed_keys() == []


@pytest.fixture(scope="session")
def sglang_release():
    from flashtree.patches.adapters import installed_version

    return installed_version()


@pytest.fixture
def tp_rank0():
    from sglang.srt.runtime_context import get_parallel

    with get_parallel().override(tp_rank=0):
        yield
