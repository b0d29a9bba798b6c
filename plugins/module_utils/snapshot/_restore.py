# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Restore of a process snapshot: the engine behind the restore module (without ``into``).

Guarantee: a restore touches no process before checksums and compatibility pass.

``restore`` checks its options and chooses the snapshot (``_choose``, ``_preflight.select``), takes the
workload's restore lock, then ``_restore_locked``: preflight and work dir (``_prepare``: ``_preflight``,
``_restorework``), the workload's files and control dir, CRIU's restore in the restorer child
(``_criu_phase``, with the lazy-pages daemon when lazy), the overlapped verify's verdict on the tree CRIU
left stopped (``_settle``), GPU state and the copy's lifecycle stages (``_after_criu``), restore-complete.
A copy that fails after CRIU is killed and forgotten (``_kill_copy``): never half-restored.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import shutil
import signal
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _control as ctl
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _appsteps as aps
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _profile as profiles
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _appprofile as app
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cuda as cu
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cudaabi as cuabi
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _digest as dg
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _gpuhooks as gh
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _gpuplace as gpl
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _lazy as lz
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _mountns as mns
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _ondemand as od
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _overlap as ov
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _preflight as pf
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _progress as prog
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _restorer as rst
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _restorework as rw
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _checksums as ck
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _storecopy as sc
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _tcp as tcpm
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _workload as wl
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._gpunode import GpuNode
from ansible_collections.warmstart.snapshot.plugins.module_utils.node._compat import CUDA_MODES
from ansible_collections.warmstart.snapshot.plugins.module_utils.node._node import describe_node
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu import CriuError
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._storeapi import Store
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._tls import loopback
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import CriuOptions, log_tail, read_stats
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import restore as criu_restore


IF_RUNNING = ("refuse", "keep")


@dataclass
class _RestoreArgs:
    """The options of one restore, as ``restore`` checked them; node-side places are this node's."""

    verify: bool
    skip_compat: bool
    options: Optional[CriuOptions]
    restore_root: str
    cuda: str
    gpu_node: GpuNode
    lazy: bool
    lazy_wait: bool
    lazy_timeout: float
    page_server: Optional[str]
    workloads_root: str
    control_roots: List[str]
    tcp: Optional[str] = None   # keep | close; None: decided by where the tree comes back (_tcp)
    remote: Any = None      # the page server's parsed address
    tls: Any = None         # _tls.TlsFiles for the connection to the page server, or None
    overlap_note: str = ""  # "used", or why the page images were verified before CRIU started (_overlap)
    skip_unreadable: bool = False
    insecure: bool = False  # pages in the clear from a page server beyond loopback
    lazy_verify: str = od.BEFORE  # before | on_demand: how a lazy restore checks page images this node has not (_ondemand)
    serve_pages: Optional[lz.PageService] = None  # pages checked on demand, served by the lazy supervisor (_ondemand)
    profile: Optional[profiles.Profile] = None  # releases the copy instead of the one the snapshot recorded
    if_running: str = "refuse"  # the snapshot's workload already runs: refuse, or keep a copy of this snapshot
    passed_over: List[Dict[str, str]] = field(default_factory=list)  # newer snapshots select passed over
    t_start: float = field(default_factory=time.monotonic)
    t_wall: float = field(default_factory=time.time)


def restore(store: Store, snapshot_id: Optional[str] = None, name: Optional[str] = None,
            labels: Optional[Dict[str, str]] = None, verify: bool = True, skip_compat: bool = False,
            options: Optional[CriuOptions] = None, criu_path: Optional[str] = None,
            restore_root: str = rw.DEFAULT_RESTORE_ROOT, cuda: str = "auto",
            gpu_node: Optional[GpuNode] = None, lazy: bool = False, lazy_wait: bool = False,
            lazy_timeout: float = lz.DEFAULT_TIMEOUT, page_server: Optional[str] = None,
            workloads_root: str = wl.DEFAULT_ROOT, control_roots: Optional[List[str]] = None,
            check_mode: bool = False, tcp: Optional[str] = None, tls: Any = None,
            skip_unreadable: bool = False, insecure: bool = False,
            profile: Optional[profiles.Profile] = None, if_running: str = "refuse",
            lazy_verify: str = "before") -> Dict[str, Any]:
    """Restore a process snapshot; with GPU state (``cuda`` auto or required) the CUDA processes are restored too.

    ``lazy``: the tree resumes at once and CRIU's lazy-pages daemon streams its memory in (from the local
    images, or from ``page_server`` host:port, see ``_lazy``); without uffd on this node, or for a snapshot
    with GPU state, it is restored eagerly and ``result['lazy']['reason']`` says why. ``lazy_verify``:
    ``before`` or ``on_demand`` (``_ondemand``), for page images this node has not verified. Node-side places
    (``workloads_root``, ``control_roots``) are this node's: a manifest never chooses where we write.

    ``tcp``: ``keep`` or ``close`` the snapshot's established TCP connections (it overrides ``options.tcp``);
    None: ``keep`` when this node took the snapshot, else ``close`` (``_tcp``). ``result['tcp']`` says which
    and why; ``keep`` of a snapshot taken with ``tcp: close`` is refused with the preflight's reasons.

    ``tls``: checked files (``_tls.TlsFiles``) for CRIU's mutual TLS with ``page_server``; without it a page server
    beyond loopback is refused unless ``insecure`` (pages in the clear, on a network the user trusts).

    ``skip_unreadable``: by name/labels, pass over newer snapshots that cannot be read or trusted instead of
    refusing (``_preflight.select``); ``result['passed_over']`` names every newer snapshot passed over, and why.

    ``profile``: the application profile that releases the copy once CRIU let it go and says when it serves
    (``_appprofile``); default the one the snapshot recorded. A failed step or probe kills the copy.

    ``if_running``: ``refuse`` (a restored copy would share the running workload's files and ports), or ``keep``:
    when the workload already runs as the restore of this very snapshot (its restore-complete names the snapshot
    and the running pid), nothing is done and the result says ``already_running`` - a re-run converges. A workload
    running from anything else (another snapshot, a cold start) is refused either way.

    ``check_mode``: select and preflight (GPU checks included) and return {id, name, verified,
    compat_checked, gpu_state, tcp, passed_over}; no process, lock file, directory or store object is touched.

    Outcome, decided here once: the result says ``outcome: succeeded``; a failure's ``details`` say
    ``outcome: incompatible`` when it was refused before any process was touched because the snapshot
    does not fit this node (compatibility, checksums, schema), else ``outcome: failed``.
    """
    a = _RestoreArgs(verify, skip_compat, options, restore_root, cuda, gpu_node or GpuNode(), lazy, lazy_wait,
                     lazy_timeout, page_server, workloads_root, list(control_roots or rw.DEFAULT_CONTROL_ROOTS), tcp,
                     tls=tls, skip_unreadable=skip_unreadable, insecure=insecure, profile=profile,
                     if_running=if_running, lazy_verify=lazy_verify)
    try:
        criu, node, doc = _choose(store, snapshot_id, name, labels, criu_path, a)
        kept = _kept_copy(doc, a)
        if kept is not None:
            return kept
        if check_mode:
            return _would_restore(store, doc, node, a)
        target = doc["targets"][0] if doc.get("targets") else {}
        lock = _restore_lock(target, workloads_root)
        try:
            return _restore_locked(store, doc, node, criu, a)
        finally:
            if lock is not None:
                os.close(lock)
    except WarmstartError as exc:
        exc.details.setdefault("outcome", "failed")
        raise


def _choose(store: Store, snapshot_id: Optional[str], name: Optional[str], labels: Optional[Dict[str, str]],
            criu_path: Optional[str], a: _RestoreArgs) -> Tuple[str, Dict[str, Any], Dict[str, Any]]:
    """The options checked, this node described, the snapshot chosen: (criu, node, manifest).

    A manifest this node cannot use (schema) is ``incompatible``; a bad id or name given is the caller's error.
    """
    if a.cuda not in CUDA_MODES:
        raise snap.SnapshotError(f"cuda: {a.cuda!r} is not one of {', '.join(CUDA_MODES)}")
    if a.lazy_verify not in od.LAZY_VERIFY:
        raise snap.SnapshotError(f"lazy_verify: {a.lazy_verify!r} is not one of {', '.join(od.LAZY_VERIFY)}")
    if a.if_running not in IF_RUNNING:
        raise snap.SnapshotError(f"if_running: {a.if_running!r} is not one of {', '.join(IF_RUNNING)}")
    if a.lazy_timeout <= 0:
        raise snap.SnapshotError(f"lazy_timeout: {a.lazy_timeout:g} s is not positive")
    if tcpm.invalid(a.tcp):
        raise snap.SnapshotError(str(tcpm.invalid(a.tcp)))
    a.remote = lz.parse_address(a.page_server) if a.page_server else None
    if a.tls is not None and not a.remote:
        raise snap.SnapshotError("tls: applies to a lazy restore from a page_server only (none given)")
    if a.remote and a.tls is None and not a.insecure and not loopback(a.remote[0]):
        raise snap.SnapshotError(f"page_server {a.page_server}: reading pages in the clear from beyond loopback is refused "
                                 "(anyone on the path could read and change the process's memory): set tls: true, or "
                                 "insecure: true on a network you trust")
    criu = snap.need_criu(criu_path)
    node = describe_node(criu)
    if snapshot_id is not None:
        mf.check_id(snapshot_id)
    if name is not None:
        mf.check_name(name)
    try:
        doc = pf.select(store, snapshot_id, name, labels, node, a.skip_compat, a.gpu_node, a.cuda,
                        skip_unreadable=a.skip_unreadable, passed_over=a.passed_over)
    except mf.ManifestError as exc:
        exc.with_details(outcome="incompatible")
        raise
    return criu, node, doc


def _kept_copy(doc: Dict[str, Any], a: _RestoreArgs) -> Optional[Dict[str, Any]]:
    """``if_running: keep``: the result for a workload that already runs as the restore of ``doc`` (None: restore)."""
    target = doc["targets"][0] if doc.get("targets") else {}
    if a.if_running != "keep" or not target.get("workload"):
        return None
    pid = wl.running_pid(a.workloads_root, target["workload"])
    if pid is None:
        return None
    record = ctl.read_record(wl.paths(a.workloads_root, target["workload"])["control"], ctl.RESTORE_COMPLETE)
    if record.get("snapshot") != doc["id"] or record.get("host_pid") != str(pid):
        return None  # running, but not as this snapshot's copy: the preflight refuses it
    return {"id": doc["id"], "name": doc["name"], "outcome": "succeeded", "already_running": True, "pid": pid,
            "pids": proc.descendants(pid), "ns_pid": proc.ns_pids(pid)[-1], "workload_name": target["workload"],
            "passed_over": a.passed_over}


def _would_restore(store: Store, doc: Dict[str, Any], node: Dict[str, Any], a: _RestoreArgs) -> Dict[str, Any]:
    """Check mode: the preflight without fetching anything; what a restore would do, or every reason it would not."""
    tcp, tcp_problems = _tcp_plan(doc, node, a)
    problems = pf.preflight(store, doc, node, a.verify, a.skip_compat, fetch=False, gpu_node=a.gpu_node, cuda=a.cuda,
                            workloads_root=a.workloads_root) + tcp_problems
    profile = None
    try:
        profile = app.restored_profile(doc["targets"][0] if doc.get("targets") else {}, a.profile)
    except snap.SnapshotError as exc:
        problems += [str(exc), *exc.reasons]
    if problems:
        raise pf.refusal(doc, problems)
    return {"id": doc["id"], "name": doc["name"], "verified": a.verify, "compat_checked": not a.skip_compat,
            "gpu_state": bool(doc.get("gpu")), "tcp": tcp.result(), "passed_over": a.passed_over,
            "app_profile": {"name": profile.name, "release": [s.describe() for s in profile.release],
                            "serving": profile.serving.describe()} if profile else None}


def _tcp_plan(doc: Dict[str, Any], node: Dict[str, Any], a: _RestoreArgs) -> Tuple[tcpm.TcpPlan, List[str]]:
    """Keep or close the snapshot's TCP connections: a process comes back in this node's host network namespace,
    so the default keeps them when this node took the snapshot (its recorded hostname), else closes them."""
    target = doc["targets"][0] if doc.get("targets") else {}
    recorded = (target.get("criu") or {}).get("options", {}).get("tcp")
    return tcpm.plan(a.tcp, recorded, None, (doc.get("source") or {}).get("hostname"), str(node.get("hostname")),
                     target.get("tcp_connections"))


def _restore_lock(target: Dict[str, Any], workloads_root: str) -> Optional[int]:
    """A workload is restored by one restore at a time on a node (from the running check to its pidfile)."""
    if not target.get("workload"):
        return None
    try:
        return rst.exclusive(f"workload {target['workload']} under {workloads_root}")
    except rst.Busy as exc:
        raise snap.SnapshotError(str(exc)) from None


def _prepare(store: Store, doc: Dict[str, Any], node: Dict[str, Any], a: _RestoreArgs,
             lazy_plan: Dict[str, Any], timings: Dict[str, float]) -> Any:
    """Preflight, then the work dir with the images: (work dir, snapshot dir, page server, overlapped verify or None).
    Nothing is touched on refusal."""
    remote = a.remote if lazy_plan["used"] else None
    t0 = time.monotonic()
    use, why = ov.usable(doc, a.verify, store.reads_in_place, lazy_plan["used"])
    a.overlap_note = "used" if use else why
    on_demand, not_why = od.usable(store, doc, a.verify, lazy_plan["used"], remote is not None, a.lazy_verify)
    if lazy_plan["used"]:
        lazy_plan["pages"] = "page_server" if remote else "checked_on_demand" if on_demand else "images"
        if a.lazy_verify == od.ON_DEMAND and not on_demand and not remote:
            lazy_plan["reason"] += f"; lazy_verify: on_demand not used - {not_why}"
    staged = bool(remote) or on_demand  # only the small images and the pages CRIU restores itself, checked
    # a store read in place hands CRIU its own files unless we copy them; a compressed snapshot's local_dir is
    # already this node's plaintext copy, checked as it was decompressed (_zstore)
    copying = store.reads_in_place and a.verify and not staged and doc.get("compression") is None
    # checked on demand: the layout and the sizes here (a missing image is named), every byte as it is read
    problems = pf.preflight(store, doc, node, a.verify and not remote, a.skip_compat, fetch=not remote,
                            gpu_node=a.gpu_node, cuda=a.cuda, workloads_root=a.workloads_root,
                            copying=copying or on_demand) + _tcp_plan(doc, node, a)[1]
    target = doc["targets"][0] if doc.get("targets") else {}
    work = os.path.join(a.restore_root, f"{doc['id']}-{uuid.uuid4().hex[:8]}")
    snap_dir = os.path.join(work, "snapshot")
    if staged and not problems:
        os.makedirs(a.restore_root, mode=0o700, exist_ok=True)
        os.makedirs(work, mode=0o700)
        try:
            problems, lazy_plan["eager_bytes"] = rw.stage_remote(store, doc, target, os.path.join(work, "images"),
                                                                 a.verify)
            if on_demand and not problems:
                a.serve_pages = od.service(store, doc, os.path.join(work, "images"), os.path.join(work, "pages-fetch"))
        except (WarmstartError, OSError) as exc:
            problems = [f"pages: {exc}"]
        finally:
            if problems:
                shutil.rmtree(work, ignore_errors=True)
    timings["preflight"] = time.monotonic() - t0
    if problems:
        raise pf.refusal(doc, problems)
    deferred: ov.Items = []
    pins: Optional[sc.Pins] = None
    if not staged:
        snap_dir = store.local_dir(doc["id"])
        os.makedirs(a.restore_root, mode=0o700, exist_ok=True)
        os.makedirs(work, mode=0o700)
        if copying:
            t0 = time.monotonic()
            snap_dir, deferred, pins = rw.copy_verified(store, doc, target, work, ov.deferrable(doc) if use else set())
            timings["verified_copy"] = time.monotonic() - t0
        else:
            rw.stage_images(os.path.join(snap_dir, target["path"], "criu"), os.path.join(work, "images"))
    if not deferred:
        return work, snap_dir, remote, None
    record = (ck.VerifiedFiles(doc["id"]), store.local_dir(doc["id"]))  # the pinned files, once they matched
    return work, snap_dir, remote, ov.Overlap(deferred, pins=pins, record=record)


def _restore_locked(store: Store, doc: Dict[str, Any], node: Dict[str, Any], criu: str,
                    a: _RestoreArgs) -> Dict[str, Any]:
    """Preflight and images, the workload's files and control dir, CRIU's restore, GPU state, the result."""
    timings: Dict[str, float] = {}
    target = doc["targets"][0] if doc.get("targets") else {}
    lazy_plan = lz.plan(criu, bool(doc.get("gpu")), a.lazy or bool(a.remote))
    work, snap_dir, remote, overlap = _prepare(store, doc, node, a, lazy_plan, timings)
    try:
        control, control_note = rw.control_dir(target, a.workloads_root, a.control_roots)
        pidfile = wl.paths(a.workloads_root, target["workload"])["pidfile"] if target.get("workload") else None
        if target.get("workload"):
            within = [store.snapshot_dir(doc["id"])] if (remote or a.serve_pages) and store.reads_in_place else []
            rw.put_back_files(target, snap_dir, a.workloads_root, within)
        if os.path.dirname(snap_dir) == work:  # our copy of the workload's files (verified): put back, not needed now
            shutil.rmtree(snap_dir, ignore_errors=True)
        if control and os.path.isdir(control):  # the source's checkpoint sentinels are not the copy's
            ctl.clear(control, ctl.RESTORE_COMPLETE, ctl.RESTORE_FAILED, *ctl.CHECKPOINT_SENTINELS)
        tcp = _tcp_plan(doc, node, a)[0]
        opts = dataclasses.replace(a.options or CriuOptions.from_manifest(target["criu"]["options"]), tcp=tcp.criu_tcp,
                                   leave_stopped=overlap is not None)
        opts = mns.restore_options(target.get("mount_namespace"), opts)
        profile = app.restored_profile(target, a.profile)  # checked before any process is touched
        t0 = time.monotonic()
        pid, session = _criu_phase(criu, work, opts, lazy_plan, a, control, doc, pidfile, remote, overlap)
        timings["restore"] = time.monotonic() - t0
        if overlap is not None:
            _settle(overlap, pid, pidfile, control, doc, timings)
        cuda_result = _after_criu(pid, doc.get("gpu"), a.gpu_node, timings, control, doc, pidfile)
        try:
            released = app.release(profile, pid, timings)
        except aps.AppStepError as exc:
            raise _kill_copy(pid, pidfile, control, f"restore of snapshot {doc['id']} failed: {exc}") from None
        ns_pid = proc.ns_pids(pid)[-1] if proc.alive(pid) else None
        if control and os.path.isdir(control):
            ctl.write(control, ctl.RESTORE_COMPLETE, f"pid={ns_pid}\nhost_pid={pid}\nsnapshot={doc['id']}\n")
        stats = read_stats(os.path.join(work, "stats-restore"))
        warnings = [w for w in (control_note, _log_warning(work)) if w]
        if session is None:
            shutil.rmtree(os.path.join(work, "images"), ignore_errors=True)  # symlinks only; keep restore.log
        elif a.lazy_wait:
            _wait_lazy(work, doc, a, lazy_plan)
        timings["total"] = time.monotonic() - a.t_start
        return {
            "id": doc["id"], "name": doc["name"], "outcome": "succeeded", "pid": pid, "pids": proc.descendants(pid),
            "ns_pid": ns_pid, "workload_name": target.get("workload"), "work_dir": work,
            "started_at": mf.iso(datetime.datetime.fromtimestamp(a.t_wall, datetime.timezone.utc)),
            "timings": {k: round(v, 3) for k, v in timings.items()}, "criu_stats": stats,
            "transfer": dict(store.transfer), "cuda": cuda_result, "lazy": lazy_plan, "warnings": warnings,
            "tcp": tcp.result(), "passed_over": a.passed_over, "app_profile": released,
            "verify": {"overlapped": a.overlap_note == "used",
                       "reason": "page images hashed while CRIU restored the tree stopped" if a.overlap_note == "used"
                       else f"verified before CRIU started: {a.overlap_note}"},
        }
    finally:
        if overlap is not None:
            overlap.release()  # the pinned page images: the verdict is given, or never will be


def _criu_phase(criu: str, work: str, opts: CriuOptions, lazy_plan: Dict[str, Any], a: _RestoreArgs,
                control: Optional[str], doc: Dict[str, Any], pidfile: Optional[str],
                remote: Any, overlap: Optional[ov.Overlap] = None) -> Tuple[int, Optional[lz.Session]]:
    """The lazy-pages daemon (when lazy) and CRIU's restore: (root pid, daemon session). On failure the daemon
    is aborted, an overlapped verify stopped and restore-failed written (``_restore_failed``); a lazy supervisor
    then watches the tree."""
    images = os.path.join(work, "images")
    session: Optional[lz.Session] = None
    try:
        if lazy_plan["used"]:
            prog.phase("lazy-pages daemon")
            session = lz.start(criu, images, work, a.lazy_timeout, control, remote, doc["id"],
                               tls_args=a.tls.criu_args() if a.tls else (), serve_pages=a.serve_pages)
        if overlap is None:
            prog.phase("restore")
        else:
            overlap.start()
        with gh.criu_plugins_off(bool(doc.get("gpu"))), lz.guard(session):
            pid = _run_criu(criu, images, work, opts, session, pidfile, overlap,
                            _orphaned_verdict(overlap, pidfile, control, doc) if overlap is not None else None)
    except (CriuError, lz.LazyError) as exc:
        failed = _restore_failed(exc, session, remote, a.page_server, control, doc)
        if overlap is not None:
            raise _mismatch_first(overlap, failed, doc) from None
        raise failed from None
    if session is not None:
        session.attach(pid)
        lazy_plan.update(daemon_pid=session.daemon_pid, resumed_after=round(time.monotonic() - a.t_start, 3))
    return pid, session


def _run_criu(criu: str, images: str, work: str, opts: CriuOptions, session: Optional[lz.Session],
              pidfile: Optional[str], overlap: Optional[ov.Overlap] = None,
              orphaned: Optional[Callable[[int], None]] = None) -> int:
    """CRIU's restore in the restorer child, which writes ``pidfile`` as soon as the tree exists (_restorer).

    With ``overlap`` (the tree restored stopped while its page images are hashed) the child stays until the
    verdict (``overlap.held``); should the module die first, it calls ``orphaned(pid)`` itself."""
    if session is not None:
        opts = dataclasses.replace(opts, lazy_pages=True)
    record = rst.tree_recorder(pidfile, proc.write_pidfile)
    if overlap is None or orphaned is None:
        return rst.restore_recorded(lambda: criu_restore(criu, images, work, opts), record, _rebuild_error)
    overlap.held = rst.restore_held(lambda: criu_restore(criu, images, work, opts), record, _rebuild_error,
                                    orphaned)
    return overlap.held.pid


def _rebuild_error(report: Dict[str, Any]) -> BaseException:
    """The restorer child's failure, as the exception it raised."""
    if report.get("type") == "LazyError":
        return lz.LazyError(report["error"], report.get("log_tail"))
    return CriuError(report["error"], log_tail=report.get("log_tail"))


def _orphaned_verdict(overlap: ov.Overlap, pidfile: Optional[str], control: Optional[str],
                      doc: Dict[str, Any]) -> Callable[[int], None]:
    """The verdict on a stopped tree whose module died before giving it: the page images hashed again (on one
    thread: this runs in the forked restorer child), then the tree resumed, or killed and forgotten."""
    def orphaned(pid: int) -> None:  # pragma: no cover - runs in the forked restorer child
        bad = [entry["path"] for path, entry in overlap.items if not dg.file_matches(path, entry)]
        bad += overlap.broken()
        if bad:
            _kill_copy(pid, pidfile, control, f"restore of snapshot {doc['id']} refused: its page images do not "
                                              f"match the manifest ({', '.join(bad)})")
        else:
            proc.signal_tree(pid, signal.SIGCONT)
    return orphaned


def _settle(overlap: ov.Overlap, pid: int, pidfile: Optional[str], control: Optional[str], doc: Dict[str, Any],
            timings: Dict[str, float]) -> None:
    """The overlapped verify's verdict on the stopped tree: it runs (SIGCONT) when every page image matched its
    manifest, and is killed otherwise - restored code never runs on unverified bytes."""
    problems = overlap.finish()
    timings["verify_wait"] = overlap.waited
    try:
        if problems:
            err = _kill_copy(pid, pidfile, control, f"restore of snapshot {doc['id']} refused: its page images do "
                                                    "not match the manifest (verified while CRIU restored the tree "
                                                    "stopped)")
            raise snap.SnapshotError(str(err), reasons=problems, outcome="failed")
        proc.signal_tree(pid, signal.SIGCONT)
    finally:
        if overlap.held is not None:
            overlap.held.settled()  # the restorer child has nothing left to decide


def _mismatch_first(overlap: ov.Overlap, failed: BaseException, doc: Dict[str, Any]) -> BaseException:
    """CRIU failed while the page images were hashed: when they do not match the manifest, that is the cause
    (CRIU stumbled on bytes a store writer changed) and the error says so; otherwise CRIU's own error."""
    problems = overlap.finish()
    if not problems:
        return failed
    return snap.SnapshotError(f"restore of snapshot {doc['id']} refused: its page images do not match the manifest "
                              f"(verified while CRIU restored the tree stopped; CRIU failed on them: {failed})",
                              reasons=problems, outcome="failed", log_tail=getattr(failed, "log_tail", None))


def _restore_failed(exc: BaseException, session: Optional[lz.Session], remote: Any, page_server: Optional[str],
                    control: Optional[str], doc: Dict[str, Any]) -> BaseException:
    """The error of a failed CRIU restore (lazy daemon's cause added); restore-failed written for the workload."""
    if session is not None:
        session.abort()
        cause = session.failure()
        if cause and isinstance(exc, CriuError):
            where = f"page server {page_server}" if remote else "the local images"
            exc = CriuError(f"{exc} (lazy-pages daemon, serving from {where}: {cause})", log_tail=exc.log_tail)
    if control and os.path.isdir(control):
        ctl.write(control, ctl.RESTORE_FAILED, f"{exc}\n")
    if isinstance(exc, lz.LazyError):
        return snap.SnapshotError(f"lazy restore of snapshot {doc['id']}: {exc}", log_tail=exc.log_tail)
    return exc


def _after_criu(pid: int, gpu: Optional[Dict[str, Any]], gpu_node: GpuNode, timings: Dict[str, float],
                control: Optional[str], doc: Dict[str, Any], pidfile: Optional[str]) -> Dict[str, Any]:
    """GPU state back into the restored tree between the copy's restore_pre and restore_post stages.

    On failure (a stage's callback included) the tree is killed (never half-restored) and forgotten.
    """
    ns_pid = proc.ns_pids(pid)[-1] if proc.alive(pid) else None
    try:
        gh.copy_stage(control, doc, "restore_pre", pid, ns_pid, timings)
        result = _resume_cuda(pid, gpu, gpu_node, timings) if gpu else \
            {"used": False, "reason": "the snapshot holds no GPU state"}
        gh.copy_stage(control, doc, "restore_post", pid, ns_pid, timings)
        return result
    except ctl.StageFailed as exc:
        raise _kill_copy(pid, pidfile, control, f"restore of snapshot {doc['id']} failed: {exc}") from None
    except (cuabi.CudaError, cuabi.CudaUnavailable, snap.SnapshotError, gpl.GpuPlaceError, OSError) as exc:
        raise _kill_copy(pid, pidfile, control, f"cuda restore of snapshot {doc['id']} failed: {exc}") from None


def _resume_cuda(root: int, gpu: Dict[str, Any], gpu_node: GpuNode, timings: Dict[str, float]) -> Dict[str, Any]:
    """After the CRIU restore: map the CUDA pids, restore them onto this node's GPUs, unlock them."""
    backend, why = gpu_node.backend()
    if backend is None:
        raise snap.SnapshotError(f"cuda: this node cannot restore GPU state: {why}")
    t0 = time.monotonic()
    pids = gpl.restored_cuda_pids(root, list(gpu.get("pids") or []))
    pairs: Optional[List[Any]] = None
    if gpu.get("gpus"):
        try:
            pairs = cu.device_map(gpu["gpus"], gpu_node.gpus()[0])
        except cuabi.GpuMismatch:
            pairs = None  # skip_compat_check: let the driver try the same GPUs
    timings["cuda_map"] = time.monotonic() - t0
    prog.phase("cuda restore")
    timings.update(cu.restore_and_unlock(pids, pairs, backend))
    return {"used": True, "pids": pids, "gpu_pairs": [list(p) for p in pairs or []], "backend": backend.describe()}


def _kill_copy(pid: int, pidfile: Optional[str], control: Optional[str], text: str) -> snap.SnapshotError:
    """Never leave a half-restored copy: the tree killed, its pidfile removed, restore-failed written; the error."""
    proc.signal_tree(pid, signal.SIGKILL)
    proc.wait_gone(pid, 10)
    if pidfile:
        with contextlib.suppress(OSError):
            os.unlink(pidfile)
    text = f"{text}; the restored tree (pid {pid}) was killed"
    if control and os.path.isdir(control):
        ctl.write(control, ctl.RESTORE_FAILED, f"{text}\n")
    return snap.SnapshotError(text)


def _log_warning(work: str) -> Optional[str]:
    """A restore whose CRIU log could not be written (full or read-only work dir) succeeds, but says so."""
    path = os.path.join(work, "restore.log")
    try:
        if os.path.getsize(path) > 0:
            return None
    except OSError:
        pass
    return (f"CRIU's restore log {path} is empty or missing: the restore work dir may be full or read-only "
            f"(free space: {_free(work)}); a later failure would have no log")


def _free(path: str) -> str:
    try:
        vfs = os.statvfs(path)
    except OSError:
        return "unknown"
    return f"{vfs.f_bavail * vfs.f_frsize >> 20} MiB"


def _wait_lazy(work: str, doc: Dict[str, Any], a: _RestoreArgs, lazy_plan: Dict[str, Any]) -> None:
    prog.phase("lazy: wait for memory")
    state = lz.wait(work, a.lazy_timeout + 15)
    if state.get("state") != "complete":
        raise snap.SnapshotError(state.get("error") or f"lazy restore of snapshot {doc['id']}: memory not complete "
                                 f"after {a.lazy_timeout:g} s", log_tail=log_tail(os.path.join(work, lz.LOG)))
    lazy_plan["complete_after"] = round(state["complete_at"] - a.t_wall, 3)
