# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A checkpoint archive imported into a store as a container snapshot (the snapshot_import module's engine).

The archive is streamed once into a staging dir of the store (``_archive.read``), mapped (``_archive.plan``),
and published with checksums like any snapshot - signed, compressed or encrypted as the store is set up - so
its restore into a placeholder gets every check a warmstart snapshot gets. What the mapping changes:

- ``checkpoint/*`` become ``containers/<name>/criu/*``; the network namespace's external key ``extRootNetNS``
  becomes warmstart's (``_container.EXT_NET``); a masked file's key ``/dev/null`` becomes its mountpoint, and
  the manifest marks that mount ``masked`` (a restore binds the node's /dev/null there, as runc does);
- ``rootfs-diff.tar`` is taken as it is, ``deleted.files`` becomes ``deleted-files.json``;
- ``devshm-checkpoint.tar``, when it holds files, becomes the snapshot's volume at ``/dev/shm``, re-archived
  member by member (regular files, directories, symlinks);
- the container is restored as PID 1 of a PID namespace nested in the placeholder's (``pid_namespace``).

An archive says nothing of the node that made it: the manifest's ``source`` is the importing node, and
``imported`` records the archive (its SHA256, size, compression). Importing the same archive under the same
name again finds the snapshot it made and changes nothing.
"""
from __future__ import annotations

import json
import os
import shutil
import tarfile
import time
from typing import IO, Any, Dict, List, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _images as im
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _progress as prog
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime import _rootfs as rootfs
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime import _volumes as vol
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _archive as arc
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _checksums as ck
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import read_stats
from ansible_collections.warmstart.snapshot.plugins.module_utils.node._node import describe_node
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._storeapi import Store

FORMAT = "checkpoint-archive"
ARRIVING = ".archive"   # the container's dir in staging until config.dump has named it
DEVSHM = "/dev/shm"


def import_archive(store: Store, path: str, name: Optional[str] = None, labels: Optional[Dict[str, str]] = None,
                   container_name: Optional[str] = None, criu_path: Optional[str] = None,
                   check_mode: bool = False) -> Dict[str, Any]:
    """Import the archive at ``path`` into ``store``; ``name`` defaults to the container's name.

    The result: ``changed``, ``snapshot`` (its summary, ``_manifest.summary``, and its path), ``archive``
    (path, sha256, size, compression, images, passed_over). ArchiveError (with every reason) when the archive
    cannot be imported; nothing is published then. ``check_mode``: the archive is read and mapped, nothing
    written.
    """
    t0 = time.monotonic()
    labels = mf.check_labels(labels)
    if name is not None:
        mf.check_name(name)
    criu = snap.need_criu(criu_path)
    if check_mode:
        store.check_usable()
        prog.phase("read archive", os.path.getsize(path) if os.path.isfile(path) else None)
        archive = arc.read(path, None, prog.add)
        plan = arc.plan(archive, container_name)
        done = _existing(store, archive.sha256, name or plan.entry["name"])
        return _result(store, done, archive, plan, changed=done is None, seconds=time.monotonic() - t0)
    staging = store.stage(mf.new_id())
    try:
        arriving = os.path.join(staging.path, "containers", ARRIVING)
        for made in (os.path.dirname(arriving), arriving, os.path.join(arriving, "criu")):
            os.mkdir(made, 0o700)
        prog.phase("read archive", os.path.getsize(path) if os.path.isfile(path) else None)
        archive = arc.read(path, _sink(arriving), prog.add)
        plan = arc.plan(archive, container_name)
        done = _existing(store, archive.sha256, name or plan.entry["name"])
        if done is not None:
            staging.abort()
            return _result(store, done, archive, plan, changed=False, seconds=time.monotonic() - t0)
        manifest = _publish(staging, archive, plan, name, labels, describe_node(criu), arriving)
    except BaseException:
        staging.abort()
        raise
    return _result(store, manifest, archive, plan, changed=True, seconds=time.monotonic() - t0)


def _sink(arriving: str) -> arc.Sink:
    """Where each member the snapshot takes goes in the staging dir (names mapped, never joined)."""
    def write(member: str, data: IO[bytes], size: int) -> None:
        if member.startswith(arc.IMAGES):
            dest = os.path.join(arriving, "criu", member[len(arc.IMAGES):])
        else:
            dest = os.path.join(arriving, {arc.DIFF: rootfs.DIFF_TAR, arc.STATS: "criu/stats-dump",
                                           arc.DEVSHM: "devshm.tar"}[member])
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as out:
            left = size
            while left > 0:
                chunk = data.read(min(left, 4 << 20))
                if not chunk:
                    break
                out.write(chunk)
                left -= len(chunk)
    return write


def _existing(store: Store, sha256: str, name: str) -> Optional[Dict[str, Any]]:
    """The snapshot an import of the same archive under the same name published before, if any."""
    for doc in store.list():
        imported = doc.get("imported")
        if doc.get("name") == name and isinstance(imported, dict) and imported.get("sha256") == sha256:
            return doc
    return None


def _publish(staging: Any, archive: arc.Archive, plan: arc.Plan, name: Optional[str], labels: Dict[str, str],
             source: Dict[str, Any], arriving: str) -> Dict[str, Any]:
    entry = dict(plan.entry)
    tdir = os.path.join(staging.path, entry["path"])
    os.rename(arriving, tdir)
    images = os.path.join(tdir, "criu")
    prog.phase("map keys")
    try:
        im.rekey(images, plan.net_keys, plan.mount_keys)
    except im.ImageError as exc:
        raise arc.ArchiveError(f"archive {archive.path}: {exc}") from None
    entry["rootfs_diff"] = _rootfs_diff(tdir, plan.deleted)
    shm = os.path.join(tdir, "devshm.tar")
    if os.path.exists(shm):
        volume = _devshm(shm, tdir, entry)
        os.unlink(shm)
        if volume:
            entry["volumes"] = [volume]
    entry["criu"] = {"version": None, "options": {}}
    entry["stats"] = read_stats(os.path.join(images, "stats-dump"))
    manifest = mf.new_manifest(staging.snapshot_id, name or entry["name"], labels, source)
    manifest["imported"] = {"format": FORMAT, "sha256": archive.sha256, "size": archive.size,
                            "compression": archive.compression}
    prog.phase("checksum")
    manifest["files"] = ck.record_files(staging.path, progress=prog.add)
    manifest["size"] = sum(f["size"] for f in manifest["files"])
    manifest["targets"].append(entry)
    staging.publish(manifest)
    return manifest


def _rootfs_diff(tdir: str, deleted: Dict[str, List[str]]) -> Dict[str, Any]:
    """deleted-files.json written, rootfs-diff.tar made empty when the archive had none (``--ignore-rootfs``);
    the manifest's record."""
    tar_path = os.path.join(tdir, rootfs.DIFF_TAR)
    if not os.path.exists(tar_path):
        fd = os.open(tar_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT):
            pass
    entries = size = 0
    try:
        with tarfile.open(tar_path, mode="r:") as tar:
            for member in tar:
                entries += 1
                size += member.size if member.isreg() else 0
    except (tarfile.TarError, OSError) as exc:
        raise arc.ArchiveError(f"the archive's rootfs-diff.tar: not a readable tar archive ({exc})") from None
    fd = os.open(os.path.join(tdir, rootfs.DELETED), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(deleted, handle, indent=1, sort_keys=True)
    return {"entries": entries, "bytes": size, "deleted": len(deleted["deleted"]), "opaque": 0,
            "tar": rootfs.DIFF_TAR, "deleted_files": rootfs.DELETED}


def _devshm(shm: str, tdir: str, entry: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """``devshm-checkpoint.tar`` as the snapshot's volume at /dev/shm (None when it holds nothing); only regular
    files, directories and symlinks with plain relative names are taken."""
    if not any(m["mountpoint"] == DEVSHM for m in entry["external_mounts"]):
        return None
    rel = vol.archive_name(0)
    os.makedirs(os.path.join(tdir, vol.VOLUMES_DIR), mode=0o700, exist_ok=True)
    entries = size = 0
    fd = os.open(os.path.join(tdir, rel), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as out, \
                tarfile.open(shm, mode="r:") as src:
            for member in src:
                name = os.path.normpath(member.name).lstrip("/")
                if name in ("", ".") or name.startswith("..") or not (member.isreg() or member.isdir() or member.issym()):
                    continue
                member.name, member.mode = name, member.mode & 0o777  # no setuid, setgid or sticky bit
                out.addfile(member, src.extractfile(member) if member.isreg() else None)
                entries += 1
                size += member.size if member.isreg() else 0
    except (tarfile.TarError, OSError) as exc:
        raise arc.ArchiveError(f"the archive's devshm-checkpoint.tar: not a readable tar archive ({exc})") from None
    if not entries:
        shutil.rmtree(os.path.join(tdir, vol.VOLUMES_DIR))
        return None
    return {"mountpoint": DEVSHM, "archive": rel, "entries": entries, "bytes": size, "fstype": "tmpfs"}


def _result(store: Store, doc: Optional[Dict[str, Any]], archive: arc.Archive, plan: arc.Plan, changed: bool,
            seconds: float) -> Dict[str, Any]:
    entry = (doc.get("targets") or [plan.entry])[0] if doc else plan.entry
    snapshot = None if doc is None else dict(mf.summary(doc), path=store.snapshot_dir(doc["id"]))
    return {"changed": changed, "snapshot": snapshot, "archive": arc.summary(archive),
            "container": dict(entry.get("container") or {}, name=entry["name"]),
            "timings": {"total": round(seconds, 3)}}
