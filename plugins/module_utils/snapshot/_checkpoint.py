# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Checkpoint of a process tree, a workload or a container: the engine behind the checkpoint module.

Guarantee: a failed or interrupted checkpoint leaves the source running and no
published snapshot (staging is removed, or left for ``cleanup`` when the
checkpointing process itself is killed).

``checkpoint`` refuses what it can before anything is touched (the store, the GPU
backend, io_uring, a lazily restored tree still loading), takes the target's lock
(``_snapshot.lock_target``) and the workload's quiesce (``_gpuhooks``), then runs
its phases under one undo stack (``_checkpoint_locked``): stage, stop and dump
(CUDA locked first), capture while stopped, resume, publish, end the source. The
guardian (``_guardian``) covers the one case the stack cannot: this process dying.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _checksums as ck
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _appsteps as aps
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _appprofile as app
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _control as ctl
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cuda as cu
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cudaabi as cuabi
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _gpuhooks as gh
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _guardian as grd
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _iouring as iou
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _tcp as tcpm
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _files as cimg
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _lazy as lz
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _mountns as mns
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _progress as prog
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _workload as wl
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._gpunode import GpuNode
from ansible_collections.warmstart.snapshot.plugins.module_utils.node._node import describe_node
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu import CriuError
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._storeapi import Staging, Store
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import CriuOptions, dump, read_stats


def checkpoint(store: Store, target: snap.Target, name: str, labels: Dict[str, str], options: CriuOptions,
               leave_running: bool = True, wait_ready: bool = False, ready_timeout: Optional[float] = None,
               criu_path: Optional[str] = None, pod: Optional[Dict[str, Any]] = None, cuda: str = "auto",
               cuda_lock_timeout: float = gh.DEFAULT_LOCK_TIMEOUT, gpu_node: Optional[GpuNode] = None,
               check_mode: bool = False) -> Dict[str, Any]:
    """Snapshot ``target`` into ``store``; ``cuda`` (auto | required | off) decides about GPU state (see CudaPlan).

    ``check_mode``: what the checkpoint would refuse before touching anything (the store, the GPU
    backend, the tree's CUDA processes), and ``{"cuda", "msg"}``; nothing is created or stopped.

    ``target.profile`` (an application profile): ``wait_ready`` waits for its ready probe, its quiesce steps
    run before the dump and its resume steps after (``_appprofile``); ``ready_timeout`` defaults to its ready
    timeout (else 300 s).
    """
    if check_mode:
        return _would_checkpoint(store, target, name, cuda, cuda_lock_timeout, gpu_node)
    timings: Dict[str, float] = {}
    t_start = time.monotonic()
    mf.check_name(name)
    labels = mf.check_labels(labels)
    criu = snap.need_criu(criu_path)
    gpu_node = gpu_node or GpuNode()
    plan = gh.cuda_plan(cuda, gpu_node, cuda_lock_timeout)
    if ready_timeout is None:
        ready_timeout = target.profile.ready.timeout if target.profile else 300.0
    if wait_ready:
        _wait_ready(target, ready_timeout, timings)
    proc.check_target(target.pid)
    gh.find_cuda(plan, target.pid)
    what = _checkpoint_what(target)
    _refuse_io_uring(what, target.pid)
    streaming = lz.active(proc.descendants(target.pid))
    if streaming:
        raise snap.SnapshotError(f"{what}: pid {streaming['pid']} was restored lazily and its memory is still loading "
                                 f"(work dir {streaming.get('work_dir')}); a dump now would miss the pages not yet in - "
                                 "checkpoint it once the lazy restore is complete (restore with lazy_wait to wait for it)")
    lock = snap.lock_target(target.pid, what)
    profiled: Dict[str, Any] = {}
    try:
        with app.quiesced(target, what, leave_running, timings, profiled):
            gh.quiesce(plan, target, ready_timeout, timings)
            result = _checkpoint_replanned(store, target, name, labels, options, leave_running, criu, timings,
                                           t_start, pod, plan, gpu_node)
        if profiled:
            result["app_profile"] = profiled
        return result
    finally:
        os.close(lock)


# CRIU's words when the node's mount table changed between the plan of what to dump of a mount namespace and the
# dump (a container or a network namespace came or went meanwhile): the dump is planned again.
MOUNT_RACE = re.compile(r"mnt: No parent found for mountpoint|mnt: Can't find parent|mnt: Unable to find mount")
MOUNT_RACE_TRIES = 3


def _checkpoint_replanned(store: Store, target: snap.Target, name: str, labels: Dict[str, str],
                          options: CriuOptions, leave_running: bool, criu: str, timings: Dict[str, float],
                          t_start: float, pod: Optional[Dict[str, Any]], plan: gh.CudaPlan,
                          gpu_node: Optional[GpuNode]) -> Dict[str, Any]:
    """``_checkpoint_locked``, planned and dumped again when the node's mounts changed under the dump.

    Only a tree that nothing else was told about is tried again: no GPU state (its rollback is no free retry)
    and no checkpoint hooks (the workload heard ``failed`` and went on). A failed try has rolled back: the source
    runs, nothing was staged."""
    for attempt in range(1, MOUNT_RACE_TRIES + 1):
        try:
            return _checkpoint_locked(store, target, name, labels, options, leave_running, criu, timings, t_start,
                                      pod, plan, gpu_node)
        except CriuError as exc:
            said = f"{exc} {exc.log_tail or ''}"
            if attempt == MOUNT_RACE_TRIES or plan.used or plan.hooks or not MOUNT_RACE.search(said):
                raise
            prog.phase(f"the node's mounts changed during the dump: planning it again (try {attempt + 1})")
            timings["mount_race_retries"] = attempt
    raise AssertionError("unreachable")  # pragma: no cover


def _refuse_io_uring(what: str, pid: int) -> None:
    """Refuse a tree holding an io_uring instance before anything is touched (CRIU would fail mid-dump)."""
    problems = iou.problems(proc.descendants(pid))
    if problems:
        raise snap.SnapshotError(f"{what}: cannot be checkpointed while it uses io_uring; nothing was touched",
                                 reasons=problems)


def _would_checkpoint(store: Store, target: snap.Target, name: str, cuda: str, lock_timeout: float,
                      gpu_node: Optional[GpuNode]) -> Dict[str, Any]:
    """Check mode: the refusals a checkpoint would meet before touching anything; creates nothing."""
    store.check_usable()
    plan = gh.cuda_plan(cuda, gpu_node or GpuNode(), lock_timeout)
    gh.find_cuda(plan, target.pid)
    what = f"container {target.name} (workload pid {target.pid})" if target.capture else f"pid {target.pid}"
    _refuse_io_uring(what, target.pid)
    quiesce = f", quiesced by profile {target.profile.name} ({len(target.profile.quiesce)} step(s))" \
        if target.profile else ""
    return {"cuda": plan.result(),
            "msg": f"would snapshot {what} as {name}" + (" with its GPU state" if plan.used else "") + quiesce}


def _checkpoint_what(target: snap.Target) -> str:
    """The target as error messages name it."""
    if target.capture:
        return f"container {target.name}"
    return f"workload {target.workload}" if target.workload else f"pid {target.pid}"


def _wait_ready(target: snap.Target, timeout: float, timings: Dict[str, float]) -> None:
    """Wait until the target is warm: its profile's ready probe passes, else it says ready-for-snapshot in its
    control dir."""
    if target.profile:
        prog.phase(f"profile {target.profile.name}: wait until ready")
        try:
            timings["wait_ready"] = aps.wait_probe(target.profile.ready, target.pid,
                                                   f"wait_ready: profile {target.profile.name}", timeout)
        except aps.AppStepError as exc:
            raise snap.SnapshotError(f"{exc}; nothing was touched") from None
        return
    if not target.control_dir:
        raise snap.SnapshotError(f"wait_ready: pid {target.pid} has no SNAPSHOT_CONTROL_DIR to signal readiness in")
    prog.phase("wait for ready-for-snapshot")
    try:
        timings["wait_ready"] = ctl.wait_for(target.control_dir, ctl.READY, timeout, alive=target.pid)
    except (TimeoutError, ProcessLookupError) as exc:
        raise snap.SnapshotError(f"wait_ready: {exc}") from None


def _copy_workload_files(target: snap.Target, dest: str) -> List[Dict[str, Any]]:
    """Copy the workload's own files (logs, control dir) as they are at dump time."""
    p = wl.paths(target.workloads_root, target.workload or "")
    out = []
    for rel in ck.walk_files(p["dir"]):
        if rel in ("pid", "pid.tmp") or rel.endswith(".tmp") or ".tmp-" in rel or safefs.is_temp(rel):
            continue
        src = os.path.join(p["dir"], rel)
        dst = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(dst), mode=0o700, exist_ok=True)
        shutil.copyfile(src, dst)
        out.append({"path": rel, "mode": os.stat(src).st_mode & 0o777})
    return out


@dataclass
class _Job:
    """One checkpoint in progress: its staging, its manifest, and what the target's manifest entry is made of."""

    staging: Staging
    manifest: Dict[str, Any]
    source: Dict[str, Any]
    tdir: str
    cmdline: List[str] = field(default_factory=list)
    ns_chain: List[int] = field(default_factory=list)
    hashed: Dict[str, Any] = field(default_factory=dict)      # what the StreamingHasher hashed during the dump
    files: List[Dict[str, Any]] = field(default_factory=list)  # the workload's own files
    in_use: Dict[str, int] = field(default_factory=dict)       # files the tree maps, as CRIU saw them
    trimmed: List[Dict[str, Any]] = field(default_factory=list)  # workload files cut back to the dump's size
    extra: Dict[str, Any] = field(default_factory=dict)        # what the target kind captured while stopped
    mount_ns: Optional[Dict[str, Any]] = None                  # the tree's own mount namespace (_mountns)

    @property
    def images(self) -> str:
        return os.path.join(self.tdir, "criu")


def _checkpoint_locked(store: Store, target: snap.Target, name: str, labels: Dict[str, str], options: CriuOptions,
                       leave_running: bool, criu: str, timings: Dict[str, float], t_start: float,
                       pod: Optional[Dict[str, Any]] = None, plan: Optional[gh.CudaPlan] = None,
                       gpu_node: Optional[GpuNode] = None) -> Dict[str, Any]:
    """The checkpoint proper, under the target's lock.

    Rollback: each step that changes something pushes its undo onto ``undo`` as soon as it succeeded.
    Any failure before the snapshot is published unwinds them in reverse: the stopped tree gets its
    network back and is resumed (SIGCONT), then its CUDA processes are restored and unlocked (they
    need their own restore thread running), the guardian is let go (it keeps resuming a tree that
    CRIU lets go of late), the staging dir is removed and the workload's hooks are told ``failed``.
    Only a published snapshot clears the stack (``pop_all``): the source is never ended before.
    """
    plan = plan or gh.CudaPlan("off", reason="cuda: off")
    notes: List[str] = []  # what the CUDA rollback says, added to the error
    try:
        with contextlib.ExitStack() as undo:
            undo.push(_hooks_failed(plan, target))
            job = _stage(store, target, name, labels, criu, pod, plan, gpu_node or GpuNode(), undo)
            guardian = grd.start_guardian(target.pid, (lambda: cu.rollback(plan.pids, plan.backend))
                                          if plan.used else None)
            undo.callback(os.close, guardian)
            stopped = undo.enter_context(contextlib.ExitStack())  # tree stopped, CUDA locked: emptied by _resume
            _stop_and_dump(job, target, options, criu, plan, timings, stopped, notes)
            _capture_stopped(job, target, timings)
            if leave_running:
                _resume(target, plan, timings, stopped)
            _publish(job, target, options, timings, t_start)
            undo.pop_all()
    except BaseException as exc:
        better = _rollback_error(exc, notes)
        if better is None:
            raise
        raise better from None
    if not leave_running:
        _end_source(target)
    grd.release_guardian(guardian)
    timings["total"] = time.monotonic() - t_start
    return _checkpoint_result(job, store, target, leave_running, timings, plan)


def _hooks_failed(plan: gh.CudaPlan, target: snap.Target) -> Callable[..., bool]:
    """An exit callback: on failure, the workload's pre-checkpoint hooks hear ``failed`` and why."""
    def tell(exc_type: Any, exc: Optional[BaseException], tb: Any) -> bool:
        del exc_type, tb
        gh.finish_hooks(plan, target, "failed", str(exc))
        return False
    return tell


def _rollback_error(exc: BaseException, notes: List[str]) -> Optional[BaseException]:
    """The error a failed checkpoint raises: a CUDA failure as a SnapshotError, with what the rollback did."""
    note = "".join(notes)
    if isinstance(exc, cuabi.CudaError):
        return snap.SnapshotError(f"cuda: {exc}{note}")
    if note and isinstance(exc, (CriuError, snap.SnapshotError)):
        return snap.SnapshotError(f"{exc}{note}", reasons=exc.reasons, log_tail=exc.log_tail, **exc.details)
    return None


def _stage(store: Store, target: snap.Target, name: str, labels: Dict[str, str], criu: str,
           pod: Optional[Dict[str, Any]], plan: gh.CudaPlan, gpu_node: GpuNode, undo: contextlib.ExitStack) -> _Job:
    """The manifest and the staging dir (its removal pushed onto ``undo``); what the target is, while it runs."""
    source = describe_node(criu)
    snapshot_id = mf.new_id()
    manifest = mf.new_manifest(snapshot_id, name, labels, source)
    if plan.used:
        manifest["gpu"] = gh.gpu_section(plan, gpu_node)
    if plan.stages:
        manifest["hooks"] = {"stages": list(plan.stages)}  # the copy's restore_pre / restore_post
    staging = store.stage(snapshot_id)
    undo.callback(staging.abort)
    if pod:
        manifest["pod"] = {k: v for k, v in pod.items() if v is not None}
    job = _Job(staging, manifest, source, os.path.join(staging.path, "containers", target.name))
    os.makedirs(job.images, mode=0o700)
    job.cmdline = proc.cmdline(target.pid)
    job.ns_chain = proc.ns_pids(target.pid)
    return job


def _stop_and_dump(job: _Job, target: snap.Target, options: CriuOptions, criu: str, plan: gh.CudaPlan,
                   timings: Dict[str, float], stopped: contextlib.ExitStack, notes: List[str]) -> None:
    """Lock and checkpoint the CUDA processes, then CRIU's dump, which leaves the tree stopped.

    Onto ``stopped``: the CUDA rollback once they are locked, then the tree's resume (before the
    dump: a failed dump may leave it stopped); unwound in reverse, the tree runs before CUDA is restored.
    """
    dump_options = target.capture.criu_options(options) if target.capture else _mount_options(job, target, options)
    if plan.used:
        prog.phase("cuda checkpoint")
        try:
            timings.update(cu.lock_and_checkpoint(plan.pids, plan.lock_timeout_ms, plan.backend))
        except cuabi.CudaError as exc:  # lock_and_checkpoint rolled back what it touched
            raise snap.SnapshotError(f"cuda: {exc}") from None
        stopped.callback(_rollback_cuda, plan, notes)
    stopped.callback(_resume_tree, target, True)
    gh.hook_stage(plan, target, "backup_pre", timings)  # locked, not yet frozen
    t0 = time.monotonic()
    hasher = ck.StreamingHasher(job.images, os.path.relpath(job.images, job.staging.path))
    prog.phase("dump")
    hasher.start()
    try:
        with gh.criu_plugins_off(plan.used):
            dump(criu, target.pid, job.images, dump_options, leave_stopped=True)
    finally:
        job.hashed = hasher.finish()
    timings["dump"] = time.monotonic() - t0


def _mount_options(job: _Job, target: snap.Target, options: CriuOptions) -> CriuOptions:
    """A process tree in a mount namespace of its own (a workload's): what CRIU dumps of it (``_mountns``)."""
    try:
        mounts = mns.plan(target.pid, proc.descendants(target.pid))
    except mns.MountNsError as exc:
        raise snap.SnapshotError(f"{_checkpoint_what(target)}: {exc}; nothing was touched") from None
    if mounts is None:
        return options
    job.mount_ns = mounts.record()
    return mounts.criu_options(options)


def _rollback_cuda(plan: gh.CudaPlan, notes: List[str]) -> None:
    """Undo: the CUDA processes restored and unlocked after a failure (the tree runs again first)."""
    undone, problems = cu.rollback(plan.pids, plan.backend)
    notes.append(f"; rolling back CUDA failed, these may stay locked: {'; '.join(problems)}" if problems else
                 f"; CUDA pid(s) {', '.join(map(str, undone or plan.pids))} restored and unlocked, running again")


def _resume_tree(target: snap.Target, failed: bool) -> None:
    """The stopped tree runs again: the target kind undoes what the dump left (network lock), then SIGCONT.

    After a failure (``failed``) the resume never hides the error: the network unlock is best effort.
    """
    if target.capture:
        if failed:
            with contextlib.suppress(WarmstartError, OSError):
                target.capture.before_resume()
        else:
            target.capture.before_resume()
    proc.signal_tree(target.pid, signal.SIGCONT)


def _capture_stopped(job: _Job, target: snap.Target, timings: Dict[str, float]) -> None:
    """What must match the memory image, taken while the tree is still stopped (every thread of it)."""
    _hold_stopped(target)
    if target.capture:
        t0 = time.monotonic()
        job.extra = target.capture.while_stopped(job.tdir)
        timings["rootfs"] = time.monotonic() - t0
        return
    own_dir = wl.paths(target.workloads_root, target.workload)["dir"] + "/" if target.workload else None
    if target.workload:
        job.files = _copy_workload_files(target, os.path.join(job.tdir, "files"))
        _match_dump(job, target)
    # Sizes as CRIU saw them: taken while the tree is still stopped (a running
    # source may append to a file between any earlier look and the freeze).
    job.in_use = proc.files_in_use(target.pid, exclude=(own_dir,) if own_dir else ())


STOP_SETTLE = 2.0  # seconds a thread may take to stop after the dump before it gets a SIGSTOP of ours


def _hold_stopped(target: snap.Target) -> None:
    """Every thread of the tree is stopped before its files are copied.

    CRIU leaves the tree stopped by a SIGSTOP it queues before it detaches; a thread still runs until it takes
    that signal. One still running after STOP_SETTLE s gets a SIGSTOP of ours; one that never stops fails the
    checkpoint (the rollback resumes the tree)."""
    end, nudged = time.monotonic() + STOP_SETTLE, False
    while True:
        running = proc.unstopped(target.pid)
        if not running:
            return
        if time.monotonic() >= end:
            if nudged:
                raise snap.SnapshotError(
                    f"{_checkpoint_what(target)}: thread(s) {', '.join(map(str, running))} kept running after the "
                    "dump, so its files cannot be copied as the dump saw them; nothing was published and the tree "
                    "runs on - checkpoint it again (a thread stuck in uninterruptible I/O does not stop)")
            proc.signal_tree(target.pid, signal.SIGSTOP)
            end, nudged = time.monotonic() + STOP_SETTLE, True
        time.sleep(0.01)


def _match_dump(job: _Job, target: snap.Target) -> None:
    """The copied workload files have the sizes CRIU recorded, or the snapshot could not be restored.

    A file that grew only by appends after the dump (opened ``O_APPEND``; the source ran on for a moment
    before its stop took hold) is cut back to the recorded size: the bytes past it were written by code the
    memory image never ran. Any other difference fails the checkpoint, naming each file."""
    try:
        recorded = cimg.regular_files(job.images)
    except Exception as exc:  # pylint: disable=broad-except  # pycriu's and protobuf's decoder errors
        raise snap.SnapshotError(f"{_checkpoint_what(target)}: cannot read the dump's files.img ({exc}); nothing was "
                                 "published") from None
    wdir = wl.paths(target.workloads_root, target.workload or "")["dir"]
    real = os.path.realpath(wdir)  # CRIU names a file by the path its process resolved
    problems = []
    for item in job.files:
        seen = recorded.get(os.path.join(wdir, item["path"])) or recorded.get(os.path.join(real, item["path"]))
        if seen is None:
            continue
        copy = os.path.join(job.tdir, "files", item["path"])
        size = os.stat(copy).st_size
        if size == seen.size:
            continue
        if size > seen.size and seen.flags & os.O_APPEND:
            os.truncate(copy, seen.size)
            job.trimmed.append({"path": item["path"], "bytes": size - seen.size})
            continue
        problems.append(f"{item['path']}: {seen.size} bytes at the dump, {size} when copied")
    if problems:
        raise snap.SnapshotError(
            f"{_checkpoint_what(target)}: workload files changed between the dump and their copy, so the "
            f"snapshot could not be restored ({'; '.join(problems)}); nothing was published and the source runs on - "
            "checkpoint it again", reasons=problems)


def _resume(target: snap.Target, plan: gh.CudaPlan, timings: Dict[str, float], stopped: contextlib.ExitStack) -> None:
    """``leave_running``: the source runs on before the checksums; its CUDA processes get their GPUs back.

    The rollback on ``stopped`` is dropped only once everything is back (a failed CUDA resume rolls back).
    """
    _resume_tree(target, False)
    gh.hook_stage(plan, target, "backup_post", timings)  # running again, still locked
    gh.hook_stage(plan, target, "restore_pre", timings)
    if plan.used:  # after SIGCONT: the driver's restore thread in each process must run
        t0 = time.monotonic()
        prog.phase("cuda resume")
        cu.restore_and_unlock(plan.pids, None, plan.backend)
        timings["cuda_resume"] = time.monotonic() - t0
    stopped.pop_all()
    gh.hook_stage(plan, target, "restore_post", timings)  # unlocked: a failure here leaves nothing locked
    gh.finish_hooks(plan, target, "ok")  # unlock_post


def _publish(job: _Job, target: snap.Target, options: CriuOptions, timings: Dict[str, float], t_start: float) -> None:
    """Checksums, the target's manifest entry, then the publish (by rename): the snapshot exists from here on."""
    t0 = time.monotonic()
    prog.phase("checksum")
    manifest = job.manifest
    manifest["files"] = ck.record_files(job.staging.path, progress=prog.add, known=job.hashed)
    timings["checksum"] = time.monotonic() - t0
    manifest["size"] = sum(f["size"] for f in manifest["files"])
    manifest["targets"].append(_target_entry(job, target, options))
    timings["total"] = time.monotonic() - t_start
    manifest["timings"] = {k: round(v, 3) for k, v in timings.items()}
    t0 = time.monotonic()
    job.staging.publish(manifest)
    timings["publish"] = time.monotonic() - t0


def _target_entry(job: _Job, target: snap.Target, options: CriuOptions) -> Dict[str, Any]:
    """The manifest's entry of the target: what it was, what CRIU dumped with which options, where."""
    entry = {
        "name": target.name,
        "kind": "process",
        "pid": target.pid,
        "ns_pid": job.ns_chain[-1],
        "pid_namespace": len(job.ns_chain) > 1 and job.ns_chain[-1] == 1,
        "cmdline": job.cmdline,
        "workload": target.workload,
        "workloads_root": target.workloads_root if target.workload else None,
        "workload_files": job.files,
        "control_dir": target.control_dir,
        "files_in_use": job.in_use,
        "criu": {"version": job.source.get("criu_version"), "options": options.as_dict()},
        "stats": read_stats(os.path.join(job.images, "stats-dump")),
        "path": f"containers/{target.name}",
    }
    if job.mount_ns is not None:
        entry["mount_namespace"] = job.mount_ns
    if job.trimmed:  # appended to after the dump, before the stop took hold: cut back (_match_dump)
        entry["workload_files_trimmed"] = job.trimmed
    if options.tcp == "established":  # which connections have both ends in the snapshot (a restore decides on it)
        conns = tcpm.listed(job.images)
        if conns:
            entry["tcp_connections"] = conns
    if target.profile is not None:  # what releases the copy; quiesced: what the source had done before the dump
        entry["app_profile"] = {**target.profile.record(), "quiesced": [s.describe() for s in target.profile.quiesce]}
    if target.capture:
        entry.update(target.capture.entry())
        entry.update(job.extra)
    return entry


def _end_source(target: snap.Target) -> None:
    """``leave_running: false``, once the snapshot is published: the source is killed and its pidfile removed."""
    os.kill(target.pid, signal.SIGKILL)
    proc.wait_gone(target.pid, 10)
    if target.workload:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(wl.paths(target.workloads_root, target.workload)["pidfile"])


def _checkpoint_result(job: _Job, store: Store, target: snap.Target, leave_running: bool, timings: Dict[str, float],
                       plan: gh.CudaPlan) -> Dict[str, Any]:
    manifest = job.manifest
    volumes = manifest["targets"][0].get("volumes")
    return {
        **({"volumes": volumes} if volumes else {}),
        "id": manifest["id"],
        "name": manifest["name"],
        "labels": manifest["labels"],
        "size": manifest["size"],
        "path": store.snapshot_dir(manifest["id"]),
        "pid": target.pid,
        "source_running": leave_running,
        "timings": {k: round(v, 3) for k, v in timings.items()},
        "criu_stats": manifest["targets"][0]["stats"],
        "source_node": {k: v for k, v in job.source.items() if k != "cpu_flags"},
        "pod": manifest.get("pod"),
        "cuda": plan.result(),
        "gpu": manifest.get("gpu"),
    }
