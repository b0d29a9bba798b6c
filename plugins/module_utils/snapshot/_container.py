# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Container snapshots, and restore into an inert placeholder container.

Checkpoint: the container's workload (the tree under its PID 1, an init such
as ``podman run --init`` gives) is dumped with the container's network and PID
namespaces declared external, its bind and cgroup mounts external, its root
file system as CRIU's root; the overlay upper dir goes along as a rootfs diff.

Restore: the placeholder (a container of the same image whose PID 1 is an
inert command such as ``sleep infinity``) keeps the namespaces, cgroup and
mounts its runtime gave it. CRIU runs on the host and puts the workload into
them: the placeholder's network and PID namespaces (pinned by open fds and
handed to CRIU as the external namespaces), its UTS and IPC namespaces
(joined), its cgroup (cgroup root remapped), a mount tree rebuilt on the
placeholder's root file system with the placeholder's own bind sources. The
workload comes back as a sibling of the placeholder's PID 1 with its original
PIDs. Nothing is mounted into the placeholder, so nothing is left behind.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _control as ctl
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cuda as cu
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _gpuplace as gpl
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _namespaces as nsu
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _progress as prog
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _pstree as pstree
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _restorer as rst
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime import _rootfs as rootfs
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _storecopy as sc
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _tcp as tcpm
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._gpunode import GpuNode
from ansible_collections.warmstart.snapshot.plugins.module_utils.node._compat import (
    describe_node, gpu_incompatibilities, incompatibilities)
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._containerinfo import ContainerInfo
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu import CriuError, find_criu
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import (
    CriuOptions, ExtMount, InheritFd, JoinNs, read_stats)
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import restore as criu_restore
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._runtime import Runtime, get_runtime, running
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._storeapi import Store

EXT_NET = "warmstart-net"
EXT_PID = "warmstart-pid"
PINNED = ("mnt", "net", "pid", "uts", "ipc")  # the placeholder's namespaces a restore holds open
ENV_FILE = "env.json"  # the placeholder's environment, offered to the restored workload


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
        return {"rootfs_diff": dict(stats, tar=rootfs.DIFF_TAR, deleted_files=rootfs.DELETED), "session": session}

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


def resolve(runtime_name: str, container: str, name: Optional[str] = None) -> snap.Target:
    """A running container -> the checkpoint target: its workload tree (``_workload``).

    ``name`` names the container in the snapshot (default: the runtime's name for it; a pod's container
    name for pod targets, so that container maps speak Kubernetes names).
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
    target = snap.Target(pid=root, name=name or info.name, control_dir=control_host)
    target.capture = ContainerCapture(info=info, root_pid=root, ns_pids=ns_pids, external=external,
                                      stdio=_stdio(root), net_ns=nsu.ns_inode(root, "net"),
                                      pid_ns=nsu.ns_inode(root, "pid"), control_path=control,
                                      control_host=control_host, own_pid_ns=own_pid_ns)
    return target


# --- restore into placeholders -------------------------------------------------

def parse_container_map(spec: Any, sources: List[str]) -> List[Tuple[str, str]]:
    """``src=dst,...`` (or a list of ``src=dst``; a bare ``dst`` means the snapshot's only container)."""
    items: List[str] = []
    if isinstance(spec, str):
        items = [p.strip() for p in spec.split(",") if p.strip()]
    elif isinstance(spec, (list, tuple)):
        items = [str(p).strip() for p in spec if str(p).strip()]
    elif isinstance(spec, dict):
        for src, dsts in spec.items():
            for dst in (dsts if isinstance(dsts, list) else [dsts]):
                items.append(f"{src}={dst}")
    if not items:
        raise snap.SnapshotError("into: no destination container given")
    out: List[Tuple[str, str]] = []
    seen = set()
    for item in items:
        src, sep, dst = item.partition("=")
        if not sep:
            if len(sources) != 1:
                raise snap.SnapshotError(f"into: {item!r} names no source container, and the snapshot holds "
                                         f"{len(sources)} ({', '.join(sources)}): write src=dst")
            src, dst = sources[0], item
        src, dst = src.strip(), dst.strip()
        if not src or not dst:
            raise snap.SnapshotError(f"into: {item!r} is not src=dst")
        if src not in sources:
            raise snap.SnapshotError(f"into: the snapshot holds no container {src!r} (it holds {', '.join(sources)})")
        if dst in seen:
            raise snap.SnapshotError(f"into: destination {dst!r} appears twice")
        seen.add(dst)
        out.append((src, dst))
    return out


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
    host = container_host_path(info.pid, path, info.rootfs)
    if host is None:
        return None
    m = nsu.mount_for(nsu.mountinfo(info.pid), path)
    base = info.rootfs if m is None or m.mountpoint == "/" else nsu.host_path(m.dev, m.root)
    return host if base and safefs.inside(host, [base]) else None


def control_host_path(info: ContainerInfo, path: str) -> Optional[str]:
    """Where container ``info``'s path ``path`` (its snapshot-control dir) is on this host, confined as
    ``_confined_host_path``; None when it is not mounted or leads outside."""
    return _confined_host_path(info, path)


def _offer_env(control: str, placeholder_pid: int, restored_pid: int) -> None:
    """Write the placeholder's environment as env.json (0600, owned by the workload) for the workload to re-read."""
    env = proc.environ(placeholder_pid)
    status = proc.status(restored_pid)
    uid, gid = int(status["Uid"].split()[0]), int(status["Gid"].split()[0])
    safefs.write_file(os.path.join(control, ENV_FILE), json.dumps(env, sort_keys=True).encode("utf-8"), 0o600,
                      owner=(uid, gid))


def _kill_placeholder(info: ContainerInfo) -> str:
    try:
        os.kill(info.pid, signal.SIGKILL)
    except ProcessLookupError:
        return "already gone"
    proc.wait_gone(info.pid, 10)
    return "killed"


def _inheritable(path: str, flags: int) -> int:
    fd = os.open(path, flags)
    os.set_inheritable(fd, True)
    return fd


@dataclass
class _Restore:
    """One restore into one placeholder, as its phases share it. ``out`` is the destination's result."""

    doc: Dict[str, Any]
    d: Destination
    info: ContainerInfo
    tdir: str                   # the source container's dir in the snapshot
    work: str                   # CRIU's work dir (its log and stats)
    control: Optional[str]      # the placeholder's control dir on the host, if it has one
    out: Dict[str, Any]
    timings: Dict[str, float] = field(default_factory=dict)
    pinned: Dict[str, int] = field(default_factory=dict)         # namespace -> our fd of the placeholder's
    stdio: List[Tuple[int, int]] = field(default_factory=list)  # (our fd, stdio number) of its piped stdio
    hostname: str = ""          # the placeholder's, which CRIU overwrites
    pid: int = 0                # host PID of the restored tree, once CRIU restored it


def _begin(snap_dir: str, doc: Dict[str, Any], d: Destination, info: ContainerInfo, restore_root: str) -> _Restore:
    work = os.path.join(restore_root, f"{doc['id']}-{os.urandom(4).hex()}")
    os.makedirs(restore_root, mode=0o700, exist_ok=True)
    os.makedirs(work, mode=0o700)
    out: Dict[str, Any] = {"container": info.name, "source": d.source["name"], "result": "failed", "work_dir": work}
    control = d.control_host if d.control_host and os.path.isdir(d.control_host) else None
    return _Restore(doc=doc, d=d, info=info, tdir=os.path.join(snap_dir, d.source["path"]), work=work,
                    control=control, out=out)


def _copy_source(r: _Restore, snap_dir: str) -> List[str]:
    """The source container's files (images, rootfs diff) copied into ``r.work/snapshot``, hashed as they pass;
    ``r.tdir`` then points there. The problems, as checksum refusals."""
    prefix = f"{r.d.source['path']}/"
    items = [(e, os.path.join(r.work, "snapshot", e["path"])) for e in r.doc.get("files", [])
             if e["path"].startswith(prefix) and e["path"] != f"{prefix}criu/dump.log"]
    need = sum(int(e["size"]) for e, _dest in items)
    space = sc.space_problem(r.work, need)
    if space:
        return [space]
    t0 = time.monotonic()
    problems, _deferred = sc.copy_verified(snap_dir, items)
    r.timings["verified_copy"] = time.monotonic() - t0
    os.makedirs(os.path.join(r.work, "snapshot", r.d.source["path"], "criu"), mode=0o700, exist_ok=True)
    r.tdir = os.path.join(r.work, "snapshot", r.d.source["path"])
    return [f"checksum: {p}" for p in problems]


def _pin(r: _Restore) -> None:
    """Pin the placeholder: its namespaces stay what we checked even if it is replaced meanwhile."""
    for ns in PINNED:
        r.pinned[ns] = _inheritable(f"/proc/{r.info.pid}/ns/{ns}", os.O_RDONLY)
    if nsu.ns_inode(r.info.pid, "pid") != os.fstat(r.pinned["pid"]).st_ino:
        raise snap.SnapshotError(f"placeholder {r.info.name} was replaced while it was being prepared")


def _prepare(r: _Restore) -> None:
    """The placeholder's side before CRIU: its control files cleared, its hostname kept, the rootfs diff
    applied, its piped stdio opened for the workload to inherit."""
    if r.control:
        ctl.clear(r.control, ctl.RESTORE_COMPLETE, ctl.RESTORE_FAILED)
    r.hostname = nsu.get_hostname(r.info.pid)
    t0 = time.monotonic()
    r.out["rootfs"] = rootfs.apply(r.info.rootfs, r.tdir, [m.mountpoint for m in nsu.mountinfo(r.info.pid)])
    r.timings["rootfs"] = time.monotonic() - t0
    for n, key in enumerate(r.d.source.get("stdio") or []):
        if key.startswith("pipe:"):
            r.stdio.append((_inheritable(f"/proc/{r.info.pid}/fd/{n}", os.O_RDONLY if n == 0 else os.O_WRONLY), n))


def _restore_options(r: _Restore, base: CriuOptions) -> CriuOptions:
    """``base`` with what restoring into the pinned placeholder adds: its rootfs and cgroup, its network and PID
    namespaces (the dump's external ones) and stdio pipes inherited, its UTS and IPC namespaces joined, its
    own bind sources for the external mounts."""
    beside = () if r.d.source.get("pid_namespace") else (("pid", EXT_PID),)  # else: CRIU makes a nested one
    inherit = [InheritFd(key, r.pinned[ns]) for ns, key in (("net", EXT_NET),) + beside]
    inherit += [InheritFd(r.d.source["stdio"][n], fd) for fd, n in r.stdio]
    me = "self" if beside == () else str(os.getpid())  # CRIU in the placeholder's PID namespace sees not our PID
    return dataclasses.replace(
        base, root=r.info.rootfs, shell_job=True, manage_cgroups=True, manage_cgroups_mode="soft",
        cgroup_root=r.info.cgroup_path,
        network_lock="skip",  # the placeholder's network namespace has no dump-time rules
        mntns_compat_mode=True, inherit_fd=inherit,
        join_ns=[JoinNs(ns, f"/proc/{me}/fd/{r.pinned[ns]}") for ns in ("uts", "ipc")],
        ext_mnt=[ExtMount(key, val) for key, val in (r.d.ext_mnt or {}).items()])


def _run_criu(r: _Restore, criu: str, options: CriuOptions) -> None:
    # The images are read in place (CRIU writes its log and stats into the work dir): a staged dir of
    # symlinks would not do, the restored tasks open images after they moved into the new mount tree.
    t0 = time.monotonic()
    prog.phase(f"restore into {r.info.name}")
    if r.d.source.get("pid_namespace"):  # CRIU in the placeholder's PID namespace makes the nested one there
        seen = criu_restore(criu, os.path.join(r.tdir, "criu"), r.work, options, in_pid_ns=r.pinned["pid"])
        r.pid = _host_pid(r.info.pid, seen)
    else:
        r.pid = criu_restore(criu, os.path.join(r.tdir, "criu"), r.work, options)
    r.timings["restore"] = time.monotonic() - t0


def _host_pid(placeholder: int, seen: int) -> int:
    """The host PID of the restored PID 1 that the placeholder's PID namespace sees as ``seen``."""
    level = len(proc.ns_pids(placeholder)) - 1
    for pid in nsu.nested_inits(nsu.ns_inode(placeholder, "pid")):
        if proc.ns_pids(pid)[level] == seen:
            return pid
    raise snap.SnapshotError(f"the restored tree (pid {seen} in the placeholder's PID namespace) is not running")


def _finish(r: _Restore, t_start: float) -> None:
    """The restored tree handed to the placeholder: its hostname back, the workload told; the result."""
    # CRIU writes the dump-time hostname into the UTS namespace it joined: give the placeholder its own back.
    nsu.set_hostname(r.info.pid, r.hostname)
    if not proc.alive(r.info.pid):
        raise snap.SnapshotError(f"placeholder {r.info.name} exited during the restore")
    ns_pid = proc.ns_pids(r.pid)[len(proc.ns_pids(r.info.pid)) - 1]  # as the placeholder's PID namespace sees it
    if r.control:
        _offer_env(r.control, r.info.pid, r.pid)
        if r.d.source.get("ready_for_snapshot"):
            ctl.write(r.control, ctl.READY, f"restored from {r.doc['id']}\n")
        ctl.write(r.control, ctl.RESTORE_COMPLETE, f"pid={ns_pid}\nhost_pid={r.pid}\nsnapshot={r.doc['id']}\n")
    r.timings["total"] = time.monotonic() - t_start
    r.out.update(result="succeeded", pid=r.pid, ns_pid=ns_pid, pids=proc.descendants(r.pid),
                 criu_stats=read_stats(os.path.join(r.work, "stats-restore")))
    if r.d.notes:
        r.out["notes"] = r.d.notes


def _roll_back(r: _Restore, error: str, tail: Optional[str], kill_on_failure: bool) -> None:
    """A failed restore leaves no half-done copy: the restored tree (if any) killed, the workload's control dir
    told, the placeholder killed when asked."""
    if r.pid and proc.alive(r.pid):
        proc.signal_tree(r.pid, signal.SIGKILL)
    r.out["error"] = f"container {r.info.name}: {error}"
    if tail:
        r.out["criu_log_tail"] = tail.splitlines()
    if r.control:
        try:
            ctl.write(r.control, ctl.RESTORE_FAILED, f"{error}\n")
        except OSError:
            pass
    if kill_on_failure:
        r.out["placeholder"] = _kill_placeholder(r.info)


def _unpin(r: _Restore) -> None:
    for fd in list(r.pinned.values()) + [fd for fd, _n in r.stdio]:
        try:
            os.close(fd)
        except OSError:
            pass


def _resume_gpu(r: _Restore, gpu_node: GpuNode) -> None:
    """The restored tree's CUDA processes get their GPU state back, onto the placeholder's GPUs, and run."""
    gpu = r.doc.get("gpu")
    if not gpu:
        return
    prog.phase(f"cuda restore in {r.info.name}")
    backend, why = gpu_node.backend()
    try:
        r.out["cuda"] = gpl.resume(r.pid, gpu, backend, why, r.d.gpu_pairs, r.timings)
    except cu.CudaError as exc:
        raise snap.SnapshotError(f"cuda restore failed: {exc}") from None


def _copy_stage(r: _Restore, stage: str) -> None:
    """The restored copy's ``stage`` callbacks, when its snapshot recorded them; a failure rolls the restore back."""
    if not r.pid or not r.control:
        return
    depth = len(proc.ns_pids(r.info.pid)) - 1
    ns_pid = proc.ns_pids(r.pid)[depth] if proc.alive(r.pid) else None  # as the placeholder's PID namespace sees it
    try:
        snap.copy_stage(r.control, r.doc, stage, r.pid, ns_pid, r.timings)
    except ctl.StageFailed as exc:
        raise snap.SnapshotError(f"restore of snapshot {r.doc['id']}: {exc}") from None


def restore_one(criu: str, snap_dir: str, doc: Dict[str, Any], d: Destination, options: CriuOptions,
                restore_root: str, kill_on_failure: bool, gpu_node: Optional[GpuNode] = None,
                verified_copy: bool = False) -> Dict[str, Any]:
    """Restore one source container into one checked placeholder; never raises for a restore failure.

    Phases: pin the placeholder, prepare it, CRIU (no CRIU plugin loaded for a GPU snapshot), the GPU state
    (every CUDA process restored onto ``d.gpu_pairs``, then all unlocked), finish (restore-complete); any
    failure rolls back (``_roll_back``), and the pins are always closed.

    ``verified_copy`` (a store read in place, verify on): the source's files are first copied into the work dir,
    hashed as they pass (``_storecopy``), and CRIU and the rootfs diff read only that copy; a mismatch refuses
    this destination before the placeholder is touched.
    """
    if d.info is None:
        raise snap.SnapshotError(f"placeholder {d.name} was not checked")
    t_start = time.monotonic()
    r = _begin(snap_dir, doc, d, d.info, restore_root)
    if verified_copy:
        problems = _copy_source(r, snap_dir)
        if problems:
            shutil.rmtree(r.work, ignore_errors=True)
            return {"container": d.name, "source": d.source["name"], "result": "refused", "reasons": problems,
                    "error": f"refusing to restore into {d.name}: " + "; ".join(problems)}
    try:
        _pin(r)
        _prepare(r)
        with snap.criu_plugins_off(bool(doc.get("gpu"))):
            _run_criu(r, criu, _restore_options(r, options))
        _copy_stage(r, "restore_pre")  # the workload's lifecycle stages around its device restore (snap.copy_stage)
        _resume_gpu(r, gpu_node or GpuNode())
        _copy_stage(r, "restore_post")
        _finish(r, t_start)
    except WarmstartError as exc:
        _roll_back(r, str(exc), exc.log_tail, kill_on_failure)
    except OSError as exc:
        _roll_back(r, str(exc), None, kill_on_failure)
    finally:
        _unpin(r)
        if verified_copy:  # our copy of the memory images: CRIU is done with it, whatever happened
            shutil.rmtree(os.path.join(r.work, "snapshot"), ignore_errors=True)
    r.out["timings"] = {k: round(v, 3) for k, v in r.timings.items()}
    return r.out


def _select(store: Store, snapshot_id: Optional[str], name: Optional[str], labels: Optional[Dict[str, str]],
            node: Dict[str, Any], skip_compat: bool, verify: bool, fetch: bool = True,
            gpu_node: Optional[GpuNode] = None, cuda: str = "auto", skip_unreadable: bool = False,
            passed_over: Optional[List[Dict[str, str]]] = None) -> Dict[str, Any]:
    """The snapshot to restore, after every check of the snapshot itself; reads only.

    A snapshot that does not fit this node (none compatible, compatibility, checksums, not a container
    snapshot, GPU state) is refused with every reason and ``outcome="incompatible"``.
    """
    try:
        doc = snap.select(store, snapshot_id, name, labels, node, skip_compat, skip_unreadable=skip_unreadable,
                          passed_over=passed_over)
    except snap.SnapshotError as exc:  # with reasons: snapshots were found, and none fits this node
        raise exc.with_details(outcome="incompatible") if exc.reasons else exc
    problems = [] if skip_compat else incompatibilities(doc["source"], node)
    if verify and getattr(store, "reads_in_place", False) and fetch:  # each destination hashes its copy (restore_one)
        problems += [f"checksum: {p}" for p in st.verify_files(store.local_dir(doc["id"]), doc, phase=False,
                                                               hashed=False)]
    elif verify:
        problems += [f"checksum: {p}" for p in st.verify_local(store, doc, fetch=fetch, cached=True)]
    targets = doc.get("targets") or []
    if not targets or any(t.get("kind") != "container" for t in targets):
        problems.append("snapshot: it is not a container snapshot (restore a process snapshot without into)")
    if doc.get("gpu") or cuda == "required":  # the node's side; each placeholder's GPUs are checked on their own
        node_side = dict(doc["gpu"], gpus=[]) if doc.get("gpu") else None
        problems += gpu_incompatibilities(node_side, gpu_node or GpuNode(), cuda, hard_only=skip_compat)
    if problems:
        raise snap.SnapshotError(f"refusing to restore snapshot {doc['id']} ({doc['name']}) on this node",
                                 reasons=problems, outcome="incompatible")
    return doc


@dataclass
class _GpuCheck:
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


def _restore_exclusive(runtime: Runtime, criu: str, store: Any, doc: Dict[str, Any], d: Destination,
                       opts: CriuOptions, restore_root: str, kill_on_failure: bool,
                       skip_image_check: bool, gpu: Optional[_GpuCheck] = None,
                       verified_copy: bool = False) -> Dict[str, Any]:
    """One restore into a placeholder at a time: its lock held from a fresh inertness check to the end."""
    refused = {"container": d.name, "source": d.source["name"], "result": "refused"}
    try:
        lock = rst.exclusive(f"placeholder {d.info.id if d.info else d.name}")
    except rst.Busy as exc:
        return dict(refused, error=f"refusing to restore into {d.name}: {exc}", reasons=[str(exc)])
    try:
        d, problems = check_destination(runtime, d.source, d.name, skip_image_check)  # another restore may have won
        d, problems = gpu.check(d, problems) if gpu else (d, problems)
        if problems:
            return dict(refused, error=f"refusing to restore into {d.name}: " + "; ".join(problems), reasons=problems)
        return restore_one(criu, store.local_dir(doc["id"]), doc, d, opts, restore_root, kill_on_failure,
                           gpu.node if gpu else None, verified_copy=verified_copy)
    finally:
        os.close(lock)


def restore_into(store: Store, into: Any, snapshot_id: Optional[str] = None, name: Optional[str] = None,
                 labels: Optional[Dict[str, str]] = None, verify: bool = True, skip_compat: bool = False,
                 skip_image_check: bool = False, kill_on_failure: bool = True, runtime_name: str = "podman",
                 options: Optional[CriuOptions] = None, criu_path: Optional[str] = None,
                 restore_root: str = snap.DEFAULT_RESTORE_ROOT, check_mode: bool = False,
                 tcp: Optional[str] = None, cuda: str = "auto", gpu_node: Optional[GpuNode] = None,
                 skip_unreadable: bool = False) -> Dict[str, Any]:
    """Restore a container snapshot into placeholder containers; per-destination results.

    By name/labels, newer snapshots passed over are named in ``passed_over`` (``snap.select``; one that cannot be
    read or trusted refuses the restore unless ``skip_unreadable``).

    ``cuda`` (auto | required | off) as for a process restore. A snapshot with GPU state needs this node's CUDA
    checkpoint backend and driver (checked once), and each placeholder given GPUs that take the snapshot's
    (``_gpuplace``: its visible devices and device nodes; refused naming both lists); after CRIU every CUDA
    process is restored onto them and unlocked before restore-complete.

    ``tcp``: ``keep`` or ``close`` the snapshot's established TCP connections (None: ``close``, a placeholder's
    network namespace is not the dump's; see ``_tcp``); each destination's result says which and why.

    Checksums and compatibility are checked once, before anything; each
    destination is then checked (running, inert, PIDs free, image, mounts) and
    a destination that fails its check is reported and left untouched. In
    ``check_mode`` nothing is fetched or touched: each destination that passes
    its check says "would restore".

    The result's ``outcome`` is computed here, once: over the destinations on
    return; on a raise, in the error's details - ``incompatible`` when the
    snapshot does not fit this node (refused before any container is touched),
    ``failed`` otherwise.
    """
    t_start = time.monotonic()
    try:
        if tcpm.invalid(tcp):
            raise snap.SnapshotError(str(tcpm.invalid(tcp)))
        criu = find_criu(criu_path)
        if not criu:
            raise CriuError("no CRIU found on this node; prepare it with warmstart.snapshot.node_prep")
        gpu_node = gpu_node or GpuNode()
        passed_over: List[Dict[str, str]] = []
        doc = _select(store, snapshot_id, name, labels, describe_node(criu), skip_compat, verify,
                      fetch=not check_mode, gpu_node=gpu_node, cuda=cuda, skip_unreadable=skip_unreadable,
                      passed_over=passed_over)
        sources = {t["name"]: t for t in doc["targets"]}
        pairs = parse_container_map(into, list(sources))
        runtime = get_runtime(runtime_name)
        gpu = _GpuCheck(doc.get("gpu"), gpu_node, skip_compat)
        checked = [gpu.check(*check_destination(runtime, sources[src], dst, skip_image_check)) for src, dst in pairs]
        copying = bool(getattr(store, "reads_in_place", False) and verify)
        results = [_destination(runtime, criu, store, doc, d, problems, options, restore_root, kill_on_failure,
                                skip_image_check, check_mode, tcp, gpu, copying) for d, problems in checked]
    except WarmstartError as exc:
        raise exc.with_details(outcome=exc.details.get("outcome", "failed"))
    return {"id": doc["id"], "name": doc["name"], "outcome": _outcome(results), "destinations": results,
            "timings": {"total": round(time.monotonic() - t_start, 3)}, "passed_over": passed_over}


def _destination(runtime: Runtime, criu: str, store: Any, doc: Dict[str, Any], d: Destination, problems: List[str],
                 options: Optional[CriuOptions], restore_root: str, kill_on_failure: bool, skip_image_check: bool,
                 check_mode: bool, tcp: Optional[str] = None, gpu: Optional[_GpuCheck] = None,
                 verified_copy: bool = False) -> Dict[str, Any]:
    """One destination's result: refused (its check failed), would restore (check mode), or its restore; the
    last two say what the restore does with the snapshot's TCP connections (``_tcp``)."""
    recorded = (d.source.get("criu") or {}).get("options", {}).get("tcp")
    plan, tcp_problems = tcpm.plan(tcp, recorded, d.info.name if d.info else d.name, None, "")
    problems = problems + tcp_problems
    if problems:
        return {"container": d.name, "source": d.source["name"], "result": "refused",
                "error": f"refusing to restore into {d.name}: " + "; ".join(problems), "reasons": problems}
    if check_mode:
        return {"container": d.name, "source": d.source["name"], "result": "would restore", "notes": d.notes,
                "tcp": plan.result()}
    opts = dataclasses.replace(options or CriuOptions.from_manifest(d.source["criu"]["options"]), tcp=plan.criu_tcp)
    done = _restore_exclusive(runtime, criu, store, doc, d, opts, restore_root, kill_on_failure, skip_image_check,
                              gpu, verified_copy)
    return done if done["result"] == "refused" else dict(done, tcp=plan.result())


def _outcome(results: List[Dict[str, Any]]) -> str:
    ok = sum(1 for r in results if r["result"] in ("succeeded", "would restore"))
    return "succeeded" if ok == len(results) else ("failed" if ok == 0 else "partially_succeeded")
