# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Artifact store on a file system: staging, atomic publish, listing, deletion.

Layout (filesystem store; a local dir or a shared mount such as NFS)::

    <root>/snapshots/<id>/manifest.json   written last; published = present
    <root>/snapshots/<id>/containers/<target>/criu/...
    <root>/tmp/<uuid>/                    staging, renamed into snapshots/ on success

Snapshots hold process memory: directories are 0700, files 0600. An object
store backend implements the same ``_storeapi.Store`` protocol and hands
restores a local directory (its node cache); ``_stores.open_store`` picks one.
The checksums of a snapshot's files, and the checks of what lies in its
directory, are ``_checksums``'.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _storecopy as sc
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._checksums import VerifiedFiles, file_kind, real_dirs, verify_files


class StoreError(WarmstartError):
    """The store cannot do what was asked; the message names path and cause."""


def lock_down(top: str) -> None:
    """0700 directories and 0600 files under ``top`` (and ``top`` itself); nothing followed (``safefs``)."""
    safefs.lock_down_tree(top)


@dataclass
class Staging:
    """A snapshot being written. ``publish`` makes it visible, ``abort`` removes it."""

    store: "FsStore"
    path: str
    snapshot_id: str
    done: bool = False

    def publish(self, manifest: Dict[str, Any]) -> str:
        mf.dump(manifest, os.path.join(self.path, mf.MANIFEST))
        lock_down(self.path)
        final = self.store.snapshot_dir(self.snapshot_id)
        try:
            os.rename(self.path, final)
        except OSError as exc:
            raise StoreError(f"cannot publish snapshot {self.snapshot_id} into {final}: {exc.strerror}") from None
        _fsync_dir(os.path.dirname(final))
        self.done = True
        cache = VerifiedFiles(self.snapshot_id)  # digests computed here from what CRIU wrote: a restore here need not redo them
        for entry in manifest.get("files", []):
            cache.add(os.path.join(final, entry["path"]), entry["sha256"])
        cache.save()
        return final

    def abort(self) -> None:
        if not self.done:
            shutil.rmtree(self.path, ignore_errors=True)
            self.done = True


def _existing_parent(path: str) -> str:
    """The nearest ancestor of ``path`` that exists."""
    parent = os.path.dirname(path.rstrip("/")) or "/"
    while not os.path.exists(parent) and parent != "/":
        parent = os.path.dirname(parent)
    return parent


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def refuse_encrypted(store: Any, doc: Dict[str, Any]) -> Dict[str, Any]:
    """``doc`` from a bare backend, refused when it is encrypted: only a ``SecureStore`` (which sets the backend's
    ``admits_encrypted``) reads encrypted snapshots, so they never reach CRIU undecrypted; likewise compressed
    ones, which only a ``_zstore.CompressedStore`` (``admits_compressed``) reads."""
    if doc.get("encryption") is not None and not getattr(store, "admits_encrypted", False):
        raise StoreError(f"snapshot {doc['id']} in store {store.root} is encrypted: set store_options.encryption "
                         "(with this node's key-encryption keys, node_prep_keks)")
    if doc.get("compression") is not None and not getattr(store, "admits_compressed", False):
        raise StoreError(f"snapshot {doc['id']} in store {store.root} is compressed: open the store with "
                         "store_options.compression (a module always does) so it is decompressed before CRIU")
    return doc


class FsStore:
    """Filesystem store rooted at ``root``."""

    kind = "fs"
    admits_encrypted = False  # set by a SecureStore around it
    admits_compressed = False  # set by a CompressedStore around it

    def __init__(self, root: str) -> None:
        if not root or not os.path.isabs(root):
            raise StoreError(f"store path {root!r} must be an absolute path")
        self.root = root
        self.transfer: Dict[str, Any] = {}  # nothing moves over a network

    def describe(self) -> Dict[str, Any]:
        """Where the store is, what kind, and whether it exists yet (for snapshot_info)."""
        return {"url": self.root, "kind": self.kind, "exists": os.path.isdir(self.snapshots)}

    def cache_root(self) -> Optional[str]:
        """A filesystem store reads in place: no node-local cache."""
        return None

    @property
    def reads_in_place(self) -> bool:
        """Restores read the store's own files (``local_dir`` is ``snapshot_dir``)."""
        return True

    # -- layout ---------------------------------------------------------
    @property
    def snapshots(self) -> str:
        return os.path.join(self.root, "snapshots")

    @property
    def tmp(self) -> str:
        return os.path.join(self.root, "tmp")

    def snapshot_dir(self, snapshot_id: str) -> str:
        return os.path.join(self.snapshots, mf.check_id(snapshot_id))

    def check_layout(self) -> None:
        """Refuse a store whose ``snapshots/`` or ``tmp/`` is a symlink (nothing is followed out of the store), and
        say "permission denied" when this user cannot look into the store (not "no snapshots")."""
        for path in (self.snapshots, self.tmp):
            try:
                info = os.lstat(path)
            except (FileNotFoundError, NotADirectoryError):  # not there yet, or the root is no directory (ensure says)
                continue
            except PermissionError:
                raise StoreError(f"store {self.root}: permission denied looking into it (snapshots are 0700 root: "
                                 "run as root, become: true)") from None
            if stat.S_ISLNK(info.st_mode):
                raise StoreError(f"store {self.root}: {path} is a symlink (to {os.readlink(path)}); "
                                 "refusing to use it (a store's layout must be real directories)")

    def check_usable(self) -> None:
        """What ``ensure`` would refuse, found without creating anything (check mode)."""
        self.check_layout()
        for path in (self.root, self.snapshots, self.tmp):
            if os.path.isdir(path):
                continue
            if os.path.lexists(path):
                raise StoreError(f"store {self.root}: cannot create {path}: {os.strerror(errno.EEXIST)} "
                                 "(not a directory)")
            parent = _existing_parent(path)
            if not os.access(parent, os.W_OK | os.X_OK):
                raise StoreError(f"store {self.root}: cannot create {path}: {os.strerror(errno.EACCES)} "
                                 f"(on {parent})")
            return  # the rest is created below it
        if not os.access(self.tmp, os.W_OK):
            raise StoreError(f"store {self.root}: {self.tmp} is not writable (read-only filesystem or permissions)")

    def ensure(self) -> None:
        """Create the store layout (0700) or explain why it cannot be used."""
        self.check_layout()
        for path in (self.root, self.snapshots, self.tmp):
            try:
                os.makedirs(path, mode=0o700, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"store {self.root}: cannot create {path}: {exc.strerror}") from None
        if not os.access(self.tmp, os.W_OK):
            raise StoreError(f"store {self.root}: {self.tmp} is not writable (read-only filesystem or permissions)")
        safefs.set_mode(self.root, 0o700)

    # -- writing --------------------------------------------------------
    def stage(self, snapshot_id: str) -> Staging:
        self.ensure()
        path = os.path.join(self.tmp, uuid.uuid4().hex)
        os.mkdir(path, 0o700)
        return Staging(self, path, mf.check_id(snapshot_id))

    # -- reading --------------------------------------------------------
    def exists(self, snapshot_id: str) -> bool:
        return os.path.isfile(os.path.join(self.snapshot_dir(snapshot_id), mf.MANIFEST))

    def load(self, snapshot_id: str) -> Dict[str, Any]:
        self.check_layout()
        top = self.snapshot_dir(snapshot_id)
        path = os.path.join(top, mf.MANIFEST)
        try:
            info = os.lstat(top)
        except FileNotFoundError:
            raise StoreError(f"snapshot {snapshot_id} not found in store {self.root}") from None
        except PermissionError:
            raise StoreError(f"snapshot {snapshot_id} in store {self.root}: permission denied on {top} "
                             "(snapshots are 0700 root: run as root, become: true)") from None
        if not stat.S_ISDIR(info.st_mode):
            raise StoreError(f"snapshot {snapshot_id} in store {self.root}: {top} is {file_kind(info.st_mode)}, "
                             "not a directory; refusing to follow it")
        doc = mf.load(path)
        if doc["id"] != snapshot_id:
            raise StoreError(f"{path}: manifest id {doc['id']} does not match its directory {snapshot_id}")
        return refuse_encrypted(self, doc)

    def list(self) -> List[Dict[str, Any]]:
        """Published snapshots, oldest first. Unreadable ones are returned with ``error``."""
        out: List[Dict[str, Any]] = []
        self.check_layout()
        if not os.path.isdir(self.snapshots):
            return out
        try:
            names = sorted(os.listdir(self.snapshots))
        except PermissionError:
            raise StoreError(f"store {self.root}: permission denied reading {self.snapshots} (snapshots are "
                             "0700 root: run as root, become: true)") from None
        for entry in names:
            try:
                mf.check_id(entry)
            except mf.ManifestError:
                continue
            try:
                out.append(self.load(entry))
            except (mf.ManifestError, StoreError) as exc:
                out.append({"id": entry, "error": str(exc)})
        return out

    def local_dir(self, snapshot_id: str) -> str:
        """A local directory holding the snapshot's files (here: the store itself)."""
        return self.snapshot_dir(snapshot_id)

    def verify(self, doc: Dict[str, Any], fetch: bool = True, cached: bool = False) -> List[str]:
        """Every file of the snapshot hashed in place (nothing to download); without ``fetch`` (check mode) this
        node's record of hashed files is read but not written."""
        cache = VerifiedFiles(doc["id"], record=fetch) if cached else None
        return verify_files(self.local_dir(doc["id"]), doc, cache=cache)

    def fetch_file(self, snapshot_id: str, entry: Dict[str, Any], path: str, verify: bool = True) -> None:
        """One file of the snapshot at ``path``: with ``verify`` a copy of ours hashed as it is written (a store
        writer cannot change it after the check, ``_storecopy``); without, a symlink into the store."""
        src = os.path.join(self.snapshot_dir(snapshot_id), entry["path"])
        if verify:
            problems = real_dirs(self.snapshot_dir(snapshot_id), os.path.dirname(entry["path"]))
            if problems:
                raise StoreError(f"{entry['path']}: {problems}")
            found, _deferred = sc.copy_verified(self.snapshot_dir(snapshot_id), [(entry, path)])
            if found:
                raise StoreError(found[0])
            return
        if not stat.S_ISREG(os.lstat(src).st_mode if os.path.lexists(src) else 0):
            raise StoreError(f"{entry['path']}: missing")
        os.symlink(src, path)

    def read_range(self, snapshot_id: str, rel: str, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` of one file of the snapshot."""
        path = os.path.join(self.snapshot_dir(snapshot_id), rel)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # never a fifo a store writer put there
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise StoreError(f"{path}: not a regular file")
            return os.pread(fd, length, offset)
        finally:
            os.close(fd)

    def staging_entries(self) -> List[Dict[str, Any]]:
        self.check_layout()
        return local_staging(self.tmp)

    def delete(self, snapshot_id: str) -> int:
        """Remove a published snapshot: unpublish first (manifest), then the files."""
        path = self.snapshot_dir(snapshot_id)
        size = tree_size(path)
        doomed = os.path.join(self.tmp, f"deleting-{snapshot_id}-{uuid.uuid4().hex[:8]}")
        os.makedirs(self.tmp, mode=0o700, exist_ok=True)
        os.rename(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        VerifiedFiles(snapshot_id).forget()
        return size

    def delete_staging(self, path: str) -> int:
        size = tree_size(path)
        shutil.rmtree(path, ignore_errors=True)
        return size


STAGING_RE = re.compile(r"[0-9a-f]{32}|deleting-[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}-[0-9a-f]{8}")


def local_staging(tmp: str) -> List[Dict[str, Any]]:
    """warmstart's own staging directories under ``tmp`` (path, mtime, size): what cleanup judges by age.

    Only entries of warmstart's naming (``<32 hex>`` staging, ``deleting-<id>-<8 hex>``) are listed:
    anything else in ``tmp`` was not made by warmstart and is never removed. ``tmp`` itself must not be
    a symlink.
    """
    out: List[Dict[str, Any]] = []
    if os.path.islink(tmp):
        raise StoreError(f"{tmp} is a symlink (to {os.readlink(tmp)}); refusing to list or clean it")
    if not os.path.isdir(tmp):
        return out
    for entry in sorted(os.listdir(tmp)):
        if not STAGING_RE.fullmatch(entry):
            continue
        full = os.path.join(tmp, entry)
        try:
            stat = os.lstat(full)
        except FileNotFoundError:
            continue
        out.append({"path": full, "mtime": stat.st_mtime, "size": tree_size(full)})
    return out


def tree_size(top: str) -> int:
    total = 0
    if os.path.isfile(top):
        return os.path.getsize(top)
    for dirpath, _dirs, files in os.walk(top):
        for fname in files:
            try:
                total += os.lstat(os.path.join(dirpath, fname)).st_size
            except OSError:
                pass
    return total
