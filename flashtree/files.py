"""Reading flashtree's own files (results, training state, checkpoints): a damaged or unreadable file gives one message that names it.

`set_aside` moves a damaged file out of the way (kept, renamed `<name>.damaged`) so that the work it held can be redone
without losing the evidence.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class DamagedFile(RuntimeError):
    """A file flashtree wrote earlier cannot be read back (truncated, corrupt, another format)."""

    def __init__(self, path, what: str, err: BaseException):
        self.path = Path(path)
        super().__init__(f"{what} {self.path} is damaged and cannot be read ({type(err).__name__}: {err})")


def load_torch(path, what: str) -> Any:
    import torch

    try:
        return torch.load(path, weights_only=False, map_location="cpu")
    except FileNotFoundError:
        raise
    except Exception as err:  # noqa: BLE001 - zip, pickle and EOF errors alike mean "damaged"
        raise DamagedFile(path, what, err) from None


def load_json(path, what: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise
    except (ValueError, UnicodeDecodeError) as err:
        raise DamagedFile(path, what, err) from None


def load_safetensors(path, what: str) -> dict:
    from safetensors.torch import load_file

    if not Path(path).is_file():
        raise FileNotFoundError(f"{what} {path} is missing")
    try:
        return load_file(str(path))
    except Exception as err:  # noqa: BLE001 - SafetensorError (header, truncation) names no file
        raise DamagedFile(path, what, err) from None


def set_aside(err: DamagedFile, redo: str) -> Path:
    """Rename the damaged file to `<name>.damaged` and log what happens instead (`redo`)."""
    aside = err.path.with_name(err.path.name + ".damaged")
    os.replace(err.path, aside)
    print(f"flashtree: {err}; kept as {aside}, {redo}")
    return aside
