# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Encryption at rest for a ``SecureStore``: what it writes into and reads from an encrypted store.

``_securestore.SecureStore`` holds one ``Encryption`` when ``store_options.encryption`` is on and calls it
from its ``Store`` members; the format is ``_crypt``'s. Invariants:

- CRIU writes into a node-local staging directory (``<cache_dir>/tmp/<uuid>``, 0700); ``encrypt_into``
  encrypts every listed file into the backend's staging and rewrites the manifest's ``files`` (size and
  SHA256 of the stored, encrypted bytes) before the manifest is signed and published: no plaintext byte
  reaches the store, and every backend check (sizes, digests, downloads) works on the stored bytes;
- an encrypted snapshot is read into ``<cache_dir>/plain/<store key>/<id>/`` (0700/0600) in one pass per
  file that hashes the stored bytes against the manifest and authenticates and decrypts them; a file's
  plaintext is renamed into place only when both pass, and the copy's ``manifest.json`` (the manifest it
  was made from) is written last: a copy with it and the right sizes is complete and is reused - within
  the boot that made it (``.unsynced``: its files are not fsynced; after a reboot it is made again);
- a filesystem store's files are opened without following symlinks, through real directories only;
  an object store's are read with ranged GETs, several at a time;
- no key, and no plaintext outside the node-local cache, is ever written; messages name files and key ids.
"""
from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import os
import re
import shutil
import stat
import uuid
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Set

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.store.security import _crypt as cr
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _progress as prog
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _storecopy as sc
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._checksums import real_dirs, unaccounted
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._store import (
    StoreError, local_staging, lock_down, tree_size)
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._storeapi import Store

GET_CHUNKS = 4            # stored chunks per ranged GET of an object store
UNSYNCED = ".unsynced"    # in a plaintext copy: the boot it is valid in (its files are not fsynced)


def store_key(root: str) -> str:
    """A directory name for the store ``root`` (readable, and unique through a digest of the root)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", root.strip("/"))[-48:].strip("_.") or "store"
    return f"{safe}-{hashlib.sha256(root.encode()).hexdigest()[:12]}"


class Encryption:
    """The encrypting side of one store (see the module docstring)."""

    def __init__(self, inner: Store, kek_dir: Optional[str], kek: Optional[str], cache_dir: str) -> None:
        self.inner = inner
        self.kek_dir = kek_dir
        self.kek = kek
        self.cache_dir = cache_dir
        self.tmp = os.path.join(cache_dir, "tmp")
        self.plain_root = os.path.join(cache_dir, "plain", store_key(inner.root))
        self.keys: Dict[str, bytes] = {}           # snapshot id -> data key (admitted manifests only)
        self.docs: Dict[str, Dict[str, Any]] = {}  # snapshot id -> admitted manifest
        self.ready: Set[str] = set()               # ids whose plaintext copy was found complete in this run
        self.chunk = cr.CHUNK                      # plaintext bytes per chunk of what this store writes

    def _fail(self, exc: BaseException, sid: Optional[str] = None) -> StoreError:
        what = f"snapshot {sid} in store {self.inner.root}" if sid else f"store {self.inner.root}"
        return StoreError(f"{what}: {exc}", reasons=getattr(exc, "reasons", None))

    # -- admission -----------------------------------------------------------------------------------
    def admit(self, doc: Dict[str, Any]) -> None:
        """Refuse ``doc`` unless it is encrypted with a KEK of this node's ring that unwraps its data key."""
        sid = str(doc.get("id"))
        block = doc.get("encryption")
        if block is None:
            raise StoreError(f"snapshot {sid} in store {self.inner.root} is not encrypted, but the store is "
                             "(store_options.encryption): refusing it - a plaintext snapshot in an encrypted "
                             "store may have been planted there")
        try:
            problems = cr.check_block(block)
            if problems:
                raise cr.CryptError(f"manifest {problems[0]}", reasons=problems)
            self.keys[sid] = cr.unwrap(block, cr.find_kek(self.kek_dir, block["kek_id"]), sid)
        except cr.CryptError as exc:
            raise self._fail(exc, sid) from None
        self.docs[sid] = doc

    def check_writable(self) -> cr.Kek:
        """The KEK new snapshots are wrapped with (and ``cryptography`` present), or StoreError why not."""
        try:
            cr.require()
            return cr.writing_kek(self.kek_dir, self.kek)
        except cr.CryptError as exc:
            raise self._fail(exc) from None

    # -- writing ---------------------------------------------------------------------------------------
    def new_staging(self) -> str:
        """A node-local plaintext staging directory for CRIU (0700)."""
        return new_local_staging(self.tmp)

    def encrypt_into(self, plain: str, dest: str, manifest: Dict[str, Any], kek: cr.Kek) -> None:
        """Every file ``manifest`` lists, from ``plain`` encrypted into ``dest``; the manifest's ``files`` and
        ``size`` then describe the stored bytes and its ``encryption`` block holds the wrapped data key."""
        sid = str(manifest["id"])
        data_key = cr.new_data_key()
        prog.phase("encrypt", sum(int(e["size"]) for e in manifest["files"]))
        files = []
        for entry in manifest["files"]:
            rel = entry["path"]
            out = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(out), mode=0o700, exist_ok=True)
            files.append(cr.encrypt_file(os.path.join(plain, rel), out, cr.FileCipher(data_key, sid, rel),
                                         self.chunk, prog.add))
        manifest["files"] = files
        manifest["size"] = sum(e["size"] for e in files)
        manifest["encryption"] = cr.wrap(data_key, kek, sid, self.chunk)
        self.keys[sid] = data_key

    def keep_plain(self, plain: str, manifest: Dict[str, Any]) -> None:
        """After publish: the plaintext staging becomes this node's decrypted copy (a restore here decrypts
        nothing); the backend's own cached copy of the stored bytes is dropped (never read)."""
        sid = str(manifest["id"])
        dest = self.plain_dir(sid)
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(self.plain_root, mode=0o700, exist_ok=True)
        lock_down(plain)
        os.rename(plain, dest)
        finish_copy(dest, manifest)
        self.docs[sid] = manifest
        self.ready.add(sid)
        cached = self.inner.cache_root()
        if cached:
            shutil.rmtree(os.path.join(cached, sid), ignore_errors=True)

    # -- the plaintext copy ----------------------------------------------------------------------------
    def plain_dir(self, snapshot_id: str) -> str:
        return os.path.join(self.plain_root, mf.check_id(snapshot_id))

    def _complete(self, doc: Dict[str, Any]) -> bool:
        """This node holds a finished plaintext copy of exactly ``doc``."""
        sid = doc["id"]
        if sid in self.ready:
            return True
        chunk = int(doc["encryption"]["chunk"])
        if not copy_complete(self.plain_dir(sid), doc, lambda e: cr.plain_size(int(e["size"]), chunk)):
            return False
        self.ready.add(sid)
        return True

    def copy(self, doc: Dict[str, Any], reuse: bool = True) -> List[str]:
        """Problems making this node's plaintext copy of ``doc`` (empty: it is complete at ``plain_dir``)."""
        sid = doc["id"]
        if reuse and self._complete(doc):
            if not self.inner.reads_in_place:  # a filesystem store moves nothing over a network: no transfer
                self.inner.transfer["reused"] = self.inner.transfer.get("reused", 0) + int(doc.get("size") or 0)
            return []
        self.ready.discard(sid)
        try:
            stored = self._shared_copy(doc)
        except StoreError as exc:
            return [str(exc)]
        try:
            prog.phase("decrypt", sum(int(e["size"]) for e in doc["files"]))
            problems = build_copy(self.plain_dir(sid), doc,
                                  lambda entry, path: self.decrypt_file(doc, entry, path, stored),
                                  need=sum(int(e["size"]) for e in doc["files"]))  # plaintext <= stored
        finally:
            if stored is not None:  # the stored bytes were only the way to the plaintext copy
                shutil.rmtree(stored, ignore_errors=True)
                getattr(self.inner, "verified", {}).pop(sid, None)
        if not problems:
            self.ready.add(sid)
        return problems

    def _shared_copy(self, doc: Dict[str, Any]) -> Optional[str]:
        """With ``peers`` (an object store whose nodes share downloads, ``_peers``): the stored, encrypted bytes
        fetched into the backend's cache, every chunk checked and shared with the other nodes; else None (the
        decrypting pass reads the bucket directly). Only ciphertext travels between nodes."""
        if self.inner.reads_in_place or getattr(self.inner, "peers", None) is None:
            return None
        return self.inner.local_dir(doc["id"])

    def local_dir(self, doc: Dict[str, Any]) -> str:
        problems = self.copy(doc)
        if problems:
            raise StoreError(f"snapshot {doc['id']} in store {self.inner.root}: {problems[0]}", reasons=problems)
        return self.plain_dir(doc["id"])

    def verify(self, doc: Dict[str, Any], cached: bool) -> List[str]:
        """The stored files against the manifest (unlisted, missing, sizes), then the decrypting pass (skipped
        for a complete copy when ``cached``)."""
        if self.inner.reads_in_place:
            problems = unaccounted(self.inner.snapshot_dir(doc["id"]), doc)
        else:
            problems = self.inner.verify(doc, fetch=False)
            if problems:
                return problems
        return problems + self.copy(doc, reuse=cached)

    # -- decrypting ----------------------------------------------------------------------------------
    def decrypt_file(self, doc: Dict[str, Any], entry: Dict[str, Any], path: str, stored: Optional[str] = None) -> None:
        """One file: stored bytes hashed and decrypted in one pass into ``path`` (renamed in when intact); read from
        ``stored`` (a local copy of the stored bytes, ``_shared_copy``) when given."""
        sid, rel, size = doc["id"], entry["path"], int(entry["size"])
        chunk = int(doc["encryption"]["chunk"])
        cipher = cr.FileCipher(self.keys[sid], sid, rel)
        count = cr.chunk_count(size, chunk)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        part = f"{path}.part"
        safefs.remove(part)
        fd = safefs.create_file(part)
        try:
            with os.fdopen(fd, "wb") as out:
                digest = cr.decrypt_stream(self._stored_chunks(sid, rel, size, chunk, stored), cipher, count,
                                           out.write, prog.add)
            if digest != entry["sha256"]:
                raise StoreError("SHA256 mismatch (corrupted)")
            os.rename(part, path)
        except BaseException:
            if os.path.lexists(part):
                os.unlink(part)
            raise
        if not self.inner.reads_in_place and stored is None:  # a shared copy's bytes were counted as it came
            self.inner.transfer["downloaded"] = self.inner.transfer.get("downloaded", 0) + size

    def _stored_chunks(self, sid: str, rel: str, size: int, chunk: int, stored: Optional[str] = None) -> Iterator[bytes]:
        spans = cr.spans(size, chunk)
        if self.inner.reads_in_place or stored is not None:
            return self._local_chunks(sid, rel, size, spans, stored)
        return self._remote_chunks(sid, rel, spans)

    def _open_stored(self, sid: str, rel: str, size: Optional[int], top: Optional[str] = None) -> int:
        """A read-only fd of a filesystem store's file (or of one under ``top``): real directories, no symlink, a
        regular file of ``size``."""
        top = top or self.inner.snapshot_dir(sid)
        parent = os.path.dirname(rel)
        why = real_dirs(top, parent) if parent else None
        if why:
            raise StoreError(why)
        try:
            fd = os.open(os.path.join(top, rel), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            raise StoreError("missing" if isinstance(exc, FileNotFoundError) else f"cannot open it: {exc.strerror}"
                             + (" (a symlink)" if exc.errno == 40 else "")) from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (size is not None and info.st_size != size):
            os.close(fd)
            raise StoreError(f"size {info.st_size} bytes, manifest says {size} (truncated or replaced)"
                             if stat.S_ISREG(info.st_mode) else "not a regular file")
        return fd

    def _local_chunks(self, sid: str, rel: str, size: int, spans: List[Any], top: Optional[str] = None) -> Iterator[bytes]:
        fd = self._open_stored(sid, rel, size, top)
        try:
            for _index, offset, length in spans:
                yield _pread_all(fd, length, offset)
        finally:
            os.close(fd)

    def _remote_chunks(self, sid: str, rel: str, spans: List[Any]) -> Iterator[bytes]:
        """Stored chunks in order, fetched GET_CHUNKS at a time by ranged GETs, ``concurrency`` GETs ahead."""
        groups = [spans[i:i + GET_CHUNKS] for i in range(0, len(spans), GET_CHUNKS)]
        workers = max(1, int(getattr(self.inner, "concurrency", 4)))

        def get(group: List[Any]) -> bytes:
            start = group[0][1]
            return self.inner.read_range(sid, rel, start, group[-1][1] + group[-1][2] - start)

        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            pending: Deque[Any] = collections.deque()
            todo = iter(groups)
            for group in todo:
                pending.append((group, pool.submit(get, group)))
                if len(pending) > workers:
                    break
            while pending:
                group, future = pending.popleft()
                nxt = next(todo, None)
                if nxt is not None:
                    pending.append((nxt, pool.submit(get, nxt)))
                data, base = future.result(), group[0][1]
                for _index, offset, length in group:
                    piece = data[offset - base:offset - base + length]
                    if len(piece) != length:
                        raise StoreError(f"short read ({len(piece)} of {length} bytes at {offset})")
                    yield piece

    def fetch_file(self, sid: str, entry: Dict[str, Any], path: str) -> None:
        """One file decrypted to ``path`` (from the complete copy when there is one), checked on the way."""
        doc = self.docs[sid]
        if self._complete(doc):
            safefs.copy_into(os.path.dirname(path), os.path.basename(path),
                             os.path.join(self.plain_dir(sid), entry["path"]), 0o600)
            return
        try:
            self.decrypt_file(doc, entry, path)
        except cr.CryptError as exc:
            raise self._fail(exc, sid) from None

    def read_range(self, sid: str, rel: str, offset: int, length: int) -> bytes:
        """Plaintext bytes of one file: from the complete copy, else the stored chunks covering them."""
        doc = self.docs[sid]
        if self._complete(doc):
            with open(os.path.join(self.plain_dir(sid), rel), "rb") as handle:
                return os.pread(handle.fileno(), length, offset)
        entry = next((e for e in doc["files"] if e["path"] == rel), None)
        if entry is None:
            raise StoreError(f"snapshot {sid}: {rel} is not listed in its manifest")
        cipher = cr.FileCipher(self.keys[sid], sid, rel)
        try:
            return cr.read_plain(lambda off, n: self._read_stored(sid, rel, off, n), cipher, int(entry["size"]),
                                 int(doc["encryption"]["chunk"]), offset, length)
        except cr.CryptError as exc:
            raise self._fail(exc, sid) from None

    def _read_stored(self, sid: str, rel: str, offset: int, length: int) -> bytes:
        if not self.inner.reads_in_place:
            return self.inner.read_range(sid, rel, offset, length)
        fd = self._open_stored(sid, rel, None)
        try:
            return _pread_all(fd, length, offset)
        finally:
            os.close(fd)

    # -- housekeeping --------------------------------------------------------------------------------
    def forget(self, snapshot_id: str) -> None:
        """Drop this node's plaintext copy of ``snapshot_id`` (the snapshot was deleted)."""
        shutil.rmtree(self.plain_dir(snapshot_id), ignore_errors=True)
        self.ready.discard(snapshot_id)

    def staging_entries(self, inner: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """The backend's leftovers and this node's plaintext staging leftovers (once each)."""
        seen = {e["path"] for e in inner}
        return inner + [e for e in local_staging(self.tmp) if e["path"] not in seen]

    def owns_staging(self, path: str) -> bool:
        return os.path.dirname(path.rstrip("/")) == self.tmp

    @staticmethod
    def delete_staging(path: str) -> int:
        size = tree_size(path)
        shutil.rmtree(path, ignore_errors=True)
        return size


def new_local_staging(tmp: str) -> str:
    """A new node-local staging directory ``<tmp>/<32 hex>`` (0700), as ``_store.local_staging`` lists them."""
    os.makedirs(tmp, mode=0o700, exist_ok=True)
    path = os.path.join(tmp, uuid.uuid4().hex)
    os.mkdir(path, 0o700)
    return path


def private_dirs(path: str) -> None:
    """``path`` and every missing directory above it created 0700 (``os.makedirs`` gives the parents the umask's
    mode); existing ones are left as they are."""
    parent = os.path.dirname(path)
    if parent and parent != path and not os.path.isdir(parent):
        private_dirs(parent)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass


def build_copy(dest: str, doc: Dict[str, Any], one: Callable[[Dict[str, Any], str], None],
               need: Optional[int] = None) -> List[str]:
    """Make ``dest`` (0700, replaced) a complete copy of ``doc``: ``one(entry, path)`` writes each listed file
    (checked); problems as sentences naming the file, and then no copy is left; else ``finish_copy``. With
    ``need`` (the plaintext's bytes), a node without that much free space is refused before anything is written."""
    shutil.rmtree(dest, ignore_errors=True)
    private_dirs(os.path.dirname(dest))
    if need is not None:
        short = sc.space_problem(dest, need, f"the plaintext copy of snapshot {doc.get('id')}",
                                 "point store_options.cache_dir elsewhere")
        if short:
            return [short]
    os.mkdir(dest, 0o700)
    problems = []
    for entry in doc["files"]:
        try:
            one(entry, os.path.join(dest, entry["path"]))
        except (WarmstartError, OSError) as exc:
            why = str(getattr(exc, "strerror", None) or exc)
            problems.append(why if why.startswith(f"{entry['path']}: ") else f"{entry['path']}: {why}")
    if problems:
        shutil.rmtree(dest, ignore_errors=True)
        return problems
    lock_down(dest)
    finish_copy(dest, doc)
    return []


def copy_complete(dest: str, doc: Dict[str, Any], plain_size: Callable[[Dict[str, Any]], int]) -> bool:
    """Whether ``dest`` is a finished node-local copy of exactly ``doc``, valid in this boot: its manifest is
    ``doc`` and each ``files[]`` entry is a regular file of ``plain_size(entry)`` bytes (the encrypted and the
    compressed stores' plaintext copies alike)."""
    try:
        if os.path.lexists(os.path.join(dest, UNSYNCED)):
            with open(os.path.join(dest, UNSYNCED), "r", encoding="ascii") as handle:
                if handle.read() != _boot_id():
                    return False
        if mf.load(os.path.join(dest, mf.MANIFEST)) != doc:
            return False
        for entry in doc["files"]:
            info = os.lstat(os.path.join(dest, entry["path"]))
            if not stat.S_ISREG(info.st_mode) or info.st_size != plain_size(entry):
                return False
    except (OSError, mf.ManifestError, WarmstartError, KeyError, TypeError, ValueError):
        return False
    return True


def finish_copy(dest: str, doc: Dict[str, Any]) -> None:
    """Mark ``dest`` a complete copy of ``doc``, valid in this boot: the boot id, then the manifest, last."""
    safefs.write_file(os.path.join(dest, UNSYNCED), _boot_id().encode("ascii"), 0o600)
    mf.dump(doc, os.path.join(dest, mf.MANIFEST))


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", "r", encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _pread_all(fd: int, length: int, offset: int) -> bytes:
    parts, done = [], 0
    while done < length:
        data = os.pread(fd, length - done, offset + done)
        if not data:
            break
        parts.append(data)
        done += len(data)
    return b"".join(parts)
