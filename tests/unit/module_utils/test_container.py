"""_restoreinto.restore_into: the outcome of a raised refusal or failure, check mode; restore_one's rollback."""
from __future__ import annotations

from typing import Any, Dict, List

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _container as ctr
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _placeholder as ph
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _preflight as pf
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _restoreinto as rinto
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._runtime import ContainerInfo

DOC = {"id": "20261203T000000Z-abcdef01", "name": "embed", "source": {},
       "targets": [{"name": "app", "kind": "container", "path": "app", "criu": {"options": {}}}]}


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Dict[str, Any]:
    """restore_into with CRIU, the node, the store and the runtime faked; ``calls`` records what was asked."""
    calls: Dict[str, Any] = {"incompatible": [], "checksums": [], "fetch": []}
    monkeypatch.setattr(rinto, "find_criu", lambda path: "/usr/local/bin/criu")
    monkeypatch.setattr(rinto, "describe_node", lambda criu: {"arch": "x86_64"})
    monkeypatch.setattr(pf, "select", lambda *a, **kw: DOC)
    monkeypatch.setattr(rinto, "incompatibilities", lambda source, node: list(calls["incompatible"]))

    def verify_local(store: Any, doc: Dict[str, Any], fetch: bool, cached: bool) -> List[str]:
        calls["fetch"].append(fetch)
        return list(calls["checksums"])

    monkeypatch.setattr(rinto.ck, "verify_local", verify_local)
    monkeypatch.setattr(rinto, "get_runtime", lambda name: object())
    info = ContainerInfo(id="c" * 64, name="ph", runtime="podman", image="i", image_id="x", running=True,
                         status="running", pid=4242, cgroup_path="/cg", rootfs="/r", upper_dir=None, hostname="h")
    monkeypatch.setattr(ph, "check_destination",
                        lambda runtime, target, dest, skip: (ph.Destination(source=target, name=dest, info=info), []))
    return calls


def test_a_snapshot_that_does_not_fit_is_refused_as_incompatible(engine: Dict[str, Any]) -> None:
    engine["incompatible"] = ["arch: the snapshot is aarch64, this node x86_64"]
    engine["checksums"] = ["app/criu/pages-1.img: sha256 mismatch"]
    with pytest.raises(WarmstartError) as err:
        rinto.restore_into(object(), "app=ph", snapshot_id=DOC["id"])
    assert err.value.details == {"outcome": "incompatible"}
    assert err.value.reasons == ["arch: the snapshot is aarch64, this node x86_64",
                                 "checksum: app/criu/pages-1.img: sha256 mismatch"]


def test_no_compatible_snapshot_is_incompatible_and_none_at_all_failed(engine: Dict[str, Any],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def none_fits(*args: Any, **kwargs: Any) -> Dict[str, Any]:
        raise ctr.snap.SnapshotError("no snapshot matching name='embed' is compatible", reasons=["x: arch"])

    monkeypatch.setattr(pf, "select", none_fits)
    with pytest.raises(WarmstartError) as err:
        rinto.restore_into(object(), "app=ph", name="embed")
    assert err.value.details["outcome"] == "incompatible"

    def none_found(*args: Any, **kwargs: Any) -> Dict[str, Any]:
        raise ctr.snap.SnapshotError("no published snapshot matches name='embed'")

    monkeypatch.setattr(pf, "select", none_found)
    with pytest.raises(WarmstartError) as err:
        rinto.restore_into(object(), "app=ph", name="embed")
    assert err.value.details["outcome"] == "failed"


def test_other_raised_failures_are_failed(engine: Dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(WarmstartError, match="destination 'ph' already receives 'app'") as err:
        rinto.restore_into(object(), "app=ph,app=ph", snapshot_id=DOC["id"])
    assert err.value.details["outcome"] == "failed"
    monkeypatch.setattr(rinto, "find_criu", lambda path: None)
    with pytest.raises(WarmstartError, match="no CRIU found") as err:
        rinto.restore_into(object(), "app=ph", snapshot_id=DOC["id"])
    assert err.value.details["outcome"] == "failed"


def test_check_mode_fetches_and_touches_nothing(engine: Dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rinto, "_restore_exclusive", lambda *a: pytest.fail("check mode restored"))
    result = rinto.restore_into(object(), "app=ph", snapshot_id=DOC["id"], check_mode=True)
    assert engine["fetch"] == [False]
    assert result["outcome"] == "succeeded"
    closed = {"mode": "close", "reason": "restored into placeholder ph's network namespace, not the one the "
                                         "connections were dumped in"}
    assert result["destinations"] == [{"container": "ph", "source": "app", "result": "would restore", "notes": [],
                                       "tcp": closed}]


def test_a_failed_restore_kills_what_it_restored_and_the_placeholder(tmp_path: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The rollback path: CRIU restored the tree, the placeholder died meanwhile -> tree and placeholder killed."""
    info = ContainerInfo(id="c" * 64, name="ph", runtime="podman", image="i", image_id="x", running=True,
                         status="running", pid=4242, cgroup_path="/cg", rootfs="/r", upper_dir=None, hostname="h")
    d = ph.Destination(source=DOC["targets"][0], name="ph", info=info)
    killed: List[Any] = []
    monkeypatch.setattr(rinto, "_pin", lambda r: r.pinned.update({ns: 60000 + n for n, ns in enumerate(rinto.PINNED)}))
    monkeypatch.setattr(rinto, "_prepare", lambda r: None)
    monkeypatch.setattr(rinto, "criu_restore", lambda criu, images, work, options: 777)
    monkeypatch.setattr(ctr.nsu, "set_hostname", lambda pid, name: None)
    monkeypatch.setattr(ctr.proc, "alive", lambda pid: pid == 777)
    monkeypatch.setattr(ctr.proc, "signal_tree", lambda pid, sig: killed.append(("tree", pid)))
    monkeypatch.setattr(rinto, "_kill_placeholder", lambda i: killed.append(("placeholder", i.pid)) or "killed")
    out = rinto.restore_one("/criu", str(tmp_path), DOC, d, ctr.CriuOptions(), str(tmp_path / "restore"), True)
    assert out["result"] == "failed" and out["error"] == "container ph: placeholder ph exited during the restore"
    assert killed == [("tree", 777), ("placeholder", 4242)] and out["placeholder"] == "killed"


def test_a_container_dump_adds_its_root_namespaces_mounts_and_cgroups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ctr.nsu, "criu_lock_tables", lambda pid: ["filter"])
    info = ContainerInfo(id="c" * 64, name="embed-1", runtime="podman", image="i", image_id="x", running=True,
                         status="running", pid=4000, cgroup_path="/cg", rootfs="/merged", upper_dir=None, hostname="h")
    cap = ctr.ContainerCapture(info=info, root_pid=4242, ns_pids=[2], stdio=[], net_ns=11, pid_ns=12,
                               external=[{"mountpoint": "/data", "fstype": "ext4", "source": "/srv/data"}],
                               control_path=None)
    base = ctr.CriuOptions(tcp="close", timeout=7)
    got = cap.criu_options(base)
    assert got == ctr.CriuOptions(tcp="close", timeout=7, root="/merged", shell_job=True, manage_cgroups=True,
                                  manage_cgroups_mode="soft",
                                  external=["net[11]:warmstart-net", "pid[12]:warmstart-pid"],
                                  ext_mnt=[ctr.ExtMount("/data", "/data")])
    assert base == ctr.CriuOptions(tcp="close", timeout=7), "the caller's options are not changed"
    assert cap.lock_tables == ["filter"], "the network lock's tables are remembered for before_resume"


# --- which tree is a container's workload (_workload), and is a placeholder inert (_pid_problems) ---------------

def _info(pid: int = 100) -> ContainerInfo:
    return ContainerInfo(id="c" * 64, name="web", runtime="podman", image="i", image_id="x", running=True,
                         status="running", pid=pid, cgroup_path="/cg", rootfs="/r", upper_dir=None, hostname="h")


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Dict[str, Any]:
    """A fake /proc: NSpid per host pid, children, exe basenames, restored roots, nested PID-1s."""
    w: Dict[str, Any] = {"nspid": {100: [100, 1]}, "children": {}, "exe": {}, "beside": [], "nested": []}
    monkeypatch.setattr(ctr.proc, "ns_pids", lambda pid: w["nspid"][pid])
    monkeypatch.setattr(ctr.proc, "children", lambda pid: w["children"].get(pid, []))
    monkeypatch.setattr(ctr.proc, "cmdline", lambda pid: ["prog"])
    monkeypatch.setattr(ctr, "_is_container_init", lambda pid: w["exe"].get(pid) in ctr.CONTAINER_INITS)
    monkeypatch.setattr(ctr, "_restored_roots", lambda pid1: w["beside"])
    monkeypatch.setattr(ctr.nsu, "ns_inode", lambda pid, ns: 4026531999)
    monkeypatch.setattr(ctr.nsu, "nested_inits", lambda ino: w["nested"])
    return w


def test_an_app_that_is_pid1_is_the_whole_tree_with_its_pid_namespace(world: Dict[str, Any]) -> None:
    world["children"][100] = [101, 102]  # its own workers do not make it an init
    assert ctr._workload(_info()) == (100, True)


def test_the_child_of_a_container_init_is_restored_beside(world: Dict[str, Any]) -> None:
    world["children"][100], world["exe"][100] = [101], "catatonit"
    assert ctr._workload(_info()) == (101, False)
    world["children"][100] = [101, 102]
    with pytest.raises(ctr.proc.TargetError, match="2 workload trees"):
        ctr._workload(_info())


def test_a_process_of_a_shared_pid_namespace_is_the_workload_itself(world: Dict[str, Any]) -> None:
    world["nspid"][100] = [100, 7]  # pause is PID 1 of the pod's namespace
    world["children"][100] = [101]
    assert ctr._workload(_info()) == (100, False)


def test_restored_copies_are_found_beside_or_nested(world: Dict[str, Any]) -> None:
    world["beside"] = [300]
    assert ctr._workload(_info()) == (300, False)
    world["beside"], world["nested"] = [], [400]
    assert ctr._workload(_info()) == (400, True)
    world["nested"] = [400, 401]
    with pytest.raises(ctr.proc.TargetError, match="2 PID namespaces nested"):
        ctr._workload(_info())


def test_an_inert_placeholder_and_its_pids(world: Dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    own = {1: (100, "sleep")}
    assert ph._pid_problems(_info(), {"ns_pids": [2, 3]}, own) == []
    busy = ph._pid_problems(_info(), {"ns_pids": [2]}, {1: (100, "sleep"), 2: (150, "sh")})
    assert "is not inert" in busy[0] and "2 (sh)" in busy[0] and "PID 2" in busy[1] and "taken by sh" in busy[1]
    world["nested"] = [400]
    nested = ph._pid_problems(_info(), {"pid_namespace": True, "ns_pids": [1, 2]}, own)
    assert len(nested) == 1 and "nested PID namespace" in nested[0], "a nested restore needs no PID of the placeholder"
    world["nested"] = []
    # a pod sharing its PID namespace: pause is PID 1; a sidecar (other cgroup) is fine, the pod's PIDs count
    monkeypatch.setattr(ph, "_same_cgroup", lambda pid, other: pid == 160)
    pod = {1: (90, "pause"), 2: (100, "sleep"), 3: (120, "sidecar"), 4: (160, "leftover")}
    shared = ph._pid_problems(_info(), {"ns_pids": [2]}, pod)
    assert "not inert" in shared[0] and "4 (leftover)" in shared[0] and "sidecar" not in shared[0]
    assert "PID 2" in shared[1] and "taken by sleep" in shared[1] and "init container" in shared[1]


def test_a_transient_store_error_is_transient_only_while_nothing_was_touched(
        engine: Dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(*args: Any, **kwargs: Any) -> List[str]:
        raise ctr.snap.SnapshotError("store s3://snaps: downloading app/criu/pages-1.img: cannot reach the endpoint",
                                     transient=True)

    monkeypatch.setattr(rinto.ck, "verify_local", unreachable)
    with pytest.raises(WarmstartError) as err:
        rinto.restore_into(object(), "app=ph", snapshot_id=DOC["id"])
    assert err.value.details == {"transient": True, "outcome": "failed"}  # the agent may try again

    monkeypatch.setattr(rinto.ck, "verify_local", lambda *a, **kw: [])
    monkeypatch.setattr(rinto, "_destination", unreachable)  # raised once a placeholder may have been touched
    with pytest.raises(WarmstartError) as err:
        rinto.restore_into(object(), "app=ph", snapshot_id=DOC["id"])
    assert err.value.details == {"outcome": "failed"}


# --- volumes taken along: which ones (_volumes at checkpoint), room in the placeholder's (volume_problems) ------

def test_the_volumes_asked_for_must_be_bind_mounts_of_the_container_and_every_wrong_one_is_named(tmp_path: Any) -> None:
    external = [{"mountpoint": "/cache", "fstype": "ext4", "source": str(tmp_path)},
                {"mountpoint": "/snapshot-control", "fstype": "ext4", "source": str(tmp_path)},
                {"mountpoint": "/gone", "fstype": "ext4", "source": str(tmp_path / "missing")}]
    kept = ctr._volumes("web", external, ["/cache", "/cache"], "/snapshot-control")  # pylint: disable=protected-access
    assert kept == [external[0]]
    with pytest.raises(ctr.proc.TargetError) as err:
        ctr._volumes("web", external, ["/nowhere", "/snapshot-control", "/gone"],  # pylint: disable=protected-access
                     "/snapshot-control")
    assert str(err.value) == (
        "container web: cannot take its volumes along: /nowhere is not one of its volumes (its bind mounts: /cache, "
        "/gone, /snapshot-control); /snapshot-control is its snapshot-control dir, which a snapshot never takes "
        f"along; /gone is no directory on this host ({tmp_path / 'missing'})")


def test_a_placeholder_without_room_in_its_volume_is_refused_naming_it(tmp_path: Any) -> None:
    import os  # pylint: disable=import-outside-toplevel
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    source = {"name": "app", "external_mounts": [{"mountpoint": "/cache"}, {"mountpoint": "/big"}],
              "volumes": [{"mountpoint": "/cache", "archive": "volumes/0.tar", "entries": 2, "bytes": 1000},
                          {"mountpoint": "/big", "archive": "volumes/1.tar", "entries": 1, "bytes": free + 1},
                          {"mountpoint": "/stray", "archive": "volumes/2.tar", "entries": 1, "bytes": 1}]}
    d = ph.Destination(source=source, name="ph", ext_mnt={"/cache": str(tmp_path), "/big": str(tmp_path)})
    problems = ph.volume_problems(d, _info())
    assert len(problems) == 2, problems
    assert problems[0].startswith("placeholder web: volume /big has ") and "the snapshot's 1 files there need" in \
        problems[0] and "emptyDir.sizeLimit" in problems[0]
    assert problems[1] == "placeholder web: the snapshot's volume /stray is none of its container's mounts"


def test_destinations_are_restored_at_the_same_time_unless_told_otherwise() -> None:
    import threading  # pylint: disable=import-outside-toplevel
    both = threading.Barrier(2, timeout=10)  # each job waits for the other: only together do they finish
    names: List[str] = []

    def job(name: str) -> Any:
        def run() -> Dict[str, Any]:
            both.wait()
            names.append(threading.current_thread().name)
            return {"container": name}
        return run

    assert rinto._each([job("a"), job("b")], parallel=True) == [  # pylint: disable=protected-access
        {"container": "a"}, {"container": "b"}], "in the order of the destinations"
    assert all(n.startswith("restore-into") for n in names) and len(set(names)) == 2
    order: List[str] = []
    assert rinto._each([lambda: order.append("a") or {}, lambda: order.append("b") or {}],  # pylint: disable=protected-access
                       parallel=False) == [{}, {}] and order == ["a", "b"]
