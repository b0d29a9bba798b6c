# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The mount namespace of a process target: what CRIU dumps of it, and what a restore needs of this node.

A workload (``_workload``) runs in a mount namespace of its own, in which every mount is a slave of the
node's and /proc shows the workload's own PID namespace (CUDA, and anything else that reads /proc/self,
needs that). CRIU dumps such a namespace with the tree. ``plan`` decides what of it a snapshot keeps:

- the root, bound again at restore from this node's root (CRIU's ``root``);
- every mount that is a view of one of the node's mounts (CRIU's auto-detected external mounts): a restore
  binds it again from the same path of the restoring node - a slave of that node's mount where the
  source's copy was a slave, so the restored copy keeps receiving the node's mounts;
- the /proc of the tree's own PID namespace, mounted anew in the restored one;
- not: mounts that belong to other containers, pods, sessions or kernel facilities (``NODE_LOCAL_DIRS``,
  ``NODE_LOCAL_FS``, a container id in the path, a kernel file system away from its place: ``node_local``) and
  that no process of the tree holds anything on - they differ from node to node, come and go with what they
  belong to, and would have to exist wherever the snapshot is restored. The restored copy does not see them.

``restore_problems`` is the restore's preflight for it: every kept mount's path present on this node and,
where the source's copy was a slave, a shared mount here (CRIU makes the copy a slave of it).

A target whose mount namespace is the node's needs none of this (``plan`` returns None), nor does one whose
root is not the node's (a container's: its runtime's path handles it).
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _paths
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _namespaces as nsu
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import CriuOptions
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

# Mounts under these directories belong to container runtimes, the kubelet, login sessions and network
# namespaces: node-local, and coming and going with the things they belong to.
NODE_LOCAL_DIRS = (
    "/var/lib/containers", "/var/lib/docker", "/var/lib/containerd", "/var/lib/kubelet", "/var/lib/rancher",
    "/var/lib/lxc", "/var/lib/lxd", _paths.RESTORE_DIR, "/run/containers", "/run/containerd",
    "/run/docker", "/run/crio", "/run/k3s", "/run/netns", "/run/user", "/run/snapd", "/run/credentials",
    "/snap",
)
# File systems that are a kernel facility or another container's root, not a place a server keeps data.
NODE_LOCAL_FS = frozenset({
    "overlay", "nsfs", "autofs", "binfmt_misc", "debugfs", "tracefs", "securityfs", "configfs", "bpf", "pstore",
    "efivarfs", "fusectl", "rpc_pipefs", "nfsd", "fuse.lxcfs", "fuse.gvfsd-fuse", "fuse.portal",
})


# Kernel file systems at their own place; mounted anywhere else they are another root's (a container's, a
# chroot's, a build's): /data/containers/.../rootfs/proc is not this tree's /proc.
KERNEL_FS_HOMES = {
    "proc": ("/proc",), "sysfs": ("/sys",), "devpts": ("/dev/pts",), "mqueue": ("/dev/mqueue",),
    "cgroup": ("/sys/fs/cgroup",), "cgroup2": ("/sys/fs/cgroup",), "hugetlbfs": ("/dev/hugepages",),
    "devtmpfs": ("/dev",),
}
# A path component that is a container's id (podman, Docker, containerd, CRI-O: 64 hex digits), wherever the
# runtime keeps its state (custom graph roots included): .../overlay-containers/<id>/userdata/shm.
CONTAINER_ID = re.compile(r"(^|/)[0-9a-f]{64}(/|$)")


class MountNsError(WarmstartError):
    """The target's mount namespace cannot be read."""


def node_local(m: nsu.Mount) -> bool:
    """Whether a mount is one a snapshot leaves out when nothing of the tree is on it: a kernel facility, another
    container's, pod's or session's (by directory, by a container id in its path), or a kernel file system
    mounted away from its own place (another root's)."""
    if m.fstype in NODE_LOCAL_FS or CONTAINER_ID.search(m.mountpoint):
        return True
    homes = KERNEL_FS_HOMES.get(m.fstype)
    if homes and not any(m.mountpoint == h or m.mountpoint.startswith(h + "/") for h in homes):
        return True
    return any(m.mountpoint == d or m.mountpoint.startswith(d + "/") for d in NODE_LOCAL_DIRS)


def _fdinfo_mnt_id(path: str) -> Optional[int]:
    try:
        with open(path, "r", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("mnt_id:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _mnt_id_of(path: str) -> Optional[int]:
    """The mount ``path`` (a /proc magic link: cwd, root, exe, map_files/...) is on."""
    try:
        fd = os.open(path, os.O_PATH)
    except OSError:
        return None
    try:
        return _fdinfo_mnt_id(f"/proc/self/fdinfo/{fd}")
    finally:
        os.close(fd)


def used_mounts(tree: Sequence[int]) -> Set[int]:
    """Mount ids that processes of ``tree`` hold something on: open files, mapped files, cwd, root, executable."""
    used: Set[int] = set()
    for pid in tree:
        base = f"/proc/{pid}"
        found = [_mnt_id_of(f"{base}/{link}") for link in ("cwd", "root", "exe")]
        found += [_fdinfo_mnt_id(f"{base}/fdinfo/{fd}") for fd in _entries(f"{base}/fdinfo")]
        found += [_mnt_id_of(f"{base}/map_files/{name}") for name in _entries(f"{base}/map_files")]
        used.update(mnt for mnt in found if mnt is not None)
    return used


def _entries(path: str) -> List[str]:
    """The names in a /proc directory, none when it is gone or not ours to read."""
    try:
        return os.listdir(path)
    except OSError:
        return []


@dataclass
class MountPlan:
    """What of a tree's mount namespace a checkpoint dumps (``criu_options``) and records (``record``)."""

    kept: List[nsu.Mount] = field(default_factory=list)
    skipped: List[str] = field(default_factory=list)   # mountpoints CRIU leaves out
    own_proc: bool = False                             # /proc shows the tree's own PID namespace

    def criu_options(self, base: CriuOptions) -> CriuOptions:
        return dataclasses.replace(base, skip_mnt=list(self.skipped), auto_ext_mnt=True, ext_masters=True)

    def record(self) -> Dict[str, Any]:
        """The manifest's ``mount_namespace`` of the target."""
        return {
            "own_proc": self.own_proc,
            "mounts": [{"path": m.mountpoint, "fstype": m.fstype, "slave": m.slave} for m in self.kept],
            "skipped": list(self.skipped),
        }


def _same_root(pid: int) -> bool:
    try:
        theirs, ours = os.stat(f"/proc/{pid}/root"), os.stat("/")
    except OSError:
        return False
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)


def own_mount_ns(pid: int) -> bool:
    """Whether ``pid`` runs in another mount namespace than ours, with our root (a workload's)."""
    try:
        if nsu.ns_inode(pid, "mnt") == os.stat("/proc/self/ns/mnt").st_ino:
            return False
    except OSError as exc:
        raise MountNsError(f"pid {pid}: cannot read its mount namespace: {exc}") from None
    return _same_root(pid)


def plan(pid: int, tree: Sequence[int]) -> Optional[MountPlan]:
    """The plan for the tree of ``pid`` (its processes: ``tree``); None when its mount namespace is ours or its
    root is not ours."""
    if not own_mount_ns(pid):
        return None
    try:
        mounts = nsu.mountinfo(pid)
    except OSError as exc:
        raise MountNsError(f"pid {pid}: cannot read its mounts: {exc}") from None
    kept, skipped = choose(mounts, used_mounts(tree))
    proc_mounts = [m for m in kept if m.mountpoint == "/proc"]
    own_proc = bool(proc_mounts) and proc_mounts[-1].fstype == "proc" and _proc_shows(pid)
    return MountPlan(kept, skipped, own_proc)


def choose(mounts: List[nsu.Mount], used: Set[int]) -> Tuple[List[nsu.Mount], List[str]]:
    """(mounts kept, mountpoints skipped): the root, what the tree uses and what is not node-local are kept, with
    every mount above a kept one; a mountpoint is skipped only when no kept mount sits there."""
    by_id = {m.mount_id: m for m in mounts}
    keep = {m.mount_id for m in mounts if m.mountpoint == "/" or m.mount_id in used or not node_local(m)}
    for mount_id in list(keep):  # a kept mount needs every mount above it
        parent = by_id[mount_id].parent_id
        while parent in by_id and parent not in keep:
            keep.add(parent)
            parent = by_id[parent].parent_id
    kept_points = {m.mountpoint for m in mounts if m.mount_id in keep}
    skipped = sorted({m.mountpoint for m in mounts if m.mount_id not in keep} - kept_points)
    return [m for m in mounts if m.mount_id in keep], skipped


def _proc_shows(pid: int) -> bool:
    """Whether the /proc that ``pid`` sees is the one of its own PID namespace (not the node's)."""
    try:
        with open(f"/proc/{pid}/status", "r", encoding="ascii", errors="replace") as handle:
            nspid = next((line.split()[1:] for line in handle if line.startswith("NSpid:")), [])
        if len(nspid) < 2:
            return False
        return os.stat(f"/proc/{pid}/root/proc/{nspid[-1]}/ns/pid").st_ino == nsu.ns_inode(pid, "pid")
    except OSError:
        return False


def restore_options(record: Optional[Dict[str, Any]], base: CriuOptions) -> CriuOptions:
    """``base`` with what restoring a tree with this mount namespace record needs (none without one)."""
    if not record:
        return base
    return dataclasses.replace(base, root="/", auto_ext_mnt=True, ext_masters=True)


def restore_problems(record: Any, mounts: Optional[List[nsu.Mount]] = None) -> List[str]:
    """Every reason this node cannot give a restored copy the mounts its snapshot kept (none without a record)."""
    if not record:
        return []
    if not isinstance(record, dict) or not isinstance(record.get("mounts"), list):
        return ["mount namespace: the snapshot's record of it is malformed"]
    here = mounts if mounts is not None else nsu.mountinfo()
    top: Dict[str, nsu.Mount] = {}
    for m in here:  # mountinfo lists mounts in mount order: the last one at a path is the one on top
        top[m.mountpoint] = m
    problems = []
    for entry in record["mounts"]:
        path = entry.get("path") if isinstance(entry, dict) else None
        if not isinstance(path, str) or not path.startswith("/"):
            problems.append(f"mount namespace: a kept mount's path is malformed ({entry!r})")
            continue
        if entry.get("fstype") == "proc" and not entry.get("slave"):
            continue  # a /proc of the tree's own: mounted anew in the restored PID namespace
        if not os.path.lexists(path):
            problems.append(f"mount {path}: the workload had it ({entry.get('fstype')}), this node has no {path}")
            continue
        if entry.get("slave") and not (path in top and top[path].shared):
            what = "not a mount point" if path not in top else f"a {top[path].fstype} mount that is not shared"
            problems.append(f"mount {path}: the workload's copy of it was a slave of the node's (it received the "
                            f"node's mounts); here {path} is {what}, so it cannot be its master (make it shared: "
                            f"mount --make-shared {path}, as systemd does for every mount)")
    return problems
