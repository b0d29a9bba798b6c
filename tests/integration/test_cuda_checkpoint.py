"""GPU options of checkpoint / restore through the real modules and real CRIU, on a node without a GPU.

- ``cuda: required`` on a plain process fails with the cause named, before anything is touched: the
  process keeps running, nothing is staged or published (the real, absent NVIDIA driver).
- ``cuda: auto`` snapshots the same process CPU-only and says why.
- With ``$WARMSTART_LIBCUDA`` pointing at the fake libcuda (tests/support/fake_libcuda.c) told that the
  workload is a CUDA process, the modules lock and checkpoint it around a real CRIU dump, give it back
  (restore + unlock) since it keeps running, and after a real CRIU restore restore + unlock the copy's
  new pid: the fake's call log shows the order.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from tests.support.fake_cuda import task_environment

from .process_lab import Lab, free_port, query, running_free

pytestmark = pytest.mark.integration


def no_real_driver() -> None:
    for path in ("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1", "/usr/lib/aarch64-linux-gnu/libcuda.so.1"):
        if Path(path).exists():
            pytest.skip(f"{path} exists: this node has an NVIDIA driver (the no-GPU case is for nodes without one)")


def started(lab: Lab, name: str) -> Tuple[int, Optional[int], Dict[str, Any]]:
    """Workload ``name`` (8 MiB of pattern memory) started on a free port: (its port, its pid, its first answer)."""
    port = free_port()
    lab.play([lab.start(name, port, 8, "--pattern")])
    return port, lab.pidfile_pid(name), query(port)


def assert_untouched(lab: Lab, pid: Optional[int], port: int, before: int) -> None:
    """After a refusal: the workload still runs untraced and serves (its counter went on past ``before``), and
    nothing was staged or published."""
    assert pid is not None and running_free(pid) and query(port)["counter"] > before  # untouched, still serving
    assert lab.published() == [] and lab.staging() == []


def calls(log: Path) -> List[Dict[str, str]]:
    out = []
    for line in log.read_text().splitlines() if log.exists() else []:
        out.append(dict(item.split("=", 1) for item in line.split()))
    return out


def changes(log: Path) -> List[str]:
    """The state-changing calls, in order, as ``call:pid``."""
    return [f"{c['call']}:{c['pid']}" for c in calls(log) if c["call"] in ("lock", "checkpoint", "restore", "unlock")]


def test_required_fails_cleanly_without_a_driver_and_auto_snapshots_cpu_only(lab: Lab) -> None:
    no_real_driver()
    port, pid, first = started(lab, "plain")
    before = first["counter"]
    res = lab.play([
        lab.checkpoint("required", workload="plain", cuda="required", expect_fail=True),
        lab.checkpoint("check required", workload="plain", cuda="required", check=True, expect_fail=True),
    ])
    failed = res["required"]
    assert failed.get("failed"), failed
    assert failed["msg"].startswith("cuda: required, but this node cannot checkpoint GPU state: libcuda.so.1 not found")
    assert "NVIDIA driver >= 570" in failed["msg"] and "nothing was touched" in failed["msg"]
    assert res["check required"].get("failed") and "libcuda.so.1 not found" in res["check required"]["msg"]
    assert_untouched(lab, pid, port, before)

    res = lab.play([lab.checkpoint("auto", workload="plain", cuda="auto")])
    snap = res["auto"]["snapshot"]
    assert snap["cuda"]["used"] is False
    assert snap["cuda"]["mode"] == "auto"
    assert "no CUDA checkpoint support on this node: libcuda.so.1 not found" in snap["cuda"]["reason"]
    assert snap["gpu"] is None
    assert not [k for k in snap["timings"] if k.startswith("cuda")]
    assert lab.published() == [snap["id"]]
    assert running_free(pid)


def test_fake_cuda_process_is_locked_checkpointed_dumped_and_restored_in_order(lab: Lab) -> None:
    env, state, log = task_environment(lab.tmp, lab.script)
    script = str(lab.script)
    port, pid, first = started(lab, "gpuish")
    token = first["token"]

    task = lab.checkpoint("gpu checkpoint", workload="gpuish", cuda="required", cuda_lock_timeout=5)
    task["environment"] = env
    snap = lab.play([task])["gpu checkpoint"]["snapshot"]
    assert snap["cuda"]["used"] is True and snap["cuda"]["pids"] == [pid], snap["cuda"]
    assert changes(log) == [f"lock:{pid}", f"checkpoint:{pid}", f"restore:{pid}", f"unlock:{pid}"]
    assert [c["timeoutMs"] for c in calls(log) if c["call"] == "lock"] == ["5000"]
    assert {"cuda_lock", "cuda_checkpoint", "cuda_resume", "dump"} <= set(snap["timings"])
    assert snap["gpu"]["pids"] == [{"pid": pid, "ns_pid": 1}]
    assert snap["gpu"]["cuda_version"] == 13000
    assert state.read_text().split()[:2] == [str(pid), "running"]  # given back: the source is not left locked
    assert running_free(pid) and query(port)["token"] == token

    # a CPU-only restore of a GPU snapshot is refused before anything is touched
    lab.play([lab.stop("gpuish")])
    off = lab.restore("restore off", snapshot=snap["id"], cuda="off", expect_fail=True)
    off["environment"] = env
    refused = lab.play([off])["restore off"]
    assert refused.get("failed") and "cuda: off, but the snapshot holds the GPU state" in refused["msg"]

    log.unlink()
    restore_env = dict(env, FAKE_CUDA_ADOPT=f"{script}=checkpointed")  # the copy's new pid starts CHECKPOINTED
    task = lab.restore("gpu restore", snapshot=snap["id"], cuda="required")
    task["environment"] = restore_env
    out = lab.play([task])["gpu restore"]["restore"]
    new = out["pid"]
    assert new != pid
    assert out["cuda"]["used"] is True and out["cuda"]["pids"] == [new]
    assert changes(log) == [f"restore:{new}", f"unlock:{new}"]
    assert {"cuda_restore", "cuda_unlock", "restore"} <= set(out["timings"])
    restored_line = [line for line in state.read_text().splitlines() if line.startswith(f"{new} ")]
    assert restored_line and restored_line[0].split()[1] == "running"
    assert query(port)["token"] == token  # the same process memory, answering again
    complete = (lab.wdir("gpuish") / "control" / "restore-complete").read_text()
    assert f"host_pid={new}" in complete


def test_restore_failure_of_the_gpu_state_kills_the_copy(lab: Lab) -> None:
    env, _state, _log = task_environment(lab.tmp, lab.script)
    port = free_port()
    lab.play([lab.start("gpufail", port, 8, "--pattern")])
    task = lab.checkpoint("gpu checkpoint", workload="gpufail", cuda="required", leave_running=False)
    task["environment"] = env
    snap = lab.play([task])["gpu checkpoint"]["snapshot"]
    task = lab.restore("gpu restore", snapshot=snap["id"], expect_fail=True)
    task["environment"] = dict(env, FAKE_CUDA_ADOPT=f"{lab.script}=checkpointed", FAKE_CUDA_FAIL="restore:*=2")
    failed = lab.play([task])["gpu restore"]
    assert failed.get("failed")
    assert "cuda restore of snapshot" in failed["msg"] and "CUDA_ERROR_OUT_OF_MEMORY" in failed["msg"]
    assert "was killed" in failed["msg"]
    assert lab.ours() == []  # no half-restored copy left
    assert (lab.wdir("gpufail") / "control" / "restore-failed").exists()


def test_accelerator_refusals_name_the_accelerator_asked_for_and_touch_nothing(lab: Lab) -> None:
    """``accelerator: ascend`` (no NPU here) and ``accelerator: cuda`` (no driver here) on a CPU process: each
    refusal names the accelerator asked for and why; the process keeps serving, nothing is staged or published;
    a restore that asks for an accelerator of a CPU-only snapshot is refused, naming it, before anything runs."""
    no_real_driver()
    if list(Path("/dev").glob("davinci[0-9]*")):
        pytest.skip("this node has an Ascend NPU (/dev/davinci*): the no-NPU case is for nodes without one")
    port, pid, first = started(lab, "cpu")
    before = first["counter"]
    res = lab.play([
        lab.checkpoint("ascend", workload="cpu", accelerator="ascend", expect_fail=True),
        lab.checkpoint("check ascend", workload="cpu", accelerator="ascend", check=True, expect_fail=True),
        lab.checkpoint("cuda", workload="cpu", accelerator="cuda", expect_fail=True),
    ])
    ascend = res["ascend"]["msg"]
    assert ascend.startswith(f"accelerator: ascend, but pid {pid} is not an Ascend NPU process"), ascend
    assert "this node has no Ascend NPU (/dev/davinci<N> missing)" in ascend and "nothing was touched" in ascend
    assert "CUDA" not in ascend and "cuda" not in ascend
    assert res["check ascend"]["msg"] == ascend
    assert res["cuda"]["msg"].startswith("cuda: required, but this node cannot checkpoint GPU state")
    assert_untouched(lab, pid, port, before)

    snap = lab.play([lab.checkpoint("cpu only", workload="cpu", leave_running=False)])["cpu only"]["snapshot"]
    refused = lab.play([lab.restore("restore ascend", snapshot=snap["id"], accelerator="ascend", expect_fail=True),
                        lab.restore("restore cuda", snapshot=snap["id"], accelerator="cuda", expect_fail=True)])
    assert refused["restore ascend"]["reasons"] == [
        "accelerator: ascend, but the snapshot holds no NPU state (it was taken CPU-only)"]
    assert refused["restore cuda"]["reasons"] == [
        "cuda: required, but the snapshot holds no GPU state (it was taken CPU-only)"]
    assert lab.ours() == [] and lab.pidfile_pid("cpu") is None
