# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Writing under a directory without ever following a symlink out of it.

Every file the engine creates, replaces, chmods or chowns goes through here (test_code_shape holds it: no
``os.chmod``/``os.chown`` by path, no ``open()`` for writing, every ``os.open`` that writes has ``O_NOFOLLOW``
and creates only with ``O_EXCL`` or relative to a directory descriptor). Control dirs, metrics and progress
dirs, /tmp and the store are written by others too - a user, a container, a store writer - who may race
symlinks and hard links into them. Invariants:

- every component below ``base`` is opened with ``O_NOFOLLOW`` relative to its parent's descriptor
  (``dir_fd``): a symlink anywhere on the way, planted before or during the restore, makes the write
  fail with the path named instead of landing elsewhere;
- files are created ``O_EXCL`` under a temporary name, given their mode with ``fchmod`` (permission
  bits only: setuid, setgid and sticky are dropped) and renamed into place within the same directory;
- ``write_file`` / ``open_file`` / ``remove`` act on a name relative to a directory descriptor; an existing file
  opened for writing must be a regular file with one link (a hard link planted to a file elsewhere is
  refused); modes and owners are set with ``fchmod``/``fchown`` on the open file, never by path;
- ``inside`` decides with resolved paths whether a node path lies under one of the node's own roots.

Pure stdlib.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
from typing import Callable, Iterable, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(OSError, WarmstartError):
    """A path that would be reached through a symlink or a non-directory (``UnsafePath(errno, text)``)."""

    def __init__(self, errno: Optional[int], text: str) -> None:
        OSError.__init__(self, errno, text)
        self.message, self.reasons, self.log_tail, self.details = text, [], None, {}

    def __str__(self) -> str:
        return self.message


def open_dir(base: str, rel: str = "", create: bool = True, mode: int = 0o700) -> int:
    """A descriptor of ``base/rel``, each component below ``base`` opened without following symlinks."""
    try:
        fd = os.open(base, NOFOLLOW_DIR)
    except OSError as exc:
        raise UnsafePath(exc.errno, f"{base}: {exc.strerror} (must be a real directory)") from None
    for part in [p for p in rel.split("/") if p]:
        if part in (".", ".."):
            os.close(fd)
            raise UnsafePath(22, f"{os.path.join(base, rel)}: '.' or '..' component")
        try:
            if create:
                try:
                    os.mkdir(part, mode, dir_fd=fd)
                except FileExistsError:
                    pass
            nxt = os.open(part, NOFOLLOW_DIR, dir_fd=fd)
        except OSError as exc:
            os.close(fd)
            raise UnsafePath(exc.errno, f"{os.path.join(base, rel)}: component {part!r}: {exc.strerror} "
                                        "(a symlink or not a directory?)") from None
        os.close(fd)
        fd = nxt
    return fd


def open_source(src: str, within: Iterable[str] = ()) -> int:
    """``src`` opened for reading: not followed if a symlink, unless it resolves inside one of ``within``."""
    roots = list(within)
    if roots and os.path.islink(src):
        if not inside(src, roots):
            raise UnsafePath(40, f"{src}: a symlink leading outside {', '.join(roots)}")
        return os.open(os.path.realpath(src), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    return os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)


PLACE_TRIES = 5  # a temporary file someone removed or replaced before it was renamed into place: tried again
TEMP_RE = re.compile(r"\..+\.ws-[0-9a-f]{16}")


def is_temp(name: str) -> bool:
    """Whether ``name`` (a file name) is one of ``_place``'s temporary files: never a file of its own."""
    return TEMP_RE.fullmatch(os.path.basename(name)) is not None


def _place(dfd: int, name: str, where: str, fill: Callable[[int], None],
           before_rename: Optional[Callable[[], None]] = None) -> None:
    """Write a file into the directory ``dfd`` as ``name``, atomically: a temporary file of a random name created
    ``O_EXCL|O_NOFOLLOW`` (mode 0600), ``fill``-ed through its descriptor, renamed over ``name`` (a symlink there is
    replaced itself, never followed). In a directory others can write, the temporary file may be removed or
    replaced before the rename, and ``name`` replaced right after it: each is noticed (the rename fails, or the
    inode at ``name`` is not the one written) and the whole write is tried again, ``PLACE_TRIES`` times, before
    ``UnsafePath`` says so. ``before_rename`` runs once, before the first rename."""
    for _try in range(PLACE_TRIES):
        tmp = f".{name}.ws-{secrets.token_hex(8)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        except FileExistsError:
            continue
        try:  # the file stays open until it was seen in place: its inode number cannot be another file's meanwhile
            try:
                fill(fd)
                mine = os.fstat(fd)
                if before_rename is not None:
                    before_rename()
                    before_rename = None
                os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except FileNotFoundError:
                continue  # the temporary file was removed before the rename
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except OSError:
                    pass
                raise
            try:
                there = os.lstat(name, dir_fd=dfd)
            except FileNotFoundError:
                continue
            if (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino):
                return
        finally:
            os.close(fd)
    raise UnsafePath(16, f"{where}: the file written there was removed or replaced before it was in place, "
                         f"{PLACE_TRIES} times (someone else writes that directory); gave up")


def copy_into(base: str, rel: str, src: str, mode: int, keep_old_suffix: Optional[str] = None,
              src_within: Iterable[str] = ()) -> str:
    """Copy ``src`` (a regular file; a symlink only when it resolves inside ``src_within``) to ``base/rel``,
    mode ``mode & 0o777`` (``_place``: atomic, tried again when someone removes or replaces it meanwhile).

    With ``keep_old_suffix``, an existing ``rel`` is first renamed to ``rel + keep_old_suffix``.
    Returns the destination path.
    """
    parent, name = os.path.split(rel)
    dfd = open_dir(base, parent)
    try:
        sfd = open_source(src, src_within)
        with os.fdopen(sfd, "rb") as source:
            if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
                raise UnsafePath(22, f"{src}: not a regular file")

            def fill(out: int) -> None:
                source.seek(0)
                with os.fdopen(os.dup(out), "wb") as dest:
                    shutil.copyfileobj(source, dest, 4 << 20)
                    os.fchmod(dest.fileno(), mode & 0o777)

            def keep_old() -> None:
                try:
                    info = os.lstat(name, dir_fd=dfd)
                    if stat.S_ISREG(info.st_mode):
                        os.rename(name, name + str(keep_old_suffix), src_dir_fd=dfd, dst_dir_fd=dfd)
                except FileNotFoundError:
                    pass

            _place(dfd, name, os.path.join(base, rel), fill, keep_old if keep_old_suffix else None)
    finally:
        os.close(dfd)
    return os.path.join(base, rel)


def inside(path: str, roots: Iterable[str]) -> bool:
    """``path`` (resolved) is one of ``roots`` (resolved) or below one."""
    real = os.path.realpath(path)
    for root in roots:
        top = os.path.realpath(root)
        if real == top or real.startswith(top.rstrip("/") + "/"):
            return True
    return False


def _checked(fd: int, where: str) -> int:
    """``fd`` when it is a regular file with one link (else closed, UnsafePath): no device, FIFO or hard link to
    another file reached through a name someone else could plant."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        why = "not a regular file" if not stat.S_ISREG(info.st_mode) else f"{info.st_nlink} hard links"
        raise UnsafePath(22, f"{where}: {why}; refusing to write it")
    return fd


def write_file(path: str, data: bytes, mode: int = 0o600, owner: Optional[Tuple[int, int]] = None,
               sync: bool = False, create_dirs: bool = False) -> str:
    """Replace ``path`` atomically (``_place``): a temporary file created ``O_EXCL|O_NOFOLLOW`` in its directory
    (opened without following a symlink), written, ``fchmod`` (and ``fchown`` to ``owner``), renamed over the name.
    A symlink there is replaced itself, never followed. Returns ``path``."""
    base, name = os.path.split(path)
    dfd = open_dir(base, create=False) if not create_dirs else open_dir("/", base.lstrip("/"), create=True)

    def fill(fd: int) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode & 0o777)
        if owner is not None:
            os.fchown(fd, owner[0], owner[1])
        if sync:
            os.fsync(fd)

    try:
        _place(dfd, name, path, fill)
    finally:
        os.close(dfd)
    return path


def open_file(path: str, flags: int, mode: int = 0o600) -> int:
    """``path`` opened with ``flags`` (O_WRONLY/O_RDWR, O_APPEND, O_CREAT...) relative to its directory, never
    through a symlink; an existing file must be a regular file with one link. A new file gets ``mode``."""
    base, name = os.path.split(path)
    dfd = open_dir(base, create=False)
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode, dir_fd=dfd)
    except OSError as exc:
        raise UnsafePath(exc.errno, f"{path}: {exc.strerror} (a symlink?)") from None
    finally:
        os.close(dfd)
    os.set_blocking(fd, True)
    return _checked(fd, path)


def create_file(path: str, mode: int = 0o600) -> int:
    """A new file at ``path`` for writing (``O_EXCL``: nothing there before, not even a symlink)."""
    return open_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)


def remove(path: str) -> bool:
    """Unlink ``path`` (the name itself, relative to its directory); False when it was not there."""
    base, name = os.path.split(path)
    dfd = open_dir(base, create=False)
    try:
        os.unlink(name, dir_fd=dfd)
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(dfd)


def set_mode(path: str, mode: int, owner: Optional[Tuple[int, int]] = None) -> None:
    """``fchmod`` (and ``fchown``) of ``path`` itself, opened without following a symlink: a symlink or a special
    file put there is refused, never the file it leads to changed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise UnsafePath(exc.errno, f"{path}: {exc.strerror} (a symlink?)") from None
    try:
        info = os.fstat(fd)
        if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
            raise UnsafePath(22, f"{path}: not a regular file or directory; refusing to change its mode")
        os.fchmod(fd, mode & 0o7777)
        if owner is not None:
            os.fchown(fd, owner[0], owner[1])
    finally:
        os.close(fd)


def lock_down_tree(top: str, dir_mode: int = 0o700, file_mode: int = 0o600) -> None:
    """Every directory under ``top`` (and ``top``) ``dir_mode``, every regular file ``file_mode``: walked with
    directory descriptors, nothing followed (symlinks are left as they are)."""
    set_mode(top, dir_mode)
    for _dirpath, dirnames, filenames, dfd in os.fwalk(top, follow_symlinks=False):
        for name in dirnames + filenames:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
            except OSError:
                continue  # a symlink (ELOOP) or gone
            try:
                info = os.fstat(fd)
                if stat.S_ISDIR(info.st_mode):
                    os.fchmod(fd, dir_mode)
                elif stat.S_ISREG(info.st_mode):
                    os.fchmod(fd, file_mode)
            finally:
                os.close(fd)
