# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Restore of a container snapshot into inert placeholder containers.

The placeholder (a container of the same image whose PID 1 is an inert command
such as ``sleep infinity``, checked by _placeholder) keeps the namespaces, cgroup
and mounts its runtime gave it. CRIU runs on the host and puts the workload into
them: the placeholder's network and PID namespaces (pinned by open fds and
handed to CRIU as the external namespaces), its UTS and IPC namespaces
(joined), its cgroup (cgroup root remapped), a mount tree rebuilt on the
placeholder's root file system with the placeholder's own bind sources. The
workload comes back as a sibling of the placeholder's PID 1 with its original
PIDs. Nothing is mounted into the placeholder, so nothing is left behind.

``restore_into`` checks the snapshot once and each destination on its own;
``restore_one`` restores into one checked placeholder and rolls back on failure
(``_roll_back``).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _checksums as ck
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _container as ctr
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _appsteps as aps
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _appprofile as app
from ansible_collections.warmstart.snapshot.plugins.module_utils.node._profile import Profile
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _control as ctl
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cudaabi as cuabi
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _gpuhooks as gh
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _gpuplace as gpl
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _namespaces as nsu
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _placeholder as ph
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _preflight as pf
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _progress as prog
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _restorer as rst
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _restorework as rw
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime import _rootfs as rootfs
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime import _volumes as vol
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _storecopy as sc
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _lazy as lz
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _tcp as tcpm
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._gpunode import GpuNode
from ansible_collections.warmstart.snapshot.plugins.module_utils.node._compat import (
    gpu_incompatibilities,
    incompatibilities,
    memory_problems,
)
from ansible_collections.warmstart.snapshot.plugins.module_utils.node._node import describe_node
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._containerinfo import ContainerInfo
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu import CriuError, find_criu
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import (
    CriuOptions,
    ExtMount,
    InheritFd,
    JoinNs,
    log_tail,
    read_stats,
)
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import restore as criu_restore
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._runtime import Runtime, get_runtime
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._storeapi import Store


PINNED = ("mnt", "net", "pid", "uts", "ipc")  # the placeholder's namespaces a restore holds open
ENV_FILE = "env.json"  # the placeholder's environment, offered to the restored workload
PARALLEL = 8           # placeholders restored at the same time (a pod's containers, a fan-out)


@dataclass
class _Restore:
    """One restore into one placeholder, as its phases share it. ``out`` is the destination's result."""

    doc: Dict[str, Any]
    d: ph.Destination
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
    lazy: Optional["Lazy"] = None  # a lazy restore's settings (None: eager)
    session: Optional[lz.Session] = None  # its lazy-pages daemon, once started
    criu_at: float = 0.0        # wall time CRIU's restore began (a lazy restore's times count from it)
    images: str = ""            # the images CRIU reads, when not the source's own (a mixed tcp plan's rewrite)


@dataclass
class Lazy:
    """A lazy restore into placeholders: its plan (``lz.plan``: used, reason), its timeout, whether to wait."""

    plan: Dict[str, Any]
    timeout: float = lz.DEFAULT_TIMEOUT
    wait: bool = False


def _begin(snap_dir: str, doc: Dict[str, Any], d: ph.Destination, info: ContainerInfo, restore_root: str) -> _Restore:
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


def _tcp_images(r: _Restore, plan: Optional[tcpm.TcpPlan], verified_copy: bool) -> List[str]:
    """A ``mixed`` tcp plan's own images (``_tcp.own_images``: in place in our verified copy, else in
    ``r.work/tcp-images``); ``r.images`` then points there. The problems, as refusals."""
    if plan is None or plan.mode != "mixed":
        return []
    try:
        r.images = tcpm.own_images(plan, os.path.join(r.tdir, "criu"), None if verified_copy else r.work)
        return []
    except Exception as exc:  # pylint: disable=broad-except  # pycriu's decoder and the file system: a refusal
        return [f"tcp: cannot close the connections that leave the snapshot in its files.img: {exc}"]


def _own_images(r: _Restore, verified_copy: bool) -> List[str]:  # removed once CRIU and a lazy daemon are done
    return [os.path.join(r.work, d) for d in (["snapshot"] if verified_copy else []) + [tcpm.OWN_IMAGES]]


def _pin(r: _Restore) -> None:
    """Pin the placeholder: its namespaces stay what we checked even if it is replaced meanwhile."""
    for ns in PINNED:
        r.pinned[ns] = _inheritable(f"/proc/{r.info.pid}/ns/{ns}", os.O_RDONLY)
    if nsu.ns_inode(r.info.pid, "pid") != os.fstat(r.pinned["pid"]).st_ino:
        raise snap.SnapshotError(f"placeholder {r.info.name} was replaced while it was being prepared")


def _prepare(r: _Restore) -> None:
    """The placeholder's side before CRIU: its control files cleared, its hostname kept, the rootfs diff
    applied, the volumes the snapshot took along put back, its piped stdio opened for the workload to inherit."""
    if r.control:
        ctl.clear(r.control, ctl.RESTORE_COMPLETE, ctl.RESTORE_FAILED)
    r.hostname = nsu.get_hostname(r.info.pid)
    t0 = time.monotonic()
    r.out["rootfs"] = rootfs.apply(r.info.rootfs, r.tdir, [m.mountpoint for m in nsu.mountinfo(r.info.pid)])
    r.timings["rootfs"] = time.monotonic() - t0
    if r.d.source.get("volumes"):
        t0 = time.monotonic()
        r.out["volumes"] = [vol.apply((r.d.ext_mnt or {})[v["mountpoint"]], v["mountpoint"],
                                      os.path.join(r.tdir, v["archive"])) for v in r.d.source["volumes"]]
        r.timings["volumes"] = time.monotonic() - t0
    for n, key in enumerate(r.d.source.get("stdio") or []):
        if key.startswith("pipe:"):
            r.stdio.append((_inheritable(f"/proc/{r.info.pid}/fd/{n}", os.O_RDONLY if n == 0 else os.O_WRONLY), n))


def _restore_options(r: _Restore, base: CriuOptions) -> CriuOptions:
    """``base`` with what restoring into the pinned placeholder adds: its rootfs and cgroup, its network and PID
    namespaces (the dump's external ones) and stdio pipes inherited, its UTS and IPC namespaces joined, its
    own bind sources for the external mounts."""
    beside = () if r.d.source.get("pid_namespace") else (("pid", ctr.EXT_PID),)  # else: CRIU makes a nested one
    inherit = [InheritFd(key, r.pinned[ns]) for ns, key in (("net", ctr.EXT_NET),) + beside]
    inherit += [InheritFd(r.d.source["stdio"][n], fd) for fd, n in r.stdio]
    me = "self" if beside == () else str(os.getpid())  # CRIU in the placeholder's PID namespace sees not our PID
    return dataclasses.replace(
        base, root=r.info.rootfs, shell_job=True, manage_cgroups=True, manage_cgroups_mode="soft",
        cgroup_root=r.info.cgroup_path,
        network_lock="skip",  # the placeholder's network namespace has no dump-time rules
        mntns_compat_mode=True, inherit_fd=inherit,
        join_ns=[JoinNs(ns, f"/proc/{me}/fd/{r.pinned[ns]}") for ns in ("uts", "ipc")],
        ext_mnt=[ExtMount(key, val) for key, val in (r.d.ext_mnt or {}).items()])


def _run_criu(r: _Restore, criu: str, options: CriuOptions, verified_copy: bool, kill_on_failure: bool) -> None:
    """CRIU's restore into the pinned placeholder; lazily (``r.lazy``) with a lazy-pages daemon serving the
    verified images, which a supervisor owns from then on (``_lazy``: it kills the tree - and the placeholder,
    ``kill_on_failure`` - if memory cannot be complete, and removes our verified copy once the daemon is done)."""
    # The images are read in place (CRIU writes its log and stats into the work dir): a staged dir of
    # symlinks would not do, the restored tasks open images after they moved into the new mount tree.
    t0, r.criu_at = time.monotonic(), time.time()
    images = r.images or os.path.join(r.tdir, "criu")
    if r.lazy is not None and r.lazy.plan["used"]:
        prog.phase(f"lazy-pages daemon for {r.info.name}")
        r.session = lz.start(criu, images, r.work, r.lazy.timeout, r.control, snapshot_id=r.doc["id"],
                             tidy=_own_images(r, verified_copy))
        options = dataclasses.replace(options, lazy_pages=True)
    prog.phase(f"restore into {r.info.name}")
    try:
        with lz.guard(r.session):
            if r.d.source.get("pid_namespace"):  # CRIU in the placeholder's PID namespace makes the nested one there
                seen = criu_restore(criu, images, r.work, options, in_pid_ns=r.pinned["pid"])
                r.pid = _host_pid(r.info.pid, seen)
            else:
                r.pid = criu_restore(criu, images, r.work, options)
    except (WarmstartError, OSError) as exc:
        if r.session is not None:
            r.session.abort()
            cause = r.session.failure()
            r.session = None
            if cause and isinstance(exc, WarmstartError):
                raise CriuError(f"{exc} (lazy-pages daemon: {cause})", log_tail=exc.log_tail) from None
        raise
    if r.session is not None:
        r.session.attach(r.pid, placeholder=r.info.pid if kill_on_failure else None)
        r.out["lazy"] = dict(r.lazy.plan if r.lazy else {}, daemon_pid=r.session.daemon_pid,
                             resumed_after=round(time.monotonic() - t0, 3))
    elif r.lazy is not None:
        r.out["lazy"] = dict(r.lazy.plan)
    r.timings["restore"] = time.monotonic() - t0


def _wait_lazy(r: _Restore) -> None:
    """``lazy_wait``: until the supervisor says memory is complete; a failure raises (the supervisor has killed
    the tree and the placeholder and written restore-failed)."""
    if r.session is None or r.lazy is None or not r.lazy.wait:
        return
    prog.phase(f"lazy: wait for the memory of {r.info.name}")
    state = lz.wait(r.work, r.lazy.timeout + 15)
    if state.get("state") != "complete":
        raise snap.SnapshotError(state.get("error") or f"lazy restore into {r.info.name}: memory not complete after "
                                 f"{r.lazy.timeout:g} s", log_tail=log_tail(os.path.join(r.work, lz.LOG)))
    r.out.setdefault("lazy", {})["complete_after"] = round(state["complete_at"] - r.criu_at, 3)


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


def _offer_env(control: str, placeholder_pid: int, restored_pid: int) -> None:
    """Write the placeholder's environment as env.json (0600, owned by the workload) for the workload to re-read."""
    env = proc.environ(placeholder_pid)
    status = proc.status(restored_pid)
    uid, gid = int(status["Uid"].split()[0]), int(status["Gid"].split()[0])
    safefs.write_file(os.path.join(control, ENV_FILE), json.dumps(env, sort_keys=True).encode("utf-8"), 0o600,
                      owner=(uid, gid))


def _roll_back(r: _Restore, error: str, tail: Optional[str], kill_on_failure: bool) -> None:
    """A failed restore leaves no half-done copy: the restored tree (if any) killed, the workload's control dir
    told, the placeholder killed when asked."""
    if r.pid and proc.alive(r.pid):
        proc.signal_tree(r.pid, signal.SIGKILL)
    r.out["result"] = "failed"  # also after _finish: a lazy restore whose memory did not complete (_wait_lazy)
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


def _kill_placeholder(info: ContainerInfo) -> str:
    try:
        os.kill(info.pid, signal.SIGKILL)
    except ProcessLookupError:
        return "already gone"
    proc.wait_gone(info.pid, 10)
    return "killed"


def _unpin(r: _Restore) -> None:
    for fd in list(r.pinned.values()) + [fd for fd, _n in r.stdio]:
        try:
            os.close(fd)
        except OSError:
            pass


def _inheritable(path: str, flags: int) -> int:
    fd = os.open(path, flags)
    os.set_inheritable(fd, True)
    return fd


def _resume_gpu(r: _Restore, gpu_node: GpuNode) -> None:
    """The restored tree's CUDA processes get their GPU state back, onto the placeholder's GPUs, and run."""
    gpu = r.doc.get("gpu")
    if not gpu:
        return
    prog.phase(f"cuda restore in {r.info.name}")
    backend, why = gpu_node.backend()
    try:
        r.out["cuda"] = gpl.resume(r.pid, gpu, backend, why, r.d.gpu_pairs, r.timings)
    except cuabi.CudaError as exc:
        raise snap.SnapshotError(f"cuda restore failed: {exc}") from None


def _release(r: _Restore, profile: Optional[Profile]) -> None:
    """The source container's application profile releases the copy and waits until it serves (``_appprofile``)."""
    try:
        released = app.release(profile, r.pid, r.timings)
    except aps.AppStepError as exc:
        raise snap.SnapshotError(f"restore of snapshot {r.doc['id']}: {exc}") from None
    if released:
        r.out["app_profile"] = released


def _copy_stage(r: _Restore, stage: str) -> None:
    """The restored copy's ``stage`` callbacks, when its snapshot recorded them; a failure rolls the restore back."""
    if not r.pid or not r.control:
        return
    depth = len(proc.ns_pids(r.info.pid)) - 1
    ns_pid = proc.ns_pids(r.pid)[depth] if proc.alive(r.pid) else None  # as the placeholder's PID namespace sees it
    try:
        gh.copy_stage(r.control, r.doc, stage, r.pid, ns_pid, r.timings)
    except ctl.StageFailed as exc:
        raise snap.SnapshotError(f"restore of snapshot {r.doc['id']}: {exc}") from None


def restore_one(criu: str, snap_dir: str, doc: Dict[str, Any], d: ph.Destination, options: CriuOptions,
                restore_root: str, kill_on_failure: bool, gpu_node: Optional[GpuNode] = None,
                verified_copy: bool = False, lazy: Optional[Lazy] = None,
                tcp: Optional[tcpm.TcpPlan] = None) -> Dict[str, Any]:
    """Restore one source container into one checked placeholder; never raises for a restore failure.

    Phases: pin the placeholder, prepare it, CRIU (no CRIU plugin loaded for a GPU snapshot), the GPU state
    (every CUDA process restored onto ``d.gpu_pairs``, then all unlocked), finish (restore-complete); any
    failure rolls back (``_roll_back``), and the pins are always closed.

    ``verified_copy`` (a store read in place, verify on): the source's files are first copied into the work dir,
    hashed as they pass (``_storecopy``), and CRIU and the rootfs diff read only that copy; a mismatch refuses
    this destination before the placeholder is touched.

    ``lazy``: CRIU's lazy restore (``_run_criu``): the tree runs as soon as it is restored, its memory streamed
    in from the same verified images; with ``lazy.wait`` the result waits for memory to be complete.

    ``tcp``: the destination's plan (``_tcp.plan``); a ``mixed`` one gets images of its own (``_tcp_images``).
    """
    if d.info is None:
        raise snap.SnapshotError(f"placeholder {d.name} was not checked")
    t_start = time.monotonic()
    try:
        profile = app.restored_profile(d.source, None)  # checked before the placeholder is touched
    except snap.SnapshotError as exc:
        return {"container": d.name, "source": d.source["name"], "result": "refused", "reasons": exc.reasons,
                "error": f"refusing to restore into {d.name}: {exc}"}
    r = _begin(snap_dir, doc, d, d.info, restore_root)
    r.lazy = lazy
    problems = _copy_source(r, snap_dir) if verified_copy else []
    problems = problems or _tcp_images(r, tcp, verified_copy)
    if problems:
        shutil.rmtree(r.work, ignore_errors=True)
        return {"container": d.name, "source": d.source["name"], "result": "refused", "reasons": problems,
                "error": f"refusing to restore into {d.name}: " + "; ".join(problems)}
    try:
        _pin(r)
        _prepare(r)
        with gh.criu_plugins_off(bool(doc.get("gpu"))):
            _run_criu(r, criu, _restore_options(r, options), verified_copy, kill_on_failure)
        _copy_stage(r, "restore_pre")  # the workload's lifecycle stages around its device restore (_gpuhooks.copy_stage)
        _resume_gpu(r, gpu_node or GpuNode())
        _copy_stage(r, "restore_post")
        _release(r, profile)
        _finish(r, t_start)
        _wait_lazy(r)
    except WarmstartError as exc:
        _roll_back(r, str(exc), exc.log_tail, kill_on_failure)
    except OSError as exc:
        _roll_back(r, str(exc), None, kill_on_failure)
    finally:
        _unpin(r)
        if r.session is None:  # our copies of the memory images: CRIU is done with them (a lazy daemon's supervisor
            for mine in _own_images(r, verified_copy):  # removes them)
                shutil.rmtree(mine, ignore_errors=True)
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
        doc = pf.select(store, snapshot_id, name, labels, node, skip_compat, skip_unreadable=skip_unreadable,
                        passed_over=passed_over)
    except snap.SnapshotError as exc:  # with reasons: snapshots were found, and none fits this node
        raise exc.with_details(outcome="incompatible") if exc.reasons else exc
    problems = [] if skip_compat else incompatibilities(doc["source"], node) + memory_problems(doc)
    if verify and getattr(store, "reads_in_place", False) and fetch:  # each destination hashes its copy (restore_one)
        problems += [f"checksum: {p}" for p in ck.verify_files(store.local_dir(doc["id"]), doc, phase=False,
                                                               hashed=False)]
    elif verify:
        problems += [f"checksum: {p}" for p in ck.verify_local(store, doc, fetch=fetch, cached=True)]
    targets = doc.get("targets") or []
    if not targets or any(t.get("kind") != "container" for t in targets):
        problems.append("snapshot: it is not a container snapshot (restore a process snapshot without into)")
    listed = {e.get("path") for e in doc.get("files") or []}
    problems += [f"snapshot: container {t['name']}: volume {v['mountpoint']}: its archive {v['archive']} is not one "
                 "of the snapshot's checksummed files" for t in targets for v in t.get("volumes") or []
                 if f"{t.get('path')}/{v['archive']}" not in listed]
    if doc.get("gpu") or cuda == "required":  # the node's side; each placeholder's GPUs are checked on their own
        node_side = dict(doc["gpu"], gpus=[]) if doc.get("gpu") else None
        problems += gpu_incompatibilities(node_side, gpu_node or GpuNode(), cuda, hard_only=skip_compat)
    if problems:
        raise snap.SnapshotError(f"refusing to restore snapshot {doc['id']} ({doc['name']}) on this node",
                                 reasons=problems, outcome="incompatible")
    return doc


def _restore_exclusive(runtime: Runtime, criu: str, store: Any, doc: Dict[str, Any], d: ph.Destination,
                       opts: CriuOptions, restore_root: str, kill_on_failure: bool,
                       skip_image_check: bool, gpu: Optional[ph.GpuCheck] = None,
                       verified_copy: bool = False, lazy: Optional[Lazy] = None,
                       tcp: Optional[tcpm.TcpPlan] = None) -> Dict[str, Any]:
    """One restore into a placeholder at a time: its lock held from a fresh inertness check to the end."""
    refused = {"container": d.name, "source": d.source["name"], "result": "refused"}
    try:
        lock = rst.exclusive(f"placeholder {d.info.id if d.info else d.name}")
    except rst.Busy as exc:
        return dict(refused, error=f"refusing to restore into {d.name}: {exc}", reasons=[str(exc)])
    try:
        d, problems = ph.check_destination(runtime, d.source, d.name, skip_image_check)  # another restore may have won
        d, problems = gpu.check(d, problems) if gpu else (d, problems)
        if problems:
            return dict(refused, error=f"refusing to restore into {d.name}: " + "; ".join(problems), reasons=problems)
        return restore_one(criu, store.local_dir(doc["id"]), doc, d, opts, restore_root, kill_on_failure,
                           gpu.node if gpu else None, verified_copy=verified_copy, lazy=lazy, tcp=tcp)
    finally:
        os.close(lock)


def restore_into(store: Store, into: Any, snapshot_id: Optional[str] = None, name: Optional[str] = None,
                 labels: Optional[Dict[str, str]] = None, verify: bool = True, skip_compat: bool = False,
                 skip_image_check: bool = False, kill_on_failure: bool = True, runtime_name: str = "auto",
                 options: Optional[CriuOptions] = None, criu_path: Optional[str] = None,
                 restore_root: str = rw.DEFAULT_RESTORE_ROOT, check_mode: bool = False,
                 tcp: Optional[str] = None, cuda: str = "auto", gpu_node: Optional[GpuNode] = None,
                 skip_unreadable: bool = False, lazy: bool = False, lazy_wait: bool = False,
                 lazy_timeout: float = lz.DEFAULT_TIMEOUT) -> Dict[str, Any]:
    """Restore a container snapshot into placeholder containers; per-destination results.

    By name/labels, newer snapshots passed over are named in ``passed_over`` (``_preflight.select``; one that cannot be
    read or trusted refuses the restore unless ``skip_unreadable``).

    ``cuda`` (auto | required | off) as for a process restore. A snapshot with GPU state needs this node's CUDA
    checkpoint backend and driver (checked once), and each placeholder given GPUs that take the snapshot's
    (``_gpuplace``: its visible devices and device nodes; refused naming both lists); after CRIU every CUDA
    process is restored onto them and unlocked before restore-complete.

    ``tcp``: ``keep`` or ``close`` the snapshot's established TCP connections (None: ``close``, a placeholder's
    network namespace is not the dump's; see ``_tcp``); each destination's result says which and why.

    ``lazy``: each placeholder's tree runs as soon as CRIU restored it, its memory streamed in from the same
    verified images by a lazy-pages daemon under a supervisor (``restore_one``); eager, saying why in each
    destination's ``lazy``, where the node lacks userfaultfd or the snapshot holds GPU state. ``lazy_wait``: each
    destination's result waits until its memory is complete; ``lazy_timeout``: seconds within which it must be.

    Checksums and compatibility are checked once, before anything; each
    destination is then checked (running, inert, PIDs free, image, mounts) and
    a destination that fails its check is reported and left untouched. The
    destinations are restored at the same time (``_each``; one after another
    for a GPU snapshot). In
    ``check_mode`` nothing is fetched or touched: each destination that passes
    its check says "would restore".

    The result's ``outcome`` is computed here, once: over the destinations on
    return; on a raise, in the error's details - ``incompatible`` when the
    snapshot does not fit this node (refused before any container is touched),
    ``failed`` otherwise; the detail ``transient`` (a store error a later try
    may not meet, ``_s3bucket``) is kept only while no container was touched.
    """
    t_start = time.monotonic()
    touching = False
    try:
        if tcpm.invalid(tcp):
            raise snap.SnapshotError(str(tcpm.invalid(tcp)))
        if lazy_timeout <= 0:
            raise snap.SnapshotError(f"lazy_timeout: {lazy_timeout:g} s is not positive")
        if lazy_wait and not lazy:
            raise snap.SnapshotError("lazy_wait: applies to a lazy restore only (lazy: true)")
        criu = find_criu(criu_path)
        if not criu:
            raise CriuError("no CRIU found on this node; prepare it with warmstart.snapshot.node_prep")
        gpu_node = gpu_node or GpuNode()
        passed_over: List[Dict[str, str]] = []
        doc = _select(store, snapshot_id, name, labels, describe_node(criu), skip_compat, verify,
                      fetch=not check_mode, gpu_node=gpu_node, cuda=cuda, skip_unreadable=skip_unreadable,
                      passed_over=passed_over)
        sources = {t["name"]: t for t in doc["targets"]}
        pairs = ph.parse_container_map(into, list(sources))
        runtime = get_runtime(runtime_name)
        gpu = ph.GpuCheck(doc.get("gpu"), gpu_node, skip_compat)
        checked = [gpu.check(*ph.check_destination(runtime, sources[src], dst, skip_image_check)) for src, dst in pairs]
        copying = bool(getattr(store, "reads_in_place", False) and verify)
        lazily = Lazy(lz.plan(criu, bool(doc.get("gpu")), lazy), lazy_timeout, lazy_wait) if lazy else None
        touching = not check_mode  # from here an error may come after a placeholder was touched
        jobs: List[Callable[[], Dict[str, Any]]] = [
            functools.partial(_destination, runtime, criu, store, doc, d, problems, options, restore_root,
                              kill_on_failure, skip_image_check, check_mode, tcp, gpu, copying, lazily)
            for d, problems in checked]
        results = _each(jobs, parallel=not check_mode and not doc.get("gpu"))
    except WarmstartError as exc:
        if touching:  # "transient" (a store error a later try may not meet) only while nothing was touched
            exc.details.pop("transient", None)
        raise exc.with_details(outcome=exc.details.get("outcome", "failed"))
    return {"id": doc["id"], "name": doc["name"], "outcome": _outcome(results), "destinations": results,
            "timings": {"total": round(time.monotonic() - t_start, 3)}, "passed_over": passed_over}


def _each(jobs: List[Callable[[], Dict[str, Any]]], parallel: bool) -> List[Dict[str, Any]]:
    """Each destination's restore, at the same time (up to ``PARALLEL``) when ``parallel``, in order otherwise.

    Each placeholder is its own: its own lock, pins, work dir, CRIU and (lazy) daemon; what they share is only
    the verified snapshot they read. A GPU snapshot's restores run one after another (they hand CRIU an
    environment without its plugins, which is process-wide, and share the GPUs' checkpoint driver)."""
    if not parallel or len(jobs) < 2:
        return [job() for job in jobs]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(jobs), PARALLEL),
                                               thread_name_prefix="restore-into") as pool:
        return list(pool.map(lambda job: job(), jobs))


def _destination(runtime: Runtime, criu: str, store: Any, doc: Dict[str, Any], d: ph.Destination, problems: List[str],
                 options: Optional[CriuOptions], restore_root: str, kill_on_failure: bool, skip_image_check: bool,
                 check_mode: bool, tcp: Optional[str] = None, gpu: Optional[ph.GpuCheck] = None,
                 verified_copy: bool = False, lazy: Optional[Lazy] = None) -> Dict[str, Any]:
    """One destination's result: refused (its check failed), would restore (check mode), or its restore; the
    last two say what the restore does with the snapshot's TCP connections (``_tcp``)."""
    recorded = (d.source.get("criu") or {}).get("options", {}).get("tcp")
    plan, tcp_problems = tcpm.plan(tcp, recorded, d.info.name if d.info else d.name, None, "",
                                   d.source.get("tcp_connections"))
    problems = problems + tcp_problems
    if problems:
        return {"container": d.name, "source": d.source["name"], "result": "refused",
                "error": f"refusing to restore into {d.name}: " + "; ".join(problems), "reasons": problems}
    if check_mode:
        return {"container": d.name, "source": d.source["name"], "result": "would restore", "notes": d.notes,
                "tcp": plan.result(), **({"lazy": dict(lazy.plan)} if lazy else {})}
    opts = dataclasses.replace(options or CriuOptions.from_manifest(d.source["criu"]["options"]), tcp=plan.criu_tcp)
    done = _restore_exclusive(runtime, criu, store, doc, d, opts, restore_root, kill_on_failure, skip_image_check,
                              gpu, verified_copy, lazy, plan)
    return done if done["result"] == "refused" else dict(done, tcp=plan.result())


def _outcome(results: List[Dict[str, Any]]) -> str:
    ok = sum(1 for r in results if r["result"] in ("succeeded", "would restore"))
    return "succeeded" if ok == len(results) else ("failed" if ok == 0 else "partially_succeeded")
