# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A container's root file system changes: captured from its overlay upper dir, applied to another container.

``rootfs-diff.tar`` holds every file the container added or changed (the
upper dir as it is); ``deleted-files.json`` lists what it deleted from the
image (overlay whiteouts) and the directories it replaced whole (opaque
directories). ``apply`` runs chrooted into the destination's root file
system, so absolute symlinks in the image resolve inside it, never on the host.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import tarfile
from typing import Any, Dict, FrozenSet, Iterable, List

from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._namespaces import fork_call

DIFF_TAR = "rootfs-diff.tar"
DELETED = "deleted-files.json"
OPAQUE_XATTRS = ("trusted.overlay.opaque", "user.overlay.opaque")


class RootfsError(WarmstartError):
    """A rootfs diff that cannot be made or applied; the message names the file and cause."""


def _opaque(path: str) -> bool:
    for name in OPAQUE_XATTRS:
        try:
            if os.getxattr(path, name, follow_symlinks=False) == b"y":
                return True
        except OSError:
            continue
    return False


def capture(upper_dir: str, out_dir: str) -> Dict[str, Any]:
    """Write rootfs-diff.tar and deleted-files.json for ``upper_dir`` into ``out_dir``."""
    if not upper_dir or not os.path.isdir(upper_dir):
        raise RootfsError(f"overlay upper dir {upper_dir!r} does not exist: the container's rootfs changes cannot be read")
    deleted: List[str] = []
    opaque: List[str] = []
    count = size = 0
    tar_path = os.path.join(out_dir, DIFF_TAR)
    fd = os.open(tar_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(upper_dir):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, upper_dir)
            for name in sorted(dirnames) + sorted(filenames):
                full = os.path.join(dirpath, name)
                rel = os.path.normpath(os.path.join(rel_dir, name))
                st = os.lstat(full)
                if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                    deleted.append("/" + rel)
                    continue
                if name.startswith(".wh."):
                    if name != ".wh..wh..opq":
                        deleted.append("/" + os.path.normpath(os.path.join(rel_dir, name[4:])))
                    else:
                        opaque.append("/" + os.path.normpath(rel_dir))
                    continue
                if stat.S_ISSOCK(st.st_mode):
                    continue  # a socket file cannot be archived; its listener re-creates it
                if stat.S_ISDIR(st.st_mode) and _opaque(full):
                    opaque.append("/" + rel)
                tar.add(full, arcname=rel, recursive=False)
                count += 1
                if stat.S_ISREG(st.st_mode):
                    size += st.st_size
    doc = {"deleted": deleted, "opaque": opaque}
    with os.fdopen(os.open(os.path.join(out_dir, DELETED), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600),
                   "w", encoding="utf-8") as handle:
        json.dump(doc, handle, indent=1, sort_keys=True)
    return {"entries": count, "bytes": size, "deleted": len(deleted), "opaque": len(opaque)}


def _safe(name: str) -> bool:
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and ".." not in parts


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _holds_mount(path: str, keep: FrozenSet[str]) -> bool:
    """Whether removing ``path`` would take a mount of the destination with it.

    Unlinking a file that is a mountpoint in another mount namespace detaches
    that mount there: the destination's /etc/hosts bind would silently vanish.
    """
    prefix = path.rstrip("/") + "/"
    return path in keep or any(k.startswith(prefix) for k in keep)


def apply_here(tar_path_fd: int, deleted: Dict[str, List[str]], keep: FrozenSet[str], what: str = DIFF_TAR) -> str:
    """Runs chrooted in the destination root: deletions, opaque dirs, then the archive ``what`` on ``tar_path_fd``
    (also a volume's, ``_volumes``); the number of entries extracted."""
    for path in deleted.get("deleted", []):
        if not path.startswith("/") or ".." in path.split("/"):
            raise RootfsError(f"{DELETED}: refusing path {path!r}")
        if not _holds_mount(path, keep):
            _remove(path)
    for path in deleted.get("opaque", []):
        if not path.startswith("/") or ".." in path.split("/"):
            raise RootfsError(f"{DELETED}: refusing path {path!r}")
        if os.path.isdir(path) and not os.path.islink(path):
            for entry in os.listdir(path):
                if not _holds_mount(os.path.join(path, entry), keep):
                    _remove(os.path.join(path, entry))
    count = 0
    with os.fdopen(tar_path_fd, "rb") as raw, tarfile.open(fileobj=raw, mode="r:") as tar:
        for member in tar:
            if not _safe(member.name) or (member.islnk() and not _safe(member.linkname)):
                raise RootfsError(f"{what}: refusing member {member.name!r} (absolute or '..' path)")
            target = "/" + member.name
            if target in keep:
                continue  # a mountpoint of the destination: it exists, and its mount stays
            if os.path.lexists(target) and not member.isdir():
                _remove(target)
            kwargs: Dict[str, Any] = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
            tar.extract(member, path="/", numeric_owner=True, **kwargs)
            count += 1
    return str(count)


def apply(rootfs: str, diff_dir: str, mountpoints: Iterable[str] = ()) -> Dict[str, Any]:
    """Apply the diff in ``diff_dir`` to the root file system at host path ``rootfs``.

    ``mountpoints`` are the destination container's mountpoints: they are
    neither replaced nor deleted (that would detach its mounts).
    """
    keep = frozenset(m for m in mountpoints if m != "/")
    tar_path = os.path.join(diff_dir, DIFF_TAR)
    try:
        with open(os.path.join(diff_dir, DELETED), "r", encoding="utf-8") as handle:
            deleted = json.load(handle)
        if not isinstance(deleted, dict):
            raise ValueError("not an object")
    except (OSError, ValueError, RecursionError) as exc:
        raise RootfsError(f"{os.path.join(diff_dir, DELETED)} cannot be read: {exc}") from None
    if not os.path.isdir(rootfs):
        raise RootfsError(f"destination root file system {rootfs} does not exist")
    fd = os.open(tar_path, os.O_RDONLY)  # opened before the chroot; the child reads it through the fd

    def enter() -> None:
        os.chroot(rootfs)
        os.chdir("/")

    try:
        count = fork_call(lambda: apply_here(fd, deleted, keep), enter, what=f"applying {tar_path} to {rootfs}")
    except OSError as exc:
        raise RootfsError(str(exc)) from None
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    return {"entries": int(count), "deleted": len(deleted.get("deleted", [])), "opaque": len(deleted.get("opaque", []))}
