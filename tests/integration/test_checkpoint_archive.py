"""The standard checkpoint archive both ways, with real podman (runc), real CRIU and the modules.

- In: ``podman container checkpoint --export`` of a PID-1 app with two workers (podman's default zstd archive,
  the format the kubelet writes) -> snapshot_import -> restore into a placeholder: the app answers with the
  same memory and its counter goes on; a second import changes nothing; a tampered file of the imported
  snapshot is refused by the restore like any snapshot's.
- Out: warmstart's checkpoint of a PID-1 counter -> snapshot_export -> ``podman container restore --import``:
  the counter goes on; a second export changes nothing. The imported snapshot goes back out too (podman ->
  warmstart -> podman), once its bind mounts are given to the carrier, and the refusals name their cause.
"""
from __future__ import annotations

import contextlib
import os
import stat
import tarfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from .container_lab import Pod, ask, pod_for, wait_file

# serial: podman's restore reads /etc/criu/runc.conf, which this module writes around it (nothing may dump beside it)
pytestmark = [pytest.mark.integration, pytest.mark.serial]

RUNC_CONF = Path("/etc/criu/runc.conf")
COUNTER = "import time\nn = 0\nwhile True:\n    n += 1\n    open('/tmp/count', 'w').write(str(n))\n    time.sleep(0.1)\n"


@contextlib.contextmanager
def compat_conf() -> Iterator[None]:
    """On this VM podman's restore needs CRIU's mntns-compat-mode (bench/containers.py says why): written to
    runc's CRIU config for the restore when that file does not exist, removed after."""
    mine = not RUNC_CONF.exists()
    if mine:
        RUNC_CONF.parent.mkdir(parents=True, exist_ok=True)
        RUNC_CONF.write_text("mntns-compat-mode\n")
    try:
        yield
    finally:
        if mine:
            RUNC_CONF.unlink()


def task(module: str, title: str, check_mode: bool = False, fail: bool = False, **args: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = {"name": title, f"warmstart.snapshot.{module}": args}
    if check_mode:
        out["check_mode"] = True
    if fail:
        out["ignore_errors"] = True
    return out


def count(pod: Pod, name: str) -> int:
    return int(pod.podman("exec", name, "cat", "/tmp/count").stdout or 0)


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    yield from pod_for(tmp_path_factory.mktemp("archive"))


@pytest.fixture(scope="module")
def imported(pod: Pod) -> Dict[str, Any]:
    """podman's archive of a PID-1 app with two workers, imported (previewed, twice), restored into a placeholder."""
    src = pod.run("imp", "python3", "/app/app.py", init=False, env={"APP_WORKERS": "2"})
    wait_file(pod.control("imp") / "ready-for-snapshot", 60)
    time.sleep(1.0)
    before = ask(pod.ip(src))
    archive = pod.tmp / "podman-export.tar.zst"
    pod.podman("container", "checkpoint", "--export", str(archive), src)  # podman's default: zstd
    ph = pod.placeholder("imp-ph")
    args = {"path": str(archive), "store": str(pod.store), "name": "imported", "labels": {"from": "podman"}}
    res = pod.play([task("snapshot_import", "preview", check_mode=True, **args),
                    task("snapshot_import", "import", **args),
                    task("snapshot_import", "again", **args),
                    pod.restore("restore", name="imported", into={"container": ph})], "import")
    time.sleep(1.0)
    return {"src": src, "ph": ph, "before": before, "res": res, "after": ask(pod.ip(ph)), "archive": archive}


def test_a_podman_archive_imports_once_and_restores_into_a_placeholder(imported: Dict[str, Any]) -> None:
    res = imported["res"]
    assert res["preview"]["changed"] is True and res["preview"]["snapshot"] is None
    got = res["import"]
    assert got["changed"] is True and got["archive"]["compression"] == "zstd"
    assert got["container"]["name"] == imported["src"] and got["snapshot"]["labels"] == {"from": "podman"}
    assert res["again"]["changed"] is False and res["again"]["snapshot"]["id"] == got["snapshot"]["id"]
    assert res["restore"]["restore"]["outcome"] == "succeeded", res["restore"]
    before, after = imported["before"], imported["after"]
    assert after["token"] == before["token"] and after["digest"] == before["digest"]
    assert after["sha256"] == after["digest"], "the restored memory differs from the dumped"
    assert after["pid"] == 1 and after["counter"] > before["counter"]
    assert after["workers"]["alive"] == 2, after["workers"]


def test_an_imported_snapshot_is_checked_like_any_other(pod: Pod, imported: Dict[str, Any]) -> None:
    res = pod.play([task("snapshot_import", "import", path=str(imported["archive"]), store=str(pod.store),
                         name="tampered")], "import-again")
    snap_dir = Path(res["import"]["snapshot"]["path"])
    pages = sorted((snap_dir / "containers" / imported["src"] / "criu").glob("pages-*.img"))[0]
    ph = pod.placeholder("imp-tampered")
    data = bytearray(pages.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pages.write_bytes(bytes(data))
    res = pod.play([pod.restore("tampered", expect_fail=True, name="tampered", into={"container": ph})], "tampered")
    out = res["tampered"]
    assert out.get("failed") and "SHA256 mismatch" in str(out), out
    assert pod.running(ph) and len(pod.ps(ph)) == 1, "the placeholder was touched"


@pytest.fixture(scope="module")
def exported(pod: Pod) -> Dict[str, Any]:
    """warmstart's snapshot of a PID-1 counter (no bind mounts), exported twice and once in check mode, then
    restored by podman."""
    src = f"exp-{pod.tag}"
    pod.podman("run", "-d", "--name", src, pod.image, "python3", "-c", COUNTER)
    pod.names.append(src)
    time.sleep(1.0)
    path = pod.tmp / "exported.tar.gz"
    export = {"name": "counter", "store": str(pod.store), "path": str(path)}
    res = pod.play([pod.checkpoint("checkpoint", container=src, name="counter", leave_running=False),
                    task("snapshot_export", "preview", check_mode=True, **{**export, "path": str(pod.tmp / "no.tgz")}),
                    task("snapshot_export", "export", **export),
                    task("snapshot_export", "again", **export)], "export")
    with tarfile.open(path) as tar:  # what the workload had counted when it was dumped: the rootfs diff has it
        diff = tar.extractfile("rootfs-diff.tar")
        with tarfile.open(fileobj=diff) as inner:
            dumped = int(inner.extractfile("tmp/count").read())  # type: ignore[union-attr]
    back = f"exp-back-{pod.tag}"
    with compat_conf():
        pod.podman(*res["export"]["restore_command"][1:], "--name", back)
    pod.names.append(back)
    first = count(pod, back)
    time.sleep(0.5)
    return {"res": res, "path": path, "dumped": dumped, "counts": (first, count(pod, back)), "back": back}


def test_a_snapshot_exports_as_an_archive_podman_restores(pod: Pod, exported: Dict[str, Any]) -> None:
    res = exported["res"]
    assert res["preview"]["changed"] is True and not (pod.tmp / "no.tgz").exists()
    assert res["export"]["changed"] is True and res["export"]["archive"]["compression"] == "gzip"
    assert stat.S_IMODE(os.stat(exported["path"]).st_mode) == 0o600
    assert res["again"]["changed"] is False and res["again"]["archive"]["size"] == os.path.getsize(exported["path"])
    first, second = exported["counts"]
    assert exported["dumped"] < first < second, f"the counter did not go on: dumped {exported['dumped']}, then {first}, {second}"
    assert pod.inspect(exported["back"])["State"]["Running"]
    assert not [n for n in os.listdir(pod.tmp) if n.startswith(".warmstart-export-")], "an export left its work behind"


def test_an_imported_snapshot_goes_back_to_podman_with_its_mounts(pod: Pod, imported: Dict[str, Any]) -> None:
    src, before = imported["src"], imported["before"]
    snapshot_id = imported["res"]["import"]["snapshot"]["id"]
    path = pod.tmp / "round-trip.tar"
    base = {"snapshot_id": snapshot_id, "store": str(pod.store), "path": str(path), "compression": "none"}
    pod.podman("rm", "-f", "-t", "0", src)  # the restore takes the source's name, ip and control dir again
    res = pod.play([task("snapshot_export", "bare", fail=True, **base),
                    task("snapshot_export", "with mounts", **base, carrier_volumes=[
                        f"{pod.app}:/app:ro", f"{pod.control('imp')}:/snapshot-control"])], "round-trip")
    assert res["bare"].get("failed") and "no mount at /app, /snapshot-control" in res["bare"]["msg"], res["bare"]
    assert res["with mounts"]["changed"] is True
    back = f"imp-back-{pod.tag}"
    with compat_conf():
        pod.podman(*res["with mounts"]["restore_command"][1:], "--name", back)
    pod.names.append(back)
    time.sleep(1.0)
    got = ask(pod.ip(back))
    assert got["token"] == before["token"] and got["sha256"] == before["digest"] and got["pid"] == 1


def test_what_cannot_be_exported_is_refused_naming_every_cause(pod: Pod, tmp_path: Path) -> None:
    src = pod.source("init")  # --init: the workload runs beside the container's init
    res = pod.play([pod.checkpoint("checkpoint", container=src, name="beside"),
                    task("snapshot_export", "export", fail=True, name="beside", store=str(pod.store),
                         path=str(tmp_path / "missing-dir" / "a.tar"))], "refused")
    out = res["export"]
    assert out.get("failed") and "(2 reasons)" in out["msg"], out
    reasons = "\n".join(out.get("reasons") or [])
    assert "beside the container's init" in reasons and "missing-dir does not exist" in reasons
