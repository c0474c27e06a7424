"""Two writers never share a results folder: the second sweep is refused naming the first; a lock left by a process
that is gone is taken over with a message."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from flashtree.results import lock

from .helpers import TINY, run_app


@pytest.fixture
def live_pid():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def write_lock(folder, pid):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / lock.LOCK).write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))


def test_a_second_sweep_into_a_busy_directory_is_refused_before_any_job(tmp_path, live_pid):
    sweep = tmp_path / "sweep"
    write_lock(sweep, live_pid)
    proc = run_app("sweep.py", ["--multirun", *TINY, "tree.n=1,4", f"hydra.sweep.dir={sweep}"], cwd=tmp_path,
                   check=False)
    assert proc.returncode == 2
    assert f"{sweep} is being written by another flashtree process (pid {live_pid} on" in proc.stderr
    assert not list(sweep.rglob("summary.json"))


def test_a_second_single_run_into_a_busy_directory_is_refused(tmp_path, live_pid):
    write_lock(tmp_path / "run", live_pid)
    proc = run_app("sweep.py", [*TINY, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, check=False)
    assert proc.returncode == 2 and f"(pid {live_pid} on" in proc.stderr
    assert not (tmp_path / "run" / "summary.json").exists()


def test_a_stale_lock_is_taken_over_and_released(tmp_path, capsys):
    gone = dead_pid()
    write_lock(tmp_path, gone)
    with lock.holding(tmp_path):
        assert json.loads((tmp_path / lock.LOCK).read_text())["pid"] != gone
        with lock.holding(tmp_path):  # the holder may take it again
            pass
        assert (tmp_path / lock.LOCK).exists()
    assert f"left by pid {gone}, which is gone; taking it over" in capsys.readouterr().out
    assert not (tmp_path / lock.LOCK).exists()


def test_a_sweep_releases_its_lock(tmp_path):
    sweep = tmp_path / "sweep"
    run_app("sweep.py", ["--multirun", *TINY, "logger.wandb.mode=disabled", "tree.n=1", f"hydra.sweep.dir={sweep}"],
            cwd=tmp_path)
    assert (sweep / "summary.parquet").is_file() and not (sweep / lock.LOCK).exists()
