# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A container snapshot exported as the standard checkpoint archive, which ``podman container restore --import``
restores (the snapshot_export module's engine).

Only a whole container exports: the snapshot of a container whose app is its PID 1 (``pid_namespace``), one
container, no GPU state, no volume but ``/dev/shm``, no whole directories replaced in its root file system. Every
reason against it is listed before anything is written.

What goes in, in this order: ``warmstart.json`` (which snapshot this is: a re-run that finds it changes nothing),
``config.dump``, ``spec.dump`` and ``network.status`` from a carrier container of the snapshot's image
(``_podmancarrier``: podman writes its own records), the snapshot's CRIU images as ``checkpoint/`` (the network
namespace's key renamed back to runc's ``extRootNetNS``) with ``descriptors.json`` from the manifest's stdio,
``rootfs-diff.tar``, ``deleted.files``, ``devshm-checkpoint.tar``, ``stats-dump``. Every file of the snapshot is
copied and hashed first (``_storecopy.copy_verified``) and only that verified copy is read; the archive is written
to a new file beside ``dest`` and renamed over it once complete.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import tarfile
import tempfile
import time
from typing import IO, Any, Dict, List, Optional, Sequence

from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _images as im
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime import _podmancarrier as carrier
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime import _rootfs as rootfs
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _archive as arc
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _container as ctr
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _preflight as pf
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _progress as prog
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _storecopy as sc
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._storeapi import Store

MARK = "warmstart.json"
COMPRESSIONS = ("none", "gzip", "zstd")
CARRIER_FILES = (arc.CONFIG, arc.SPEC, "network.status")
LEFT_OUT = ("dump.log", "stats-dump")  # of the snapshot's criu dir


def export_archive(store: Store, dest: str, snapshot_id: Optional[str] = None, name: Optional[str] = None,
                   labels: Optional[Dict[str, str]] = None, compression: str = "gzip",
                   carrier_command: Optional[List[str]] = None, carrier_volumes: Sequence[str] = (), force: bool = False,
                   check_mode: bool = False) -> Dict[str, Any]:
    """Export the snapshot (by id, or the newest by name/labels) to the archive ``dest``.

    The result: ``changed``, ``snapshot`` (its summary, ``_manifest.summary``), ``archive`` (path, size,
    compression), ``restore_command`` (what restores it with podman), ``timings``. ArchiveError with every reason
    when it cannot be exported.
    """
    t0 = time.monotonic()
    if compression not in COMPRESSIONS:
        raise arc.ArchiveError(f"compression: {compression!r} is not one of {', '.join(COMPRESSIONS)}")
    doc = pf.select(store, snapshot_id, name, labels, {}, skip_compat=True)
    dest = os.path.abspath(dest)
    problems = exportable(doc) + _dest_problems(dest)
    if compression == "zstd" and importlib.util.find_spec("zstandard") is None:
        problems.append("compression: zstd needs the Python zstandard library on the node (node_prep installs it); "
                        "or choose gzip")
    target = (doc.get("targets") or [{}])[0]
    why = carrier.image_problem(str((target.get("container") or {}).get("image_id") or ""),
                                str((target.get("container") or {}).get("image") or ""))
    if why:
        problems.append(why)
    if problems:
        raise arc.ArchiveError(f"snapshot {doc['id']} ({doc['name']}) cannot be exported as a checkpoint archive"
                               + (f": {problems[0]}" if len(problems) == 1 else f" ({len(problems)} reasons)"),
                               problems if len(problems) > 1 else None)
    done = not force and _marked(dest) == doc["id"]
    result: Dict[str, Any] = {
        "changed": not done, "snapshot": mf.summary(doc),
        "archive": {"path": dest, "compression": compression}, "restore_command": _restore_command(dest, target)}
    if done or check_mode:
        if done:
            result["archive"]["size"] = os.path.getsize(dest)
        return dict(result, timings={"total": round(time.monotonic() - t0, 3)})
    work = tempfile.mkdtemp(prefix=".warmstart-export-", dir=os.path.dirname(dest))
    try:
        copy = _verified_copy(store, doc, target, work)
        prog.phase("carrier container")
        carrier_tar = os.path.join(work, "carrier.tar")
        carrier.checkpoint_archive(target["container"]["image_id"], f"warmstart-export-{os.urandom(4).hex()}",
                                   list(carrier_command or ["sleep", "infinity"]), carrier_tar, carrier_volumes)
        missing = _missing_mounts(carrier_tar, target)
        if missing:
            raise arc.ArchiveError(f"snapshot {doc['id']}: podman's container of image {target['container']['image']} "
                                   f"has no mount at {', '.join(missing)}, where the snapshot's container had one; "
                                   "its restore would fail (give them as carrier_volumes)")
        masked = {m["mountpoint"]: arc.MASKED_KEY for m in target.get("external_mounts") or [] if m.get("masked")}
        im.rekey(os.path.join(copy, "criu"), {ctr.EXT_NET: arc.NET_KEY}, masked)  # runc's keys, as it gives them
        result["archive"]["size"] = _write(dest, compression, doc, target, copy, carrier_tar)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dict(result, timings={"total": round(time.monotonic() - t0, 3)})


def exportable(doc: Dict[str, Any]) -> List[str]:
    """Every reason the snapshot ``doc`` is not a whole container a checkpoint archive can hold."""
    targets = doc.get("targets") or []
    if len(targets) != 1 or targets[0].get("kind") != "container":
        return [f"it holds {len(targets)} target(s) of kind(s) {', '.join(sorted({str(t.get('kind')) for t in targets}))}"
                "; an archive holds one container"]
    t, problems = targets[0], []
    if not t.get("pid_namespace"):
        problems.append(f"container {t['name']}: its workload ran beside the container's init (podman run --init, a "
                        "pod's shared PID namespace): the images hold no PID 1 for the runtime to restore")
    if doc.get("gpu"):
        problems.append("it holds GPU state, which podman restores only with CRIU's own GPU plugin")
    others = [v["mountpoint"] for v in t.get("volumes") or [] if v.get("mountpoint") != "/dev/shm"]
    if others:
        problems.append(f"container {t['name']}: the contents of its volumes {', '.join(others)} have no place in "
                        "the archive")
    if (t.get("rootfs_diff") or {}).get("opaque"):
        problems.append(f"container {t['name']}: its root file system replaced whole directories, which the "
                        "archive's deleted.files cannot say")
    return problems


def _dest_problems(dest: str) -> List[str]:
    parent = os.path.dirname(dest)
    if not os.path.isdir(parent):
        return [f"path: directory {parent} does not exist"]
    if os.path.lexists(dest) and (os.path.islink(dest) or not os.path.isfile(dest)):
        return [f"path: {dest} exists and is not a regular file"]
    return []


def _marked(dest: str) -> Optional[str]:
    """The snapshot id an earlier export wrote into ``dest`` (its first member), or None."""
    try:
        handle = os.fdopen(os.open(dest, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb")
    except OSError:
        return None
    try:
        with handle, tarfile.open(fileobj=handle, mode="r|*") as tar:
            first = tar.next()
            data = tar.extractfile(first) if first is not None and first.name == MARK and first.size < 65536 else None
            return str(json.loads(data.read()).get("snapshot_id")) if data is not None else None
    except (OSError, tarfile.TarError, ValueError, AttributeError):
        return None


def _missing_mounts(carrier_tar: str, target: Dict[str, Any]) -> List[str]:
    """The snapshot's external mounts (cgroup mounts aside: runc gives each) that the carrier's spec lacks."""
    with tarfile.open(carrier_tar, mode="r:") as src:
        member = src.extractfile(arc.SPEC)
        spec = json.loads(member.read()) if member is not None else {}
    have = {m.get("destination") for m in spec.get("mounts") or [] if isinstance(m, dict)}
    return sorted(m["mountpoint"] for m in target.get("external_mounts") or []  # sorted: CRIU's order varies
                  if m.get("fstype") not in ("cgroup", "cgroup2") and not m.get("masked") and m["mountpoint"] not in have)


def _restore_command(dest: str, target: Dict[str, Any]) -> List[str]:
    tcp = ["--tcp-established"] if target.get("tcp_connections") else []
    return ["podman", "container", "restore", "--import", dest, *tcp]


def _verified_copy(store: Store, doc: Dict[str, Any], target: Dict[str, Any], work: str) -> str:
    """The container's files copied into ``work/snapshot`` and hashed on the way; SnapshotError on a mismatch."""
    prog.phase("verified copy")
    snap_dir = store.local_dir(doc["id"])
    prefix = f"{target['path']}/"
    items = [(e, os.path.join(work, "snapshot", e["path"])) for e in doc.get("files") or []
             if e["path"].startswith(prefix) and e["path"] != f"{prefix}criu/dump.log"]
    space = sc.space_problem(work, 2 * sum(int(e["size"]) for e, _dest in items), "the verified copy and the archive",
                             "export to a path on another file system")
    if space:
        raise arc.ArchiveError(f"snapshot {doc['id']}: {space}")
    problems, _deferred = sc.copy_verified(snap_dir, items)
    if problems:
        raise arc.ArchiveError(f"snapshot {doc['id']}: its files do not match its manifest",
                               [f"checksum: {p}" for p in problems])
    return os.path.join(work, "snapshot", target["path"])


def _write(dest: str, compression: str, doc: Dict[str, Any], target: Dict[str, Any], copy: str,
           carrier_tar: str) -> int:
    """The archive, written to a new file beside ``dest`` and renamed over it; its size."""
    prog.phase("write archive")
    fd, tmp = tempfile.mkstemp(prefix=".warmstart-export-", suffix=".tar", dir=os.path.dirname(dest))
    try:
        with os.fdopen(fd, "wb") as raw:
            with _compressed(raw, compression) as out, tarfile.open(
                    fileobj=out, mode="w|gz" if compression == "gzip" else "w|", format=tarfile.PAX_FORMAT) as tar:
                _add_bytes(tar, MARK, json.dumps({"snapshot_id": doc["id"], "name": doc["name"]}).encode())
                with tarfile.open(carrier_tar, mode="r:") as src:
                    for member in src:
                        if member.name == arc.CONFIG:
                            _add_bytes(tar, arc.CONFIG, _config(src.extractfile(member), target))
                        elif member.isreg() and member.name in CARRIER_FILES + (arc.DEVSHM,):
                            if member.name == arc.DEVSHM and _devshm_volume(target):
                                continue
                            _add_stream(tar, member.name, src.extractfile(member), member.size)
                _add_images(tar, copy, target)
                _add_rootfs(tar, copy, target)
            raw.flush()
            os.fsync(raw.fileno())
        os.rename(tmp, dest)
    except BaseException:
        os.unlink(tmp)
        raise
    return os.path.getsize(dest)


def _config(data: Optional[IO[bytes]], target: Dict[str, Any]) -> bytes:
    """The carrier's config.dump under the snapshot's container name (what ``restore --import`` names it)."""
    config = json.loads(data.read()) if data is not None else {}
    config["name"] = target["name"]
    return json.dumps(config).encode()


def _compressed(raw: IO[bytes], compression: str) -> Any:
    """``raw`` itself, or a zstd stream writer over it (closed before ``raw``)."""
    if compression != "zstd":
        return contextlib.nullcontext(raw)
    try:
        import zstandard  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise arc.ArchiveError("compression: zstd needs the Python zstandard library on the node (node_prep "
                               "installs it); or choose gzip") from None
    return zstandard.ZstdCompressor().stream_writer(raw, closefd=False)


def _add_images(tar: tarfile.TarFile, copy: str, target: Dict[str, Any]) -> None:
    images = os.path.join(copy, "criu")
    for name in sorted(os.listdir(images)):
        if name not in LEFT_OUT:
            tar.add(os.path.join(images, name), arc.IMAGES + name, recursive=False)
    _add_bytes(tar, arc.IMAGES + "descriptors.json", json.dumps(target.get("stdio") or []).encode())
    if os.path.exists(os.path.join(images, "stats-dump")):
        tar.add(os.path.join(images, "stats-dump"), arc.STATS, recursive=False)


def _add_rootfs(tar: tarfile.TarFile, copy: str, target: Dict[str, Any]) -> None:
    tar.add(os.path.join(copy, rootfs.DIFF_TAR), arc.DIFF, recursive=False)
    with open(os.path.join(copy, rootfs.DELETED), "r", encoding="utf-8") as handle:
        deleted = json.load(handle).get("deleted") or []
    if deleted:
        _add_bytes(tar, arc.DELETED, json.dumps(deleted).encode())
    volume = _devshm_volume(target)
    if volume:
        tar.add(os.path.join(copy, volume["archive"]), arc.DEVSHM, recursive=False)


def _devshm_volume(target: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    return next((v for v in target.get("volumes") or [] if v.get("mountpoint") == "/dev/shm"), None)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    _add_stream(tar, name, io.BytesIO(data), len(data))


def _add_stream(tar: tarfile.TarFile, name: str, data: Optional[IO[bytes]], size: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o600, int(time.time())
    tar.addfile(info, data)
