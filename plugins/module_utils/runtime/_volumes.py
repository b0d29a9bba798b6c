# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A container's volumes (a pod's ``emptyDir`` volumes): their contents captured with a snapshot, put back into a
placeholder's volume at the same mountpoint.

A volume is a mount of the container's, a bind of a host directory (the kubelet makes one per ``emptyDir``; a
``medium: Memory`` one is a tmpfs), named by its mountpoint in the container. ``capture`` archives what it holds
into ``volumes/<n>.tar`` beside the CRIU images while the workload is stopped; ``apply`` extracts that archive
into the placeholder's volume before CRIU restores, so the files the workload holds open there exist again and
what it wrote at start-up (a compile cache, a downloaded tokenizer) is there.

Both run in a forked child chrooted into the volume's host directory: the pod's other containers may write that
directory at the same time, and no symlink they plant leads either side out of it (an absolute one resolves in
the volume; ``..`` stops at its top). Sockets (their listener makes them again) and device nodes are left out.
"""
from __future__ import annotations

import os
import stat
import tarfile
from typing import Any, Dict

from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._namespaces import fork_call
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime import _rootfs as rootfs

VOLUMES_DIR = "volumes"


class VolumeError(WarmstartError):
    """A volume that cannot be captured or put back; the message names it and the cause."""


def archive_name(n: int) -> str:
    """The archive of the snapshot's ``n``-th volume, relative to the target's directory."""
    return f"{VOLUMES_DIR}/{n}.tar"


def _open_dir(host_dir: str, mountpoint: str) -> int:
    try:
        return os.open(host_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise VolumeError(f"volume {mountpoint}: its host directory {host_dir} cannot be opened "
                          f"({exc.strerror or exc})") from None


def _enter(dir_fd: int) -> None:
    os.fchdir(dir_fd)
    os.chroot(".")
    os.chdir("/")


def _archive_here(out_fd: int) -> str:
    """Runs chrooted in the volume: every entry under / (sockets left out) into the archive on ``out_fd``;
    ``"<entries> <bytes>"``."""
    count = size = 0
    with os.fdopen(out_fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk("/"):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                full = os.path.join(dirpath, name)
                try:
                    st = os.lstat(full)
                except FileNotFoundError:
                    continue  # another container of the pod removed it meanwhile
                if stat.S_ISSOCK(st.st_mode) or stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                    continue  # a socket's listener makes it again; a device node is nothing a volume should carry
                try:
                    tar.add(full, arcname=full.lstrip("/"), recursive=False)  # opened before its header is written
                except FileNotFoundError:
                    continue  # removed between the two looks: nothing of it is in the archive
                count += 1
                if stat.S_ISREG(st.st_mode):
                    size += st.st_size
    return f"{count} {size}"


def capture(host_dir: str, mountpoint: str, fstype: str, target_dir: str, n: int) -> Dict[str, Any]:
    """Archive the volume at host path ``host_dir`` (the container's ``mountpoint``, a ``fstype`` mount) into the
    target's directory as ``archive_name(n)`` (0600, in a 0700 ``volumes`` dir); its manifest record."""
    dir_fd = _open_dir(host_dir, mountpoint)
    try:
        out_dir = os.path.join(target_dir, VOLUMES_DIR)
        os.makedirs(out_dir, mode=0o700, exist_ok=True)
        rel = archive_name(n)
        out_fd = os.open(os.path.join(target_dir, rel), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            done = fork_call(lambda: _archive_here(out_fd), lambda: _enter(dir_fd), what=f"archiving volume {mountpoint}")
        finally:
            os.close(out_fd)
    except OSError as exc:
        raise VolumeError(f"volume {mountpoint}: its contents cannot be captured ({exc})") from None
    finally:
        os.close(dir_fd)
    entries, size = (int(x) for x in done.split())
    return {"mountpoint": mountpoint, "archive": rel, "entries": entries, "bytes": size, "fstype": fstype}


def apply(host_dir: str, mountpoint: str, archive: str) -> Dict[str, Any]:
    """Extract ``archive`` (a verified copy) into the placeholder's volume at host path ``host_dir``; what an
    entry of the archive replaces there is replaced. ``{mountpoint, entries}``."""
    dir_fd = _open_dir(host_dir, mountpoint)
    try:
        tar_fd = os.open(archive, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            count = fork_call(lambda: rootfs.apply_here(tar_fd, {}, frozenset(), what=archive),
                              lambda: _enter(dir_fd), what=f"putting back volume {mountpoint}")
        finally:
            try:
                os.close(tar_fd)
            except OSError:
                pass
    except OSError as exc:
        raise VolumeError(f"volume {mountpoint}: the snapshot's contents cannot be put back ({exc})") from None
    finally:
        os.close(dir_fd)
    return {"mountpoint": mountpoint, "entries": int(count)}
