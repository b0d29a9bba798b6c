# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A snapshot's files copied out of a store read in place, verified as they pass: CRIU reads only our copy.

A store is written by others (other nodes over NFS, a user with write access, a container with the store
mounted). Hashing a store file and then letting CRIU open it by path leaves a window in which a writer can
rename, rewrite in place or truncate it, and CRIU runs their bytes as root. So a restore copies every file it
will read into its own work dir (0700, files created ``O_EXCL``) and hashes the bytes while it writes them:
what matched the manifest is what sits in the copy, and nobody but root can change the copy.

Invariants:

- a source is opened ``O_NOFOLLOW|O_NONBLOCK`` and must be a regular file of the manifest's size; whatever a
  writer does to it during the copy (rewrite, truncate, swap a directory for a symlink) can only make the
  digest of what was read differ, and the restore is refused;
- chunks of large files are copied and hashed on every core (``_digest.pieces``: a file's chunk digests, or
  the whole file's); a file with a mismatch is named, and its copy removed by the caller with the work dir;
- entries in ``defer`` are copied without hashing and handed back: the caller hashes our copy while CRIU
  restores the tree stopped (``_overlap``) - still the bytes CRIU reads;
- ``space_problem`` refuses a copy that would not fit on the node before anything is written.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import os
import stat
from typing import AbstractSet, Any, Dict, Iterable, List, Optional, Set, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils import _digest as dg
from ansible_collections.warmstart.snapshot.plugins.module_utils import _progress as prog
from ansible_collections.warmstart.snapshot.plugins.module_utils import _safefs as safefs

Items = List[Tuple[str, Dict[str, Any]]]
MARGIN = 64 << 20   # bytes a copy leaves free on the node, beyond its own size


def space_problem(where: str, need: int, what: str = "the verified copy of the snapshot's files",
                  remedy: str = "restore with another restore_root") -> Optional[str]:
    """Why ``need`` bytes (``what``) cannot be written under ``where`` (None when they fit, with ``MARGIN`` to
    spare); the sentence ends with ``remedy``."""
    probe = where
    while not os.path.isdir(probe) and probe not in ("", "/"):
        probe = os.path.dirname(probe)
    try:
        info = os.statvfs(probe or "/")
    except OSError as exc:
        return f"{where}: cannot tell its free space ({exc.strerror})"
    free = info.f_bavail * info.f_frsize
    if free < need + MARGIN:
        return (f"{where}: {free >> 20} MiB free, {what} needs {need >> 20} MiB "
                f"(+{MARGIN >> 20} MiB to spare): free space there, or {remedy}")
    return None


def _open_source(path: str, size: int) -> Tuple[Optional[int], Optional[str]]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return None, "missing" if exc.errno == 2 else f"cannot be opened ({exc.strerror}; a symlink?)"
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size != size:
        os.close(fd)
        return None, ("not a regular file" if not stat.S_ISREG(info.st_mode)
                      else f"size {info.st_size} bytes, manifest says {size} (truncated or replaced)")
    return fd, None


def _in_kernel(src: int, dst: int, offset: int, length: int) -> int:
    """Bytes copied at ``offset`` by ``copy_file_range`` (no pass through user space; a reflink where the file
    system shares extents, which a later write to the store's file does not change: it gets blocks of its own).
    Stops early (short count) where the kernel cannot, for the caller to finish by reading."""
    done = 0
    while done < length:
        try:
            n = os.copy_file_range(src, dst, length - done, offset + done, offset + done)
        except OSError:
            break  # EXDEV, EINVAL, ENOSYS, EOPNOTSUPP...: read and write instead
        if n <= 0:
            break
        done += n
        prog.add(n)
    return done


def _piece(src: int, dst: int, offset: int, length: int, want: Optional[str]) -> bool:
    """Copy ``length`` bytes at ``offset``; with ``want``, True only when they hash to it (without, the bytes are
    hashed later, on our copy: they go through the kernel alone where it can)."""
    if want is None:
        kernel = _in_kernel(src, dst, offset, length)
        offset, length = offset + kernel, length - kernel
    digest = hashlib.sha256() if want else None
    done = 0
    for data in dg.reads(src, offset, length) if length else ():
        if digest is not None:
            digest.update(data)
        view = memoryview(data)
        at = offset + done
        while view:
            wrote = os.pwrite(dst, view, at)
            view, at = view[wrote:], at + wrote
        done += len(data)
        prog.add(len(data))
    return done == length and (digest is None or digest.hexdigest() == want)


def copy_verified(src_top: str, items: Iterable[Tuple[Dict[str, Any], str]], defer: AbstractSet[str] = frozenset(),
                  threads: Optional[int] = None) -> Tuple[List[str], Items]:
    """Copy each (manifest entry, destination path) from ``src_top`` into a new file of ours, hashing on the way.

    Returns (problems, deferred): a sentence per file that is missing, of another size or kind, or whose bytes
    did not match; and (destination, entry) of the entries in ``defer`` (copied, not hashed).
    """
    problems: List[str] = []
    deferred: Items = []
    fds: List[int] = []
    jobs: List[Tuple[str, int, int, int, int, Optional[str]]] = []
    try:
        for entry, dest in items:
            rel, size = str(entry["path"]), int(entry["size"])
            src, why = _open_source(os.path.join(src_top, rel), size)
            if src is None:
                problems.append(f"{rel}: {why}")
                continue
            fds.append(src)
            os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
            dst = safefs.create_file(dest, 0o600)
            fds.append(dst)
            os.ftruncate(dst, size)
            hashed = rel not in defer
            if not hashed:
                deferred.append((dest, entry))
            for offset, length, want in dg.pieces(entry):
                jobs.append((rel, src, dst, offset, length, want if hashed else None))
        jobs.sort(key=lambda job: -job[4])  # the largest pieces first: no core left with one big file at the end
        bad: Set[str] = set()
        with concurrent.futures.ThreadPoolExecutor(max_workers=threads or dg.workers()) as pool:
            futures = {pool.submit(_piece, src, dst, off, n, want): rel for rel, src, dst, off, n, want in jobs}
            for future in concurrent.futures.as_completed(futures):
                if not future.result():
                    bad.add(futures[future])
        problems += [f"{rel}: SHA256 mismatch (corrupted)" for rel in sorted(bad)]
    finally:
        for fd in fds:
            os.close(fd)
    return problems, deferred
