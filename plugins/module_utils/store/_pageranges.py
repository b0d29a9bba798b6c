# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Ranges of a snapshot's page images read from its store, checked, for a restore whose pages come from a page server.

Such a restore fetches of each pages image only the ranges CRIU restores itself (``_lazyimages.sparse_pages``);
the page server sends the rest. The store is input, so those ranges are handed out only from checked bytes.

Invariants:

- with ``verify`` on, ``read`` returns bytes only from a piece of the file (one of its manifest chunks, or
  the whole file when it has none, ``_digest.pieces``) that was read whole and matched its SHA256 in the
  manifest the restore checked; a piece that does not match, or comes back short, raises ``StoreError``
  naming the file, the piece and its bytes, before anything of it is written;
- a compressed file is fetched whole through the store (decompressed, its plaintext SHA256 checked, as any
  fetch) into ``scratch`` (0700/0600) and read from that copy; ``close`` removes ``scratch``;
- an encrypted snapshot's ranges are authenticated as they are decrypted (AES-GCM per stored chunk, a key
  per snapshot and file): what the store returns for them is already checked;
- at most ``keep`` checked pieces are held (the least recently used goes first): memory is bounded by
  ``keep`` chunks; a piece read again after it went is checked again - unless ``keep_checked``: then each
  checked piece is also written into a private copy (``scratch``, 0700/0600, removed by ``close``) and read
  from there when asked again, so no piece is read or hashed twice (disk: what was asked for, at most the
  image).
"""
from __future__ import annotations

import collections
import hashlib
import os
import shutil
from typing import Any, Dict, List, Set, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _digest as dg
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._store import StoreError
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._storeapi import Store


class PageRanges:
    """``read(name, offset, length)``: bytes of the pages image ``name`` (under ``prefix``), checked."""

    def __init__(self, store: Store, doc: Dict[str, Any], prefix: str, scratch: str, verify: bool = True,
                 keep: int = 1, keep_checked: bool = False) -> None:
        self.store = store
        self.doc = doc
        self.prefix = prefix
        self.scratch = scratch
        self.verify = verify
        self.entries = {e["path"]: e for e in doc.get("files", [])}
        self.read_bytes = 0          # bytes asked of the store (whole pieces, or whole compressed files)
        self.keep = max(1, keep)
        self._pieces: "collections.OrderedDict[Tuple[str, int], bytes]" = collections.OrderedDict()  # checked
        self._copies: Dict[str, str] = {}
        # keep_checked: every checked piece is also written into a private copy of its image under ``scratch``
        # (sparse, 0600) and read from there when asked again: each piece is read and hashed once
        self.keep_checked = keep_checked
        self._checked_in: Dict[str, int] = {}   # rel -> fd of its private copy
        self._done: Set[Tuple[str, int]] = set()  # (rel, piece offset) held in the private copy

    def read(self, name: str, offset: int, length: int) -> bytes:
        rel = self.prefix + name
        entry = self.entries.get(rel)
        if entry is None:
            raise StoreError(f"snapshot {self.doc['id']}: {rel} is not listed in its manifest")
        if not self.verify or self.doc.get("encryption"):
            self.read_bytes += length
            return self.store.read_range(self.doc["id"], rel, offset, length)
        if rel in ((self.doc.get("compression") or {}).get("files") or {}):
            return self._from_copy(rel, entry, offset, length)
        return self._from_pieces(rel, entry, offset, length)

    def _from_pieces(self, rel: str, entry: Dict[str, Any], offset: int, length: int) -> bytes:
        out: List[bytes] = []
        end = offset + length
        for index, (start, size, want) in enumerate(dg.pieces(entry)):
            if start + size <= offset or start >= end:
                continue
            data = self._checked(rel, index, (start, size, want))
            out.append(data[max(offset, start) - start:min(end, start + size) - start])
        return b"".join(out)

    def _checked(self, rel: str, index: int, piece: Tuple[int, int, str]) -> bytes:
        """Piece ``index`` (offset, size, SHA256) of ``rel``: read whole, its SHA256 compared with the manifest's."""
        start, size, want = piece
        if (rel, start) in self._done:
            return os.pread(self._checked_in[rel], size, start)
        held = self._pieces.get((rel, start))
        if held is not None:
            self._pieces.move_to_end((rel, start))
            return held
        while len(self._pieces) >= self.keep:
            self._pieces.popitem(last=False)
        data = self.store.read_range(self.doc["id"], rel, start, size)
        self.read_bytes += len(data)
        if len(data) != size:
            raise StoreError(f"{rel}: bytes {start}-{start + size - 1}: the store returned {len(data)} of "
                             f"{size} bytes (truncated or replaced)")
        if hashlib.sha256(data).hexdigest() != want:
            raise StoreError(f"{rel}: chunk {index} (bytes {start}-{start + size - 1}): SHA256 mismatch (corrupted)")
        self._pieces[(rel, start)] = data
        if self.keep_checked:
            self._keep(rel, start, data)
        return data

    def _keep(self, rel: str, start: int, data: bytes) -> None:
        fd = self._checked_in.get(rel)
        if fd is None:
            os.makedirs(self.scratch, mode=0o700, exist_ok=True)
            path = os.path.join(self.scratch, f"checked-{len(self._checked_in)}.img")
            fd = self._checked_in[rel] = safefs.open_file(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        if os.pwrite(fd, data, start) == len(data):
            self._done.add((rel, start))

    def _from_copy(self, rel: str, entry: Dict[str, Any], offset: int, length: int) -> bytes:
        path = self._copies.get(rel)
        if path is None:
            os.makedirs(self.scratch, mode=0o700, exist_ok=True)
            path = os.path.join(self.scratch, f"{len(self._copies)}.img")
            self.store.fetch_file(self.doc["id"], entry, path, True)
            self.read_bytes += int(entry["size"])
            self._copies[rel] = path
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            return os.pread(fd, length, offset)
        finally:
            os.close(fd)

    def close(self) -> None:
        self._pieces.clear()
        for fd in self._checked_in.values():
            os.close(fd)
        self._checked_in.clear()
        self._done.clear()
        shutil.rmtree(self.scratch, ignore_errors=True)
