"""One writer per results folder: a sweep, a replay or a single run holds `<folder>/.flashtree.lock` (its pid and
host) while it writes there, so two processes never compute the same runs twice or leave a run whose summary.json
and steps.parquet come from different writers. A second writer is refused naming the holder; a lock left behind by a
process of this host that is gone is taken over, with a message.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

LOCK = ".flashtree.lock"


class FolderBusy(RuntimeError):
    """Another live process writes into the folder."""


def _me() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _holder(path: Path) -> dict | None:
    """The lock's {pid, host}; None while its writer has created but not yet filled it (or it is garbage)."""
    try:
        holder = json.loads(path.read_text())
        return holder if isinstance(holder, dict) and {"pid", "host"} <= holder.keys() else None
    except (FileNotFoundError, ValueError):
        return None


def acquire(folder) -> Path | None:
    """Take `folder`'s lock (released at exit at the latest) and return it; None when this process holds it already.
    FolderBusy naming the holder when a live process has it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path, me, waits = folder / LOCK, _me(), 0
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            holder = _holder(path)
            if holder is None and waits < 50:
                waits += 1
                time.sleep(0.02)  # its writer is filling it in right now
                continue
            if holder is not None and {k: holder[k] for k in ("pid", "host")} == me:
                return None
            if holder is not None and holder["host"] == me["host"] and not _alive(int(holder["pid"])):
                print(f"flashtree: {path} was left by pid {holder['pid']}, which is gone; taking it over")
                path.unlink(missing_ok=True)
                continue
            who = f"pid {holder['pid']} on {holder['host']}" if holder else "an unknown process (unreadable lock)"
            raise FolderBusy(f"{folder} is being written by another flashtree process ({who}; lock file {path}); "
                             "wait for it to finish or write elsewhere (another name=...); delete the lock file only "
                             "if that process is gone") from None
    with os.fdopen(fd, "w") as f:
        json.dump({**me, "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, f)
    atexit.register(release, path)
    return path


def acquire_or_exit(folder) -> Path | None:
    """`acquire`, or the refusal on stderr and exit status 2 (what the apps do with a second writer)."""
    try:
        return acquire(folder)
    except FolderBusy as err:
        print(f"flashtree: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def release(path: Path) -> None:
    """Remove the lock if this process holds it."""
    holder = _holder(Path(path))
    if holder is not None and {k: holder[k] for k in ("pid", "host")} == _me():
        Path(path).unlink(missing_ok=True)


@contextmanager
def holding(folder):
    """`folder`'s lock for the block (kept if the process held it before); a second writer exits (`acquire_or_exit`)."""
    path = acquire_or_exit(folder)
    try:
        yield
    finally:
        if path is not None:
            release(path)
