"""Container snapshots on real podman containers, restored into inert placeholder containers.

The source container (local Debian image, ``podman run --init``) runs container_lab.APP: random memory whose SHA256
it reports, a TCP listener on all addresses, a file it wrote into its root file system and one it
deleted from the image, and the workload helper (workload/warmstart_workload.py) that says
``ready-for-snapshot`` and, in a restored copy, re-reads its instance (hostname, IPs, env.json).
Placeholders are containers of the same image and mounts running ``sleep infinity`` as PID 1. The
tests talk to every container over its own IP on podman's bridge, so an answer from a placeholder's
IP is an answer from inside the placeholder's network namespace.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from .container_lab import Pod, ask, mounts_of, pod_for
from .process_lab import pids_running, wait_for_swrk

# serial: it watches what the whole node holds (its mount table, any CRIU worker running): nothing else may run beside it.
pytestmark = [pytest.mark.integration, pytest.mark.serial]


def processes_with(token: str) -> List[int]:
    """Host PIDs of app processes whose /tmp/state.txt (in their own root) holds ``token``: copies of one workload."""
    out = []
    for pid in pids_running("/app/app.py"):
        try:
            with open(f"/proc/{pid}/root/tmp/state.txt", "r", encoding="utf-8") as handle:
                if handle.read() == token:
                    out.append(pid)
        except OSError:
            continue
    return out


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    yield from pod_for(tmp_path_factory.mktemp("containers"))


# --- the main path: capture, then restore into two placeholders ---------------------------------

@pytest.fixture(scope="module")
def captured(pod: Pod) -> Dict[str, Any]:
    src = pod.source("src")
    before = ask(pod.ip(src))
    ph = {n: pod.placeholder(n) for n in ("ph-a", "ph-b")}
    ph_mounts = {n: mounts_of(pod.pid1(full)) for n, full in ph.items()}
    host_mounts = mounts_of(os.getpid())
    res = pod.play([
        dict(pod.checkpoint("checkpoint check mode", container=src), check_mode=True),
        pod.checkpoint("checkpoint", container=src, wait_ready=True, labels={"app": "demo"}),
        {"name": "restore check mode", "check_mode": True,
         "warmstart.snapshot.restore": {"name": src, "store": str(pod.store), "restore_root": str(pod.restore_root),
                                        "into": {"container_map": [f"{ph['ph-a']}", f"{src}={ph['ph-b']}"]}}},
    ], "capture")
    after_check = {n: pod.ps(full) for n, full in ph.items()}
    t0 = time.monotonic()
    res.update(pod.play([pod.restore("restore", name=src, into={"container_map": f"{src}={ph['ph-a']},{src}={ph['ph-b']}"})],
                        "restore"))
    restore_wall = time.monotonic() - t0
    host_mounts_after = mounts_of(os.getpid())  # now: later tests start containers of their own (new mounts)
    return {"src": src, "ph": ph, "before": before, "res": res, "ph_mounts": ph_mounts, "host_mounts": host_mounts,
            "host_mounts_after": host_mounts_after,
            "after_check": after_check, "restore_wall": restore_wall,
            "answers": {n: ask(pod.ip(full)) for n, full in ph.items()}, "src_after": ask(pod.ip(src))}


def test_checkpoint_of_a_container_is_published_with_rootfs_diff_and_image(pod: Pod, captured: Dict[str, Any]) -> None:
    res = captured["res"]
    assert res["checkpoint check mode"]["changed"] is True
    assert "would snapshot container" in res["checkpoint check mode"]["msg"]
    snap = res["checkpoint"]["snapshot"]
    assert snap["name"] == captured["src"] and snap["source_running"] is True
    snaps = sorted((pod.store / "snapshots").iterdir())
    assert [p.name for p in snaps] == [snap["id"]], "check mode must not have written a snapshot"
    tdir = Path(snap["path"]) / "containers" / captured["src"]
    assert (tdir / "criu" / "inventory.img").is_file()
    with open(Path(snap["path"]) / "manifest.json", encoding="utf-8") as handle:
        manifest = json.load(handle)
    target = manifest["targets"][0]
    info = pod.inspect(captured["src"])
    assert target["kind"] == "container"
    assert target["container"]["image"] == info["ImageName"] and target["container"]["image_id"] == info["Image"]
    assert target["container"]["id"] == info["Id"]
    assert target["ns_pid"] > 1, "the workload runs under the container's init"
    assert "/snapshot-control" in [m["mountpoint"] for m in target["external_mounts"]]
    deleted = json.loads((tdir / "deleted-files.json").read_text())
    assert "/etc/issue.net" in deleted["deleted"]
    import tarfile  # pylint: disable=import-outside-toplevel
    with tarfile.open(tdir / "rootfs-diff.tar") as tar:
        member = tar.extractfile("tmp/state.txt")
        assert member is not None and member.read().decode() == captured["before"]["token"]
    for path in Path(snap["path"]).rglob("*"):
        mode = path.stat().st_mode & 0o777
        assert mode == (0o700 if path.is_dir() else 0o600), f"{path} has mode {oct(mode)}"
    # the source went on, and answers through its own network namespace
    assert captured["src_after"]["token"] == captured["before"]["token"]
    assert captured["src_after"]["counter"] > captured["before"]["counter"]


def test_check_mode_restore_touches_no_placeholder(captured: Dict[str, Any]) -> None:
    res = captured["res"]["restore check mode"]
    assert res["changed"] is True
    assert [d["result"] for d in res["restore"]["destinations"]] == ["would restore", "would restore"]
    for name, lines in captured["after_check"].items():
        assert len(lines) == 1 and "sleep infinity" in lines[0], f"{name} was touched in check mode: {lines}"


@pytest.mark.parametrize("name", ["ph-a", "ph-b"])
def test_workload_answers_from_each_placeholder_with_its_state(pod: Pod, captured: Dict[str, Any], name: str) -> None:
    res = captured["res"]["restore"]["restore"]
    assert res["outcome"] == "succeeded"
    dest = next(d for d in res["destinations"] if d["container"] == captured["ph"][name])
    assert dest["result"] == "succeeded", dest
    full = captured["ph"][name]
    got, before = captured["answers"][name], captured["before"]
    assert got["token"] == before["token"] and got["digest"] == before["digest"]
    assert got["sha256"] == before["digest"], "memory changed across checkpoint/restore"
    assert got["counter"] >= before["counter"] + 1
    assert got["pid"] == dest["ns_pid"] > 1
    assert got["state_file"] == before["token"], "the rootfs diff was not applied"
    assert got["issue_net"] is False, "a file deleted in the source is back"
    # this copy knows it is a copy, and re-read its own instance
    assert got["hostname"] == pod.inspect(full)["Config"]["Hostname"] != before["hostname"]
    assert len(got["restores"]) == 1
    seen = got["restores"][0]
    assert seen["pid"] == dest["ns_pid"] and seen["snapshot"] == res["id"]
    assert seen["role"] == name and pod.ip(full) in seen["ips"]
    assert got["env_role"] is None, "the restored process keeps the source's environ; env.json carries the new one"
    sentinel = (pod.control(name) / "restore-complete").read_text()
    assert f"pid={dest['ns_pid']}\n" in sentinel and f"snapshot={res['id']}" in sentinel
    env_file = pod.control(name) / "env.json"
    assert env_file.stat().st_mode & 0o777 == 0o600 and json.loads(env_file.read_text())["ROLE"] == name
    lines = pod.ps(full)
    assert lines[0].split()[0] == "1" and "sleep infinity" in lines[0]
    assert any("/app/app.py" in line for line in lines[1:])


def test_restore_mounts_nothing_into_placeholders_or_host(pod: Pod, captured: Dict[str, Any]) -> None:
    for name, full in captured["ph"].items():
        assert mounts_of(pod.pid1(full)) == captured["ph_mounts"][name], f"mounts of {name} changed"
    assert captured["host_mounts_after"] == captured["host_mounts"]


# --- bad input and faults ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def refusals(pod: Pod, captured: Dict[str, Any]) -> Dict[str, Any]:
    src = captured["src"]
    stopped = pod.run("stopped", "python3", "/app/app.py", create_only=True)
    busy = pod.placeholder("busy")
    pod.podman("exec", "-d", busy, "sleep", "1000")
    time.sleep(0.5)
    good = pod.placeholder("good")
    derived = f"localhost/warmstart-derived:{pod.tag}"
    tmp = pod.run("deriver", "sh", "-c", "echo x > /derived", init=False)
    pod.podman("wait", tmp, check=False)
    pod.podman("commit", "-q", tmp, derived)
    pod.images.append(derived)
    other = pod.placeholder("other", image=derived)
    other2 = pod.placeholder("other2", image=derived)
    state = {"busy_ps": pod.ps(busy), "other_mounts": mounts_of(pod.pid1(other)), "host_mounts": mounts_of(os.getpid())}
    res = pod.play([
        pod.checkpoint("not found", True, container=f"nope-{pod.tag}"),
        pod.checkpoint("not running", True, container=stopped),
        pod.restore("busy and good", True, name=src, into={"container_map": [f"{src}={busy}", f"{src}={good}"]}),
        pod.restore("other image", True, name=src, into={"container": other}),
        pod.restore("other image, check skipped", name=src, into={"container": other2, "skip_image_check": True}),
    ], "refusals", ok=False)
    state.update(res=res, busy=busy, good=good, other=other, other2=other2, src=src)
    return state


def test_bad_container_targets_are_refused_with_the_cause(pod: Pod, refusals: Dict[str, Any]) -> None:
    res = refusals["res"]
    assert res["not found"]["failed"] and "not found in podman" in res["not found"]["msg"]
    assert res["not running"]["failed"] and "is not running" in res["not running"]["msg"]
    published = [p.name for p in (pod.store / "snapshots").iterdir()]
    assert len(published) == 1 and not list((pod.store / "tmp").iterdir())


def test_busy_placeholder_is_refused_and_the_good_one_restored(pod: Pod, refusals: Dict[str, Any],
                                                               captured: Dict[str, Any]) -> None:
    res = refusals["res"]["busy and good"]
    assert res["failed"] and res["restore"]["outcome"] == "partially_succeeded"
    assert "partially succeeded" in res["msg"] and "1 of 2" in res["msg"]
    busy, good = (next(d for d in res["restore"]["destinations"] if d["container"] == refusals[n]) for n in ("busy", "good"))
    assert busy["result"] == "refused" and "is not inert" in busy["error"] and "(sleep)" in busy["error"]
    assert pod.ps(refusals["busy"]) == refusals["busy_ps"], "a refused placeholder was touched"
    assert not (pod.control("busy") / "restore-complete").exists()
    assert good["result"] == "succeeded"
    assert ask(pod.ip(refusals["good"]))["token"] == captured["before"]["token"]


def test_other_image_is_refused_naming_both_unless_skipped(pod: Pod, refusals: Dict[str, Any],
                                                           captured: Dict[str, Any]) -> None:
    res = refusals["res"]["other image"]
    assert res["failed"] and res["restore"]["outcome"] == "failed"
    err = res["restore"]["destinations"][0]["error"]
    assert "warmstart-derived" in err and pod.image in err, err
    assert [line.split(None, 1)[1].strip() for line in pod.ps(refusals["other"])] == ["sleep infinity"]
    assert mounts_of(pod.pid1(refusals["other"])) == refusals["other_mounts"]
    skipped = refusals["res"]["other image, check skipped"]
    assert skipped["restore"]["outcome"] == "succeeded", skipped.get("msg")
    assert ask(pod.ip(refusals["other2"]))["token"] == captured["before"]["token"]


def test_failed_dump_leaves_the_source_container_running(pod: Pod) -> None:
    src = pod.source("ghost", APP_GHOST="1", APP_MIB="4")
    before = ask(pod.ip(src))
    published = sorted(p.name for p in (pod.store / "snapshots").iterdir())
    res = pod.play([pod.checkpoint("dump fails", True, container=src, ghost_limit=4096, leave_running=False)],
                   "dumpfail", ok=False)["dump fails"]
    assert res["failed"] and "CRIU dump" in res["msg"] and "ghost" in res["msg"] and res.get("criu_log_tail")
    after = ask(pod.ip(src))
    assert after["token"] == before["token"] and after["counter"] > before["counter"]
    assert sorted(p.name for p in (pod.store / "snapshots").iterdir()) == published
    assert not list((pod.store / "tmp").iterdir())


def test_corrupt_rootfs_diff_is_refused_before_the_placeholder_is_touched(pod: Pod, tmp_path: Path) -> None:
    src = pod.source("corrupt")
    token = ask(pod.ip(src))["token"]
    store = tmp_path / "store"
    snap = pod.play([pod.checkpoint("checkpoint", container=src, store=str(store), leave_running=False)],
                    "corrupt")["checkpoint"]["snapshot"]
    tar = Path(snap["path"]) / "containers" / src / "rootfs-diff.tar"
    data = bytearray(tar.read_bytes())
    data[700:1400] = b"\xff" * 700  # garbage over the first member's content and the next header
    tar.write_bytes(bytes(data))
    ph_v, ph_nv = pod.placeholder("corrupt-v"), pod.placeholder("corrupt-nv")
    mounts = {full: mounts_of(pod.pid1(full)) for full in (ph_v, ph_nv)}
    host_mounts = mounts_of(os.getpid())
    res = pod.play([
        pod.restore("verified", True, snapshot=snap["id"], store=str(store), into={"container": ph_v}),
        pod.restore("unverified", True, snapshot=snap["id"], store=str(store), verify=False, into={"container": ph_nv}),
    ], "corrupt-restore", ok=False)
    verified = res["verified"]
    assert verified["failed"] and "checksum" in verified["msg"] and "rootfs-diff.tar" in verified["msg"]
    assert pod.ps(ph_v) == [pod.ps(ph_v)[0]] and mounts_of(pod.pid1(ph_v)) == mounts[ph_v]
    assert not (pod.control("corrupt-v") / "restore-failed").exists()
    unverified = res["unverified"]
    dest = unverified["restore"]["destinations"][0]
    assert unverified["failed"] and dest["result"] == "failed" and "rootfs-diff.tar" in dest["error"]
    assert dest["placeholder"] == "killed" and not pod.running(ph_nv), "a failed placeholder must be killed"
    assert (pod.control("corrupt-nv") / "restore-failed").exists()
    assert not (pod.control("corrupt-nv") / "restore-complete").exists()
    assert processes_with(token) == [], "a half-restored workload is left"
    # the killed placeholder's own mounts go with it; nothing may be added
    assert set(mounts_of(os.getpid())) - set(host_mounts) == set()


def test_placeholder_killed_during_restore_fails_cleanly(pod: Pod, tmp_path: Path) -> None:
    src = pod.source("big", APP_MIB="1024", APP_PATTERN="1")
    token = ask(pod.ip(src), timeout=60)["token"]
    store = tmp_path / "store"
    snap = pod.play([pod.checkpoint("checkpoint", container=src, store=str(store), leave_running=False)],
                    "big")["checkpoint"]["snapshot"]
    victim = pod.placeholder("victim")
    pid1 = pod.pid1(victim)
    host_mounts = mounts_of(os.getpid())
    killed = threading.Event()

    def kill_when_criu_restores() -> None:
        if wait_for_swrk(poll=0.01):
            time.sleep(0.2)
            os.kill(pid1, 9)
            killed.set()

    killer = threading.Thread(target=kill_when_criu_restores, daemon=True)
    killer.start()
    res = pod.play([pod.restore("restore", True, snapshot=snap["id"], store=str(store), verify=False,
                                into={"container": victim})], "victim", ok=False)["restore"]
    killer.join(5)
    assert killed.is_set(), "the placeholder was never killed: CRIU was not seen running"
    dest = res["restore"]["destinations"][0]
    assert res["failed"] and dest["result"] == "failed", dest
    assert victim in dest["error"]
    assert (pod.control("victim") / "restore-failed").exists()
    assert not (pod.control("victim") / "restore-complete").exists()
    assert processes_with(token) == []
    assert set(mounts_of(os.getpid())) - set(host_mounts) == set()
