# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The placeholder containers a container snapshot is restored into, and the container map.

A placeholder is a container of the same image whose PID 1 is an inert command
such as ``sleep infinity``; it keeps the namespaces, cgroup and mounts its
runtime gave it (see _restoreinto). Before anything is touched each
destination is checked (``check_destination``, reads only): running, inert (nothing
of it runs besides its own process), the PIDs the workload needs free in it, the
same image, a mount for each of the snapshot's external mounts (``Destination.ext_mnt``), room
in each volume whose contents the snapshot took along (``volume_problems``), and, for a GPU snapshot, GPUs that take the snapshot's (``GpuCheck``).

``parse_container_map`` reads the ``into`` option: which source container goes
into which placeholder.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _container as ctr
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _gpuplace as gpl
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _containermap as cmap
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _namespaces as nsu
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._gpunode import GpuNode
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._containerinfo import ContainerInfo
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._runtime import Runtime, running


def parse_container_map(spec: Any, sources: List[str]) -> List[Tuple[str, str]]:
    """The ``into`` option (``_containermap``'s syntax; a bare ``dst`` means the snapshot's only container)."""
    pairs, problems = cmap.read(spec, sources)
    if problems:
        raise snap.SnapshotError("into: " + "; ".join(problems), problems)
    if not pairs:
        raise snap.SnapshotError("into: no destination container given")
    return pairs


@dataclass
class Destination:
    source: Dict[str, Any]
    name: str
    info: Optional[ContainerInfo] = None
    ext_mnt: Optional[Dict[str, str]] = None
    control_host: Optional[str] = None
    notes: List[str] = field(default_factory=list)
    gpu_pairs: Optional[List[Tuple[str, str]]] = None   # the snapshot's GPUs -> the placeholder's (GPU snapshots)


def check_destination(runtime: Runtime, target: Dict[str, Any], dest: str, skip_image_check: bool) -> Tuple[Destination, List[str]]:
    """Every reason ``dest`` cannot take ``target`` now; reads only."""
    d = Destination(source=target, name=dest)
    try:
        d.info = info = running(runtime, dest)
    except proc.TargetError as exc:
        return d, [str(exc)]
    problems = [] if skip_image_check else _image_problems(info, target)
    try:
        members = nsu.pid_ns_members(nsu.ns_inode(info.pid, "pid"))
    except OSError as exc:
        return d, problems + [f"placeholder {info.name}: cannot read its PID namespace ({exc})"]
    problems += _pid_problems(info, target, members)
    if not info.rootfs or not os.path.isdir(info.rootfs):
        problems.append(f"placeholder {info.name}: its root file system {info.rootfs or '?'} is not mounted on this host")
    try:
        mounts = nsu.mountinfo(info.pid)
    except OSError as exc:
        return d, problems + [f"placeholder {info.name}: cannot read its mounts ({exc.strerror or exc})"]
    problems += _map_mounts(d, info, mounts)
    problems += volume_problems(d, info)
    if target.get("control_dir"):
        d.control_host = _confined_host_path(info, target["control_dir"])
    return d, problems


def _image_problems(info: ContainerInfo, target: Dict[str, Any]) -> List[str]:
    src = target.get("container") or {}
    if not src.get("image_id") or info.image_id == src["image_id"]:
        return []
    return [f"image: placeholder {info.name} runs {info.image or '?'} ({info.image_id[:12]}), the snapshot "
            f"was taken from {src.get('image') or '?'} ({src['image_id'][:12]}); use the same image "
            "(or skip_image_check)"]


def _pid_problems(info: ContainerInfo, target: Dict[str, Any], members: Dict[int, Tuple[int, str]]) -> List[str]:
    """The placeholder is inert and the PIDs the workload needs are free in it.

    Inert: nothing of the placeholder runs besides its own process - in its own PID namespace only its PID 1; in a
    shared one (a pod with ``shareProcessNamespace``) nothing else in its cgroup - and no PID namespace of an earlier
    restore is nested in it. A workload that was PID 1 of its own PID namespace needs no PID of the placeholder's.
    """
    problems: List[str] = []
    own = members.get(1, (0, ""))[0] == info.pid
    others = {p: v for p, v in members.items() if p != 1 and (own or _same_cgroup(v[0], info.pid))}
    others = {p: v for p, v in others.items() if v[0] != info.pid}
    nested = nsu.nested_inits(nsu.ns_inode(info.pid, "pid"))
    if others or nested:
        listed = [f"{p} ({name})" for p, (_host, name) in sorted(others.items())]
        listed += [f"host pid {h} (PID 1 of a nested PID namespace: {' '.join(proc.cmdline(h))[:40]})" for h in nested]
        problems.append(f"placeholder {info.name} is not inert: besides its own process it runs {', '.join(listed)}")
    if target.get("pid_namespace"):
        return problems
    hint = "" if own else (" (its pod shares one PID namespace: run the source without shareProcessNamespace, or give "
                           "the restore pod an init container that runs a few processes first, so that its placeholder "
                           "starts at a higher PID)")
    for p in [p for p in target.get("ns_pids") or [] if p in members]:
        problems.append(f"placeholder {info.name}: PID {p}, which the snapshot's workload needs, is taken by "
                        f"{members[p][1]}{hint}")
    return problems


def _same_cgroup(pid: int, other: int) -> bool:
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as one, open(f"/proc/{other}/cgroup", "rb") as two:
            return one.read() == two.read()
    except OSError:
        return False


def _map_mounts(d: Destination, info: ContainerInfo, mounts: List[nsu.Mount]) -> List[str]:
    """``d.ext_mnt``: each external mount of the snapshot -> the host path the placeholder has there (or this
    node's container init, noted); a problem for each it lacks."""
    host = nsu.mountinfo()
    by_mp = {m.mountpoint: m for m in mounts}
    problems: List[str] = []
    d.ext_mnt = {}
    for m in d.source.get("external_mounts") or []:
        if m.get("masked") is True:  # a file the runtime masked (an imported archive's): the node's /dev/null
            d.ext_mnt[m["mountpoint"]] = MASKED
            continue
        mine = by_mp.get(m["mountpoint"])
        path = nsu.host_path(mine.dev, mine.root, host) if mine else None
        if path is None and _is_runtime_init(m.get("source")):
            path = os.path.realpath(m["source"])
            d.notes.append(f"{m['mountpoint']}: not mounted in {info.name}; bound from this node's {path} (the "
                           "container runtime's init, as in the source)")
        if path is None:
            problems.append(f"placeholder {info.name} has no mount at {m['mountpoint']} (the snapshot's container had "
                            f"{m.get('source') or m.get('fstype')} there): start it with the same mounts")
            continue
        d.ext_mnt[m["mountpoint"]] = path
    return problems


def volume_problems(d: Destination, info: ContainerInfo) -> List[str]:
    """Each volume the snapshot took along (``_volumes``) needs the placeholder's mount there (``d.ext_mnt``) with
    room for its files: their bytes plus a block for each entry."""
    problems = []
    for v in d.source.get("volumes") or []:
        path = (d.ext_mnt or {}).get(v["mountpoint"])
        if path is None:
            if not any(m["mountpoint"] == v["mountpoint"] for m in d.source.get("external_mounts") or []):
                problems.append(f"placeholder {info.name}: the snapshot's volume {v['mountpoint']} is none of its "
                                "container's mounts")
            continue  # else _map_mounts said the placeholder lacks it
        try:
            fs = os.statvfs(path)
        except OSError as exc:
            problems.append(f"placeholder {info.name}: volume {v['mountpoint']} ({path}): cannot tell its free "
                            f"space ({exc.strerror})")
            continue
        free, need = fs.f_bavail * fs.f_frsize, int(v["bytes"]) + int(v["entries"]) * fs.f_frsize
        if free < need:
            problems.append(f"placeholder {info.name}: volume {v['mountpoint']} has {_mib(free)} MiB free, the "
                            f"snapshot's {v['entries']} files there need {_mib(need)} MiB: give the pod's volume "
                            "more room (emptyDir.sizeLimit, or the node's disk)")
    return problems


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f}"


MASKED = "/dev/null"  # what a masked mount binds over the file (runc's masked paths)
RUNTIME_INITS = ("/usr/bin/catatonit", "/usr/libexec/podman/catatonit", "/usr/libexec/catatonit/catatonit",
                 "/usr/bin/tini", "/usr/bin/docker-init")


def _is_runtime_init(source: Any) -> bool:
    """A manifest's mount source is bound into a placeholder only when it is this node's container init binary
    (podman --init mounts it at /run/podman-init); any other host path named by a manifest never is."""
    if not isinstance(source, str) or not source.startswith("/"):
        return False
    real = os.path.realpath(source)
    return os.path.isfile(real) and real in {os.path.realpath(p) for p in RUNTIME_INITS if os.path.exists(p)}


def _confined_host_path(info: ContainerInfo, path: str) -> Optional[str]:
    """``container_host_path``, kept only if it resolves inside the container's root or the mount it is on: the
    manifest names the path, and no symlink on the host side may lead it elsewhere."""
    host = ctr.container_host_path(info.pid, path, info.rootfs)
    if host is None:
        return None
    m = nsu.mount_for(nsu.mountinfo(info.pid), path)
    base = info.rootfs if m is None or m.mountpoint == "/" else nsu.host_path(m.dev, m.root)
    return host if base and safefs.inside(host, [base]) else None


def control_host_path(info: ContainerInfo, path: str) -> Optional[str]:
    """Where container ``info``'s path ``path`` (its snapshot-control dir) is on this host, confined as
    ``_confined_host_path``; None when it is not mounted or leads outside."""
    return _confined_host_path(info, path)


@dataclass
class GpuCheck:
    """A GPU snapshot's check of each placeholder: the GPUs it was given must take the snapshot's."""

    gpu: Optional[Dict[str, Any]]
    node: GpuNode
    skip_compat: bool

    def check(self, d: Destination, problems: List[str]) -> Tuple[Destination, List[str]]:
        if not self.gpu or d.info is None:
            return d, problems
        gpus, why = self.node.gpus()
        if not gpus and self.gpu.get("gpus") and not self.skip_compat:
            used = ", ".join(str(g.get("uuid")) for g in self.gpu["gpus"])
            return d, problems + [f"gpu: the snapshot used GPU(s) {used}, this node has none that warmstart can see "
                                  f"({why}), placeholder {d.info.name} none either"]
        d.gpu_pairs, more = gpl.placeholder_pairs(d.info.pid, d.info.name, self.gpu, gpus)
        return d, problems + ([] if self.skip_compat else more)
