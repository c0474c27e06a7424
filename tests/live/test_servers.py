"""The server manager against stand-in servers: start on free loopback ports, health-check, a clear error naming the
server (with its log's tail) when one dies or is not up in time, and every server stopped on leaving, Ctrl-C too."""

from __future__ import annotations

import os
import time

import pytest

from flashtree.live.http_json import healthy
from flashtree.live.servers import ServerManager, ServerStartError

from .helpers import fake


def gone(proc) -> bool:
    return proc.poll() is not None


def test_start_health_and_stop_everything(tmp_path):
    with ServerManager(tmp_path / "logs") as m:
        a, b = m.start(fake("alpha", "plain")), m.start(fake("beta", "tree", "--start-delay", "1.5"))
        assert m.start(fake("alpha", "plain")) is a  # one process per instance
        assert a.port != b.port
        t = time.monotonic()
        m.wait_healthy(30)
        assert time.monotonic() - t >= 1.0  # beta answered /health only after its delay
        assert healthy(a.port) and healthy(b.port)
        m.stop("alpha")
        assert gone(a.process) and not healthy(a.port) and healthy(b.port)
    assert gone(b.process) and m.running == {}
    assert "fake sglang server tree" in (tmp_path / "logs" / "server_beta.log").read_text()


def test_servers_get_their_own_rendezvous_ports(tmp_path):
    """Each server is handed its HTTP port and sglang's rendezvous port (--nccl-port), none shared with another
    server of the run: sglang's own pick raced a neighbour's start (EADDRINUSE, live run 45). The stand-ins hold
    their rendezvous port while serving, so a shared one would fail a start."""
    with ServerManager(tmp_path, stagger_s=0) as m:
        runs = [m.start(fake(f"s{i}", "plain")) for i in range(4)]
        m.wait_healthy(30)
        ports = [p for r in runs for p in (r.port, r.nccl_port)]
        assert len(set(ports)) == 8 and set(ports) <= m.ports
        assert all(f"--nccl-port {r.nccl_port}" in " ".join(r.process.args) for r in runs)


def test_timeout_names_the_server_and_quotes_its_log(tmp_path):
    with pytest.raises(ServerStartError) as err:
        with ServerManager(tmp_path, poll_s=0.2) as m:
            up, slow = m.start(fake("up", "plain")), m.start(fake("slow", "plain", "--start-delay", "600"))
            m.wait_healthy(3)
    msg = str(err.value)
    assert msg.startswith("server slow not healthy after 3 s")
    assert "fake_server.py plain --start-delay 600 --host 127.0.0.1 --port" in msg
    assert "server_slow.log" in msg and "fake sglang server plain on 127.0.0.1" in msg
    assert gone(up.process) and gone(slow.process)


def test_a_server_that_dies_while_starting(tmp_path):
    with pytest.raises(ServerStartError, match="server broken exited with status 3 while starting") as err:
        with ServerManager(tmp_path, poll_s=0.2) as m:
            m.start(fake("broken", "die"))
            m.wait_healthy(30)
    assert "told to die" in str(err.value)


def test_ctrl_c_stops_every_server(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with ServerManager(tmp_path) as m:
            procs = [m.start(fake(f"s{i}", "plain")).process for i in range(2)]
            m.wait_healthy(30)
            raise KeyboardInterrupt
    assert all(gone(p) for p in procs)


def test_servers_stop_together(tmp_path):
    """Leaving stops every server at once: three that take 2 s each to shut down are gone in well under 6 s (a run
    stopped at its time limit keeps its grace period for writing its tables)."""
    with ServerManager(tmp_path) as m:
        procs = [m.start(fake(f"s{i}", "plain", "--stop-delay", "2")).process for i in range(3)]
        m.wait_healthy(30)
        t = time.monotonic()
    assert all(gone(p) for p in procs) and time.monotonic() - t < 4.5


def test_server_environment_drops_inherited_toggles(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHTREE_TREE_N", "8")
    monkeypatch.setenv("KEEP_ME", "1")
    inst = fake("t", "plain")
    inst.env.update(FLASHTREE_SPLITKV_VERIFY="1")
    env = ServerManager(tmp_path, work_dir=tmp_path / "work").environment(inst)
    assert "FLASHTREE_TREE_N" not in env and env["FLASHTREE_SPLITKV_VERIFY"] == "1" and env["KEEP_ME"] == "1"
    assert env["TVM_FFI_CACHE_DIR"] == str(tmp_path / "work" / "tvmffi" / "t") and os.path.isdir(env["TVM_FFI_CACHE_DIR"])


def test_a_server_whose_toggles_sglang_plugins_would_drop_is_refused(tmp_path, monkeypatch):
    """sglang never loads an excluded plugin, so a tree server under an SGLANG_PLUGINS that leaves flashtree out would
    come up as DSPARK's chain with no word: the manager refuses to start it, naming both variables."""
    monkeypatch.setenv("SGLANG_PLUGINS", "other")
    tree = fake("t", "plain")
    tree.env.update(FLASHTREE_TREE_N="8")
    manager = ServerManager(tmp_path, work_dir=tmp_path / "work")
    with pytest.raises(SystemExit, match=r"FLASHTREE_TREE_N set, but SGLANG_PLUGINS='other' leaves out the flashtree "
                                         r"plugin.*add flashtree to SGLANG_PLUGINS"):
        manager.start(tree)
    assert manager.running == {}
    assert manager.environment(fake("p", "plain"))["SGLANG_PLUGINS"] == "other"  # no toggles: nothing to refuse
    monkeypatch.setenv("SGLANG_PLUGINS", "other,flashtree")
    assert manager.environment(tree)["FLASHTREE_TREE_N"] == "8"
