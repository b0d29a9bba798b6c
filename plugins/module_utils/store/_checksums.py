# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The checksums of a snapshot's files: recording them, verifying them, and what lies in a snapshot directory.

- recording: ``record_files`` (the manifest entry of every file: size, SHA256, chunk digests, ``_digest``),
  helped by a ``StreamingHasher`` that hashes CRIU's page images while CRIU writes them;
- verifying: ``verify_files`` (every problem with the files of a snapshot, hashed in parallel by chunk) and
  ``hash_problems``; ``VerifiedFiles`` is this node's record of the files it hashed, so an unchanged file is
  not hashed again;
- what a directory holds: ``scan_tree``, ``stray_entries`` / ``unaccounted`` (entries the manifest does not
  account for), ``real_dirs`` (a path reached through real directories only).

Every store backend (``_store``, ``_s3store``, the encrypted and compressed stores) checks through these.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
import time
from typing import Any, Callable, Collection, Dict, Iterator, List, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _paths
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _digest as dg
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _progress as prog
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._storeapi import Store

CHUNK = 4 << 20


def sha256_file(path: str, progress: Optional[Callable[[int], None]] = None) -> str:
    digest = hashlib.sha256()
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb", buffering=0) as handle:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while True:
            n = handle.readinto(buf)
            if not n:
                break
            digest.update(view[:n])
            if progress:
                progress(n)
    return digest.hexdigest()


VERIFIED_DIR = _paths.VERIFIED_DIR
VERIFIED_DIR_ENV = "WARMSTART_VERIFIED_DIR"
VERIFIED_KEEP_DAYS = 30


class VerifiedFiles:
    """This node's record of one snapshot's files it hashed: path -> device, inode, size, mtime, ctime, SHA256.

    A restore on the node that took the snapshot, or restoring it again, skips re-hashing a file whose inode
    still has the size, mtime and ctime it had when it was hashed: any write, truncation, rename over it or
    chmod changes its ctime, which no unprivileged process can set back. What it does not see is a change
    below the filesystem (bit rot, a raw write to the block device); ``snapshot_info verify`` always hashes.
    One small file per snapshot (``<VERIFIED_DIR>/<id>.json``): a restore reads only its own. Unreadable or
    unwritable: everything is hashed.
    """

    def __init__(self, snapshot_id: str, root: Optional[str] = None, record: bool = True) -> None:
        self.root = root or os.environ.get(VERIFIED_DIR_ENV) or VERIFIED_DIR
        self.record = record  # False (check mode): what is known is used, nothing is written
        self.path = os.path.join(self.root, f"{mf.check_id(snapshot_id)}.json")
        self.data = self._load()
        self.added: Dict[str, List[Any]] = {}

    def _load(self) -> Dict[str, List[Any]]:
        try:
            with open(self.path, "r", encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    @staticmethod
    def _value(path: str, sha256: str) -> Optional[List[Any]]:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, sha256]

    def known(self, path: str, sha256: str) -> bool:
        """``path`` was hashed to ``sha256`` on this node and has not changed since."""
        value = self._value(path, sha256)
        return value is not None and self.data.get(path) == value

    def add(self, path: str, sha256: str) -> None:
        value = self._value(path, sha256)
        if value is not None:
            self.added[path] = value

    def add_open(self, path: str, fd: int, sha256: str) -> None:
        """``path`` hashed to ``sha256``, as the file open on ``fd`` is now (the inode hashed, whatever ``path``
        names by now: a file renamed over it later does not match the record)."""
        st = os.fstat(fd)
        self.added[path] = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, sha256]

    def save(self) -> None:
        """Write the record (best effort: it only saves work); drop records not written for VERIFIED_KEEP_DAYS."""
        if not self.added or not self.record:
            return
        try:
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            data = dict(self._load(), **self.added)
            safefs.write_file(self.path, json.dumps(data).encode("utf-8"), 0o600)
        except OSError:
            return
        self.data.update(self.added)
        self.added = {}
        old = time.time() - VERIFIED_KEEP_DAYS * 86400
        for name in os.listdir(self.root):
            try:
                if os.stat(os.path.join(self.root, name)).st_mtime < old:
                    os.unlink(os.path.join(self.root, name))
            except OSError:
                continue

    def forget(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass


def walk_files(top: str) -> Iterator[str]:
    """Relative paths of the regular files under ``top``, sorted."""
    out = []
    for dirpath, _dirs, files in os.walk(top):
        for fname in files:
            full = os.path.join(dirpath, fname)
            if os.path.isfile(full) and not os.path.islink(full):
                out.append(os.path.relpath(full, top))
    return iter(sorted(out))


def record_files(top: str, progress: Optional[Callable[[int], None]] = None,
                 known: Optional[Dict[str, Any]] = None) -> List[Dict[str, Any]]:
    """The manifest entry of every file under ``top`` (manifest excluded): size, SHA256, and chunk digests
    of large files (``_digest``).

    ``known`` maps relative paths to entries already computed (by a StreamingHasher); they are used
    when the size still matches.
    """
    entries = []
    for rel in walk_files(top):
        if rel in (mf.MANIFEST, mf.MANIFEST + ".tmp"):
            continue
        full = os.path.join(top, rel)
        pre = (known or {}).get(rel)
        if pre and pre["size"] == os.path.getsize(full):
            entries.append(pre)
        else:
            entries.append(dg.hash_file(full, rel, progress))
    return entries


class StreamingHasher(threading.Thread):
    """Hash CRIU's page images while CRIU writes them, on another core.

    CRIU writes ``pages-*.img`` sequentially, append only; this thread follows
    each file as it grows, so the checksum pass after the dump has almost
    nothing left to do. ``finish()`` (after CRIU is done) drains to the end
    and returns {relative path: manifest entry} (SHA256 and chunk digests).
    Any file it did not follow to the end is simply hashed again by record_files.
    """

    def __init__(self, top: str, rel_prefix: str, prefix: str = "pages-") -> None:
        super().__init__(daemon=True)
        self.top = top
        self.rel_prefix = rel_prefix
        self.prefix = prefix
        self._done = threading.Event()
        self._state: Dict[str, Any] = {}
        self.error: Optional[BaseException] = None

    def _pass(self) -> bool:
        moved = False
        try:
            names = [n for n in os.listdir(self.top) if n.startswith(self.prefix)]
        except OSError:
            return False
        for name in names:
            state = self._state.get(name)
            if state is None:
                state = self._state[name] = [open(os.path.join(self.top, name), "rb", buffering=0),
                                             dg.ChunkedHasher()]
            while True:
                chunk = state[0].read(CHUNK)
                if not chunk:
                    break
                state[1].update(chunk)
                prog.add(len(chunk))
                moved = True
        return moved

    def run(self) -> None:
        try:
            while not self._done.is_set():
                if not self._pass():
                    time.sleep(0.02)
            while self._pass():
                pass
        except BaseException as exc:  # reported through finish(); the caller falls back to hashing
            self.error = exc

    def finish(self) -> Dict[str, Any]:
        self._done.set()
        self.join()
        out = {}
        for name, (handle, hasher) in self._state.items():
            handle.close()
            if self.error is None:
                rel = f"{self.rel_prefix}/{name}"
                out[rel] = hasher.entry(rel)
        return out


def verify_local(store: Store, doc: Dict[str, Any], fetch: bool = True, cached: bool = False) -> List[str]:
    """Checksum problems of the store's local copy of ``doc``: ``Store.verify`` (see there)."""
    return store.verify(doc, fetch=fetch, cached=cached)


_KINDS = ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a fifo"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def file_kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def real_dirs(top: str, rel: str) -> Optional[str]:
    """Why ``top/rel`` is not reached through real directories only (None when it is): no component of
    ``rel`` may be a symlink or anything but a directory, so nothing under it leads out of ``top``."""
    path = top
    for part in rel.split("/"):
        path = os.path.join(path, part)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return f"{os.path.relpath(path, top)}: missing"
        if not stat.S_ISDIR(info.st_mode):
            return f"{os.path.relpath(path, top)}: {file_kind(info.st_mode)}, not a directory"
    return None


def scan_tree(top: str) -> Dict[str, Any]:
    """Everything under ``top`` without following symlinks: {relative path: lstat result}, directories excluded."""
    out: Dict[str, Any] = {}
    for dirpath, dirs, files in os.walk(top):  # os.walk does not descend into symlinked directories
        for name in files + [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]:
            full = os.path.join(dirpath, name)
            try:
                out[os.path.relpath(full, top)] = os.lstat(full)
            except FileNotFoundError:
                continue
    return out


def stray_entries(top: str, doc: Dict[str, Any], extra: Tuple[str, ...] = (mf.MANIFEST,)) -> List[Tuple[str, str]]:
    """(relative path, why) for each entry of a snapshot directory its manifest does not account for:
    unlisted files, and listed or unlisted entries that are not regular files (symlinks, devices, fifos,
    sockets). ``extra``: files that belong there without being listed (the manifest itself)."""
    listed = {e["path"] for e in doc.get("files", [])}
    out = []
    for rel, info in sorted(scan_tree(top).items()):
        if not stat.S_ISREG(info.st_mode):
            out.append((rel, f"{file_kind(info.st_mode)}, not a regular file"))
        elif rel not in listed and rel not in extra:
            out.append((rel, "not listed in the manifest"))
    return out


def unaccounted(top: str, doc: Dict[str, Any]) -> List[str]:
    """``stray_entries`` as sentences."""
    return [f"{rel}: {why}" for rel, why in stray_entries(top, doc)]


def verify_files(top: str, doc: Dict[str, Any], phase: bool = True, hashed: bool = True,
                 cache: Optional[VerifiedFiles] = None, whole: bool = True,
                 defer: Collection[str] = (), deferred: Optional[List[Tuple[str, Dict[str, Any]]]] = None) -> List[str]:
    """Every problem with the files of a snapshot, as readable sentences (empty = intact).

    Every entry of ``top`` must be a regular file the manifest lists (``whole``; off when checking a
    single file). With ``cache``, a file it knows unchanged since this node hashed it is not hashed again.
    Files are hashed in parallel, by chunk (``_digest.check_files``). Paths in ``defer`` are checked for
    presence, type and size only: their (path, entry) go to ``deferred``, for the caller to hash
    (``hash_problems``) while it does something else. Without ``hashed`` nothing is hashed: the caller copies
    and hashes what it reads (``_storecopy``).
    """
    problems = unaccounted(top, doc) if whole else []
    todo: List[Tuple[str, Dict[str, Any]]] = []
    for entry in doc.get("files", []):
        full = os.path.join(top, entry["path"])
        hashable, why = _entry_problem(top, entry, full, whole)
        if why:
            problems.append(f"{entry['path']}: {why}")
        if not hashable:
            continue
        if not hashed:
            continue  # presence, kind and size only: the caller hashes what it copies (_storecopy)
        if cache is not None and cache.known(full, entry["sha256"]):
            prog.add(int(entry["size"]))
        elif entry["path"] in defer and deferred is not None:
            deferred.append((full, entry))
        else:
            todo.append((full, entry))
    if phase:
        prog.phase("verify", sum(int(e["size"]) for _f, e in todo))
    problems += hash_problems(todo, cache)
    return problems


def _entry_problem(top: str, entry: Dict[str, Any], full: str, whole: bool) -> Tuple[bool, Optional[str]]:
    """(hash it?, why not) for the file of ``entry``; in a ``whole`` check a listed entry that is not a regular
    file is skipped without a reason here (``unaccounted`` gave it)."""
    parent = os.path.dirname(entry["path"])
    why = real_dirs(top, parent) if parent and not whole else None
    if why:
        return False, why
    try:
        info = os.lstat(full)
    except OSError:
        return False, "missing"
    if not stat.S_ISREG(info.st_mode):
        return False, None if whole else f"{file_kind(info.st_mode)}, not a regular file"
    if info.st_size != entry["size"]:
        return False, f"size {info.st_size} bytes, manifest says {entry['size']} (truncated or replaced)"
    return True, None


def hash_problems(items: List[Tuple[str, Dict[str, Any]]], cache: Optional[VerifiedFiles] = None,
                  cancel: Optional[threading.Event] = None, threads: Optional[int] = None) -> List[str]:
    """"SHA256 mismatch" for each (path, entry) whose bytes do not match (chunks hashed on ``threads`` cores,
    default every one); the intact ones recorded in ``cache`` (saved). ``cancel`` set: stop early (the result is
    then meaningless)."""
    ok = dg.check_files(items, prog.add, threads=threads, cancel=cancel) if items else {}
    problems = [f"{entry['path']}: SHA256 mismatch (corrupted)" for path, entry in items if not ok.get(path)]
    if cache is not None:
        for path, entry in items:
            if ok.get(path):
                cache.add(path, entry["sha256"])
        cache.save()
    return problems
