# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Writing under a directory without ever following a symlink out of it.

What a restore writes on a node from a snapshot's content (the workload's own files, control files) goes
through here. Invariants:

- every component below ``base`` is opened with ``O_NOFOLLOW`` relative to its parent's descriptor
  (``dir_fd``): a symlink anywhere on the way, planted before or during the restore, makes the write
  fail with the path named instead of landing elsewhere;
- files are created ``O_EXCL`` under a temporary name, given their mode with ``fchmod`` (permission
  bits only: setuid, setgid and sticky are dropped) and renamed into place within the same directory;
- ``inside`` decides with resolved paths whether a node path lies under one of the node's own roots.

Pure stdlib.
"""
from __future__ import annotations

import os
import shutil
import stat
from typing import Iterable, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils._errors import WarmstartError

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


def copy_into(base: str, rel: str, src: str, mode: int, keep_old_suffix: Optional[str] = None,
              src_within: Iterable[str] = ()) -> str:
    """Copy ``src`` (a regular file; a symlink only when it resolves inside ``src_within``) to ``base/rel``,
    mode ``mode & 0o777``.

    With ``keep_old_suffix``, an existing ``rel`` is first renamed to ``rel + keep_old_suffix``.
    Returns the destination path.
    """
    parent, name = os.path.split(rel)
    dfd = open_dir(base, parent)
    tmp = f".{name}.restore-tmp-{os.getpid()}"
    try:
        sfd = open_source(src, src_within)
        with os.fdopen(sfd, "rb") as source:
            if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
                raise UnsafePath(22, f"{src}: not a regular file")
            try:
                os.unlink(tmp, dir_fd=dfd)
            except FileNotFoundError:
                pass
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
            with os.fdopen(out, "wb") as dest:
                shutil.copyfileobj(source, dest, 4 << 20)
                os.fchmod(dest.fileno(), mode & 0o777)
        if keep_old_suffix:
            try:
                info = os.lstat(name, dir_fd=dfd)
                if stat.S_ISREG(info.st_mode):
                    os.rename(name, name + keep_old_suffix, src_dir_fd=dfd, dst_dir_fd=dfd)
            except FileNotFoundError:
                pass
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)  # replaces a symlink named ``name`` itself, never its target
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        raise
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
