# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Container snapshots: the checkpoint target of a running container's workload.

Checkpoint: the container's workload (the tree under its PID 1, an init such
as ``podman run --init`` gives) is dumped with the container's network and PID
namespaces declared external, its bind and cgroup mounts external, its root
file system as CRIU's root; the overlay upper dir goes along as a rootfs diff, and the contents of the volumes asked
for (a pod's ``emptyDir`` volumes) as archives (``_volumes``).
``resolve`` finds the workload tree (``_workload``) and returns the target, whose
``ContainerCapture`` adds all that to the checkpoint (``_snapshot.Capture``).

Such a snapshot is restored into an inert placeholder container: _placeholder
checks each placeholder, _restoreinto restores into it.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _control as ctl
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _namespaces as nsu
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _progress as prog
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _pstree as pstree
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime import _rootfs as rootfs
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime import _volumes as vol
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._containerinfo import ContainerInfo
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import CriuOptions, ExtMount
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._runtime import get_runtime, running


EXT_NET = "warmstart-net"
EXT_PID = "warmstart-pid"


def _restored_roots(pid1: int) -> List[int]:
    """Workload trees beside PID 1 of its PID namespace: what a restore into a placeholder leaves (CRIU restores
    the workload as a sibling of the placeholder's inert PID 1), so that a restored container can be snapshotted
    again. Their parent is outside the namespace."""
    members = {host for host, _name in nsu.pid_ns_members(nsu.ns_inode(pid1, "pid")).values()}
    return sorted(h for h in members if h != pid1 and proc.parent(h) not in members)


def _session_outside(pid: int) -> bool:
    """True when the session leader of ``pid`` is outside its PID namespace (NSsid 0 there)."""
    try:
        return proc.status(pid).get("NSsid", "").split()[-1:] == ["0"]
    except OSError:
        return False


def _stdio(pid: int) -> List[str]:
    out = []
    for fd in (0, 1, 2):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            out.append("")
    return out


def container_host_path(pid: int, path: str, rootfs_dir: str) -> Optional[str]:
    """The host path of ``path`` as the container of ``pid`` sees it (bind source, or under its rootfs)."""
    mounts = nsu.mountinfo(pid)
    m = nsu.mount_for(mounts, path)
    if m is None:
        return None
    rest = path[len(m.mountpoint.rstrip("/")):] if m.mountpoint != "/" else path
    if m.mountpoint == "/":
        return os.path.join(rootfs_dir, path.lstrip("/"))
    base = nsu.host_path(m.dev, m.root)
    if base is None:
        return None
    return base.rstrip("/") + rest if rest else base


@dataclass
class ContainerCapture:
    """The checkpoint side: what CRIU needs for a container's workload, and what the manifest keeps."""

    info: ContainerInfo
    root_pid: int
    ns_pids: List[int]
    external: List[Dict[str, str]]
    stdio: List[str]
    net_ns: int
    pid_ns: int
    control_path: Optional[str]
    lock_tables: Optional[List[str]] = None
    control_host: Optional[str] = None
    own_pid_ns: bool = False    # the workload is PID 1 of its own PID namespace (dumped with it, not beside it)
    volumes: List[Dict[str, str]] = dataclasses.field(default_factory=list)  # external mounts whose contents go along

    def criu_options(self, base: CriuOptions) -> CriuOptions:
        """``base`` with what dumping a container's workload adds: its rootfs as root, its session's job, its
        cgroups (soft), its network and PID namespaces and its bind mounts external.

        Reads the network namespace's nftables first (see ``before_resume``): SnapshotError when it cannot,
        before CRIU touches anything.
        """
        self._remember_lock_tables()
        return dataclasses.replace(
            base, root=self.info.rootfs, shell_job=True,  # the session belongs to the container's init
            manage_cgroups=True, manage_cgroups_mode="soft",
            external=[f"net[{self.net_ns}]:{EXT_NET}"] + ([] if self.own_pid_ns else [f"pid[{self.pid_ns}]:{EXT_PID}"]),
            ext_mnt=[ExtMount(m["mountpoint"], m["mountpoint"]) for m in self.external])

    def _remember_lock_tables(self) -> None:
        # CRIU locks the whole network namespace while it dumps and, for a tree it leaves stopped, keeps it
        # locked; remember what was there so before_resume removes only CRIU's new tables.
        try:
            self.lock_tables = nsu.criu_lock_tables(self.root_pid)
        except OSError as exc:
            # Without reading the tables now we could not remove CRIU's lock before the source resumes: it would
            # run on, unreachable over the network. Refuse before CRIU touches anything.
            raise snap.SnapshotError(
                f"container {self.info.name}: cannot read the nftables of its network namespace ({exc}); CRIU locks "
                "that network during the dump and the lock could not be lifted afterwards - prepare the node with "
                "warmstart.snapshot.node_prep (its CRIU bundle carries libnftables)") from None

    def before_resume(self) -> None:
        if self.lock_tables is None:
            return
        for table in nsu.criu_lock_tables(self.root_pid):
            if table not in self.lock_tables:
                nsu.nft(self.root_pid, f"delete table inet {table}")

    def while_stopped(self, target_dir: str) -> Dict[str, Any]:
        try:  # the tree leads its own session: restorable beside any placeholder's PID 1 (see _pstree)
            moved = pstree.rewrite_file(os.path.join(target_dir, "criu", "pstree.img"))
        except pstree.PstreeError as exc:
            raise snap.SnapshotError(f"container {self.info.name}: {exc}") from None
        prog.phase("rootfs diff")
        try:
            stats = rootfs.capture(self.info.upper_dir or "", target_dir)
        except (OSError, rootfs.RootfsError) as exc:
            raise snap.SnapshotError(f"container {self.info.name}: rootfs changes cannot be captured: {exc}") from None
        session = {"own_session": True, "moved_from": {k: sorted(v) for k, v in moved.items()}}
        extra: Dict[str, Any] = {"rootfs_diff": dict(stats, tar=rootfs.DIFF_TAR, deleted_files=rootfs.DELETED),
                                 "session": session}
        if self.volumes:
            prog.phase("volumes")
            try:
                extra["volumes"] = [vol.capture(m["source"], m["mountpoint"], m["fstype"], target_dir, n)
                                    for n, m in enumerate(self.volumes)]
            except vol.VolumeError as exc:
                raise snap.SnapshotError(f"container {self.info.name}: {exc}") from None
        return extra

    def entry(self) -> Dict[str, Any]:
        i = self.info
        return {
            "kind": "container",
            "ns_pid": self.ns_pids[0],
            "ns_pids": self.ns_pids,
            "pid_namespace": self.own_pid_ns,  # restored as PID 1 of a new PID namespace in the placeholder's
            "container": {"runtime": i.runtime, "id": i.id, "name": i.name, "image": i.image,
                          "image_id": i.image_id, "hostname": i.hostname, "cgroup_path": i.cgroup_path},
            "external_mounts": self.external,
            "stdio": self.stdio,
            "control_dir": self.control_path,
            # a workload that said it was warm is as warm in every copy: its restores say so again
            "ready_for_snapshot": bool(self.control_host and os.path.exists(os.path.join(self.control_host, ctl.READY))),
        }


CONTAINER_INITS = ("catatonit", "tini", "tini-static", "docker-init", "dumb-init", "podman-init")


def _workload(info: ContainerInfo) -> Tuple[int, bool]:
    """(root PID, whether it is PID 1 of its own PID namespace) of the container's workload.

    - The container's process is not PID 1 of its PID namespace (a pod with ``shareProcessNamespace``, whose
      PID 1 is the pause process): it is the workload, restored beside the placeholder's process.
    - Its PID 1 is a container init (``podman run --init``, tini) or a placeholder with a restored copy beside
      it: that one tree, restored beside the placeholder's PID 1.
    - A placeholder holding a copy restored as PID 1 of a nested PID namespace: that copy, the same way again.
    - Otherwise the app is PID 1 (an ordinary Kubernetes pod): the whole tree, with its PID namespace; it is
      restored as PID 1 of a new PID namespace nested in the placeholder's, so no PID of it can collide.
    """
    if proc.ns_pids(info.pid)[-1] != 1:
        return info.pid, False
    kids = sorted(set(proc.children(info.pid)))
    beside = kids if kids and _is_container_init(info.pid) else _restored_roots(info.pid)
    if len(beside) > 1:
        names = ", ".join(f"{k} ({' '.join(proc.cmdline(k))[:60]})" for k in beside)
        raise proc.TargetError(f"container {info.name}: its PID 1 has {len(beside)} workload trees ({names}); "
                               "warmstart snapshots one workload tree per container")
    if beside:
        return beside[0], False
    nested = nsu.nested_inits(nsu.ns_inode(info.pid, "pid"))
    if len(nested) > 1:
        raise proc.TargetError(f"container {info.name}: {len(nested)} PID namespaces nested in its own have a "
                               f"process ({', '.join(map(str, nested))}); expected at most one restored copy")
    return (nested[0] if nested else info.pid), True


def _is_container_init(pid: int) -> bool:
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return False
    return exe in CONTAINER_INITS


def resolve(runtime_name: str, container: str, name: Optional[str] = None, volumes: Sequence[str] = ()) -> snap.Target:
    """A running container -> the checkpoint target: its workload tree (``_workload``).

    ``name`` names the container in the snapshot (default: the runtime's name for it; a pod's container
    name for pod targets, so that container maps speak Kubernetes names). ``volumes``: mountpoints in the
    container whose contents the snapshot takes along (each one of its bind mounts; ``_volumes``).
    """
    runtime = get_runtime(runtime_name)
    info = running(runtime, container)
    root, own_pid_ns = _workload(info)
    proc.check_target(root)
    if _session_outside(root):
        raise proc.TargetError(
            f"container {info.name}: its workload (pid {root}, {' '.join(proc.cmdline(root))[:60]!r}) belongs to a "
            "session whose leader is outside the container's PID namespace - a workload restored into a placeholder "
            "keeps the session of the restore - and CRIU cannot dump a process whose session leader is outside its "
            "PID namespace: snapshot the original container (or pod) instead")
    tree = proc.descendants(root)
    ns_pids = [proc.ns_pids(p)[-1] for p in tree]
    mounts = nsu.mountinfo(root)
    host = nsu.mountinfo()
    external = []
    for m in nsu.external_mounts(mounts):
        external.append({"mountpoint": m.mountpoint, "fstype": m.fstype,
                         "source": nsu.host_path(m.dev, m.root, host) or ""})
    control = ctl.process_control_dir(root)
    control_host = container_host_path(root, control, info.rootfs) if control else None
    kept = _volumes(info.name, external, volumes, control)
    target = snap.Target(pid=root, name=name or info.name, control_dir=control_host)
    target.capture = ContainerCapture(info=info, root_pid=root, ns_pids=ns_pids, external=external,
                                      stdio=_stdio(root), net_ns=nsu.ns_inode(root, "net"),
                                      pid_ns=nsu.ns_inode(root, "pid"), control_path=control,
                                      control_host=control_host, own_pid_ns=own_pid_ns, volumes=kept)
    return target


def _volumes(container: str, external: List[Dict[str, str]], asked: Sequence[str],
             control: Optional[str]) -> List[Dict[str, str]]:
    """The external mounts at the ``asked`` mountpoints; TargetError listing every one that is none (or the
    snapshot-control dir, or not a directory on this host)."""
    by_mp = {m["mountpoint"]: m for m in external}
    kept, problems = [], []
    for path in dict.fromkeys(asked):
        m = by_mp.get(path)
        if m is None:
            problems.append(f"{path} is not one of its volumes (its bind mounts: {', '.join(sorted(by_mp)) or 'none'})")
        elif control and path.rstrip("/") == control.rstrip("/"):
            problems.append(f"{path} is its snapshot-control dir, which a snapshot never takes along")
        elif not m["source"] or not os.path.isdir(m["source"]):
            problems.append(f"{path} is no directory on this host ({m['source'] or 'its source is not visible'})")
        else:
            kept.append(m)
    if problems:
        raise proc.TargetError(f"container {container}: cannot take its volumes along: " + "; ".join(problems))
    return kept
