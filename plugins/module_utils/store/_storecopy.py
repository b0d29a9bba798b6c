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
- ``space_problem`` refuses a copy that would not fit on the node before anything is written;
- ``pin`` spares the copy of a deferred file where the kernel can promise its bytes do not change: the store's
  own file, on a local file system (ext2/3/4, XFS, Btrfs, tmpfs: no FUSE daemon or NFS server answering
  reads) that the work dir shares, under a read lease (``F_SETLEASE``) taken while nobody had it open for
  writing, hard-linked into the work dir from the open file (no path). Any later open for writing or
  truncate breaks the lease, and ``Pins.broken`` names the file: the caller refuses the restore. Where any
  of this is refused, the file is copied as above.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import fcntl
import hashlib
import os
import stat
import struct
from typing import AbstractSet, Any, Dict, Iterable, List, Optional, Set, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _digest as dg
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _progress as prog
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs

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


# statfs f_type of the file systems whose page cache is the only source of a file's bytes
KERNEL_FS = {0xEF53: "ext2/3/4", 0x58465342: "xfs", 0x9123683E: "btrfs", 0x01021994: "tmpfs"}
AT_EMPTY_PATH = 0x1000
_LIBC: Any = None


def _libc() -> Any:
    global _LIBC  # pylint: disable=global-statement
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _fs_type(fd: int) -> int:
    """The statfs magic of the file system ``fd`` is on (0 when unknown)."""
    buf = ctypes.create_string_buffer(256)  # struct statfs, f_type first
    if _libc().fstatfs(fd, buf) != 0:
        return 0
    return int(struct.unpack_from("l", buf.raw)[0]) & 0xFFFFFFFF


def _link_open_file(fd: int, dest: str) -> None:
    """Hard-link the open file ``fd`` as ``dest`` (linkat AT_EMPTY_PATH: the inode we hold, whatever its path is
    now); OSError where the kernel refuses (another file system: EXDEV; no CAP_DAC_READ_SEARCH: ENOENT)."""
    parent = safefs.open_dir(os.path.dirname(dest))
    try:
        if _libc().linkat(fd, b"", parent, os.fsencode(os.path.basename(dest)), AT_EMPTY_PATH) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), dest)
    finally:
        os.close(parent)


class Pins:
    """Store files CRIU reads in place, each through a hard link in the work dir and under a read lease held by
    an open file of ours (forked children share it: the restorer child's verdict can still ask)."""

    def __init__(self) -> None:
        self.items: Items = []                    # (link in the work dir, manifest entry): hashed by _overlap
        self._held: List[Tuple[str, int]] = []    # (manifest path, leased fd)

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, rel: str, fd: int, dest: str, entry: Dict[str, Any]) -> None:
        self._held.append((rel, fd))
        self.items.append((dest, entry))

    def broken(self) -> List[str]:
        """A sentence per pinned file that someone opened for writing (or truncated) since it was pinned."""
        out = []
        for rel, fd in self._held:
            try:
                kind = fcntl.fcntl(fd, fcntl.F_GETLEASE)
            except OSError:
                kind = fcntl.F_UNLCK
            if kind != fcntl.F_RDLCK:
                out.append(f"{rel}: opened for writing in the store while the restore read it in place")
        return out

    def record(self, cache: Any, top: str) -> None:
        """Record the pinned files whose lease still holds as hashed (``_checksums.VerifiedFiles``, by their open
        file): the restore's hard links changed their ctime, which would otherwise make the next restore on this
        node hash them again. Call only once they matched, the links are gone, and before ``release``."""
        for (rel, fd), (_dest, entry) in zip(self._held, self.items):
            try:
                if fcntl.fcntl(fd, fcntl.F_GETLEASE) == fcntl.F_RDLCK:
                    cache.add_open(os.path.join(top, rel), fd, str(entry["sha256"]))
            except OSError:
                continue
        cache.save()

    def release(self) -> None:
        """Close the leased files (the lease goes with the last holder; a waiting writer goes on)."""
        held, self._held = self._held, []
        for _rel, fd in held:
            os.close(fd)


def _pin_one(pins: Pins, src_top: str, entry: Dict[str, Any], dest: str) -> bool:
    rel, size = str(entry["path"]), int(entry["size"])
    fd, _why = _open_source(os.path.join(src_top, rel), size)
    if fd is None:
        return False  # the copy names the problem
    try:
        if _fs_type(fd) not in KERNEL_FS:
            raise OSError("not a local file system")
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)  # EAGAIN: open for writing somewhere
        fcntl.fcntl(fd, fcntl.F_SETOWN, 0)  # a lease break sends no SIGIO (it would kill us): broken() tells
        if os.fstat(fd).st_size != size:
            raise OSError("changed size")
        os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
        _link_open_file(fd, dest)
    except OSError:
        os.close(fd)
        return False
    pins.hold(rel, fd, dest, entry)
    prog.add(size)
    return True


def pin(src_top: str, items: Iterable[Tuple[Dict[str, Any], str]],
        defer: AbstractSet[str]) -> Tuple[Pins, List[Tuple[Dict[str, Any], str]]]:
    """Pin each (manifest entry, destination) in ``defer`` that can be (module docstring); (the pins, the items
    left to ``copy_verified``)."""
    pins, rest = Pins(), []
    try:
        for entry, dest in items:
            if str(entry["path"]) not in defer or not _pin_one(pins, src_top, entry, dest):
                rest.append((entry, dest))
    except BaseException:
        pins.release()
        raise
    return pins, rest


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
