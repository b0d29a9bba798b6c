"""The CANN snapshot binding (_ascend) against a fake libascendcl.so compiled here from tests/support/fake_libascendcl.c.

The fake keeps the state machine and an arena of "device memory" in host
memory of the process that loads it and logs every snapshot call, so these
tests see the order of calls, the refusals before any call, and the rollback
at every failure point. gcc is required: without it they fail.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _ascend
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._ascend import (
    BACKED_UP,
    LOCKED,
    RUNNING,
    AclSnapshot,
    AscendError,
    AscendStateError,
    AscendUnavailable,
    lock_and_backup,
    npu_inventory,
    restore_and_unlock,
)
from tests.support.fake_ascend import calls, install

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(name="lib")
def fixture_lib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return install(tmp_path, monkeypatch)


def names(log: Path) -> List[str]:
    return [f"{c['call']}:{c['result']}" for c in calls(log)]


def test_full_cycle_calls_in_order_with_own_pid(lib: Path, tmp_path: Path) -> None:
    acl = AclSnapshot(str(lib))
    assert lock_and_backup(acl).keys() == {"npu_lock", "npu_backup"}
    assert acl.state == BACKED_UP
    assert restore_and_unlock(acl).keys() == {"npu_restore", "npu_unlock"}
    assert acl.state == RUNNING
    log = calls(tmp_path / "acl.log")
    assert [c["call"] for c in log] == ["lock", "backup", "restore", "unlock"]
    assert all(c["pid"] == c["self"] == str(os.getpid()) and c["result"] == "0" for c in log)
    assert [c["state"] for c in log] == ["RUNNING", "LOCKED", "BACKED_UP", "LOCKED"]
    assert [c["args"] for c in log] == ["null", "given", "given", "null"]  # zeroed args struct for backup / restore


def test_library_from_environment(lib: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMSTART_LIBASCENDCL", str(lib))
    assert AclSnapshot().library == str(lib)
    assert str(lib) in AclSnapshot().describe()


def test_missing_library_and_missing_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(AscendUnavailable, match="not found"):
        AclSnapshot(str(tmp_path / "nope.so"))
    old = install(tmp_path / "old", monkeypatch, "FAKE_WITHOUT_SNAPSHOT_API")
    with pytest.raises(AscendUnavailable, match="lacks aclrtSnapShotProcessLock.*CANN >= 9.0"):
        AclSnapshot(str(old))


@pytest.mark.parametrize("state, action, why", [
    (RUNNING, "backup", "lock it first"),
    (RUNNING, "restore", "not backed up"),
    (RUNNING, "unlock", "not locked"),
    (LOCKED, "lock", "already locked"),
    (LOCKED, "restore", "only locked"),
    (BACKED_UP, "lock", "restore it, then unlock"),
    (BACKED_UP, "backup", "already backed up"),
])
def test_state_machine_refuses_before_the_library(lib: Path, tmp_path: Path, state: str, action: str, why: str) -> None:
    acl = AclSnapshot(str(lib))
    path = {RUNNING: [], LOCKED: ["lock"], BACKED_UP: ["lock", "backup"]}[state]
    for step in path:
        getattr(acl, step)()
    before = len(calls(tmp_path / "acl.log"))
    with pytest.raises(AscendStateError, match=f"cannot {action} an NPU process in state {state} .*{why}"):
        getattr(acl, action)()
    assert len(calls(tmp_path / "acl.log")) == before  # the library was not asked
    assert acl.state == state


def test_unlock_is_legal_from_backed_up(lib: Path) -> None:
    acl = AclSnapshot(str(lib))
    acl.lock()
    acl.backup()
    acl.unlock()
    assert acl.state == RUNNING


def test_lock_failure_touches_nothing(lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_ACL_FAIL", "lock=507899")
    acl = AclSnapshot(str(lib))
    with pytest.raises(AscendError, match="aclrtSnapShotProcessLock failed: ACL_ERROR_RT_INTERNAL_ERROR"):
        lock_and_backup(acl)
    assert acl.state == RUNNING
    assert names(tmp_path / "acl.log") == ["lock:507899"]


def test_backup_failure_rolls_back_to_running(lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_ACL_FAIL", "backup=507899")
    acl = AclSnapshot(str(lib))
    with pytest.raises(AscendError, match=r"ProcessBackup failed.*rolled back: pid \d+ running again"):
        lock_and_backup(acl)
    assert acl.state == RUNNING
    assert names(tmp_path / "acl.log") == ["lock:0", "backup:507899", "unlock:0"]


def test_rollback_that_fails_says_so(lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_ACL_FAIL", "backup=507899,unlock=507899")
    acl = AclSnapshot(str(lib))
    with pytest.raises(AscendError, match="rolling back failed, it may stay locked: .*ProcessUnlock failed"):
        lock_and_backup(acl)
    assert acl.state == LOCKED


def test_interrupt_during_backup_rolls_back(lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    acl = AclSnapshot(str(lib))

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(acl, "backup", interrupted)
    with pytest.raises(KeyboardInterrupt):
        lock_and_backup(acl)
    assert acl.state == RUNNING
    assert names(tmp_path / "acl.log") == ["lock:0", "unlock:0"]


def test_restore_failure_leaves_it_locked_then_unlock_failure(lib: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    acl = AclSnapshot(str(lib))
    lock_and_backup(acl)
    monkeypatch.setenv("FAKE_ACL_FAIL", "restore=507899")
    with pytest.raises(AscendError, match="ProcessRestore failed.*stays BACKED_UP"):
        restore_and_unlock(acl)
    assert acl.state == BACKED_UP
    monkeypatch.setenv("FAKE_ACL_FAIL", "unlock=100000")
    with pytest.raises(AscendError, match="ProcessUnlock failed: ACL_ERROR_INVALID_PARAM"):
        restore_and_unlock(acl)
    assert acl.state == LOCKED
    monkeypatch.delenv("FAKE_ACL_FAIL")
    assert acl.force_unlock() == []
    assert acl.state == RUNNING


def test_force_unlock_from_every_state(lib: Path, tmp_path: Path) -> None:
    acl = AclSnapshot(str(lib))
    assert acl.force_unlock() == [] and acl.state == RUNNING
    acl.lock()
    assert acl.force_unlock() == [] and acl.state == RUNNING
    acl.lock()
    acl.backup()
    assert acl.force_unlock() == [] and acl.state == RUNNING
    assert [c["call"] for c in calls(tmp_path / "acl.log")][-3:] == ["backup", "restore", "unlock"]


def test_library_refuses_other_pids_and_binding_refuses_after_fork(lib: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = ctypes.CDLL(str(lib))
    assert raw.aclrtSnapShotProcessLock(os.getpid() + 1, None) == 100000
    flags = ctypes.c_uint32(1)
    assert raw.aclrtSnapShotProcessLock(os.getpid(), None) == 0
    assert raw.aclrtSnapShotProcessBackup(os.getpid(), ctypes.byref(flags)) == 100000  # non-zero flags refused
    assert raw.aclrtSnapShotProcessUnlock(os.getpid(), None) == 0
    acl = AclSnapshot(str(lib))
    monkeypatch.setattr(acl, "pid", acl.pid + 1)
    with pytest.raises(AscendStateError, match="acts on the calling process only"):
        acl.lock()
    assert acl.force_unlock() == []


WORKLOAD = textwrap.dedent("""
    import ctypes, sys
    from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _ascend
    lib = ctypes.CDLL(sys.argv[1])
    dev = ctypes.c_void_p()
    assert lib.aclrtMalloc(ctypes.byref(dev), 64, 0) == 0
    data = ctypes.create_string_buffer(b"npu weights 0123456789", 64)
    assert lib.aclrtMemcpy(dev, 64, data, 64, 1) == 0
    acl = _ascend.AclSnapshot(sys.argv[1])
    _ascend.guard(acl)
    _ascend.lock_and_backup(acl)
    back = ctypes.create_string_buffer(64)
    print("locked-memcpy", lib.aclrtMemcpy(back, 64, dev, 64, 2))
    if sys.argv[2] == "exit-locked":
        sys.exit(0)
    _ascend.restore_and_unlock(acl)
    assert lib.aclrtMemcpy(back, 64, dev, 64, 2) == 0
    print("device", back.value.decode())
""")


@pytest.mark.parametrize("mode", ["cycle", "exit-locked"])
def test_real_process_device_memory_and_force_unlock_at_exit(lib: Path, tmp_path: Path, mode: str) -> None:
    done = subprocess.run([sys.executable, "-c", WORKLOAD, str(lib), mode], capture_output=True, text=True,
                          check=False, cwd=str(REPO), env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    assert done.returncode == 0, done.stderr
    assert "locked-memcpy 507901" in done.stdout  # device calls refused while locked
    log = [c["call"] for c in calls(tmp_path / "acl.log")]
    if mode == "cycle":
        assert "device npu weights 0123456789" in done.stdout
        assert log == ["lock", "backup", "restore", "unlock"]
    else:
        assert log == ["lock", "backup", "restore", "unlock"]  # the atexit guard brought it back


def test_inventory_from_a_fake_root(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    for name in ("davinci1", "davinci0", "davinci10", "davinci_manager", "hisi_hdc", "davinciX"):
        (tmp_path / "dev" / name).write_text("")
    version = tmp_path / _ascend.DRIVER_VERSION_FILE
    version.parent.mkdir(parents=True)
    version.write_text("Version=24.1.rc2\nascendhal_version=7.35.23\n")
    devices, facts = npu_inventory(tmp_path)
    assert devices == [{"index": 0, "path": "/dev/davinci0"}, {"index": 1, "path": "/dev/davinci1"},
                       {"index": 10, "path": "/dev/davinci10"}]
    assert facts == {"driver_version": "24.1.rc2", "manager": True, "reason": None}


def test_inventory_of_a_node_without_npus(tmp_path: Path) -> None:
    assert npu_inventory(tmp_path) == ([], {
        "driver_version": None, "manager": False,
        "reason": "no /dev/davinci<N> device nodes; no Ascend driver version file (/usr/local/Ascend/driver/version.info)"})
    version = tmp_path / _ascend.DRIVER_VERSION_FILE
    version.parent.mkdir(parents=True)
    version.write_text("nothing here\n")
    assert "names no Version=" in str(npu_inventory(tmp_path)[1]["reason"])
