"""An Ascend NPU process through the accelerator interface and real CRIU, with the fake libascendcl.so.

A real process loads the fake CANN library (tests/support/fake_libascendcl.c, built here), puts data into
its "device memory" and serves its snapshot agent (_ascend.serve). The engine's AscendAccelerator locks and
backs it up, the engine's CRIU wrapper dumps it (the source is then killed) and restores it with the same
pid, and the accelerator restores and unlocks it. The fake's call log proves the order (lock, backup before
the dump; restore, unlock after), and the restored process reads its device data back intact. The second
test runs the same through the engine's checkpoint and restore (``accelerator: ascend``): the snapshot's
gpu section names the NPU pid, and restore unlocks the copy before it returns.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable, Iterator, List

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _checkpoint as ckpt
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _restore as rs
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._accel import AscendAccelerator, ascend_gpu_node
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import CriuOptions
from tests.support.fake_ascend import calls as logged_calls, compile_fake

from .process_lab import needs_root_and_criu

pytestmark = pytest.mark.integration

CRIU = "/usr/local/bin/criu" if os.access("/usr/local/bin/criu", os.X_OK) else "/opt/warmstart/criu/current/bin/criu"
BUNDLE_PYTHON = "/opt/warmstart/criu/current/python"

WORKLOAD = textwrap.dedent("""
    import ctypes, os, sys, time
    from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _ascend
    lib_path, agents, out, token = sys.argv[1:5]
    lib = ctypes.CDLL(lib_path)
    dev = ctypes.c_void_p()
    assert lib.aclrtMalloc(ctypes.byref(dev), 64, 0) == 0
    data = ctypes.create_string_buffer(("npu weights " + token).encode(), 64)
    assert lib.aclrtMemcpy(dev, 64, data, 64, 1) == 0
    acl = _ascend.AclSnapshot(lib_path)
    _ascend.serve(acl, agents)
    back = ctypes.create_string_buffer(64)
    while True:
        rc = lib.aclrtMemcpy(back, 64, dev, 64, 2)
        text = back.value.decode(errors="replace") if rc == 0 else ""
        _ascend.write_atomic(out, f"{rc} {os.getpid()} {text}\\n")
        time.sleep(0.02)
""")


def fake_lib(tmp: Path) -> Path:
    """The fake libascendcl.so, built under ``tmp``."""
    return compile_fake(tmp / "fakeacl" / "libascendcl.so")


def calls(log: Path) -> List[str]:
    """The fake's logged snapshot calls, each as ``call:self:result``."""
    return [f"{fields['call']}:{fields['self']}:{fields['result']}" for fields in logged_calls(log)]


def wait_for(what: str, check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def seen(out: Path) -> str:
    try:
        return out.read_text().strip()
    except OSError:
        return ""


@pytest.fixture(name="criu_rpc")
def fixture_criu_rpc(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    needs_root_and_criu()
    if os.path.isdir(BUNDLE_PYTHON):
        monkeypatch.syspath_prepend(BUNDLE_PYTHON)
    before = set(sys.modules)
    from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _criu_rpc  # pylint: disable=import-outside-toplevel
    try:
        _criu_rpc.load_pycriu()
    except Exception as exc:  # pylint: disable=broad-except
        pytest.fail(f"pycriu: {exc}")
    yield _criu_rpc
    for name in set(sys.modules) - before:  # the test venv has no pycriu: leave none behind
        if name.startswith("pycriu"):
            del sys.modules[name]


def test_npu_process_locked_backed_up_dumped_restored_and_unlocked_in_order(tmp_path: Path, criu_rpc: object) -> None:
    lib, agents, out, log = fake_lib(tmp_path), tmp_path / "agents", tmp_path / "device", tmp_path / "acl.log"
    script = tmp_path / "npu_workload.py"
    script.write_text(WORKLOAD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "FAKE_ACL_LOG": str(log)}
    env.pop("FAKE_ACL_FAIL", None)
    source = subprocess.Popen([sys.executable, str(script), str(lib), str(agents), str(out), "tok-4711"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=env, start_new_session=True, cwd=str(tmp_path))
    restored = None
    try:
        pid = source.pid
        wait_for("the workload's device data", lambda: seen(out) == f"0 {pid} npu weights tok-4711")
        accel = AscendAccelerator(str(agents))
        assert accel.find_pids([pid]) == [pid] and accel.refusals([pid]) == []
        accel.lock_and_checkpoint([pid], 5000)
        wait_for("device calls refused while backed up", lambda: seen(out).startswith("507901 "))
        images = tmp_path / "images"
        images.mkdir()
        criu_rpc.dump(CRIU, pid, str(images), CriuOptions(), leave_stopped=True)  # type: ignore[attr-defined]
        assert calls(log) == [f"lock:{pid}:0", f"backup:{pid}:0"]  # both before the dump
        source.kill()
        source.wait()
        # emptied in place, not removed: the dump may have caught the source between opening it and closing it
        # (its atomic writer holds the file until the rename is checked), and CRIU reopens such a file by path
        out.write_text("")
        work = tmp_path / "work"
        work.mkdir()
        restored = criu_rpc.restore(CRIU, str(images), str(work), CriuOptions())  # type: ignore[attr-defined]
        assert restored == pid  # same pid: its agent folder is still the one the engine asks
        wait_for("the restored copy running, still backed up", lambda: seen(out).startswith(f"507901 {pid}"))
        accel.restore_and_unlock([pid])
        assert calls(log) == [f"lock:{pid}:0", f"backup:{pid}:0", f"restore:{pid}:0", f"unlock:{pid}:0"]
        wait_for("the device data read back intact", lambda: seen(out) == f"0 {pid} npu weights tok-4711")
    finally:
        if source.poll() is None:
            source.kill()
            source.wait()
        if restored is not None:
            try:
                os.kill(restored, 9)
                os.waitpid(restored, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


DETACH = "import subprocess, sys; print(subprocess.Popen(sys.argv[1:], start_new_session=True, stdin=-3, stdout=-3, " \
         "stderr=-3).pid)"


def test_engine_checkpoint_and_restore_with_accelerator_ascend(tmp_path: Path, criu_rpc: object,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    lib, agents, out, log = fake_lib(tmp_path), tmp_path / "agents", tmp_path / "device", tmp_path / "acl.log"
    script = tmp_path / "npu_workload.py"
    script.write_text(WORKLOAD)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
    monkeypatch.setenv("FAKE_ACL_LOG", str(log))
    monkeypatch.setenv("WARMSTART_ASCEND_AGENT_DIR", str(agents))
    monkeypatch.delenv("FAKE_ACL_FAIL", raising=False)
    started = subprocess.run([sys.executable, "-c", DETACH, sys.executable, str(script), str(lib), str(agents),
                              str(out), "tok-99"], capture_output=True, text=True, check=True, cwd=str(tmp_path))
    pid = int(started.stdout)
    restored = None
    try:
        wait_for("the workload's device data", lambda: seen(out) == f"0 {pid} npu weights tok-99")
        store = st.FsStore(str(tmp_path / "store"))
        store.ensure()
        target = snap.Target(pid=pid, name="npu")
        done = ckpt.checkpoint(store, target, "npu", {}, CriuOptions(), leave_running=False, criu_path=CRIU,
                               cuda="required", gpu_node=ascend_gpu_node(), cuda_lock_timeout=5)
        assert done["cuda"]["used"] is True and done["cuda"]["pids"] == [pid], done["cuda"]
        assert "CANN snapshot API" in done["cuda"]["backend"]
        assert calls(log) == [f"lock:{pid}:0", f"backup:{pid}:0"]  # the source was ended, not resumed
        wait_for("the source ended", lambda: not os.path.exists(f"/proc/{pid}"))
        out.write_text("")  # emptied in place: CRIU reopens it by path if the dump caught the source writing it
        result = rs.restore(store, snapshot_id=done["id"], criu_path=CRIU, restore_root=str(tmp_path / "restore"),
                            cuda="required", gpu_node=ascend_gpu_node())
        restored = int(result["pid"])
        assert restored == pid
        assert calls(log) == [f"lock:{pid}:0", f"backup:{pid}:0", f"restore:{pid}:0", f"unlock:{pid}:0"]
        assert {"cuda_restore", "cuda_unlock"} <= set(result["timings"])
        wait_for("the device data read back intact", lambda: seen(out) == f"0 {pid} npu weights tok-99")
    finally:
        for victim in {pid, restored} - {None}:
            try:
                os.kill(int(victim), 9)
            except ProcessLookupError:
                pass
        if restored is not None:
            try:
                os.waitpid(restored, 0)
            except ChildProcessError:
                pass
