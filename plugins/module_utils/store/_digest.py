# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""File digests: whole-file SHA256, and per-chunk SHA256 of large files hashed on every core.

A manifest entry is ``{path, size, sha256}``; a file larger than ``CHUNK_SIZE`` also carries
``chunks: {size, sha256: [one digest per chunk]}``. Checking such a file hashes its chunks in
parallel (``hashlib`` drops the GIL while it hashes), so a verify runs at the speed of all cores
instead of one. Old manifests (no ``chunks``) are checked with the whole-file digest, as before.

Invariants:

- an entry with ``chunks`` is intact only when every chunk digest matches and the file has exactly
  ``size`` bytes; the chunk list covers the file (``_schema`` checks the count against the size);
- both digests of an entry are computed from the same bytes, in one read (``ChunkedHasher``), so a
  manifest never pairs a whole-file digest with chunk digests of other bytes;
- nothing here follows a symlink (``O_NOFOLLOW``) or writes anything.

Stdlib only.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import os
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

CHUNK_SIZE = 64 << 20           # bytes per chunk digest
READ = 4 << 20                  # bytes per read
Progress = Callable[[int], None]


def workers() -> int:
    """Threads for hashing: one per core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


class ChunkedHasher:
    """The whole-file SHA256 and, past ``chunk_size`` bytes, one SHA256 per chunk, from one stream of bytes."""

    def __init__(self, chunk_size: int = CHUNK_SIZE) -> None:
        self.chunk_size = chunk_size
        self.whole = hashlib.sha256()
        self.size = 0
        self._chunk = hashlib.sha256()
        self._digests: List[str] = []

    def update(self, data: "bytes | memoryview") -> None:
        view = memoryview(data)
        self.whole.update(view)
        while len(view):
            room = self.chunk_size - (self.size % self.chunk_size)
            part, view = view[:room], view[room:]
            self._chunk.update(part)
            self.size += len(part)
            if self.size % self.chunk_size == 0:
                self._digests.append(self._chunk.hexdigest())
                self._chunk = hashlib.sha256()

    def entry(self, rel: str) -> Dict[str, Any]:
        """The manifest entry of the bytes seen: ``chunks`` only for a file larger than one chunk."""
        out: Dict[str, Any] = {"path": rel, "size": self.size, "sha256": self.whole.hexdigest()}
        if self.size > self.chunk_size:
            tail = [self._chunk.hexdigest()] if self.size % self.chunk_size else []
            out["chunks"] = {"size": self.chunk_size, "sha256": self._digests + tail}
        return out


def _open(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)


def reads(fd: int, offset: int, length: int) -> Iterator[bytes]:
    """``length`` bytes of ``fd`` from ``offset`` in reads of ``READ``; stops early at end of file."""
    end = offset + length
    while offset < end:
        data = os.pread(fd, min(READ, end - offset), offset)
        if not data:
            return
        offset += len(data)
        yield data


def hash_file(path: str, rel: str, progress: Optional[Progress] = None,
              chunk_size: int = CHUNK_SIZE) -> Dict[str, Any]:
    """The manifest entry of ``path`` (named ``rel``): size, SHA256 and, when large, chunk digests."""
    hasher = ChunkedHasher(chunk_size)
    fd = _open(path)
    try:
        for data in reads(fd, 0, os.fstat(fd).st_size):
            hasher.update(data)
            if progress:
                progress(len(data))
    finally:
        os.close(fd)
    return hasher.entry(rel)


def _chunk_ok(fd: int, offset: int, length: int, want: str, progress: Optional[Progress],
              cancel: Optional[threading.Event] = None) -> bool:
    digest = hashlib.sha256()
    got = 0
    for data in reads(fd, offset, length):
        if cancel is not None and cancel.is_set():
            return False
        digest.update(data)
        got += len(data)
        if progress:
            progress(len(data))
    return got == length and digest.hexdigest() == want


def pieces(entry: Dict[str, Any]) -> List[Tuple[int, int, str]]:
    """(offset, length, sha256) of what to hash for ``entry``: its chunks, or the whole file."""
    size = int(entry["size"])
    chunks = entry.get("chunks")
    if not chunks:
        return [(0, size, str(entry["sha256"]))]
    step = int(chunks["size"])
    return [(n * step, min(step, size - n * step), str(d)) for n, d in enumerate(chunks["sha256"])]


def file_matches(path: str, entry: Dict[str, Any]) -> bool:
    """Whether ``path`` holds the bytes of manifest ``entry``, hashed on this thread alone (no pool, no progress:
    safe in a forked child whose parent had threads)."""
    try:
        fd = _open(path)
    except OSError:
        return False
    try:
        return os.fstat(fd).st_size == int(entry["size"]) and \
            all(_chunk_ok(fd, offset, length, want, None) for offset, length, want in pieces(entry))
    finally:
        os.close(fd)


def check_files(items: List[Tuple[str, Dict[str, Any]]], progress: Optional[Progress] = None,
                threads: Optional[int] = None, cancel: Optional[threading.Event] = None) -> Dict[str, bool]:
    """{path: intact} for each (path, manifest entry), every chunk of every file hashed on ``threads`` cores.

    The caller has checked each path is a regular file of the entry's size; a file that cannot be opened
    counts as not intact, and so does every file once ``cancel`` is set.
    """
    fds: Dict[str, int] = {}
    jobs: List[Tuple[str, int, int, str]] = []
    result: Dict[str, bool] = {}
    try:
        for path, entry in items:
            try:
                fds[path] = _open(path)
            except OSError:
                result[path] = False
                continue
            result[path] = True
            jobs += [(path, off, length, want) for off, length, want in pieces(entry)]
        # the largest pieces first, so that no core is left with one big file at the end
        jobs.sort(key=lambda job: -job[2])
        with concurrent.futures.ThreadPoolExecutor(max_workers=threads or workers()) as pool:
            futures = {pool.submit(_chunk_ok, fds[p], off, n, want, progress, cancel): p for p, off, n, want in jobs}
            for future in concurrent.futures.as_completed(futures):
                if not future.result():
                    result[futures[future]] = False
    finally:
        for fd in fds.values():
            os.close(fd)
    return result
