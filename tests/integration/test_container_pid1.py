"""Containers whose app is PID 1 (an ordinary Kubernetes pod: no init), and pods that share one PID namespace.

A PID-1 app is dumped with its PID namespace and restored as PID 1 of a new PID namespace nested in the
placeholder's: it sees itself as PID 1 again, none of its PIDs can collide with the placeholder's, and the
placeholder's PID 1 stays the inert command the runtime watches. A restored copy is found and snapshotted again
the same way. In a pod with a shared PID namespace (``shareProcessNamespace``: a pause process is PID 1) the app
is not PID 1: it is restored beside the placeholder's process, in the pod's PID namespace, where its PIDs must be
free. Real podman (runc), real CRIU.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any, Dict, Iterator, List

import pytest

from .container_lab import Pod, ask, mounts_of, pod_for, wait_file

# serial: it watches what the whole node holds (its mount table, any CRIU worker running): nothing else may run beside it.
pytestmark = [pytest.mark.integration, pytest.mark.serial]


def nspid(pid: int) -> List[int]:
    with open(f"/proc/{pid}/status", "r", encoding="utf-8") as handle:
        return [int(p) for p in next(line for line in handle if line.startswith("NSpid:")).split()[1:]]


def pid_ns(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/pid").st_ino


def workers(pod: Pod, full: str) -> Dict[str, Any]:
    return ask(pod.ip(full))["workers"]


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    yield from pod_for(tmp_path_factory.mktemp("pid1"))


@pytest.fixture(scope="module")
def pid1(pod: Pod) -> Dict[str, Any]:
    """A PID-1 app with two worker processes, checkpointed, restored into two placeholders, then one copy
    checkpointed again and restored into a third placeholder."""
    src = pod.run("app1", "python3", "/app/app.py", init=False, env={"APP_WORKERS": "2"})
    wait_file(pod.control("app1") / "ready-for-snapshot", 60)
    time.sleep(1.0)
    before = ask(pod.ip(src))
    ph = [pod.placeholder(f"app1-ph{n}") for n in range(3)]
    mounts = {"host": mounts_of(os.getpid()), "ph": mounts_of(pod.pid1(ph[0]))}
    res = pod.play([
        pod.checkpoint("checkpoint", container=src, leave_running=False),
        pod.restore("restore", name=src, into={"container_map": [f"{src}={ph[0]}", f"{src}={ph[1]}"]}),
        pod.checkpoint("checkpoint the copy", container=ph[0], name="app1-copy"),
        pod.restore("restore the copy", name="app1-copy", into={"container": ph[2]}),
    ], "pid1")
    mounts.update(host_after=mounts_of(os.getpid()), ph_after=mounts_of(pod.pid1(ph[0])))
    time.sleep(1.0)
    return {"src": src, "ph": ph, "before": before, "res": res, "mounts": mounts,
            "answers": {p: ask(pod.ip(p)) for p in ph}}


def test_a_pid1_app_is_snapshotted_with_its_pid_namespace(pid1: Dict[str, Any]) -> None:
    snap = pid1["res"]["checkpoint"]["snapshot"]
    assert snap["name"] == pid1["src"]
    assert pid1["before"]["pid"] == 1, "the source app does not run as PID 1"


def test_a_pid1_app_restores_as_pid1_of_a_namespace_nested_in_each_placeholder(pod: Pod, pid1: Dict[str, Any]) -> None:
    res = pid1["res"]["restore"]["restore"]
    assert res["outcome"] == "succeeded", res
    for p in pid1["ph"][:2]:
        got = pid1["answers"][p]
        assert got["token"] == pid1["before"]["token"] and got["digest"] == pid1["before"]["digest"]
        assert got["sha256"] == got["digest"], f"{p}: restored memory differs"
        assert got["pid"] == 1, f"{p}: the restored app is not PID 1 of its namespace ({got['pid']})"
        assert got["counter"] > pid1["before"]["counter"], "the request counter did not go on"
        placeholder = pod.pid1(p)
        dest = next(d for d in res["destinations"] if d["container"] == p)
        host = dest["pid"]
        assert nspid(host)[-1] == 1 and len(nspid(host)) == len(nspid(placeholder)) + 1
        assert pid_ns(host) != pid_ns(placeholder)
        lines = pod.ps(p)
        assert lines[0].split()[0] == "1" and "sleep infinity" in lines[0], lines
        assert sum("/app/app.py" in line for line in lines) == 3, lines  # the app and its two workers
        complete = wait_file(pod.control(p.rsplit("-", 1)[0]) / "restore-complete", 5)
        assert f"pid={dest['ns_pid']}" in complete and dest["ns_pid"] == nspid(host)[-2]
    m = pid1["mounts"]
    assert not set(m["host_after"]) - set(m["host"]), "a restore left something mounted on the host"
    assert m["ph_after"] == m["ph"], "a restore left something mounted in the placeholder"
    time.sleep(0.5)
    w = workers(pod, pid1["ph"][1])
    assert w["alive"] == 2 and all(t > 0 for t in w["ticks"]), w


def test_a_restored_pid1_copy_is_found_and_snapshotted_again(pod: Pod, pid1: Dict[str, Any]) -> None:
    again = pid1["res"]["restore the copy"]["restore"]
    assert again["outcome"] == "succeeded", again
    got = ask(pod.ip(pid1["ph"][2]))
    assert got["token"] == pid1["before"]["token"] and got["pid"] == 1
    assert pid1["res"]["checkpoint the copy"]["snapshot"]["source_running"] is True
    assert ask(pod.ip(pid1["ph"][0]))["token"] == pid1["before"]["token"], "the copy stopped after its checkpoint"


def test_a_placeholder_holding_a_restored_copy_is_not_inert(pod: Pod, pid1: Dict[str, Any]) -> None:
    res = pod.play([pod.restore("restore again", True, name=pid1["src"], into={"container": pid1["ph"][1]})],
                   "pid1-busy", ok=False)["restore again"]
    assert res["failed"] and "is not inert" in res["msg"] and "nested PID namespace" in res["msg"], res["msg"]
    assert ask(pod.ip(pid1["ph"][1]))["token"] == pid1["before"]["token"], "the running copy was touched"


# --- pods that share one PID namespace (shareProcessNamespace) -----------------------------------

def pod_create(pod: Pod, name: str) -> str:
    full = f"{name}-{pod.tag}"
    pod.podman("pod", "create", "--name", full, "--share", "net,ipc,uts,pid")
    return full


def in_pod(pod: Pod, where: str, name: str, *cmd: str) -> str:
    full = f"{name}-{pod.tag}"
    pod.podman("run", "-d", "--name", full, "--pod", where, "-v", f"{pod.app}:/app:ro",
               "-v", f"{pod.control(name)}:/snapshot-control", "-e", "SNAPSHOT_CONTROL_DIR=/snapshot-control",
               "-e", f"ROLE={name}", pod.image, *cmd)
    pod.names.append(full)
    return full


def pod_infra(pod: Pod, where: str) -> str:
    infra = json.loads(pod.podman("pod", "inspect", where).stdout)
    infra = infra[0] if isinstance(infra, list) else infra
    return str(infra["InfraContainerID"])


def pod_ip(pod: Pod, where: str) -> str:
    return pod.ip(pod_infra(pod, where))


def next_pid_in(pod: Pod, where: str, pid: int) -> None:
    """Make ``pid`` the next PID handed out in the pod's PID namespace (a shell inside it writes
    ns_last_pid), so that the next container started in the pod gets it whatever ran there before."""
    pod.podman("pod", "start", where)
    host = pod.pid1(pod_infra(pod, where))
    subprocess.run(["nsenter", "-t", str(host), "-p", "--", "sh", "-c",
                    f"echo {pid - 1} > /proc/sys/kernel/ns_last_pid"], check=True, timeout=30)


@pytest.fixture(scope="module")
def shared(pod: Pod) -> Iterator[Dict[str, Any]]:
    """An app in a pod sharing its PID namespace (pause is PID 1), checkpointed; one restore pod whose
    placeholder took the app's PID, one where short-lived containers ran first (as init containers do)."""
    pods = [pod_create(pod, n) for n in ("pod-src", "pod-taken", "pod-free")]
    try:
        src = in_pod(pod, pods[0], "shapp", "python3", "/app/app.py")
        wait_file(pod.control("shapp") / "ready-for-snapshot", 60)
        before = ask(pod_ip(pod, pods[0]))
        next_pid_in(pod, pods[1], before["pid"])
        taken = in_pod(pod, pods[1], "shph-taken", "sleep", "infinity")
        assert nspid(pod.pid1(taken))[-1] == before["pid"], "the placeholder did not take the app's PID"
        for n in range(3):
            pod.podman("run", "--rm", "--pod", pods[2], pod.image, "true")
        free = in_pod(pod, pods[2], "shph-free", "sleep", "infinity")
        res = pod.play([
            pod.checkpoint("checkpoint", container=src, leave_running=False),
            pod.restore("into the taken pid", True, name=src, into={"container": taken}),
            pod.restore("into the free pid", name=src, into={"container": free}),
        ], "shared", ok=False)
        yield {"src": src, "pods": pods, "before": before, "res": res, "taken": taken, "free": free}
    finally:
        for full in pods:
            pod.podman("pod", "rm", "-f", "-t", "0", full, check=False)


def test_an_app_in_a_shared_pid_namespace_restores_beside_the_placeholder(pod: Pod, shared: Dict[str, Any]) -> None:
    assert shared["before"]["pid"] != 1, "the app of a shared-PID pod is PID 1"
    res = shared["res"]["into the free pid"]
    assert not res.get("failed") and res["restore"]["outcome"] == "succeeded", res
    got = ask(pod_ip(pod, shared["pods"][2]))
    assert got["token"] == shared["before"]["token"] and got["pid"] == shared["before"]["pid"], got
    assert got["counter"] > shared["before"]["counter"]
    dest = res["restore"]["destinations"][0]
    assert nspid(dest["pid"])[-1] == shared["before"]["pid"] and pid_ns(dest["pid"]) == pid_ns(pod.pid1(shared["free"]))


def test_a_shared_pid_namespace_whose_pid_is_taken_is_refused_naming_it(pod: Pod, shared: Dict[str, Any]) -> None:
    res = shared["res"]["into the taken pid"]
    assert res["failed"], res
    err = res["restore"]["destinations"][0]["error"]
    assert f"PID {shared['before']['pid']}" in err and "is taken by sleep" in err, err
    assert pod.running(shared["taken"])
