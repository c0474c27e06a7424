"""What a run records about where and how it ran (summary.json: `versions`, `machine`, `git`), so that a tokens/s
figure can be told apart from the load of the machine that measured it."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

PACKAGES = ("flashtree", "torch", "triton", "sglang", "transformers", "numpy", "scipy", "hydra-core", "wandb",
            "flashmap")


def versions() -> dict:
    """Python and every installed package of PACKAGES (a package that is not installed, e.g. sglang on a CPU
    machine, is left out)."""
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in PACKAGES:
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    """The host as a run sees it now: CPU model and cores, torch's thread count, GPU model (None on CPU), load
    average over 1 / 5 / 15 minutes."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "host": platform.node(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "gpu": gpu,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def git_commit() -> dict:
    """Commit (and whether the tree is dirty) of the flashtree checkout, when it is one."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if commit.returncode != 0:
            return {"commit": None}
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True, timeout=10)
        return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None}
