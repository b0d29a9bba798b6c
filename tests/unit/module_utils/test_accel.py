"""The accelerator interface (_accel): the option and its cuda alias, the CUDA adapter, and the Ascend backend
driving real NPU processes (subprocesses loading the fake libascendcl.so from tests/support/fake_libascendcl.c,
each serving its snapshot agent): multi-process lock/backup, rollback of all on a failure in one, refusals."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _accel

from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cuda
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cudaabi
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cudabackends
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._accel import (
    AcceleratorError,
    AscendAccelerator,
    CudaAccelerator,
    resolve,
)
from tests.support.fake_ascend import calls, install


@pytest.mark.parametrize("accelerator, cuda, expected", [
    (None, None, ("auto", "auto")),
    ("auto", None, ("auto", "auto")),
    (None, "required", ("cuda", "required")),
    ("cuda", "required", ("cuda", "required")),
    ("cuda", None, ("cuda", "required")),
    (None, "off", ("off", "off")),
    ("ascend", None, ("ascend", "off")),
    ("off", "off", ("off", "off")),
])
def test_resolve(accelerator: str, cuda: str, expected: Tuple[str, str]) -> None:
    assert resolve(accelerator, cuda) == expected


def test_resolve_refuses_disagreement_naming_both() -> None:
    with pytest.raises(AcceleratorError, match="accelerator: ascend and cuda: required disagree"):
        resolve("ascend", "required")
    with pytest.raises(AcceleratorError, match="accelerator: 'tpu' is not one of auto, cuda, ascend, off"):
        resolve("tpu", None)
    with pytest.raises(AcceleratorError, match="cuda: 'yes' is not one of"):
        resolve(None, "yes")


class StubBackend(_cudabackends.Backend):
    name = "stub"

    def __init__(self) -> None:
        self.states = {10: _cudaabi.RUNNING}
        self.log: List[str] = []

    def state(self, pid: int) -> int:
        if pid not in self.states:
            raise _cudaabi.CudaError(pid, "state", _cudaabi.INVALID_VALUE, "not cuda")
        return self.states[pid]

    def restore_thread_id(self, pid: int) -> int:
        self.state(pid)
        return pid

    def _lock(self, pid: int, timeout_ms: int) -> None:
        self.log.append(f"lock:{pid}")
        self.states[pid] = _cudaabi.LOCKED

    def _checkpoint(self, pid: int) -> None:
        self.log.append(f"checkpoint:{pid}")
        self.states[pid] = _cudaabi.CHECKPOINTED

    def _restore(self, pid: int, gpu_pairs: _cudaabi.GpuPairs) -> None:
        self.log.append(f"restore:{pid}")
        self.states[pid] = _cudaabi.LOCKED

    def _unlock(self, pid: int) -> None:
        self.log.append(f"unlock:{pid}")
        self.states[pid] = _cudaabi.RUNNING


def test_cuda_adapter_delegates_to_the_cuda_functions() -> None:
    backend = StubBackend()
    accel: _accel.Accelerator = CudaAccelerator(backend)
    assert accel.find_pids([9, 10, 11]) == [10] and accel.refusals([10]) == []
    assert set(accel.lock_and_checkpoint([10], 100)) == {"cuda_lock", "cuda_checkpoint"}
    assert set(accel.restore_and_unlock([10])) == {"cuda_restore", "cuda_unlock"}
    accel.lock_and_checkpoint([10], 100)
    assert accel.rollback([10]) == ([10], [])
    assert backend.log == ["lock:10", "checkpoint:10", "restore:10", "unlock:10"] * 2
    assert accel.describe() == "stub"


NPU_PROCESS = textwrap.dedent("""
    import ctypes, sys, time
    from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _ascend
    lib = ctypes.CDLL(sys.argv[1])
    acl = _ascend.AclSnapshot(sys.argv[1])
    if sys.argv[3] == "agent":
        _ascend.serve(acl, sys.argv[2])
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
""")


@pytest.fixture(name="npu")
def fixture_npu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Tuple[Path, Path, list]]:
    lib = install(tmp_path, monkeypatch)
    root = tmp_path / "agents"
    started: List[subprocess.Popen] = []
    yield lib, root, started
    for child in started:
        child.kill()
        child.wait()


def spawn(npu: Tuple[Path, Path, list], agent: bool = True, fail: str = "") -> int:
    lib, root, started = npu
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "FAKE_ACL_FAIL": fail}
    child = subprocess.Popen([sys.executable, "-c", NPU_PROCESS, str(lib), str(root), "agent" if agent else "none"],
                             stdout=subprocess.PIPE, env=env, text=True)
    started.append(child)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child.pid


def changes(log: Path) -> List[str]:
    return [f"{c['call']}:{c['self']}:{c['result']}" for c in calls(log)]


def test_ascend_locks_backs_up_restores_and_unlocks_a_tree_together(npu: Tuple[Path, Path, list], tmp_path: Path) -> None:
    a, b = spawn(npu), spawn(npu)
    accel = AscendAccelerator(str(npu[1]))
    assert accel.find_pids([1, a, b]) == [a, b]
    assert accel.refusals([a, b]) == []
    assert set(accel.lock_and_checkpoint([a, b], 1000)) == {"npu_lock", "npu_backup"}
    assert set(accel.restore_and_unlock([a, b])) == {"npu_restore", "npu_unlock"}
    assert changes(tmp_path / "acl.log") == [
        f"lock:{a}:0", f"lock:{b}:0", f"backup:{a}:0", f"backup:{b}:0",
        f"restore:{a}:0", f"restore:{b}:0", f"unlock:{a}:0", f"unlock:{b}:0"]


def test_ascend_failure_in_one_process_rolls_back_all(npu: Tuple[Path, Path, list], tmp_path: Path) -> None:
    a, b = spawn(npu), spawn(npu, fail="backup=507899")
    accel = AscendAccelerator(str(npu[1]))
    with pytest.raises(AcceleratorError, match=rf"ascend: .*pid {b}: aclrtSnapShotProcessBackup failed.*"
                                               rf"rolled back: pid\(s\) {a}, {b} running again"):
        accel.lock_and_checkpoint([a, b], 1000)
    log = changes(tmp_path / "acl.log")
    assert log[:4] == [f"lock:{a}:0", f"lock:{b}:0", f"backup:{a}:0", f"backup:{b}:507899"]
    assert sorted(log[4:]) == sorted([f"restore:{a}:0", f"unlock:{a}:0", f"unlock:{b}:0"])
    assert accel.ask(a, "force_unlock") == "RUNNING" and accel.ask(b, "force_unlock") == "RUNNING"


def test_ascend_state_refusal_is_reported_by_the_agent(npu: Tuple[Path, Path, list]) -> None:
    a = spawn(npu)
    accel = AscendAccelerator(str(npu[1]))
    with pytest.raises(_accel.asc.AscendError, match="cannot backup an NPU process in state RUNNING .lock it first"):
        accel.ask(a, "backup")
    with pytest.raises(_accel.asc.AscendError, match="'dance' is not one of"):
        accel.ask(a, "dance")


def test_ascend_refuses_npu_processes_without_agent_and_remapping(npu: Tuple[Path, Path, list]) -> None:
    plain = spawn(npu, agent=False)
    accel = AscendAccelerator(str(npu[1]))
    assert accel.find_pids([plain]) == [plain]  # found by its mapping of libascendcl.so
    assert "serves no warmstart snapshot agent" in accel.refusals([plain])[0]
    with pytest.raises(AcceleratorError, match="same device ids only; asked to move 0 -> 1"):
        accel.restore_and_unlock([plain], [("0", "1")])


def all_stopped(pid: int) -> bool:
    tasks = Path(f"/proc/{pid}/task").iterdir()
    return all((task / "stat").read_text().rsplit(")", 1)[1].split()[0] == "T" for task in tasks)


def test_ascend_agent_that_does_not_answer_is_named(npu: Tuple[Path, Path, list]) -> None:
    a = spawn(npu)
    os.kill(a, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while not all_stopped(a) and time.monotonic() < deadline:
        time.sleep(0.01)  # every thread stopped before the request is written
    try:
        accel = AscendAccelerator(str(npu[1]), reply_timeout=0.3)
        t0 = time.monotonic()
        with pytest.raises(AcceleratorError, match=f"pid {a}: its snapshot agent did not answer lock"):
            accel.lock_and_checkpoint([a], 100)
        assert time.monotonic() - t0 < 10
    finally:
        os.kill(a, signal.SIGCONT)


def test_ascend_backend_runs_the_engine_s_cuda_functions(npu: Tuple[Path, Path, list], tmp_path: Path) -> None:
    a, b = spawn(npu), spawn(npu)
    plain = spawn(npu, agent=False)
    backend = _accel.AscendBackend(AscendAccelerator(str(npu[1])))
    assert _cuda.find_cuda_pids([1, a, b], backend, nvml=_NoNvml()) == [a, b]
    with pytest.raises(_cudaabi.CudaError, match=f"pid {plain} loads libascendcl.so but serves no warmstart snapshot agent"):
        _cuda.find_cuda_pids([a, plain], backend, nvml=_NoNvml())
    _cuda.lock_and_checkpoint([a, b], 1000, backend)
    assert backend.state(a) == _cudaabi.CHECKPOINTED
    # what the checkpoint guardian runs when the module dies: every pid back to RUNNING
    assert _cuda.rollback([a, b], backend) == ([a, b], [])
    assert backend.state(a) == backend.state(b) == _cudaabi.RUNNING
    with pytest.raises(_cudaabi.CudaError, match="same device ids only"):
        backend.lock(a)
        backend.checkpoint(a)
        backend.restore(a, [("0", "1")])
    assert _cuda.rollback([a], backend) == ([a], [])
    assert [c for c in changes(tmp_path / "acl.log") if c.endswith(":0")][:6] == [
        f"lock:{a}:0", f"lock:{b}:0", f"backup:{a}:0", f"backup:{b}:0", f"restore:{a}:0", f"unlock:{a}:0"]


def test_ascend_backend_failure_in_one_rolls_back_all_through_cuda(npu: Tuple[Path, Path, list], tmp_path: Path) -> None:
    a, b = spawn(npu), spawn(npu, fail="backup=507899")
    backend = _accel.AscendBackend(AscendAccelerator(str(npu[1])))
    with pytest.raises(_cudaabi.CudaError, match=rf"aclrtSnapShotProcessBackup failed.*rolled back: pid\(s\) {a}, {b}"):
        _cuda.lock_and_checkpoint([a, b], 1000, backend)
    assert backend.state(a) == backend.state(b) == _cudaabi.RUNNING


def test_ascend_gpu_node_has_the_agent_backend_and_no_gpus(tmp_path: Path) -> None:
    node = _accel.ascend_gpu_node(AscendAccelerator(str(tmp_path)))
    backend, why = node.backend()
    assert isinstance(backend, _accel.AscendBackend) and "CANN snapshot API" in why
    assert backend.driver_version() is None
    assert node.gpus() == ([], "Ascend NPUs are restored onto the same device ids (no remapping)")


class _NoNvml:
    def nvmlInit(self) -> None:  # pylint: disable=invalid-name
        raise RuntimeError("no NVML here")
