"""Container snapshots on real containerd containers (Debian's containerd with runc), restored into placeholders.

A private containerd (containerd_lab.Daemon: its own config, socket and state dirs, namespace warmstart-test) runs
the local node image, imported from podman's storage. The source runs container_lab.APP under catatonit (bound in
as ``podman run --init`` does: containerd has no init of its own); placeholders run ``sleep infinity`` as PID 1.
Containers have loopback only: the tests ask the app from inside each container's network namespace, so an answer
through a placeholder's PID is an answer from inside that placeholder. The modules find containerd as a user's
playbook would: CONTAINERD_ADDRESS and CONTAINERD_NAMESPACE in the task's environment.
"""
from __future__ import annotations

import json
import os
import subprocess
import tarfile
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from .container_lab import mounts_of, wait_file
from .containerd_lab import POD_CONTAINER, POD_NAME, POD_NAMESPACE, Daemon, Lab, ask
from .podman_lab import podman_env

# serial: it watches what the whole node holds (its mount table, any CRIU worker running): nothing else may run beside it.
pytestmark = [pytest.mark.integration, pytest.mark.serial]


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    world = Daemon().start()
    try:
        yield world
    finally:
        world.stop()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, daemon: Daemon) -> Iterator[Lab]:
    world = Lab(tmp_path_factory.mktemp("containerd"), daemon)
    try:
        yield world
    finally:
        world.cleanup()


# --- the main path: capture, then restore one snapshot into two placeholders ---------------------------------

@pytest.fixture(scope="module")
def captured(lab: Lab) -> Dict[str, Any]:
    src = lab.source("src")
    before = ask(lab.pid1(src))
    ph = {n: lab.placeholder(n) for n in ("ph-a", "ph-b")}
    ph_mounts = {n: mounts_of(lab.pid1(cid)) for n, cid in ph.items()}
    host_mounts = mounts_of(os.getpid())
    res = lab.play([
        lab.checkpoint("checkpoint", container=src, wait_ready=True),
        lab.restore("restore", name=src, into={"container_map": [f"{src}={ph['ph-a']}", f"{src}={ph['ph-b']}"]}),
    ], "capture")
    return {"src": src, "ph": ph, "before": before, "res": res, "ph_mounts": ph_mounts, "host_mounts": host_mounts,
            "host_mounts_after": mounts_of(os.getpid()),
            "ph_mounts_after": {n: mounts_of(lab.pid1(cid)) for n, cid in ph.items()},
            "answers": {n: ask(lab.pid1(cid)) for n, cid in ph.items()}, "src_after": ask(lab.pid1(src))}


def test_checkpoint_records_the_containerd_container_its_image_and_rootfs_changes(lab: Lab,
                                                                                  captured: Dict[str, Any]) -> None:
    snap = captured["res"]["checkpoint"]["snapshot"]
    src = captured["src"]
    with open(Path(snap["path"]) / "manifest.json", encoding="utf-8") as handle:
        target = json.load(handle)["targets"][0]
    record = lab.daemon.info(src)
    parent = json.loads(lab.daemon.ctr("snapshots", "info", record["SnapshotKey"]).stdout)["Parent"]
    container = target["container"]
    assert container["runtime"] == "containerd" and container["id"] == src
    assert container["image"] == lab.image and container["image_id"] == parent.strip() != ""
    assert target["kind"] == "container" and target["ns_pid"] > 1, "the workload runs under the container's init"
    assert "/snapshot-control" in [m["mountpoint"] for m in target["external_mounts"]]
    tdir = Path(snap["path"]) / "containers" / src
    assert "/etc/issue.net" in json.loads((tdir / "deleted-files.json").read_text())["deleted"]
    with tarfile.open(tdir / "rootfs-diff.tar") as tar:
        member = tar.extractfile("tmp/state.txt")
        assert member is not None and member.read().decode() == captured["before"]["token"]
    # the source went on
    assert captured["src_after"]["token"] == captured["before"]["token"]
    assert captured["src_after"]["counter"] > captured["before"]["counter"]


@pytest.mark.parametrize("name", ["ph-a", "ph-b"])
def test_the_workload_continues_in_each_placeholder(lab: Lab, captured: Dict[str, Any], name: str) -> None:
    res = captured["res"]["restore"]["restore"]
    assert res["outcome"] == "succeeded"
    dest = next(d for d in res["destinations"] if d["container"] == captured["ph"][name])
    assert dest["result"] == "succeeded", dest
    got, before = captured["answers"][name], captured["before"]
    assert got["token"] == before["token"] and got["sha256"] == before["digest"], "memory changed across restore"
    assert got["counter"] >= before["counter"] + 1, "the counter did not go on from the snapshot's"
    assert got["pid"] == dest["ns_pid"] > 1
    assert got["state_file"] == before["token"], "the rootfs diff was not applied"
    assert got["issue_net"] is False, "a file deleted in the source is back"
    assert got["restores"] and got["restores"][-1]["role"] == name, "the copy did not re-read its placeholder's env"
    complete = wait_file(lab.control(name) / "restore-complete", 10)
    assert f"pid={dest['ns_pid']}" in complete and f"host_pid={dest['pid']}" in complete


def test_a_restore_leaves_nothing_mounted(captured: Dict[str, Any]) -> None:
    assert captured["host_mounts_after"] == captured["host_mounts"], "the restore changed the host's mounts"
    for name, before in captured["ph_mounts"].items():
        assert captured["ph_mounts_after"][name] == before, f"the restore mounted something into {name}"


# --- pod targets by the kubelet's CRI labels ----------------------------------------------------------------

@pytest.fixture(scope="module")
def pod_run(lab: Lab) -> Dict[str, Any]:
    ns, tag = "ml", lab.tag
    src_labels = {POD_NAMESPACE: ns, POD_NAME: f"embed-{tag}", POD_CONTAINER: "main"}
    dst_labels = {POD_NAMESPACE: ns, POD_NAME: f"embed-restore-{tag}", POD_CONTAINER: "main"}
    src = lab.source("pod-src", labels=src_labels)
    dst = lab.placeholder("pod-dst", labels=dst_labels)
    before = ask(lab.pid1(src))
    res = lab.play([
        lab.checkpoint("checkpoint pod", pod={"namespace": ns, "name": f"embed-{tag}", "container": "main"},
                       name=f"pod-{tag}"),
        lab.restore("restore into pod", name=f"pod-{tag}",
                    into={"runtime": "auto", "pod": {"namespace": ns, "name": f"embed-restore-{tag}", "container": "main",
                                                     "container_id": f"containerd://{dst}"}}),
    ], "pod")
    return {"src": src, "dst": dst, "before": before, "res": res, "answer": ask(lab.pid1(dst))}


def test_a_pod_container_found_by_its_cri_labels_is_snapshotted_and_restored(pod_run: Dict[str, Any]) -> None:
    snap = pod_run["res"]["checkpoint pod"]["snapshot"]
    with open(Path(snap["path"]) / "manifest.json", encoding="utf-8") as handle:
        target = json.load(handle)["targets"][0]
    assert target["name"] == "main" and target["container"]["id"] == pod_run["src"]
    dest = pod_run["res"]["restore into pod"]["restore"]["destinations"][0]
    assert dest["result"] == "succeeded" and dest["container"] == pod_run["dst"], dest
    assert pod_run["answer"]["token"] == pod_run["before"]["token"]
    assert pod_run["answer"]["counter"] >= pod_run["before"]["counter"] + 1


@pytest.fixture(scope="module")
def shared_pid_pod(lab: Lab) -> Dict[str, Any]:
    """A pod with shareProcessNamespace: its app is the container's own process (no init), PID 1 is the pause.

    A sidecar starts first, so the app's PID is above any the restore pod's placeholder takes (the placeholder
    of a pod like the source would otherwise hold the app's PID: both are their pod's second container)."""
    src = lab.fake_pod("ml", f"shared-{lab.tag}", {"side": ["sleep", "infinity"], "main": ["python3", "/app/app.py"]})
    wait_file(lab.control(f"shared-{lab.tag}-main") / "ready-for-snapshot", 60)
    dst = lab.fake_pod("ml", f"shared-restore-{lab.tag}", {"main": ["sleep", "infinity"]})
    before = ask(lab.pid1(src["main"]))
    res = lab.play([
        lab.checkpoint("checkpoint", pod={"namespace": "ml", "name": f"shared-{lab.tag}", "container": "main"},
                       name=f"shared-{lab.tag}"),
        lab.restore("restore", name=f"shared-{lab.tag}",
                    into={"pod": {"namespace": "ml", "name": f"shared-restore-{lab.tag}", "container": "main"}}),
    ], "shared")
    return {"src": src, "dst": dst, "before": before, "res": res, "answer": ask(lab.pid1(dst["main"]))}


def test_a_shared_pid_namespace_pod_app_is_restored_beside_the_placeholder(lab: Lab, shared_pid_pod: Dict[str, Any]) -> None:
    src, dst = shared_pid_pod["src"], shared_pid_pod["dst"]
    assert lab.daemon.pid1(src["main"]) != lab.daemon.pid1(src["POD"])
    dest = shared_pid_pod["res"]["restore"]["restore"]["destinations"][0]
    assert dest["result"] == "succeeded" and dest["container"] == dst["main"], dest
    got, before = shared_pid_pod["answer"], shared_pid_pod["before"]
    assert got["token"] == before["token"] and got["counter"] >= before["counter"] + 1
    # the copy lives in the restore pod's PID namespace, whose PID 1 is still its pause process
    pause = lab.daemon.pid1(dst["POD"])
    assert os.readlink(f"/proc/{dest['pid']}/ns/pid") == os.readlink(f"/proc/{pause}/ns/pid")
    assert open(f"/proc/{pause}/cmdline", "rb").read().split(b"\0")[:2] == [b"sleep", b"infinity"]


# --- bad input --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def refusals(lab: Lab, captured: Dict[str, Any]) -> Dict[str, Any]:
    src = captured["src"]
    stopped = lab.placeholder("stopped")
    lab.daemon.ctr("tasks", "kill", "-s", "SIGKILL", stopped)
    lab.daemon.ctr("tasks", "wait", stopped, check=False, timeout=30)
    created = f"created-{lab.tag}"
    lab.daemon.ctr("containers", "create", lab.image, created, "sleep", "infinity")
    lab.ids.append(created)
    derived = f"localhost/warmstart-derived:{lab.tag}"
    maker = f"deriver-{uuid.uuid4().hex[:6]}"
    env = podman_env()
    subprocess.run(["podman", "run", "--name", maker, lab.image, "sh", "-c", "echo x > /derived"], env=env, check=True,
                   capture_output=True, timeout=300)
    try:
        subprocess.run(["podman", "commit", "-q", maker, derived], env=env, check=True, capture_output=True, timeout=300)
        lab.daemon.import_podman_image(derived)
    finally:
        subprocess.run(["podman", "rm", "-f", maker], env=env, check=False, capture_output=True)
        subprocess.run(["podman", "rmi", "-f", derived], env=env, check=False, capture_output=True)
    other = lab.placeholder("other", image=derived)
    state = {"other_mounts": mounts_of(lab.pid1(other)), "published": sorted((lab.store / "snapshots").iterdir())}
    missing = {"environment": {"CONTAINERD_ADDRESS": str(lab.tmp / "no-such.sock")}}
    res = lab.play([
        lab.checkpoint("unknown id", True, container=f"nope-{lab.tag}"),
        dict(lab.checkpoint("missing socket", True, container=src), **missing),
        lab.checkpoint("stopped task", True, container=stopped),
        lab.checkpoint("no task", True, container=created),
        lab.checkpoint("auto, unknown id", True, container=f"nope-{lab.tag}", runtime="auto"),
        lab.restore("other image", True, name=src, into={"container": other}),
    ], "refusals", ok=False)
    state.update(res=res, other=other, stopped=stopped, created=created)
    return state


def test_bad_targets_are_refused_naming_the_object_and_the_cause(lab: Lab, refusals: Dict[str, Any]) -> None:
    res = refusals["res"]
    assert res["unknown id"]["failed"]
    assert f"container nope-{lab.tag} not found in containerd at {lab.daemon.socket}" in res["unknown id"]["msg"]
    assert res["missing socket"]["failed"]
    assert f"containerd socket {lab.tmp / 'no-such.sock'} does not exist" in res["missing socket"]["msg"]
    for title, cid in (("stopped task", refusals["stopped"]), ("no task", refusals["created"])):
        assert res[title]["failed"] and f"container {cid} (containerd) is not running" in res[title]["msg"], res[title]
    msg = res["auto, unknown id"]["msg"]
    assert res["auto, unknown id"]["failed"] and "no container runtime on this node knows it" in msg
    assert "containerd:" in msg and "podman:" in msg, msg
    assert sorted((lab.store / "snapshots").iterdir()) == refusals["published"], "a refusal published a snapshot"


def test_a_placeholder_of_another_image_is_refused_and_untouched(lab: Lab, refusals: Dict[str, Any]) -> None:
    res = refusals["res"]["other image"]
    assert res["failed"] and res["restore"]["outcome"] == "failed"
    err = res["restore"]["destinations"][0]["error"]
    assert "warmstart-derived" in err and lab.image in err, err
    assert mounts_of(lab.pid1(refusals["other"])) == refusals["other_mounts"]
    assert not (lab.control("other") / "restore-complete").exists()
