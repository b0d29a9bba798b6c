"""GPU containers into placeholders: real podman containers, real CRIU, the fake libcuda (tests/support).

The source container runs container_lab.APP with two forked workers (a tree of three processes) and has the
fake ``libcuda.so.1`` bind-mounted and loaded (``ctypes``), as a CUDA workload maps its driver library; the
placeholder gets the same mount. The modules load the same fake through ``$WARMSTART_LIBCUDA``, told that every
process of the app's tree is a CUDA process (``FAKE_CUDA_ADOPT``). Proven with real CRIU dumps and restores:

- checkpoint of the container locks all three CUDA processes, checkpoints all three, dumps, and gives them back
  (restore, unlock) since the source keeps running; the manifest names all three;
- restore into the placeholder: CRIU into its namespaces, then restore of all three restored processes, then
  unlock of all three, then ``restore-complete``; the copy answers from the placeholder's IP with the source's
  memory (its token and SHA256) and both workers alive;
- a checkpoint failure in one process (the second worker) rolls back all three: running again, nothing
  published; a failure of the unlock after the restore kills the copy and the placeholder and writes
  ``restore-failed``, never ``restore-complete``;
- a workload that exported "device memory" as a file descriptor (the fake's ``cuMemExportToShareableHandle``,
  opening the container's ``/dev/nvidiactl``) before forking its workers is refused before anything is locked,
  the reasons naming the processes that share it.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from tests.support.fake_cuda import compile_fake

from .container_lab import Pod, ask, pod_for, wait_file

pytestmark = pytest.mark.integration

LIBDIR = "/usr/local/fakecuda"
START = (f"import ctypes; ctypes.CDLL('{LIBDIR}/libcuda.so.1'); "
         "exec(compile(open('/app/app.py').read(), '/app/app.py', 'exec'))")
# The app exports "device memory" as a file descriptor before it forks its workers: all three hold it.
EXPORTING = (f"import ctypes; lib = ctypes.CDLL('{LIBDIR}/libcuda.so.1'); fd = ctypes.c_int(-1); "
             "assert lib.cuMemExportToShareableHandle(ctypes.byref(fd), ctypes.c_ulonglong(1), 1, "
             "ctypes.c_ulonglong(0)) == 0 and fd.value >= 0; "
             "exec(compile(open('/app/app.py').read(), '/app/app.py', 'exec'))")


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    yield from pod_for(tmp_path_factory.mktemp("gpu-containers"))


@pytest.fixture
def fake(pod: Pod, tmp_path: Path) -> Dict[str, Any]:
    lib = compile_fake(tmp_path / "lib" / "libcuda.so.1")
    state, log = tmp_path / "cuda.state", tmp_path / "cuda.log"
    state.write_text("")
    env = {"WARMSTART_LIBCUDA": str(lib), "FAKE_CUDA_STATE": str(state), "FAKE_CUDA_LOG": str(log),
           "FAKE_CUDA_ADOPT": "/app/app.py=running"}
    return {"lib": lib, "state": state, "log": log, "env": env}


def run(pod: Pod, fake: Dict[str, Any], name: str, *cmd: str, init: bool = True, device: str = "", **env: str) -> str:
    full = f"{name}-{pod.tag}"
    args = ["run", "-d", "--name", full] + (["--init"] if init else []) + (["--device", device] if device else [])
    args += ["-v", f"{pod.app}:/app:ro", "-v", f"{pod.control(name)}:/snapshot-control",
             "-v", f"{fake['lib'].parent}:{LIBDIR}:ro", "-e", "SNAPSHOT_CONTROL_DIR=/snapshot-control"]
    for key, value in env.items():
        args += ["-e", f"{key}={value}"]
    pod.podman(*args, pod.image, *cmd)
    pod.names.append(full)
    return full


def source(pod: Pod, fake: Dict[str, Any], name: str, start: str = START, device: str = "") -> str:
    full = run(pod, fake, name, "python3", "-c", start, device=device, APP_WORKERS="2", APP_MIB="8")
    wait_file(pod.control(name) / "ready-for-snapshot", 60)
    return full


def app_tree(pod: Pod, full: str) -> List[int]:
    """Host pids of the app's tree in container ``full`` (the app first, then its workers)."""
    rows = [line.split(None, 1) for line in pod.podman("top", full, "hpid", "args").stdout.splitlines()[1:]]
    return sorted(int(pid) for pid, args in rows if args.startswith("python3") and "/app/app.py" in args)


def calls(log: Path) -> List[Dict[str, str]]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [dict(item.split("=", 1) for item in line.split()) for line in lines]


def changes(log: Path) -> List[str]:
    return [f"{c['call']}:{c['pid']}" for c in calls(log) if c["call"] in ("lock", "checkpoint", "restore", "unlock")]


def states(state: Path) -> Dict[int, str]:
    return {int(line.split()[0]): line.split()[1] for line in state.read_text().splitlines() if line.strip()}


def task(t: Dict[str, Any], env: Dict[str, str]) -> Dict[str, Any]:
    return dict(t, environment=env)


def test_a_gpu_container_tree_is_checkpointed_and_restored_into_a_placeholder(pod: Pod, fake: Dict[str, Any]) -> None:
    src = source(pod, fake, "gsrc")
    tree = app_tree(pod, src)
    assert len(tree) == 3, tree
    before = ask(pod.ip(src))
    snap = pod.play([task(pod.checkpoint("checkpoint", container=src, cuda="required", cuda_lock_timeout=5),
                          fake["env"])], "gpu-ck")["checkpoint"]["snapshot"]
    assert sorted(snap["cuda"]["pids"]) == tree and snap["cuda"]["used"] is True
    order = snap["cuda"]["pids"]  # the tree's order: the app, then its workers
    assert changes(fake["log"]) == ([f"lock:{p}" for p in order] + [f"checkpoint:{p}" for p in order]
                                    + [f"restore:{p}" for p in order] + [f"unlock:{p}" for p in order])
    assert len(snap["gpu"]["pids"]) == 3 and {"cuda_lock", "cuda_checkpoint", "dump"} <= set(snap["timings"])
    assert all(states(fake["state"])[p] == "running" for p in tree)  # the source was given back
    assert ask(pod.ip(src))["token"] == before["token"]

    ph = run(pod, fake, "gph", "sleep", "infinity", init=False, ROLE="gph")
    fake["log"].unlink()
    env = dict(fake["env"], FAKE_CUDA_ADOPT="/app/app.py=checkpointed")  # the copies' pids start CHECKPOINTED
    res = pod.play([task(pod.restore("restore", snapshot=snap["id"], cuda="required", into={"container": ph}), env)],
                   "gpu-rs")["restore"]["restore"]
    dest = res["destinations"][0]
    assert dest["result"] == "succeeded", dest
    copies = app_tree(pod, ph)
    assert len(copies) == 3 and not set(copies) & set(tree)
    assert sorted(dest["cuda"]["pids"]) == copies
    assert changes(fake["log"]) == [f"restore:{p}" for p in dest["cuda"]["pids"]] + [
        f"unlock:{p}" for p in dest["cuda"]["pids"]]
    assert all(states(fake["state"])[p] == "running" for p in copies)
    assert {"cuda_restore", "cuda_unlock", "restore"} <= set(dest["timings"])
    complete = (pod.control("gph") / "restore-complete").read_text()
    assert f"host_pid={dest['pid']}" in complete
    answer = ask(pod.ip(ph))
    assert answer["token"] == before["token"] and answer["sha256"] == before["digest"]  # the memory came along
    assert answer["workers"]["alive"] == 2


def test_a_checkpoint_failure_in_one_process_rolls_back_all(pod: Pod, fake: Dict[str, Any]) -> None:
    src = source(pod, fake, "gfail")
    tree = app_tree(pod, src)
    before = ask(pod.ip(src))
    env = dict(fake["env"], FAKE_CUDA_FAIL=f"checkpoint:{tree[2]}=999")
    res = pod.play([task(pod.checkpoint("checkpoint", container=src, cuda="required", expect_fail=True), env)],
                   "gpu-ckfail", ok=False)["checkpoint"]
    assert res.get("failed") and f"pid {tree[2]}" in res["msg"] and "CUDA_ERROR_UNKNOWN" in res["msg"], res
    assert "rolled back" in res["msg"]
    order = changes(fake["log"])
    assert sorted(order[:3]) == sorted(f"lock:{p}" for p in tree)  # all locked together, then the failure
    assert f"checkpoint:{tree[2]}" in order
    assert sorted(c for c in order if c.startswith("unlock:")) == sorted(f"unlock:{p}" for p in tree)
    assert all(states(fake["state"])[p] == "running" for p in tree)  # every process runs again
    assert not any(json_has(s, src) for s in (pod.store / "snapshots").glob("*"))  # nothing published
    assert ask(pod.ip(src))["token"] == before["token"]


def json_has(path: Path, name: str) -> bool:
    manifest = path / "manifest.json"
    return manifest.exists() and name in manifest.read_text()


def test_an_unlock_failure_after_the_restore_kills_copy_and_placeholder(pod: Pod, fake: Dict[str, Any]) -> None:
    src = source(pod, fake, "gunl")
    snap = pod.play([task(pod.checkpoint("checkpoint", container=src, cuda="required"), fake["env"])],
                    "gpu-ck2")["checkpoint"]["snapshot"]
    ph = run(pod, fake, "gunlph", "sleep", "infinity", init=False)
    env = dict(fake["env"], FAKE_CUDA_ADOPT="/app/app.py=checkpointed", FAKE_CUDA_FAIL="unlock:*=999")
    fake["log"].unlink()
    res = pod.play([task(pod.restore("restore", snapshot=snap["id"], into={"container": ph}, expect_fail=True), env)],
                   "gpu-rsfail", ok=False)["restore"]
    assert res.get("failed")
    dest = res["restore"]["destinations"][0]
    assert dest["result"] == "failed" and "cuda restore failed" in dest["error"] and "ProcessUnlock" in dest["error"], dest
    assert dest["placeholder"] == "killed"
    end = time.monotonic() + 30
    while pod.running(ph):  # podman notices its container's PID 1 gone a moment later
        assert time.monotonic() < end, f"placeholder {ph} still running"
        time.sleep(0.2)
    assert [c.split(":")[0] for c in changes(fake["log"])][:3] == ["restore"] * 3
    assert (pod.control("gunlph") / "restore-failed").exists()
    assert not (pod.control("gunlph") / "restore-complete").exists()


def test_cuda_memory_shared_between_processes_is_refused_before_anything_is_locked(pod: Pod,
                                                                                   fake: Dict[str, Any]) -> None:
    src = source(pod, fake, "gipc", start=EXPORTING, device="/dev/null:/dev/nvidiactl")
    tree = app_tree(pod, src)
    before = ask(pod.ip(src))
    res = pod.play([task(pod.checkpoint("checkpoint", container=src, cuda="auto", expect_fail=True), fake["env"])],
                   "gpu-ipc", ok=False)["checkpoint"]
    assert res.get("failed") and "share GPU memory; nothing was touched" in res["msg"], res
    reasons = " ".join(res.get("reasons") or [res["msg"]])
    assert "share one open /dev/nvidiactl" in reasons and "spawn" in reasons
    assert sum(f"pid {p} " in reasons for p in tree) >= 2
    assert changes(fake["log"]) == []  # nothing was locked
    assert all(p not in states(fake["state"]) or states(fake["state"])[p] == "running" for p in tree)
    assert not any(json_has(s, src) for s in (pod.store / "snapshots").glob("*"))
    assert ask(pod.ip(src))["token"] == before["token"]
