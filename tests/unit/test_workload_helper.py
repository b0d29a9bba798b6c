"""The workload helper (workload/warmstart_workload.py): sentinels, restore detection, instance state."""
from __future__ import annotations

import importlib.util
import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

HELPER = Path(__file__).resolve().parents[2] / "workload" / "warmstart_workload.py"
spec = importlib.util.spec_from_file_location("warmstart_workload", HELPER)
ws = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ws)


def test_inactive_without_a_control_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SNAPSHOT_CONTROL_DIR", raising=False)
    control = ws.Control()
    assert not control.active
    control.ready()
    assert control.restored() is None and control.wait_restored(0.01) is None and control.on_restore(print) is None
    assert control.env() == {}


def test_ready_is_atomic_and_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SNAPSHOT_CONTROL_DIR", str(tmp_path))
    ws.Control().ready()
    assert (tmp_path / "ready-for-snapshot").read_text() == f"pid={os.getpid()}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["ready-for-snapshot"]


def test_only_a_new_restore_complete_counts(tmp_path: Path) -> None:
    (tmp_path / "restore-complete").write_text("pid=6\nsnapshot=old\n")
    control = ws.Control(str(tmp_path))
    control.ready()
    assert control.restored() is None, "a sentinel older than ready() is not this copy's restore"
    time.sleep(0.01)
    (tmp_path / "restore-complete.new").write_text("pid=7\nhost_pid=999\nsnapshot=s2\n")
    os.rename(tmp_path / "restore-complete.new", tmp_path / "restore-complete")
    info = control.restored()
    assert info is not None and info.pid == 7 and info.snapshot == "s2" and info.fields["host_pid"] == "999"
    assert control.restored() is None, "the same restore is reported once"


def test_wait_restored_times_out_and_wakes_up(tmp_path: Path) -> None:
    control = ws.Control(str(tmp_path), poll=0.01)
    control.ready()
    t0 = time.monotonic()
    assert control.wait_restored(0.1) is None and time.monotonic() - t0 >= 0.1
    threading.Timer(0.05, lambda: (tmp_path / "restore-complete").write_text("pid=9\n")).start()
    info = control.wait_restored(5)
    assert info is not None and info.pid == 9


def test_on_restore_calls_back_in_a_thread(tmp_path: Path) -> None:
    control = ws.Control(str(tmp_path), poll=0.01)
    seen = []
    done = threading.Event()
    control.on_restore(lambda info: (seen.append(info.pid), done.set()))
    control.ready()
    (tmp_path / "restore-complete").write_text("pid=12\n")
    assert done.wait(5) and seen == [12]


def test_failed_and_env_and_instance(tmp_path: Path) -> None:
    control = ws.Control(str(tmp_path))
    assert control.failed() is None
    (tmp_path / "restore-failed").write_text("CRIU restore failed: x\n")
    assert control.failed() == "CRIU restore failed: x"
    (tmp_path / "env.json").write_text(json.dumps({"ROLE": "replica-2", "N": 3}))
    me = ws.instance(control)
    assert me.env == {"ROLE": "replica-2", "N": "3"} and me.hostname == socket.gethostname()
    assert isinstance(me.ips, list) and all(ip.count(".") == 3 for ip in me.ips)
    (tmp_path / "env.json").write_text("{broken")
    assert control.env() == {}
