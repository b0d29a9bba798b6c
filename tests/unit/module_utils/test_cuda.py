"""The CUDA checkpoint binding (_cudaabi, _cudabackends, _cuda) against a fake libcuda.so.1 compiled here from
tests/support/fake_libcuda.c.

The fake keeps per-PID state in a file and logs every call with its decoded
arguments and the raw 64 bytes of each argument struct, so these tests see
what the C side of the ABI receives. gcc is required: without it they fail.
"""
from __future__ import annotations

import ctypes
import os
import struct
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, Iterator, List, Optional

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cudaabi
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._cuda import (
    device_map,
    find_cuda_pids,
    lock_and_checkpoint,
    restore_and_unlock,
)
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._cudaabi import (
    CHECKPOINTED,
    LOCKED,
    RUNNING,
    CudaError,
    CudaStateError,
    CudaUnavailable,
    GpuMismatch,
)
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._cudabackends import CliBackend, DriverBackend, availability
from tests.support.fake_cuda import Fake, compile_fake, hexid, install

UUID_A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
UUID_B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
UUID_C = "GPU-cccccccc-1111-2222-3333-444444444444"
UUID_D = "GPU-dddddddd-1111-2222-3333-444444444444"
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-40GB"


@pytest.fixture(scope="session")
def libs(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    root = tmp_path_factory.mktemp("fakecuda")
    return {
        "full": compile_fake(root / "full" / "libcuda.so.1"),
        "old": compile_fake(root / "old" / "libcuda.so.1", "FAKE_WITHOUT_CHECKPOINT_API"),
        "noname": compile_fake(root / "noname" / "libcuda.so.1", "FAKE_WITHOUT_ERROR_NAME"),
    }


@pytest.fixture
def fake(tmp_path: Path, libs: Dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> Fake:
    return install(tmp_path, libs["full"], monkeypatch)


@pytest.fixture
def drv(fake: Fake) -> DriverBackend:
    return DriverBackend(str(fake.lib))


# --- layouts -------------------------------------------------------------------------------------------------------


def test_struct_sizes_and_offsets() -> None:
    for struct_type in (_cudaabi.CUcheckpointLockArgs, _cudaabi.CUcheckpointCheckpointArgs,
                        _cudaabi.CUcheckpointUnlockArgs, _cudaabi.CUcheckpointRestoreArgs):
        assert ctypes.sizeof(struct_type) == 64, struct_type.__name__
    assert ctypes.sizeof(_cudaabi.CUcheckpointGpuPair) == 32 and ctypes.sizeof(_cudaabi.CUuuid) == 16
    lock = _cudaabi.CUcheckpointLockArgs
    assert (lock.timeoutMs.offset, lock.reserved0.offset, lock.reserved1.offset) == (0, 4, 8)
    restore = _cudaabi.CUcheckpointRestoreArgs
    assert (restore.gpuPairs.offset, restore.gpuPairsCount.offset, restore.reserved1.offset) == (0, 8, 56)
    assert _cudaabi.CUcheckpointGpuPair.newUuid.offset == 16


def test_lock_timeout_is_the_first_four_bytes_the_driver_sees(fake: Fake, drv: DriverBackend) -> None:
    fake.add(101)
    drv.lock(101, 1234)
    (call,) = fake.calls("lock")
    assert call["timeoutMs"] == "1234" and call["reserved0"] == "0" and call["result"] == "0"
    raw = bytes.fromhex(call["raw"])
    assert len(raw) == 64
    assert struct.unpack_from("<I", raw, 0)[0] == 1234, "timeoutMs must be at offset 0 (one binding puts it last)"
    assert raw[4:] == bytes(60)
    assert fake.states() == {101: "locked"}


def test_checkpoint_and_unlock_args_are_64_zero_bytes(fake: Fake, drv: DriverBackend) -> None:
    fake.add(101, "locked")
    drv.checkpoint(101)
    drv.restore(101)
    drv.unlock(101)
    for name in ("checkpoint", "unlock"):
        (call,) = fake.calls(name)
        assert call["raw"] == "00" * 64 and call["result"] == "0"
    (call,) = fake.calls("restore")
    assert call["pairs"] == "0" and call["raw"] == "00" * 64


def test_full_cycle_walks_the_state_machine(fake: Fake, drv: DriverBackend) -> None:
    fake.add(101)
    seen = [drv.state(101)]
    drv.lock(101, 0)
    seen.append(drv.state(101))
    drv.checkpoint(101)
    seen.append(drv.state(101))
    drv.restore(101)
    seen.append(drv.state(101))
    drv.unlock(101)
    seen.append(drv.state(101))
    assert seen == [RUNNING, LOCKED, CHECKPOINTED, LOCKED, RUNNING]
    assert [c["call"] for c in fake.calls("lock", "checkpoint", "restore", "unlock")] == ["lock", "checkpoint", "restore", "unlock"]
    assert drv.restore_thread_id(101) == 102  # the fake's restore thread is pid + 1


def test_gpu_pairs_reach_the_driver_exactly(fake: Fake, drv: DriverBackend) -> None:
    fake.add(101, "checkpointed", gpus=[UUID_A, UUID_B])
    drv.restore(101, [(UUID_A, UUID_C), (UUID_B, UUID_B)])
    (call,) = fake.calls("restore")
    assert call["result"] == "0" and call["pairs"] == "2"
    assert call["pair0"] == f"{hexid(UUID_A)}:{hexid(UUID_C)}"
    assert call["pair1"] == f"{hexid(UUID_B)}:{hexid(UUID_B)}"
    raw = bytes.fromhex(call["raw"])
    assert struct.unpack_from("<Q", raw, 0)[0] != 0, "gpuPairs pointer at offset 0"
    assert struct.unpack_from("<I", raw, 8)[0] == 2, "gpuPairsCount at offset 8"
    assert raw[12:] == bytes(52), "reserved bytes are zero"
    assert fake.states() == {101: "locked"}


def test_restore_pairs_must_cover_every_checkpointed_gpu(fake: Fake, drv: DriverBackend) -> None:
    fake.add(101, "checkpointed", gpus=[UUID_A, UUID_B])
    with pytest.raises(CudaError) as err:
        drv.restore(101, [(UUID_A, UUID_C)])
    assert err.value.result == 1 and err.value.pid == 101
    assert "cuCheckpointProcessRestore failed: CUDA_ERROR_INVALID_VALUE" in str(err.value)
    assert "every GPU" in str(err.value)
    assert fake.states() == {101: "checkpointed"}


def test_remapping_needs_cuda_13_but_same_gpus_restore_on_12_8(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CUDA_DRIVER_VERSION", "12080")
    drv = DriverBackend(str(fake.lib))
    assert drv.driver_version() == 12080
    fake.add(101, "checkpointed", gpus=[UUID_A])
    with pytest.raises(CudaError, match=r"pid 101: restoring onto other GPUs .* needs NVIDIA driver >= 580 .*CUDA 12\.8"):
        drv.restore(101, [(UUID_A, UUID_B)])
    assert fake.calls("restore") == [], "refused before the driver was called"
    drv.restore(101, [(UUID_A, UUID_A)])
    (call,) = fake.calls("restore")
    assert call["pairs"] == "0" and call["raw"] == "00" * 64, "CUDA 12.8's restore args are all reserved"


# --- refusals and errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("state", "action", "message"), [
    ("running", "checkpoint", "pid 123: cannot checkpoint a CUDA process in state RUNNING (lock it first)"),
    ("running", "restore", "pid 123: cannot restore a CUDA process in state RUNNING (it is not checkpointed)"),
    ("running", "unlock", "pid 123: cannot unlock a CUDA process in state RUNNING (it is not locked)"),
    ("locked", "lock", "pid 123: cannot lock a CUDA process in state LOCKED (already locked)"),
    ("locked", "restore", "pid 123: cannot restore a CUDA process in state LOCKED (it is not checkpointed, only locked: unlock it)"),
    ("checkpointed", "lock", "pid 123: cannot lock a CUDA process in state CHECKPOINTED (it is checkpointed: restore it, then unlock)"),
    ("checkpointed", "checkpoint", "pid 123: cannot checkpoint a CUDA process in state CHECKPOINTED (already checkpointed)"),
    ("checkpointed", "unlock", "pid 123: cannot unlock a CUDA process in state CHECKPOINTED (restore it first)"),
    ("failed", "restore", "pid 123: cannot restore a CUDA process in state FAILED (the driver reports its CUDA state FAILED"),
])
def test_illegal_transitions_are_refused_before_the_driver_is_called(
        fake: Fake, drv: DriverBackend, state: str, action: str, message: str) -> None:
    fake.add(123, state)
    with pytest.raises(CudaStateError) as err:
        getattr(drv, action)(123)
    assert str(err.value).startswith(message)
    assert err.value.pid == 123 and err.value.call == action and err.value.result is None
    assert [c["call"] for c in fake.calls()] == ["get_state"], "only the state was asked"
    assert fake.states() == {123: state}


def test_the_fake_driver_itself_enforces_transitions(fake: Fake) -> None:
    """Without our state machine (a raw call) the driver answers ILLEGAL_STATE: 401 is mapped."""
    fake.add(101)
    lib = ctypes.CDLL(str(fake.lib))
    assert lib.cuCheckpointProcessCheckpoint(101, None) == 401
    assert _cudaabi.result_name(401, lib) == "CUDA_ERROR_ILLEGAL_STATE"


def test_unknown_pid_is_not_a_cuda_process(fake: Fake, drv: DriverBackend) -> None:
    with pytest.raises(CudaError) as err:
        drv.state(999)
    assert err.value.result == 1
    assert str(err.value) == ("pid 999: cuCheckpointProcessGetState failed: CUDA_ERROR_INVALID_VALUE "
                              "(not a CUDA process, or no such process)")


@pytest.mark.parametrize(("code", "name", "hint"), [
    (801, "CUDA_ERROR_NOT_SUPPORTED", "UVM, IPC memory, MIG or MPS"),
    (3, "CUDA_ERROR_NOT_INITIALIZED", "not initialised"),
    (12345, "CUDA_ERROR_12345", None),
])
def test_result_codes_are_named(fake: Fake, drv: DriverBackend, monkeypatch: pytest.MonkeyPatch,
                                code: int, name: str, hint: Optional[str]) -> None:
    fake.add(101, "locked")
    monkeypatch.setenv("FAKE_CUDA_FAIL", f"checkpoint:101={code}")
    with pytest.raises(CudaError) as err:
        drv.checkpoint(101)
    assert err.value.result == code and err.value.call == "cuCheckpointProcessCheckpoint"
    assert str(err.value).startswith(f"pid 101: cuCheckpointProcessCheckpoint failed: {name}")
    if hint:
        assert hint in str(err.value)
    assert fake.states() == {101: "locked"}


def test_result_names_without_cu_get_error_name(libs: Dict[str, Path]) -> None:
    lib = ctypes.CDLL(str(libs["noname"]))
    assert not hasattr(lib, "cuGetErrorName")
    assert _cudaabi.result_name(401, lib) == "CUDA_ERROR_ILLEGAL_STATE"
    assert _cudaabi.result_name(909) == "CUDA_ERROR_TIMEOUT"
    assert _cudaabi.result_name(777, lib) == "CUDA_ERROR_777"
    full = ctypes.CDLL(str(libs["full"]))
    assert _cudaabi.result_name(600, full) == "CUDA_ERROR_NOT_READY"
    assert _cudaabi.result_name(777, full) == "CUDA_ERROR_777", "cuGetErrorName refusing a code falls back"


def test_lock_timeout_on_a_busy_process_leaves_it_running(fake: Fake, drv: DriverBackend) -> None:
    fake.add(101, busy=True)
    with pytest.raises(CudaError) as err:
        drv.lock(101, 500)
    assert err.value.result == 600
    assert "CUDA_ERROR_NOT_READY (not locked within 500 ms" in str(err.value) and "still RUNNING" in str(err.value)
    assert fake.states() == {101: "running"}


def test_cu_init_only_when_the_driver_asks_for_it(fake: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.add(101)
    fresh = compile_fake(tmp_path / "init" / "libcuda.so.1")  # its own copy: cuInit state is per loaded library
    drv = DriverBackend(str(fresh))
    drv.state(101)
    assert [c["call"] for c in fake.calls()] == ["get_state"], "no cuInit when not needed"
    fake.clear_log()
    monkeypatch.setenv("FAKE_CUDA_REQUIRE_INIT", "1")
    other = compile_fake(tmp_path / "init2" / "libcuda.so.1")
    drv = DriverBackend(str(other))
    assert drv.state(101) == RUNNING
    assert [(c["call"], c["result"]) for c in fake.calls()] == [("get_state", "3"), ("init", "0"), ("get_state", "0")]
    fake.clear_log()
    drv.lock(101)
    assert "init" not in [c["call"] for c in fake.calls()], "cuInit once per library"


def test_cu_init_failure_is_named(fake: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.add(101)
    monkeypatch.setenv("FAKE_CUDA_REQUIRE_INIT", "1")
    monkeypatch.setenv("FAKE_CUDA_INIT_RESULT", "100")
    drv = DriverBackend(str(compile_fake(tmp_path / "noinit" / "libcuda.so.1")))
    with pytest.raises(CudaError, match=r"^pid 101: cuInit failed: CUDA_ERROR_NO_DEVICE \(after cuCheckpointProcessGetState"):
        drv.state(101)


# --- high level: all or nothing -----------------------------------------------------------------------------------


def test_lock_and_checkpoint_then_restore_and_unlock(fake: Fake, drv: DriverBackend) -> None:
    fake.add(101, gpus=[UUID_A])
    fake.add(102, gpus=[UUID_A])
    timings = lock_and_checkpoint([101, 102], 5000, drv)
    assert set(timings) == {"cuda_lock", "cuda_checkpoint"} and all(v >= 0 for v in timings.values())
    assert fake.states() == {101: "checkpointed", 102: "checkpointed"}
    order = [(c["call"], c["pid"]) for c in fake.calls("lock", "checkpoint")]
    assert order == [("lock", "101"), ("lock", "102"), ("checkpoint", "101"), ("checkpoint", "102")], "all locked before any checkpoint"
    assert {c["timeoutMs"] for c in fake.calls("lock")} == {"5000"}
    fake.clear_log()
    timings = restore_and_unlock([101, 102], [(UUID_A, UUID_B)], drv)
    assert set(timings) == {"cuda_restore", "cuda_unlock"}
    assert fake.states() == {101: "running", 102: "running"}
    order = [(c["call"], c["pid"]) for c in fake.calls("restore", "unlock")]
    assert order == [("restore", "101"), ("restore", "102"), ("unlock", "101"), ("unlock", "102")]
    assert {c["pair0"] for c in fake.calls("restore")} == {f"{hexid(UUID_A)}:{hexid(UUID_B)}"}


def test_failed_checkpoint_of_the_second_pid_rolls_both_back(
        fake: Fake, drv: DriverBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.add(101)
    fake.add(102)
    monkeypatch.setenv("FAKE_CUDA_FAIL", "checkpoint:102=801")
    with pytest.raises(CudaError) as err:
        lock_and_checkpoint([101, 102], 5000, drv)
    text = str(err.value)
    assert text.startswith("pid 102: cuCheckpointProcessCheckpoint failed: CUDA_ERROR_NOT_SUPPORTED")
    assert "rolled back: pid(s) 101, 102 running again" in text
    assert err.value.pid == 102 and err.value.result == 801
    assert isinstance(err.value.__cause__, CudaError)
    assert fake.states() == {101: "running", 102: "running"}, "no process is left locked"
    undo = [(c["call"], c["pid"]) for c in fake.calls("restore", "unlock")]
    assert undo == [("restore", "101"), ("unlock", "101"), ("unlock", "102")]


def test_lock_timeout_of_the_second_pid_unlocks_the_first(fake: Fake, drv: DriverBackend) -> None:
    fake.add(101)
    fake.add(102, busy=True)
    with pytest.raises(CudaError, match=r"pid 102: cuCheckpointProcessLock failed: CUDA_ERROR_NOT_READY"):
        lock_and_checkpoint([101, 102], 200, drv)
    assert fake.states() == {101: "running", 102: "running"}
    assert fake.calls("checkpoint") == []


def test_a_failed_rollback_is_reported(fake: Fake, drv: DriverBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.add(101)
    fake.add(102)
    monkeypatch.setenv("FAKE_CUDA_FAIL", "checkpoint:102=801,unlock:101=999")
    with pytest.raises(CudaError) as err:
        lock_and_checkpoint([101, 102], 0, drv)
    assert "CUDA_ERROR_NOT_SUPPORTED" in str(err.value)
    assert "rolling back failed, these may stay locked: pid 101: cuCheckpointProcessUnlock failed: CUDA_ERROR_UNKNOWN" in str(err.value)
    assert fake.states() == {101: "locked", 102: "running"}


def test_a_process_locked_by_someone_else_is_refused_and_left_alone(fake: Fake, drv: DriverBackend) -> None:
    fake.add(101)
    fake.add(102, "locked")
    with pytest.raises(CudaStateError, match=r"pid 102: cannot lock a CUDA process in state LOCKED \(already locked\); "
                                             r"rolled back: pid\(s\) 101 running again"):
        lock_and_checkpoint([101, 102], 0, drv)
    assert fake.states() == {101: "running", 102: "locked"}


def test_restore_failure_names_the_pid(fake: Fake, drv: DriverBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.add(101, "checkpointed")
    fake.add(102, "checkpointed")
    monkeypatch.setenv("FAKE_CUDA_FAIL", "restore:102=2")
    with pytest.raises(CudaError, match=r"^pid 102: cuCheckpointProcessRestore failed: CUDA_ERROR_OUT_OF_MEMORY"):
        restore_and_unlock([101, 102], None, drv)
    assert fake.calls("unlock") == [], "nothing runs before every process has its GPUs back"


# --- finding CUDA processes ---------------------------------------------------------------------------------------


class FakeNvml:
    def __init__(self, per_gpu: List[List[int]]) -> None:
        self.per_gpu = per_gpu
        self.shutdown = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.per_gpu)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> List[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=1) for pid in self.per_gpu[handle]]


def test_find_cuda_pids_asks_the_restore_thread(fake: Fake, drv: DriverBackend) -> None:
    fake.add(101)
    fake.add(103, "checkpointed")
    assert find_cuda_pids([100, 101, 102, 103], drv, nvml=FakeNvml([])) == [101, 103]
    assert {c["call"] for c in fake.calls()} == {"get_restore_tid"}


def test_find_cuda_pids_adds_nvml_processes(fake: Fake, drv: DriverBackend) -> None:
    fake.add(101)
    nvml = FakeNvml([[100, 5555], [101]])
    assert find_cuda_pids([100, 101, 102], drv, nvml=nvml) == [100, 101]
    assert nvml.shutdown
    assert find_cuda_pids([100, 101, 102], None, nvml=FakeNvml([[102]])) == [102], "NVML alone without a backend"


def test_find_cuda_pids_takes_not_initialized_for_a_process_without_cuda(
        fake: Fake, drv: DriverBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Driver 580 on an H200 (tests/device) answers a pid that never initialised CUDA with NOT_INITIALIZED."""
    fake.add(101)
    monkeypatch.setenv("FAKE_CUDA_FAIL", "get_restore_tid:100=3")
    assert find_cuda_pids([100, 101], drv, nvml=FakeNvml([])) == [101]


def test_find_cuda_pids_raises_on_a_broken_driver(fake: Fake, drv: DriverBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.add(101)
    monkeypatch.setenv("FAKE_CUDA_FAIL", "get_restore_tid:101=999")
    with pytest.raises(CudaError, match="pid 101: cuCheckpointProcessGetRestoreThreadId failed: CUDA_ERROR_UNKNOWN"):
        find_cuda_pids([101], drv, nvml=FakeNvml([]))


# --- device map ---------------------------------------------------------------------------------------------------


def gpus(*items: str) -> List[Dict[str, str]]:
    return [{"uuid": uuid, "name": name} for uuid, name in zip(items[::2], items[1::2])]


def test_device_map_pairs_identical_uuids_first() -> None:
    assert device_map(gpus(UUID_A, H100, UUID_B, H100), gpus(UUID_B, H100, UUID_C, H100)) == [(UUID_A, UUID_C), (UUID_B, UUID_B)]


def test_device_map_pairs_the_rest_by_position() -> None:
    assert device_map(gpus(UUID_A, H100, UUID_B, H100), gpus(UUID_C, H100, UUID_D, H100)) == [(UUID_A, UUID_C), (UUID_B, UUID_D)]
    assert device_map([UUID_A, UUID_B], [UUID_D, UUID_A]) == [(UUID_A, UUID_A), (UUID_B, UUID_D)], "plain UUID strings"


def test_device_map_keeps_models_together() -> None:
    assert device_map(gpus(UUID_A, H100, UUID_B, A100), gpus(UUID_C, A100, UUID_D, H100)) == [(UUID_A, UUID_D), (UUID_B, UUID_C)]


def test_device_map_refuses_other_models_with_both_lists() -> None:
    with pytest.raises(GpuMismatch) as err:
        device_map(gpus(UUID_A, H100), gpus(UUID_C, A100))
    assert str(err.value) == (f"GPU models differ: snapshot GPUs [{UUID_A} {H100}], this node's [{UUID_C} {A100}]")


def test_device_map_refuses_fewer_gpus_with_both_lists() -> None:
    with pytest.raises(GpuMismatch) as err:
        device_map(gpus(UUID_A, H100, UUID_B, H100), gpus(UUID_A, H100))
    assert str(err.value) == (f"GPU count differs: the snapshot used 2, this node has 1: "
                              f"snapshot GPUs [{UUID_A} {H100}, {UUID_B} {H100}], this node's [{UUID_A} {H100}]")


def test_uuid_conversion() -> None:
    raw = _cudaabi.uuid_bytes(UUID_A)
    assert len(raw) == 16 and _cudaabi.uuid_text(raw) == UUID_A
    with pytest.raises(ValueError, match="MIG"):
        _cudaabi.uuid_bytes("MIG-aaaaaaaa-1111-2222-3333-444444444444/1/0")


# --- availability -------------------------------------------------------------------------------------------------


@pytest.fixture
def empty_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH without cuda-checkpoint."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", str(bindir))
    return bindir


def test_availability_without_a_driver(fake: Fake, empty_path: Path) -> None:
    backend, reason = availability("/nonexistent/libcuda.so.1")
    assert backend is None
    assert reason.startswith("/nonexistent/libcuda.so.1 not found (no NVIDIA driver on this node?)")


def test_availability_with_a_driver_older_than_570(fake: Fake, libs: Dict[str, Path], empty_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CUDA_DRIVER_VERSION", "12040")
    backend, reason = availability(str(libs["old"]))
    assert backend is None
    assert f"{libs['old']} (CUDA 12.4) lacks cuCheckpointProcessLock" in reason
    assert "the CUDA checkpoint API needs NVIDIA driver >= 570 (CUDA 12.8)" in reason
    with pytest.raises(CudaUnavailable, match=">= 570"):
        DriverBackend(str(libs["old"]))


def test_availability_with_the_api(fake: Fake, empty_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend, reason = availability(str(fake.lib))
    assert isinstance(backend, DriverBackend) and reason == f"CUDA driver API ({fake.lib}, CUDA 13.0)"
    monkeypatch.setenv("WARMSTART_LIBCUDA", str(fake.lib))
    backend = availability()[0]
    assert isinstance(backend, DriverBackend) and backend.library == str(fake.lib)


def test_availability_real_node_never_raises() -> None:
    backend, reason = availability()
    assert reason and (backend is not None or "libcuda" in reason or "cuda-checkpoint" in reason)


# --- the cuda-checkpoint fallback ---------------------------------------------------------------------------------

FAKE_CLI = r'''#!{python}
"""A fake cuda-checkpoint: logs its argv, then drives the fake libcuda (so state and checks are the driver's)."""
import ctypes, os, struct, sys

argv = sys.argv[1:]
with open(os.environ["FAKE_CLI_LOG"], "a") as log:
    log.write(" ".join(argv) + "\n")
if "--help" in argv or "-h" in argv:
    print("--action lock | checkpoint | restore | unlock --pid <pid> [--timeout <ms>]")
    sys.exit(0)
lib = ctypes.CDLL(os.environ["FAKE_LIBCUDA_PATH"])


def opt(name):
    return argv[argv.index(name) + 1]


def check(code):
    if code:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(code, ctypes.byref(name))
        print("Error: operation failed with %s" % (name.value.decode() if name.value else code), file=sys.stderr)
        sys.exit(1)


def raw_uuid(text):
    return bytes.fromhex(text.replace("GPU-", "").replace("-", ""))


pid = int(opt("--pid"))
out = ctypes.c_int(0)
if "--get-state" in argv:
    check(lib.cuCheckpointProcessGetState(pid, ctypes.byref(out)))
    print(["running", "locked", "checkpointed", "failed"][out.value])
    sys.exit(0)
if "--get-restore-tid" in argv:
    check(lib.cuCheckpointProcessGetRestoreThreadId(pid, ctypes.byref(out)))
    print(out.value)
    sys.exit(0)
action = opt("--action")
args = (ctypes.c_ubyte * 64)()
if action == "lock":
    struct.pack_into("<I", args, 0, int(opt("--timeout")) if "--timeout" in argv else 0)
    check(lib.cuCheckpointProcessLock(pid, args))
elif action == "checkpoint":
    check(lib.cuCheckpointProcessCheckpoint(pid, args))
elif action == "restore":
    pairs = [item.split("=") for item in opt("--device-map").split(",")] if "--device-map" in argv else []
    table = (ctypes.c_ubyte * (32 * max(len(pairs), 1)))()
    for i, (old, new) in enumerate(pairs):
        table[32 * i:32 * i + 32] = list(raw_uuid(old) + raw_uuid(new))
    if pairs:
        struct.pack_into("<QI", args, 0, ctypes.addressof(table), len(pairs))
    check(lib.cuCheckpointProcessRestore(pid, args))
elif action == "unlock":
    check(lib.cuCheckpointProcessUnlock(pid, args))
'''


class Cli:
    def __init__(self, bindir: Path, log: Path) -> None:
        self.bindir = bindir
        self.log = log

    def argv(self) -> List[str]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [line for line in lines if line != "--help"]


@pytest.fixture
def cli(fake: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cli]:
    bindir = tmp_path / "cli-bin"
    bindir.mkdir()
    script = bindir / "cuda-checkpoint"
    script.write_text(FAKE_CLI.replace("{python}", sys.executable))
    script.chmod(0o755)
    log = tmp_path / "cli.log"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_CLI_LOG", str(log))
    monkeypatch.setenv("FAKE_LIBCUDA_PATH", str(fake.lib))
    yield Cli(bindir, log)


def test_cli_backend_full_cycle(fake: Fake, cli: Cli) -> None:
    fake.add(101, gpus=[UUID_A])
    backend = CliBackend()
    assert backend.binary == str(cli.bindir / "cuda-checkpoint")
    assert find_cuda_pids([100, 101], backend, nvml=FakeNvml([])) == [101]
    assert backend.restore_thread_id(101) == 102
    lock_and_checkpoint([101], 700, backend)
    assert fake.states() == {101: "checkpointed"}
    restore_and_unlock([101], [(UUID_A, UUID_B)], backend)
    assert fake.states() == {101: "running"}
    actions = [line for line in cli.argv() if line.startswith("--action")]
    assert actions == [
        "--action lock --timeout 700 --pid 101",
        "--action checkpoint --pid 101",
        f"--action restore --device-map {UUID_A}={UUID_B} --pid 101",
        "--action unlock --pid 101",
    ]
    (call,) = fake.calls("restore")
    assert call["pair0"] == f"{hexid(UUID_A)}:{hexid(UUID_B)}"
    (call,) = fake.calls("lock")
    assert call["timeoutMs"] == "700"


def test_cli_backend_refuses_and_reports_like_the_api(fake: Fake, cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.add(101)
    fake.add(102)
    backend = CliBackend()
    with pytest.raises(CudaStateError, match=r"^pid 101: cannot checkpoint a CUDA process in state RUNNING \(lock it first\)$"):
        backend.checkpoint(101)
    assert not [line for line in cli.argv() if line.startswith("--action")]
    monkeypatch.setenv("FAKE_CUDA_FAIL", "checkpoint:102=801")
    with pytest.raises(CudaError) as err:
        lock_and_checkpoint([101, 102], 0, backend)
    assert str(err.value).startswith("pid 102: cuda-checkpoint --action checkpoint failed: CUDA_ERROR_NOT_SUPPORTED")
    assert "rolled back" in str(err.value)
    assert fake.states() == {101: "running", 102: "running"}


def test_availability_falls_back_to_the_cli(fake: Fake, libs: Dict[str, Path], cli: Cli) -> None:
    backend, reason = availability(str(libs["old"]))
    assert isinstance(backend, CliBackend)
    assert reason.startswith(f"cuda-checkpoint utility ({cli.bindir / 'cuda-checkpoint'}); the driver API is not usable: ")
    assert "lacks cuCheckpointProcessLock" in reason


def test_cli_without_action_support_is_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = tmp_path / "cuda-checkpoint"
    old.write_text("#!/bin/sh\necho '--toggle --pid <pid>'\n")
    old.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(CudaUnavailable, match="no --action option: it needs an NVIDIA driver >= 555"):
        CliBackend()
    backend, reason = availability("/nonexistent/libcuda.so.1")
    assert backend is None and reason.startswith("/nonexistent/libcuda.so.1 not found")


def test_a_non_cuda_pid_in_the_tree_fails_the_lock_and_rolls_back_the_rest(fake: Fake, drv: DriverBackend) -> None:
    fake.add(101)
    with pytest.raises(CudaError) as err:
        lock_and_checkpoint([101, 999], 0, drv)
    assert str(err.value) == ("pid 999: cuCheckpointProcessGetState failed: CUDA_ERROR_INVALID_VALUE (not a CUDA process, "
                              "or no such process); rolled back: pid(s) 101 running again")
    assert fake.states() == {101: "running"}


def test_a_lock_timeout_on_the_only_pid_leaves_nothing_locked(fake: Fake, drv: DriverBackend) -> None:
    fake.add(101, busy=True)
    with pytest.raises(CudaError, match=r"still RUNNING\); no process was left locked$"):
        lock_and_checkpoint([101], 100, drv)
