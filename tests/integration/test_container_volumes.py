"""A container's volumes (a pod's emptyDir volumes) taken along with its snapshot, with real podman and CRIU.

The source container's server writes a "compile cache" into its writable volume at /cache at start-up and keeps a
log there open for appending; a host dir stands for the kubelet's emptyDir. ``checkpoint volumes: [/cache]``
archives the volume while the tree is stopped; the placeholder gets its own, empty volume at /cache, and the
restore puts the archive back there before CRIU runs: the copy answers with the cache it wrote before the
snapshot, and what it appends to the file it held open lands in the placeholder's volume. Without ``volumes``
the same restore fails (CRIU finds no file to reopen) - why a pod's emptyDir volumes must go along. A volume that
is not one of the container's mounts is refused before anything is stopped, naming it.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from .container_lab import Pod, json_line, pod_for, wait_file

pytestmark = pytest.mark.integration

SERVER = r'''
import hashlib, json, os, socket, sys
sys.path.insert(0, "/app")
import warmstart_workload as ws

cache = "/cache/kernels/compiled.bin"
if not os.path.exists(cache):  # the expensive start-up work, done once: its result is kept in the volume
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    with open(cache, "wb") as out:
        out.write(os.urandom(1 << 20))
log = open("/cache/server.log", "a", buffering=1)
log.write("started\n")
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", 8080))
srv.listen(8)
ws.Control().ready()
while True:
    conn, _ = srv.accept()
    with conn:
        log.write(f"answered by {os.getpid()}\n")
        with open(cache, "rb") as handle:
            digest = hashlib.sha256(handle.read()).hexdigest()
        conn.sendall((json.dumps({"cache": digest, "pid": os.getpid()}) + "\n").encode())
'''


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    yield from pod_for(tmp_path_factory.mktemp("volume-containers"), {"server.py": SERVER})


def volume(pod: Pod, name: str) -> Path:
    path = pod.tmp / f"emptydir-{name}"
    path.mkdir(mode=0o777)
    path.chmod(0o777)
    return path


def ask(pod: Pod, full: str) -> Dict[str, Any]:
    return json_line((pod.ip(full), 8080), timeout=15.0)


def source(pod: Pod, name: str, cache: Path) -> str:
    full = pod.run(name, "python3", "/app/server.py", writable={str(cache): "/cache"})
    wait_file(pod.control(name) / "ready-for-snapshot", 60)
    return full


def test_the_volume_goes_along_and_the_copy_finds_its_cache_and_its_open_file(pod: Pod) -> None:
    src_vol = volume(pod, "src")
    src = source(pod, "volsrc", src_vol)
    before = ask(pod, src)
    assert before["cache"] == hashlib.sha256((src_vol / "kernels" / "compiled.bin").read_bytes()).hexdigest()
    snap = pod.play([pod.checkpoint("checkpoint", container=src, volumes=["/cache"], leave_running=False)],
                    "vol-ck")["checkpoint"]["snapshot"]
    (kept,) = snap["volumes"]
    assert kept["mountpoint"] == "/cache" and kept["archive"] == "volumes/0.tar" and kept["entries"] == 3, kept
    assert kept["bytes"] == (1 << 20) + (src_vol / "server.log").stat().st_size, kept
    ph_vol = volume(pod, "ph")
    ph = pod.run("volph", "sleep", "infinity", init=False, env={"ROLE": "volph"}, writable={str(ph_vol): "/cache"})
    res = pod.play([pod.restore("restore", snapshot=snap["id"], into={"container": ph})], "vol-rs")["restore"]
    dest = res["restore"]["destinations"][0]
    assert dest["result"] == "succeeded", dest
    assert dest["volumes"] == [{"mountpoint": "/cache", "entries": 3}] and "volumes" in dest["timings"], dest
    after = ask(pod, ph)
    assert after["cache"] == before["cache"], "the copy found the cache it wrote before the snapshot"
    # the file it held open is the placeholder's volume's copy: what it wrote before the snapshot, then its answer
    src_log = (src_vol / "server.log").read_text().splitlines()
    assert src_log == ["started", f"answered by {before['pid']}"], src_log
    assert (ph_vol / "server.log").read_text().splitlines() == src_log + [f"answered by {after['pid']}"]


def test_without_its_volume_the_copy_cannot_reopen_its_file_and_a_stranger_volume_is_refused(pod: Pod) -> None:
    src = source(pod, "volsrc2", volume(pod, "src2"))
    refused = pod.play([pod.checkpoint("checkpoint", container=src, volumes=["/cache", "/nowhere", "/snapshot-control"],
                                       expect_fail=True)], "vol-bad", ok=False)["checkpoint"]
    assert refused["failed"] is True
    assert "/nowhere is not one of its volumes" in refused["msg"], refused["msg"]
    assert "/snapshot-control is its snapshot-control dir" in refused["msg"], refused["msg"]
    ask(pod, src)  # nothing was stopped
    snap = pod.play([pod.checkpoint("checkpoint", container=src)], "vol-ck2")["checkpoint"]["snapshot"]
    assert "volumes" not in snap
    ph = pod.run("volph2", "sleep", "infinity", init=False, env={"ROLE": "volph2"},
                 writable={str(volume(pod, "ph2")): "/cache"})
    res = pod.play([pod.restore("restore", snapshot=snap["id"], into={"container": ph}, expect_fail=True)],
                   "vol-rs2", ok=False)["restore"]
    dest = res["restore"]["destinations"][0]
    assert dest["result"] == "failed" and "server.log" in dest["error"], dest
