"""_containerd: containerd's records -> ContainerInfo, the task's state, label filters, and each refusal.

``ctr`` is a stand-in script that answers from a table (and logs each call), the socket a real listening unix
socket in tmp_path, containerd's state dir a tmp_path with the task's bundle; the real daemon is exercised by
tests/integration/test_containerd.py.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime import _containerd as cd
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._proc import TargetError

CID = "embed-main"
PARENT = "sha256:6a46ff5c995d6cfd6c512a5ca0b1ce454c9310f371cb42cb53c996f4169d3116"
RECORD: Dict[str, Any] = {
    "ID": CID,
    "Labels": {"io.kubernetes.pod.name": "embed-0", "io.kubernetes.container.name": "main"},
    "Image": "localhost/warmstart-node:bookworm",
    "Runtime": {"Name": "io.containerd.runc.v2"},
    "SnapshotKey": CID,
    "Snapshotter": "overlayfs",
    "Spec": {
        "hostname": "embed-0",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/app", "type": "bind", "source": "/srv/app", "options": ["rbind", "ro"]},
            {"destination": "/snapshot-control", "type": "bind", "source": "/srv/ctl", "options": ["rbind", "rw"]},
        ],
        "linux": {"cgroupsPath": "/k8s.io/embed-main"},
    },
}
FAKE_CTR = r'''#!{python}
import json, sys
args = sys.argv[1:]
with open({log!r}, "a") as log:
    log.write(json.dumps(args) + "\n")
table = json.load(open({table!r}))
key = " ".join(args[4:])  # after --address A --namespace N
rc, out, err = table.get(key, [1, "", "ctr: unexpected call " + key])
sys.stdout.write(out)
sys.stderr.write(err)
sys.exit(rc)
'''


class World:
    """A Containerd whose ctr is the stand-in, whose socket listens, and whose state dir is ours."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.table: Dict[str, List[Any]] = {}
        self.log = tmp / "calls.log"
        self.short = Path(tempfile.mkdtemp(prefix="ws-ctd-unit-"))  # a socket's path must fit a sockaddr_un
        self.sock = self.short / "containerd.sock"
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.sock))
        self.listener.listen(8)
        ctr = tmp / "ctr"
        ctr.write_text(FAKE_CTR.format(python=sys.executable, log=str(self.log), table=str(tmp / "table.json")))
        ctr.chmod(0o755)
        self.runtime = cd.Containerd(binary=str(ctr), env={"CONTAINERD_ADDRESS": f"unix://{self.sock}",
                                                           "CONTAINERD_NAMESPACE": "k8s.io", cd.STATE_ENV: str(tmp)})
        self.runtime.runc = ""  # the task's status from its init's liveness
        self.bundle = tmp / cd.TASKS / "k8s.io" / CID

    def answer(self, call: str, rc: int = 0, out: Any = "", err: str = "") -> None:
        self.table[call] = [rc, out if isinstance(out, str) else json.dumps(out), err]
        (self.tmp / "table.json").write_text(json.dumps(self.table))

    def task(self, pid: int) -> None:
        self.bundle.mkdir(parents=True, exist_ok=True)
        (self.bundle / "init.pid").write_text(str(pid))

    def calls(self) -> List[List[str]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []


@pytest.fixture(name="world")
def fixture_world(tmp_path: Path) -> Iterator[World]:
    world = World(tmp_path)
    world.answer(f"containers info {CID}", out=RECORD)
    world.answer(f"snapshots --snapshotter overlayfs info {CID}", out={"Kind": "Active", "Name": CID, "Parent": PARENT})
    world.answer("tasks ls -q", out="")
    try:
        yield world
    finally:
        world.listener.close()
        shutil.rmtree(world.short, ignore_errors=True)


def test_the_environment_names_socket_namespace_and_state_dir() -> None:
    rt = cd.Containerd(binary="/bin/true", env={})
    assert (rt.address, rt.namespace, rt.state) == ("/run/containerd/containerd.sock", "k8s.io", "/run/containerd")
    k3s = cd.Containerd(binary="/bin/true", env={"CONTAINERD_ADDRESS": "/run/k3s/containerd/containerd.sock"})
    assert (k3s.address, k3s.state) == ("/run/k3s/containerd/containerd.sock", "/run/k3s/containerd")
    pinned = cd.Containerd(binary="/bin/true", env={cd.STATE_ENV: "/var/run/ctd", "CONTAINERD_NAMESPACE": "moby"})
    assert (pinned.state, pinned.namespace) == ("/var/run/ctd", "moby")


def test_a_running_task_is_described_from_its_record_snapshot_and_bundle(world: World) -> None:
    world.task(os.getpid())
    info = world.runtime.inspect(CID)
    assert (info.id, info.name, info.runtime, info.image) == (CID, CID, "containerd", "localhost/warmstart-node:bookworm")
    assert info.image_id == PARENT, "the image id is the chain id of the image's layers (the snapshot's parent)"
    assert info.running and info.status == "running" and info.pid == os.getpid()
    assert info.rootfs == str(world.bundle / "rootfs") and info.upper_dir is None  # nothing mounted there
    assert info.hostname == "embed-0" and info.cgroup_path  # this process's own cgroup
    assert info.mounts[1:] == [{"destination": "/app", "source": "/srv/app", "type": "bind", "rw": False},
                               {"destination": "/snapshot-control", "source": "/srv/ctl", "type": "bind", "rw": True}]
    assert world.calls()[0][:4] == ["--address", str(world.sock), "--namespace", "k8s.io"]


def test_a_dead_init_or_no_task_is_not_running(world: World) -> None:
    world.task(0)
    info = world.runtime.inspect(CID)
    assert (info.running, info.status, info.pid) == (False, "stopped", 0)
    (world.bundle / "init.pid").unlink()
    info = world.runtime.inspect(CID)
    assert (info.running, info.status, info.pid, info.rootfs) == (False, "created", 0, "")


def test_a_task_whose_bundle_is_elsewhere_names_the_state_dir_setting(world: World) -> None:
    world.answer("tasks ls -q", out=f"other\n{CID}\n")
    with pytest.raises(TargetError, match=rf"container {CID}: containerd has a task for it, but its bundle .* does not "
                                          rf"exist: set {cd.STATE_ENV}"):
        world.runtime.inspect(CID)


def test_an_unknown_or_invalid_container_is_refused_naming_it_and_the_socket(world: World) -> None:
    world.answer("containers info nope", rc=1, err='ctr: container "nope" in namespace "k8s.io": not found\n')
    with pytest.raises(TargetError, match=rf"container nope not found in containerd at {world.sock}, namespace k8s.io"):
        world.runtime.inspect("nope")
    world.answer("containers info broken", rc=1, err="ctr: rpc error: code = Unavailable\n")
    with pytest.raises(TargetError, match=r"ctr containers info for container broken failed .*: ctr: rpc error"):
        world.runtime.inspect("broken")
    for bad in ("", "--all", "a/b", "x" * 77):
        with pytest.raises(TargetError, match=r"is not valid for containerd"):
            world.runtime.inspect(bad)


def test_unreadable_output_is_refused(world: World) -> None:
    world.answer(f"containers info {CID}", out="not json")
    with pytest.raises(TargetError, match=rf"ctr containers info for container {CID}: unreadable output"):
        world.runtime.inspect(CID)


def test_a_missing_socket_or_ctr_is_named(world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gone = cd.Containerd(binary=world.runtime.binary, address=str(tmp_path / "gone.sock"))
    with pytest.raises(TargetError, match=rf"containerd socket {tmp_path}/gone.sock does not exist"):
        gone.inspect(CID)
    plain = tmp_path / "plain"
    plain.write_text("")
    with pytest.raises(TargetError, match=rf"containerd socket {plain}: cannot connect"):
        cd.Containerd(binary=world.runtime.binary, address=str(plain)).inspect(CID)
    monkeypatch.setattr(cd.shutil, "which", lambda name: None)
    with pytest.raises(TargetError, match=r"ctr is not installed on this node"):
        cd.Containerd(binary="", address=str(world.sock)).pod_containers("d", "p", "c")


def test_permission_denied_on_the_socket_is_named(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    class Denied(socket.socket):
        def connect(self, address: Any) -> None:
            raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cd.socket, "socket", Denied)
    with pytest.raises(TargetError, match=rf"containerd socket {world.sock}: permission denied"):
        world.runtime.inspect(CID)


def test_pod_containers_filter_by_the_cri_labels(world: World) -> None:
    query = ('labels."io.kubernetes.pod.namespace"=="ml",labels."io.kubernetes.pod.name"=="embed-0",'
             'labels."io.kubernetes.container.name"=="main"')
    world.answer(f"containers ls -q {query}", out=f"{CID}\n\nold-{CID}\n")
    assert world.runtime.pod_containers("ml", "embed-0", "main") == [CID, f"old-{CID}"]
    assert world.calls()[-1][4:] == ["containers", "ls", "-q", query]
    with pytest.raises(TargetError, match=r"not a Kubernetes name \(io.kubernetes.pod.name='a\"b'\)"):
        world.runtime.pod_containers("ml", 'a"b', "main")


def test_a_failing_pod_query_is_refused(world: World) -> None:
    with pytest.raises(TargetError, match=r"ctr containers ls \(pod ml/embed-9, containerd at .*\) failed: ctr: unexpected"):
        world.runtime.pod_containers("ml", "embed-9", "main")


def test_label_filter_ands_every_label() -> None:
    assert cd.label_filter({"a": "1", "b.c": "x-y"}) == 'labels."a"=="1",labels."b.c"=="x-y"'


MOUNTINFO = (
    "22 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
    "47 27 0:40 / /run/containerd/io.containerd.runtime.v2.task/k8s.io/a/rootfs rw,relatime - overlay overlay "
    "rw,lowerdir=/var/lib/c/snapshots/1/fs,upperdir=/var/lib/c/snapshots/2/fs,workdir=/var/lib/c/snapshots/2/work\n"
    "48 27 0:41 / /run/x\\040y/rootfs rw - overlay overlay rw,lowerdir=/l,upperdir=/u\\040p,workdir=/w\n"
    "49 27 0:42 / /run/hidden/rootfs rw - overlay overlay rw,lowerdir=/l,upperdir=/u2,workdir=/w\n"
    "50 49 0:43 / /run/hidden/rootfs rw - tmpfs tmpfs rw\n"
)


@pytest.mark.parametrize("mountpoint, upper", [
    ("/run/containerd/io.containerd.runtime.v2.task/k8s.io/a/rootfs", "/var/lib/c/snapshots/2/fs"),
    ("/run/x y/rootfs", "/u p"),
    ("/run/hidden/rootfs", None),
    ("/nowhere", None),
])
def test_the_upper_dir_comes_from_the_rootfs_overlay_mount(mountpoint: str, upper: Any) -> None:
    assert cd.upper_dir(MOUNTINFO, mountpoint) == upper


def test_container_info_from_a_bare_record() -> None:
    info = cd.container_info({"ID": "x"}, "created", 0, "", None, "")
    assert (info.id, info.image, info.running, info.cgroup_path, info.mounts) == ("x", "", False, "", [])
    info = cd.container_info(RECORD, "running", 0, "/r", "/u", PARENT)
    assert not info.running, "no PID: not running, whatever the status says"
    assert info.cgroup_path == "/k8s.io/embed-main", "the spec's cgroup path when the init's cannot be read"


@pytest.mark.parametrize("text, want", [
    ("12:pids:/a\n0::/k8s.io/x\n", "/k8s.io/x"),
    ("0::/\n4:memory:/k8s.io/y\n", "/k8s.io/y"),
])
def test_the_cgroup_of_a_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, want: str) -> None:
    real_open = open
    path = tmp_path / "cgroup"
    path.write_text(text)

    def fake_open(name: Any, *args: Any, **kwargs: Any) -> Any:
        return real_open(path if name == "/proc/77/cgroup" else name, *args, **kwargs)

    monkeypatch.setattr("builtins.open", fake_open)
    assert cd.unified_cgroup(77) == want


def test_runc_state_gives_the_status_and_its_root_comes_from_the_shim_options(world: World, tmp_path: Path) -> None:
    runc = tmp_path / "runc"
    calls = tmp_path / "runc.log"
    runc.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\necho '{{\"id\": \"{CID}\", \"status\": \"paused\"}}'\n")
    runc.chmod(0o755)
    world.task(os.getpid())
    (world.bundle / "options.json").write_text(json.dumps({"root": "/run/custom-runc"}))
    world.runtime.runc = str(runc)
    info = world.runtime.inspect(CID)
    assert (info.status, info.running, info.pid) == ("paused", False, os.getpid())
    assert calls.read_text().split() == ["--root", "/run/custom-runc/k8s.io", "state", CID]
