"""The lazy-restore plumbing that needs no CRIU: addresses, the state file, the active markers, the restore guard.

The daemon, the supervisor and every fault run against real CRIU in tests/integration/test_lazy.py.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _lazy as lz


@pytest.mark.parametrize("spec, want", [("10.0.0.5:27100", ("10.0.0.5", 27100)),
                                        ("holder.example:1", ("holder.example", 1)),
                                        ("[fd00::5]:27100", ("fd00::5", 27100))])
def test_parse_address(spec: str, want: tuple) -> None:
    assert lz.parse_address(spec) == want


@pytest.mark.parametrize("spec", ["10.0.0.5", ":27100", "host:", "host:0", "host:65536", "host:http"])
def test_parse_address_refuses(spec: str) -> None:
    with pytest.raises(lz.LazyError, match="is not host:port"):
        lz.parse_address(spec)


def test_state_file_merges_and_wait_returns_the_outcome(tmp_path: Path) -> None:
    work = str(tmp_path)
    assert not lz.read_state(work)
    lz._write_state(work, state="streaming", pid=7)  # pylint: disable=protected-access
    assert oct((tmp_path / lz.STATE).stat().st_mode & 0o777) == "0o600"
    t0 = time.monotonic()
    assert lz.wait(work, 0.3)["state"] == "streaming"  # not final: wait gives up at its timeout
    assert 0.25 <= time.monotonic() - t0 < 2

    def finish() -> None:
        time.sleep(0.2)
        lz._write_state(work, state="complete", complete_at=1.0)  # pylint: disable=protected-access

    threading.Thread(target=finish).start()
    got = lz.wait(work, 10)
    assert got == {"state": "complete", "pid": 7, "complete_at": 1.0}


def test_active_needs_a_live_supervisor(tmp_path: Path) -> None:
    (tmp_path / "41.json").write_text(json.dumps({"work_dir": "/w", "supervisor_pid": os.getpid()}))
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / "42.json").write_text(json.dumps({"work_dir": "/x", "supervisor_pid": dead.pid}))
    (tmp_path / "43.json").write_text("{not json")
    assert lz.active([40, 42, 43], str(tmp_path)) is None
    got = lz.active([42, 41], str(tmp_path))
    assert got is not None and got["pid"] == 41 and got["work_dir"] == "/w"


def test_failure_names_the_daemons_error(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    session = lz.Session(str(tmp_path), -1, dead.pid, 0.0)
    assert session.failure() == ""
    (tmp_path / lz.LOG).write_text("(00.01) uffd: Received PID: 1\n(00.02) Connecting to server 10.0.0.5:1\n"
                                   "(00.03) Can't connect to server 10.0.0.5:1\n")
    assert session.failure() == "Can't connect to server 10.0.0.5:1"
    (tmp_path / lz.LOG).write_text("(00.01) Error (criu/uffd.c:9): uffd: boom\n(00.02) later\n")
    assert session.failure() == "(00.01) Error (criu/uffd.c:9): uffd: boom"


def _fake_criu(tmp_path: Path) -> "subprocess.Popen[bytes]":
    """A child of ours whose comm is 'criu' (a copy of sleep), like pycriu's blocked ``criu swrk``."""
    binary = tmp_path / "criu"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", binary)
    return subprocess.Popen([str(binary), "60"])


def _wait_exit(child: "subprocess.Popen[bytes]", timeout: float) -> bool:
    try:
        child.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def test_guard_stops_criu_when_the_daemon_dies(tmp_path: Path) -> None:
    daemon = subprocess.Popen(["sleep", "0.3"])
    criu = _fake_criu(tmp_path)
    try:
        t0 = time.monotonic()
        with lz.guard(lz.Session(str(tmp_path), -1, daemon.pid, 0.0), grace=0.5):
            assert _wait_exit(criu, 10), "the guard did not stop CRIU after the daemon died"
        assert criu.returncode == -9
        assert 0.7 <= time.monotonic() - t0 < 5  # the daemon's 0.3 s, then the grace
    finally:
        for child in (criu, daemon):
            child.kill()
            child.wait()


def test_guard_leaves_criu_alone_while_the_daemon_runs(tmp_path: Path) -> None:
    daemon = subprocess.Popen(["sleep", "60"])
    criu = _fake_criu(tmp_path)
    try:
        with lz.guard(lz.Session(str(tmp_path), -1, daemon.pid, 0.0), grace=0.2):
            assert not _wait_exit(criu, 1.0)
        assert criu.poll() is None
    finally:
        for child in (criu, daemon):
            child.kill()
            child.wait()


def test_guard_without_a_session_is_a_no_op() -> None:
    with lz.guard(None):
        pass


def test_support_probes_once_per_binary_and_boot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    criu = tmp_path / "criu"
    criu.write_text("#!/bin/sh\n")
    probes = []
    answers = {"uffd": True, "uffd-noncoop": False}
    monkeypatch.setattr(lz, "probe_feature", lambda _c, f: probes.append(f) or answers[f])
    cache = str(tmp_path / "run" / "support.json")
    ok, why = lz.support(str(criu), cache)
    assert not ok and "lacks uffd-noncoop" in why and probes == ["uffd", "uffd-noncoop"]
    assert not os.path.exists(cache)  # a no is never remembered: probed again next time
    answers["uffd-noncoop"] = True
    assert lz.support(str(criu), cache)[0] and len(probes) == 4
    assert lz.support(str(criu), cache)[0] and len(probes) == 4  # remembered
    criu.write_text("#!/bin/sh\n# another build\n")
    answers["uffd"] = False
    assert not lz.support(str(criu), cache)[0] and len(probes) == 6  # a different binary is probed afresh


def test_lazy_plan_says_why_a_restore_is_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(lz, "support", lambda criu: calls.append(criu) or (False, "this node lacks uffd"))
    assert "every page is loaded" in lz.plan("criu", False, False)["reason"]
    gpu = lz.plan("criu", True, True)
    assert gpu["used"] is False and "GPU state" in gpu["reason"] and not calls
    plan = lz.plan("criu", False, True)
    assert plan == {"used": False, "reason": "this node lacks uffd; restored eagerly instead"} and calls == ["criu"]
    monkeypatch.setattr(lz, "support", lambda criu: (True, "uffd and uffd-noncoop available"))
    assert lz.plan("criu", False, True)["used"] is True
