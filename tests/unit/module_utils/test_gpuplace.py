"""_gpuplace: the GPUs a placeholder was given, the GPU restore of a container's tree, shared CUDA memory.

Real processes stand in where the kernel answers (``kcmp`` over two processes holding one open file
description, or two of their own); the CUDA backend is a recording stand-in.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cudaabi as cuabi
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cudabackends as cubk
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _gpuplace as gpl
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _placeholder as ph
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._gpunode import GpuNode
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._containerinfo import ContainerInfo

UUID_A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
UUID_B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
UUID_C = "GPU-cccccccc-1111-2222-3333-444444444444"
H100 = "NVIDIA H100 80GB HBM3"
NODE = [{"index": 0, "uuid": UUID_A, "name": H100}, {"index": 1, "uuid": UUID_B, "name": H100},
        {"index": 2, "uuid": UUID_C, "name": H100}]


def test_visible_gpus_from_nvidia_visible_devices_by_index_and_uuid() -> None:
    given, how, problems = gpl.visible_gpus({"NVIDIA_VISIBLE_DEVICES": f"2,{UUID_A[:12]}"}, [], NODE)
    assert [g["index"] for g in given] == [2, 0] and problems == []
    assert "NVIDIA_VISIBLE_DEVICES=2," in how


def test_nvidia_variable_wins_over_cuda_visible_devices() -> None:
    given = gpl.visible_gpus({"NVIDIA_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "0,2"}, [], NODE)[0]
    assert [g["index"] for g in given] == [1]


@pytest.mark.parametrize("value", ["none", "void", "", "NONE"])
def test_no_gpu_values(value: str) -> None:
    assert gpl.visible_gpus({"NVIDIA_VISIBLE_DEVICES": value}, [0, 1], NODE)[0] == []


def test_all_is_limited_to_the_device_nodes_it_has_and_a_visible_gpu_without_its_node_is_a_problem() -> None:
    given, _how, problems = gpl.visible_gpus({"NVIDIA_VISIBLE_DEVICES": "0,1"}, [1], NODE)
    assert [g["index"] for g in given] == [1]
    assert problems == [f"GPU 0 ({UUID_A}) is visible but the placeholder has no /dev/nvidia0"]
    given, _how, problems = gpl.visible_gpus({"CUDA_VISIBLE_DEVICES": "all"}, [], NODE)
    assert len(given) == 3 and problems == []


def test_device_nodes_alone_and_an_unknown_gpu() -> None:
    given, how, problems = gpl.visible_gpus({}, [0, 2], NODE)
    assert [g["index"] for g in given] == [0, 2] and "/dev/nvidia0, /dev/nvidia2" in how and problems == []
    given, _how, problems = gpl.visible_gpus({"NVIDIA_VISIBLE_DEVICES": "7"}, [], NODE)
    assert given == [] and problems == ["NVIDIA_VISIBLE_DEVICES names GPU '7', which this node does not have"]


def test_device_nodes_are_read_from_the_processes_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia3", "nvidiactl", "nvidia-uvm", "null"):
        (dev / name).write_text("")
    real = os.listdir
    monkeypatch.setattr(gpl.os, "listdir", lambda p: real(str(dev)) if p == "/proc/42/root/dev" else real(p))
    assert gpl.device_nodes(42) == [0, 3]


def _placeholder(monkeypatch: pytest.MonkeyPatch, env: Dict[str, str], nodes: List[int]) -> None:
    monkeypatch.setattr(gpl.proc, "environ", lambda pid: env)
    monkeypatch.setattr(gpl, "device_nodes", lambda pid: nodes)


def test_placeholder_pairs_map_the_snapshot_gpus_onto_the_placeholders(monkeypatch: pytest.MonkeyPatch) -> None:
    _placeholder(monkeypatch, {"NVIDIA_VISIBLE_DEVICES": "1,2"}, [1, 2])
    gpu = {"gpus": [{"uuid": UUID_A, "name": H100}, {"uuid": UUID_B, "name": H100}]}
    pairs, problems = gpl.placeholder_pairs(42, "ph", gpu, NODE)
    assert problems == [] and pairs == [(UUID_A, UUID_C), (UUID_B, UUID_B)]  # same UUID first, then by position


def test_placeholder_with_fewer_gpus_is_refused_naming_both_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    _placeholder(monkeypatch, {"NVIDIA_VISIBLE_DEVICES": "2"}, [2])
    gpu = {"gpus": [{"uuid": UUID_A, "name": H100}, {"uuid": UUID_B, "name": H100}]}
    pairs, problems = gpl.placeholder_pairs(42, "ph", gpu, NODE)
    assert pairs is None and len(problems) == 1
    text = problems[0]
    assert text.startswith("gpu: placeholder ph was given 1 GPU(s)") and "NVIDIA_VISIBLE_DEVICES=2" in text
    assert UUID_A in text and UUID_B in text and UUID_C in text  # both lists


def test_snapshot_without_a_gpu_list_needs_no_mapping(monkeypatch: pytest.MonkeyPatch) -> None:
    _placeholder(monkeypatch, {}, [])
    assert gpl.placeholder_pairs(42, "ph", {"gpus": []}, NODE) == (None, [])


class Recorder(cubk.Backend):
    name = "recorder"

    def __init__(self, states: Dict[int, int], fail: Tuple[str, int] = ("", 0)) -> None:
        self.states = states
        self.calls: List[str] = []
        self.fail = fail

    def state(self, pid: int) -> int:
        return self.states[pid]

    def restore_thread_id(self, pid: int) -> int:
        return pid

    def _do(self, call: str, pid: int, to: int) -> None:
        self.calls.append(f"{call}:{pid}")
        if self.fail == (call, pid):
            raise cuabi.CudaError.failed(pid, call, 999, "CUDA_ERROR_UNKNOWN")
        self.states[pid] = to

    def _restore(self, pid: int, gpu_pairs: cuabi.GpuPairs) -> None:
        self._do("restore", pid, cuabi.LOCKED)

    def _unlock(self, pid: int) -> None:
        self._do("unlock", pid, cuabi.RUNNING)


def test_resume_restores_every_process_then_unlocks_every_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpl, "restored_cuda_pids", lambda root, recorded: [11, 12, 13])
    backend = Recorder({11: cuabi.CHECKPOINTED, 12: cuabi.CHECKPOINTED, 13: cuabi.CHECKPOINTED})
    timings: Dict[str, float] = {}
    out = gpl.resume(10, {"pids": [{"ns_pid": 1}]}, backend, "", [(UUID_A, UUID_B)], timings)
    assert backend.calls == ["restore:11", "restore:12", "restore:13", "unlock:11", "unlock:12", "unlock:13"]
    assert out["pids"] == [11, 12, 13] and out["gpu_pairs"] == [[UUID_A, UUID_B]]
    assert {"cuda_map", "cuda_restore", "cuda_unlock"} <= set(timings)


def test_resume_failure_in_one_process_unlocks_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpl, "restored_cuda_pids", lambda root, recorded: [11, 12])
    backend = Recorder({11: cuabi.CHECKPOINTED, 12: cuabi.CHECKPOINTED}, fail=("restore", 12))
    with pytest.raises(cuabi.CudaError, match="pid 12: restore failed"):
        gpl.resume(10, {"pids": []}, backend, "", None, {})
    assert backend.calls == ["restore:11", "restore:12"]  # nothing runs CUDA work before all are back


def test_resume_without_a_backend_says_why() -> None:
    with pytest.raises(gpl.GpuPlaceError, match="cannot restore GPU state: libcuda.so.1 not found"):
        gpl.resume(10, {"pids": []}, None, "libcuda.so.1 not found", None, {})


def test_restored_cuda_pids_names_the_missing_namespace_pids() -> None:
    me = os.getpid()
    with pytest.raises(gpl.GpuPlaceError, match="namespace pid.s. 999999"):
        gpl.restored_cuda_pids(me, [{"ns_pid": 999999}])


# --- shared CUDA memory: one open file description in two processes ---------------------------------

HOLD = "import sys, time; f = open(sys.argv[1], 'rb'); print('ok', flush=True); time.sleep(60)"
FORKED = ("import os, sys, time; f = open(sys.argv[1], 'rb'); pid = os.fork(); "
          "os.write(1, f'{os.getpid()}\\n'.encode()); time.sleep(60)")


@pytest.fixture
def device(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "nvidia0"
    path.write_text("")
    yield path


def _start(code: str, path: Path) -> subprocess.Popen:  # type: ignore[type-arg]
    return subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)


def test_two_processes_sharing_one_open_device_file_are_found(device: Path) -> None:
    parent = _start(FORKED, device)
    pids: List[int] = []
    try:
        assert parent.stdout
        pids = sorted(int(parent.stdout.readline()) for _n in range(2))
        found = gpl.shared_memory_problems(pids, prefixes=(str(device),))
        assert len(found) == 1
        assert f"pid {pids[0]}" in found[0] and f"pid {pids[1]}" in found[0] and f"share one open {device}" in found[0]
        assert "spawn" in found[0]
    finally:
        for pid in pids:
            os.kill(pid, 9)
        parent.wait()


def test_processes_with_their_own_opens_of_the_device_share_nothing(device: Path) -> None:
    procs = [_start(HOLD, device) for _n in range(2)]
    try:
        for p in procs:
            assert p.stdout and p.stdout.readline().strip() == "ok"
        assert gpl.shared_memory_problems([p.pid for p in procs], prefixes=(str(device),)) == []
        assert gpl.shared_memory_problems([procs[0].pid]) == []  # one process shares nothing
    finally:
        for p in procs:
            p.kill()
            p.wait()


# --- the placeholder check of a GPU container snapshot (_container) ---------------------------------

def _destination(pid: int = 42) -> Any:
    info = ContainerInfo.__new__(ContainerInfo)
    object.__setattr__(info, "pid", pid)
    object.__setattr__(info, "name", "ph")
    return ph.Destination(source={"name": "src"}, name="ph", info=info)


def test_the_container_restore_refuses_a_placeholder_with_other_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    node = GpuNode(availability=lambda: (None, "unused"), inventory=lambda: (NODE, None))
    gpu = {"gpus": [{"uuid": UUID_A, "name": H100}, {"uuid": UUID_B, "name": H100}]}
    _placeholder(monkeypatch, {"NVIDIA_VISIBLE_DEVICES": "2"}, [2])
    d, problems = ph.GpuCheck(gpu, node, False).check(_destination(), ["earlier"])
    assert problems[0] == "earlier" and len(problems) == 2 and "placeholder ph was given 1 GPU(s)" in problems[1]
    assert d.gpu_pairs is None
    _placeholder(monkeypatch, {"NVIDIA_VISIBLE_DEVICES": "0,2"}, [0, 2])
    d, problems = ph.GpuCheck(gpu, node, False).check(_destination(), [])
    assert problems == [] and d.gpu_pairs == [(UUID_A, UUID_A), (UUID_B, UUID_C)]


def test_the_container_restore_without_an_inventory_refuses_a_snapshot_that_listed_gpus() -> None:
    node = GpuNode(availability=lambda: (None, "unused"), inventory=lambda: ([], "NVML unavailable"))
    gpu = {"gpus": [{"uuid": UUID_A, "name": H100}]}
    _d, problems = ph.GpuCheck(gpu, node, False).check(_destination(), [])
    assert problems and UUID_A in problems[0] and "NVML unavailable" in problems[0]
    assert ph.GpuCheck(gpu, node, True).check(_destination(), [])[1] == []
    assert ph.GpuCheck(None, node, False).check(_destination(), ["x"])[1] == ["x"]


def test_a_process_on_a_mig_instance_is_named_with_each_sign(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    caps = tmp_path / "nvidia-caps"
    caps.mkdir()
    (caps / "nvidia-cap21").write_text("")
    (tmp_path / "nvidia0").write_text("")
    monkeypatch.setattr(gpl, "MIG_CAPS", (f"{caps}/", "/proc/driver/nvidia/capabilities/"))
    mig = "MIG-5c89f6d3-2b2a-5b2c-9a4e-4d5e6f708192"
    on_mig = subprocess.Popen([sys.executable, "-c", HOLD, str(caps / "nvidia-cap21")], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "NVIDIA_VISIBLE_DEVICES": f"{mig},0"})
    whole = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "nvidia0")], stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": "GPU-aaaaaaaa-1111"})
    try:
        for p in (on_mig, whole):
            assert p.stdout and p.stdout.readline().strip() == "ok"
        found = gpl.mig_problems([on_mig.pid, whole.pid])
        assert len(found) == 1, found
        assert found[0].startswith(f"cuda: pid {on_mig.pid} runs on a MIG instance (NVIDIA_VISIBLE_DEVICES names {mig}; "
                                   f"it holds MIG capability {caps}/nvidia-cap21 open)")
        assert "MIG mode off" in found[0]
        assert gpl.mig_problems([]) == [] and gpl.mig_problems([1 << 22]) == []  # no such process: no sign
    finally:
        for p in (on_mig, whole):
            p.kill()
            p.wait()
