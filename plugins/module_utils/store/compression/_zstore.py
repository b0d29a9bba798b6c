# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Compression at rest: a ``Store`` that compresses what it publishes and decompresses what it restores.

``_stores.open_store`` puts a ``CompressedStore`` outermost (around the backend, or around the ``SecureStore``)
whenever ``store_options`` carry ``compression`` (a module always passes it, ``none`` included), so that any
node reads a compressed snapshot whatever its own switch says; ``compression: zstd`` also compresses what it
writes. The format is ``_zstd``'s. Invariants:

- compress first, then encrypt and sign: ``publish`` compresses CRIU's files from a node-local staging directory
  (0700) into the inner staging, rewrites ``files[]`` to describe the stored bytes (size, SHA256, chunk
  digests) and adds the ``compression`` block, then the inner staging encrypts (when on), signs over all of it
  and publishes; the node that wrote a snapshot keeps the plaintext as its copy (nothing is decompressed there);
- a compressed snapshot reaches CRIU only as this node's plaintext copy under
  ``<cache_dir>/plain/zstd/<store key>/<id>/`` (0700/0600, made and reused like ``_encstore``'s): the stored
  bytes are checked by the inner store as for any snapshot, then each compressed file is decompressed (no frame
  past its declared size) and its plaintext SHA256 checked before the copy is complete;
- a snapshot without a ``compression`` block is handed through untouched (old snapshots keep working);
- a compressed snapshot on a node without ``zstandard`` is refused before anything is touched, naming
  node_prep.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Set

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _paths
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.store.security import _crypt as cr
from ansible_collections.warmstart.snapshot.plugins.module_utils.store.security import _encstore as es
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _progress as prog
from ansible_collections.warmstart.snapshot.plugins.module_utils.store.compression import _zstd as zs
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._checksums import unaccounted
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._store import (
    StoreError, local_staging, lock_down, tree_size)
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._storeapi import Staging, Store


@dataclass(frozen=True)
class CompressionConfig:
    """``store_options.compression`` (``none``/``zstd``, None when not given: the store kind's default) and
    ``compression_level``; ``present``: the options carry the key (a module's always do)."""

    compression: Optional[str] = None
    level: int = zs.LEVEL
    cache_dir: str = _paths.CACHE_DIR
    present: bool = False

    @classmethod
    def from_options(cls, options: Optional[Dict[str, Any]], cache_dir: str) -> "CompressionConfig":
        o = options or {}
        level = o.get("compression_level")
        return cls(compression=o.get("compression"), level=zs.LEVEL if level is None else int(level),
                   cache_dir=cache_dir, present="compression" in o or "compression_level" in o)

    def check(self) -> None:
        """StoreError unless the options are usable (before anything is touched)."""
        if self.compression is not None and self.compression not in zs.CHOICES:
            raise StoreError(f"store_options.compression {self.compression!r}: one of {', '.join(zs.CHOICES)}")
        if not zs.MIN_LEVEL <= self.level <= zs.MAX_LEVEL:
            raise StoreError(f"store_options.compression_level {self.level}: from {zs.MIN_LEVEL} to {zs.MAX_LEVEL}")

    def compresses(self, kind: str) -> bool:
        """Whether a store of ``kind`` compresses what it writes."""
        return (self.compression or zs.default(kind)) == "zstd"


class CompressedStaging:
    """A node-local staging dir for CRIU (``path``); ``publish`` compresses into ``inner`` and publishes it."""

    def __init__(self, store: "CompressedStore", inner: Staging, plain: str) -> None:
        self.store = store
        self.inner = inner
        self.path = plain
        self.snapshot_id = inner.snapshot_id
        self.done = False

    def publish(self, manifest: Dict[str, Any]) -> str:
        try:
            self.store.compress_into(self.path, self.inner.path, manifest)
            final = self.inner.publish(manifest)  # encrypts (when on) and signs over the compression block
        except BaseException:
            self.abort()
            raise
        self.done = True
        self.store.keep_plain(self.path, self.snapshot_id)
        return final

    def abort(self) -> None:
        if not self.done:
            self.inner.abort()
            shutil.rmtree(self.path, ignore_errors=True)
            self.done = True


class CompressedStore:
    """``inner`` with compression at rest (see the module docstring); implements ``Store``."""

    def __init__(self, inner: Store, config: CompressionConfig) -> None:
        config.check()
        self.inner = inner
        self.config = config
        self.root = inner.root
        self.kind = inner.kind
        self.transfer = inner.transfer
        self.compress = config.compresses(inner.kind)
        layer: Any = inner
        while layer is not None:  # the backend (and a SecureStore) hand compressed manifests to this store
            setattr(layer, "admits_compressed", True)
            layer = getattr(layer, "inner", None)
        self.tmp = os.path.join(config.cache_dir, "tmp")
        self.plain_root = os.path.join(config.cache_dir, "plain", "zstd", es.store_key(inner.root))
        self.docs: Dict[str, Dict[str, Any]] = {}  # snapshot id -> manifest loaded through this store
        self.ready: Set[str] = set()               # ids whose plaintext copy was found complete in this run
        self.frame = zs.FRAME                      # plaintext bytes per frame of what this store writes

    def _fail(self, exc: BaseException, sid: str) -> StoreError:
        return StoreError(f"snapshot {sid} in store {self.root}: {exc}", reasons=getattr(exc, "reasons", None))

    # -- writing ---------------------------------------------------------------------------------------
    def stage(self, snapshot_id: str) -> Staging:
        if not self.compress:
            return self.inner.stage(snapshot_id)
        self._require(None)  # no zstandard: refused before CRIU runs
        inner = self.inner.stage(snapshot_id)
        return CompressedStaging(self, inner, es.new_local_staging(self.tmp))

    def compress_into(self, plain: str, dest: str, manifest: Dict[str, Any]) -> None:
        """Every file ``manifest`` lists, from ``plain`` into ``dest``: compressed when ``_zstd.worth`` it (its
        ``files[]`` entry then describes the stored bytes, its plaintext in the ``compression`` block), else
        copied as it is."""
        prog.phase("compress", sum(int(e["size"]) for e in manifest["files"]))
        block: Dict[str, Any] = {"alg": zs.ALG, "level": self.config.level, "frame": self.frame, "files": {}}
        files = []
        for entry in manifest["files"]:
            rel, src, out = entry["path"], os.path.join(plain, entry["path"]), os.path.join(dest, entry["path"])
            os.makedirs(os.path.dirname(out), mode=0o700, exist_ok=True)
            if not zs.worth(rel, int(entry["size"])):
                safefs.copy_into(os.path.dirname(out), os.path.basename(out), src, 0o600)
                prog.add(int(entry["size"]))
                files.append(entry)
                continue
            block["files"][rel], stored = zs.compress_file(src, out, self.config.level, self.frame, prog.add)
            files.append(dict(stored, path=rel))
        manifest["files"] = files
        manifest["size"] = sum(int(e["size"]) for e in files)
        manifest["compression"] = block

    def keep_plain(self, plain: str, snapshot_id: str) -> None:
        """After publish: CRIU's plaintext becomes this node's copy (a restore here decompresses nothing), marked
        complete with the manifest as published (read back: encryption and signing changed it after us)."""
        dest = self.plain_dir(snapshot_id)
        try:
            doc = self.inner.load(snapshot_id)
            shutil.rmtree(dest, ignore_errors=True)
            es.private_dirs(self.plain_root)
            lock_down(plain)
            os.rename(plain, dest)
            es.finish_copy(dest, doc)
        except (OSError, StoreError, mf.ManifestError):
            shutil.rmtree(plain, ignore_errors=True)  # no copy kept: a restore here decompresses from the store
            return
        self.docs[snapshot_id] = doc
        self.ready.add(snapshot_id)

    # -- the plaintext copy ----------------------------------------------------------------------------
    def plain_dir(self, snapshot_id: str) -> str:
        return os.path.join(self.plain_root, mf.check_id(snapshot_id))

    @staticmethod
    def _block(doc: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        block = doc.get("compression")
        return block if isinstance(block, dict) else None

    def _require(self, sid: Optional[str]) -> None:
        try:
            zs.require()
        except zs.CompressionError as exc:
            if sid is None:
                raise StoreError(f"store {self.root}: store_options.compression is zstd, but {exc}") from None
            raise StoreError(f"snapshot {sid} in store {self.root} is compressed, but {exc}") from None

    def _plain_size(self, doc: Dict[str, Any], entry: Dict[str, Any]) -> int:
        block = self._block(doc) or {"files": {}}
        meta = block["files"].get(entry["path"])
        if meta is not None:
            return int(meta["size"])
        if doc.get("encryption") is not None:
            return int(cr.plain_size(int(entry["size"]), int(doc["encryption"]["chunk"])))
        return int(entry["size"])

    def _complete(self, doc: Dict[str, Any]) -> bool:
        sid = doc["id"]
        if sid in self.ready:
            return True
        if not es.copy_complete(self.plain_dir(sid), doc, lambda e: self._plain_size(doc, e)):
            return False
        self.ready.add(sid)
        return True

    def copy(self, doc: Dict[str, Any], reuse: bool = True) -> List[str]:
        """Problems making this node's plaintext copy of ``doc`` from the inner store's checked copy (empty: it is
        complete at ``plain_dir``)."""
        sid = doc["id"]
        if reuse and self._complete(doc):
            return []
        self._require(sid)
        self.ready.discard(sid)
        try:
            src = self.inner.local_dir(sid)
        except StoreError as exc:
            return [str(exc)]
        block = self._block(doc) or {"files": {}}
        need = sum(self._plain_size(doc, e) for e in doc["files"])
        prog.phase("decompress", need)
        problems = es.build_copy(self.plain_dir(sid), doc,
                                 lambda entry, path: self._unpack_file(doc, block, src, entry, path), need=need)
        if not problems:
            self.ready.add(sid)
        return problems

    def _unpack_file(self, doc: Dict[str, Any], block: Dict[str, Any], src: str, entry: Dict[str, Any],
                     path: str) -> None:
        """One file from the inner copy ``src`` into ``path``: decompressed and checked against the block, or (not
        compressed) copied and checked against ``files[]`` - unless encrypted, where decrypting checked it."""
        rel = entry["path"]
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        meta = block["files"].get(rel)
        fd = os.open(os.path.join(src, rel), os.O_RDONLY | os.O_NOFOLLOW)
        try:
            with os.fdopen(fd, "rb") as stored, os.fdopen(_created(path), "wb") as out:
                if meta is not None:
                    _inflate(block, meta, stored, out, prog.add)
                else:
                    digest = hashlib.sha256()
                    for data in iter(lambda: stored.read(1 << 20), b""):
                        digest.update(data)
                        out.write(data)
                        prog.add(len(data))
                    if doc.get("encryption") is None and digest.hexdigest() != entry["sha256"]:
                        raise StoreError("SHA256 mismatch (corrupted)")
        except BaseException:
            if os.path.lexists(path):
                os.unlink(path)
            raise

    # -- reading ---------------------------------------------------------------------------------------
    def load(self, snapshot_id: str) -> Dict[str, Any]:
        doc = self.inner.load(snapshot_id)
        self.docs[str(doc.get("id"))] = doc
        return doc

    def list(self) -> List[Dict[str, Any]]:
        return self.inner.list()

    def _doc(self, snapshot_id: str) -> Dict[str, Any]:
        return self.docs.get(snapshot_id) or self.load(snapshot_id)

    def local_dir(self, snapshot_id: str) -> str:
        doc = self._doc(snapshot_id)
        if self._block(doc) is None:
            return self.inner.local_dir(snapshot_id)
        problems = self.copy(doc)
        if problems:
            raise StoreError(f"snapshot {snapshot_id} in store {self.root}: {problems[0]}", reasons=problems)
        return self.plain_dir(snapshot_id)

    def verify(self, doc: Dict[str, Any], fetch: bool = True, cached: bool = False) -> List[str]:
        """The stored bytes through the inner store (check mode: that only), then the decompressing pass; with
        ``cached``, a complete plaintext copy is reused without reading the store."""
        if self._block(doc) is None or not fetch:
            return self.inner.verify(doc, fetch=fetch, cached=cached)
        self.docs[doc["id"]] = doc
        if cached and self._complete(doc):
            self.transfer["reused"] = self.transfer.get("reused", 0) + sum(int(e["size"]) for e in doc["files"])
            return unaccounted(self.inner.snapshot_dir(doc["id"]), doc) if self.inner.reads_in_place else []
        self._require(doc["id"])
        problems = self.inner.verify(doc, fetch=True, cached=cached)
        return problems or self.copy(doc, reuse=False)

    def fetch_file(self, snapshot_id: str, entry: Dict[str, Any], path: str, verify: bool = True) -> None:
        doc = self._doc(snapshot_id)
        block = self._block(doc)
        if block is None or entry["path"] not in block["files"]:
            self.inner.fetch_file(snapshot_id, entry, path, verify=verify)
            return
        if self._complete(doc):
            safefs.copy_into(os.path.dirname(path), os.path.basename(path),
                             os.path.join(self.plain_dir(snapshot_id), entry["path"]), 0o600)
            return
        self._require(snapshot_id)
        stored = f"{path}.zst"
        try:
            self.inner.fetch_file(snapshot_id, entry, stored, verify=verify)
            with open(stored, "rb") as handle, os.fdopen(_created(path), "wb") as out:
                _inflate(block, block["files"][entry["path"]], handle, out)
        except zs.CompressionError as exc:
            raise self._fail(exc, snapshot_id) from None
        finally:
            if os.path.lexists(stored):
                os.unlink(stored)

    def read_range(self, snapshot_id: str, rel: str, offset: int, length: int) -> bytes:
        doc = self._doc(snapshot_id)
        block = self._block(doc)
        if block is None or rel not in block["files"]:
            return self.inner.read_range(snapshot_id, rel, offset, length)
        if self._complete(doc):
            with open(os.path.join(self.plain_dir(snapshot_id), rel), "rb") as handle:
                return os.pread(handle.fileno(), length, offset)
        self._require(snapshot_id)
        try:
            return zs.read_plain(lambda off, n: self.inner.read_range(snapshot_id, rel, off, n), block["files"][rel],
                                 int(block["frame"]), offset, length)
        except zs.CompressionError as exc:
            raise self._fail(exc, snapshot_id) from None

    # -- delegation ------------------------------------------------------------------------------------
    @property
    def snapshots(self) -> str:
        return self.inner.snapshots

    @property
    def reads_in_place(self) -> bool:
        """The inner store's: ``fetch_file`` hands out its files as they are for what is not compressed (a
        compressed file, and ``local_dir`` of a compressed snapshot, are this node's plaintext copy instead)."""
        return self.inner.reads_in_place

    def describe(self) -> Dict[str, Any]:
        return self.inner.describe()

    def cache_root(self) -> Optional[str]:
        return self.plain_root if self.compress else self.inner.cache_root()

    def snapshot_dir(self, snapshot_id: str) -> str:
        return self.inner.snapshot_dir(snapshot_id)

    def check_usable(self) -> None:
        self.inner.check_usable()
        if self.compress:
            self._require(None)

    def ensure(self) -> None:
        self.inner.ensure()

    def exists(self, snapshot_id: str) -> bool:
        return self.inner.exists(snapshot_id)

    def staging_entries(self) -> List[Dict[str, Any]]:
        entries = self.inner.staging_entries()
        if not self.compress:  # this store stages nothing of its own
            return entries
        seen = {e["path"] for e in entries}
        return entries + [e for e in local_staging(self.tmp) if e["path"] not in seen]

    def delete(self, snapshot_id: str) -> int:
        size = self.inner.delete(snapshot_id)
        shutil.rmtree(self.plain_dir(snapshot_id), ignore_errors=True)
        self.ready.discard(snapshot_id)
        return size

    def delete_staging(self, path: str) -> int:
        if self.compress and os.path.dirname(path.rstrip("/")) == self.tmp:  # this node's staging (CRIU's plaintext)
            size = tree_size(path)
            shutil.rmtree(path, ignore_errors=True)
            return size
        return self.inner.delete_staging(path)


def _inflate(block: Dict[str, Any], meta: Dict[str, Any], stored: Any, out: Any, progress: zs.Progress = None) -> None:
    """The compressed file open as ``stored`` decompressed into ``out``, checked against its block entry ``meta``."""
    size = os.fstat(stored.fileno()).st_size
    if size != sum(meta["frames"]):
        raise StoreError(f"{size} stored bytes, the compression block says {sum(meta['frames'])} (truncated or "
                         "replaced)")
    zs.decompress_stream(zs.stored_frames(lambda off, n: os.pread(stored.fileno(), n, off), list(meta["frames"])),
                         meta, int(block["frame"]), out.write, progress)


def _created(path: str) -> int:
    """``path`` created afresh (0600, ``O_EXCL``, no symlink followed) for writing; its fd."""
    safefs.remove(path)
    return safefs.create_file(path)
