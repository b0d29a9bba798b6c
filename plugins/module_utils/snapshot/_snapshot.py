# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Checkpoint and restore of processes: the engine behind the modules.

Guarantees:
- a failed or interrupted checkpoint leaves the source running and no
  published snapshot (staging is removed, or left for ``cleanup`` when the
  checkpointing process itself is killed);
- a restore touches no process before checksums and compatibility pass.

GPU state (option ``cuda``): warmstart itself locks and checkpoints the CUDA
processes of the tree through the driver API (``_cuda``) before the CRIU dump,
and restores and unlocks them after the CRIU restore. CRIU's own
``cuda_plugin.so`` (in the bundle's plugin dir, loaded by every ``criu swrk``)
must not act too: whenever warmstart handles CUDA, CRIU runs with
``CRIU_LIBS_DIR`` pointing at an empty directory, so it loads no plugin and
the images do not ask for one at restore. With ``cuda: off`` warmstart leaves
CRIU as it is.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Protocol, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _control as ctl
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cuda as cu
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _digest as dg
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _gpuplace as gpl
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _lazy as lz
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _mountns as mns
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _overlap as ov
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _pageranges as pr
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _iouring as iou
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _progress as prog
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _restorer as rst
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _storecopy as sc
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _tcp as tcpm
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _workload as wl
from ansible_collections.warmstart.snapshot.plugins.module_utils.store.compression import _zstd as zs
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._gpunode import GpuNode
from ansible_collections.warmstart.snapshot.plugins.module_utils.node._compat import (
    CUDA_MODES,
    describe_node,
    gpu_incompatibilities,
    incompatibilities,
)
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu import CriuError, find_criu
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._gpu import cuda_version_string
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._storeapi import Staging, Store
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._tls import loopback
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import CriuOptions, dump, log_tail, read_stats
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import restore as criu_restore

DEFAULT_RESTORE_ROOT = "/var/lib/warmstart/restore"


class SnapshotError(WarmstartError):
    """A checkpoint or restore that cannot go ahead; ``reasons`` lists every cause."""


class Capture(Protocol):
    """What a target kind other than a plain process adds to a checkpoint (see _container)."""

    def criu_options(self, base: CriuOptions) -> CriuOptions:
        """``base`` with what dumping this kind adds (root, external namespaces and mounts, ...); may refuse
        (SnapshotError) before CRIU touches anything."""

    def while_stopped(self, target_dir: str) -> Dict[str, Any]:
        """Capture what must match the memory image (runs while the tree is stopped); entry fields."""

    def entry(self) -> Dict[str, Any]:
        """Manifest fields of this target."""

    def before_resume(self) -> None:
        """Undo what the dump left for a stopped tree that is now resumed (network lock)."""


@dataclass
class Target:
    pid: int
    name: str
    workload: Optional[str] = None
    workloads_root: str = wl.DEFAULT_ROOT
    control_dir: Optional[str] = None
    capture: Optional[Capture] = None


def resolve_target(pid: Optional[int], pidfile: Optional[str], workload: Optional[str],
                   workloads_root: str = wl.DEFAULT_ROOT) -> Target:
    if workload:
        found = wl.running_pid(workloads_root, workload)
        if found is None:
            raise proc.TargetError(f"workload {workload} is not running (no live pid in {wl.paths(workloads_root, workload)['pidfile']})")
        return Target(found, workload, workload, workloads_root, wl.paths(workloads_root, workload)["control"])
    if pidfile:
        found = proc.read_pidfile(pidfile)
        if found is None:
            raise proc.TargetError(f"pidfile {pidfile} does not exist")
        pid = found
    if pid is None:
        raise proc.TargetError("no target: give pid, pidfile or workload")
    proc.check_target(pid)
    return Target(pid, "process", None, workloads_root, ctl.process_control_dir(pid))


# --- CUDA: which processes hold GPU state, and what to do about it -------------

CRIU_LIBS_DIR = "CRIU_LIBS_DIR"


@dataclass
class CudaPlan:
    """The ``cuda`` decision of one checkpoint: the backend, the CUDA pids of the tree, and why."""

    mode: str = "auto"
    backend: Optional[cu.Backend] = None
    reason: str = ""
    pids: List[int] = field(default_factory=list)
    lock_timeout_ms: int = cu.DEFAULT_LOCK_TIMEOUT_MS
    request: Optional[str] = None   # the checkpoint-requested id while the workload waits for checkpoint-done
    hooks: bool = False             # the workload's pre-checkpoint hooks were asked
    stages: List[str] = field(default_factory=list)  # the lifecycle stages the workload registered (ctl.STAGES)
    hook_timeout: float = ctl.STAGE_TIMEOUT          # seconds each stage's callbacks may take
    node: Optional[GpuNode] = None                   # the node's accelerator (names it in refusals)

    @property
    def used(self) -> bool:
        return bool(self.pids) and self.backend is not None

    def result(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"mode": self.mode, "used": self.used, "reason": self.reason}
        if self.used:
            out.update(pids=list(self.pids), backend=self.backend.describe() if self.backend else None,
                       hooks=self.hooks)
        return out


def cuda_plan(mode: str, gpu_node: GpuNode, lock_timeout_ms: int = cu.DEFAULT_LOCK_TIMEOUT_MS) -> CudaPlan:
    """Step 1, before anything is touched: is there a CUDA checkpoint backend? ``required`` without one fails here."""
    if mode not in CUDA_MODES:
        raise SnapshotError(f"cuda: {mode!r} is not one of {', '.join(CUDA_MODES)}")
    if lock_timeout_ms < 0:
        raise SnapshotError(f"cuda_lock_timeout: {lock_timeout_ms} ms is negative (0 waits without limit)")
    if mode == "off":
        return CudaPlan(mode, reason="cuda: off - GPU state is not checkpointed by warmstart", lock_timeout_ms=lock_timeout_ms)
    backend, why = gpu_node.backend()
    if backend is None:
        if mode == "required":
            needs = f" (needs {cu.MIN_DRIVER})" if gpu_node.accelerator == "cuda" else ""
            raise SnapshotError(f"{gpu_node.asked(mode)}, but this node cannot checkpoint {gpu_node.device_word} "
                                f"state: {why}{needs}; nothing was touched")
        return CudaPlan(mode, reason=f"no CUDA checkpoint support on this node: {why}", lock_timeout_ms=lock_timeout_ms)
    return CudaPlan(mode, backend, reason=backend.describe(), lock_timeout_ms=lock_timeout_ms, node=gpu_node)


def find_cuda(plan: CudaPlan, root: int) -> None:
    """Step 2, after wait_ready and before anything is touched: the CUDA processes of the tree of ``root``."""
    if plan.backend is None:
        return
    node = plan.node or GpuNode()
    tree = proc.descendants(root)
    try:
        plan.pids = cu.find_cuda_pids(tree, plan.backend)
    except cu.CudaError as exc:
        raise SnapshotError(f"{node.asked(plan.mode)}: cannot tell which processes of pid {root}'s tree use "
                            f"{node.process_word}: {exc}; nothing was touched") from None
    shown = ", ".join(map(str, tree[:16])) + (f" and {len(tree) - 16} more" if len(tree) > 16 else "")
    shared = gpl.shared_memory_problems(plan.pids)  # before anything is locked: see _gpuplace
    if shared:
        raise SnapshotError(f"cuda: the CUDA processes of pid {root}'s tree share GPU memory; nothing was touched",
                            reasons=shared)
    if plan.pids:
        plan.reason = f"CUDA process(es) {', '.join(map(str, plan.pids))} checkpointed through {plan.backend.describe()}"
    elif plan.mode == "required":
        kind, absent = node.process_word, node.absent()
        article = "an" if kind[:1] in "AEIOU" else "a"
        raise SnapshotError(f"{node.asked(plan.mode)}, but pid {root} is not {article} {kind} process (no process of "
                            f"its tree - {shown} - has {kind} state){'; ' + absent if absent else ''}; "
                            "nothing was touched")
    else:
        plan.reason = f"no CUDA process in the tree ({shown})"


def _gpu_section(plan: CudaPlan, gpu_node: GpuNode) -> Dict[str, Any]:
    """The manifest's ``gpu`` section: driver, CUDA pids (host and namespace) and the source node's GPUs."""
    gpus, why = gpu_node.gpus()
    pids = []
    for pid in plan.pids:
        try:
            chain = proc.ns_pids(pid)
        except OSError:
            chain = [pid]
        pids.append({"pid": pid, "ns_pid": chain[-1]})
    version = plan.backend.driver_version() if plan.backend else None
    return {
        "backend": plan.backend.describe() if plan.backend else None,
        "cuda_version": version,
        "cuda_version_text": cuda_version_string(version) if version else None,
        "driver_version": next((g.get("driver_version") for g in gpus if g.get("driver_version")), None),
        "pids": pids,
        "gpus": [{"index": g.get("index"), "uuid": g.get("uuid"), "name": g.get("name"),
                  "memory_total": g.get("memory_total")} for g in gpus],
        "inventory_error": why,
    }


@contextlib.contextmanager
def criu_plugins_off(active: bool = True) -> Iterator[None]:
    """CRIU started inside loads no plugin (``CRIU_LIBS_DIR`` = an empty directory): its cuda_plugin stays out."""
    if not active:
        yield
        return
    empty = tempfile.mkdtemp(prefix="warmstart-criu-plugins-off-")
    old = os.environ.get(CRIU_LIBS_DIR)
    os.environ[CRIU_LIBS_DIR] = empty
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(CRIU_LIBS_DIR, None)
        else:
            os.environ[CRIU_LIBS_DIR] = old
        shutil.rmtree(empty, ignore_errors=True)


def _quiesce(plan: CudaPlan, target: "Target", timeout: float, timings: Dict[str, float]) -> None:
    """Stage ``lock_pre``: a workload with hooks quiesces (checkpoint-requested) before anything is locked.

    Asked whether or not the tree holds accelerator state (the lock is then an empty step); the stages it
    registered are kept in ``plan.stages`` for ``hook_stage`` and the manifest (its restore's stages).
    """
    stages = ctl.hook_stages(target.control_dir)
    if not target.control_dir or not stages:
        return
    prog.phase("quiesce")
    try:
        answer = ctl.request_checkpoint(target.control_dir, timeout, alive=target.pid)
    except (ctl.CheckpointRefused, TimeoutError, ProcessLookupError) as exc:
        raise SnapshotError(f"checkpoint hooks: lock_pre: {exc}") from None
    plan.request = answer["request"]
    plan.hooks = True
    plan.stages = stages
    plan.hook_timeout = timeout
    timings["quiesce"] = float(answer.get("waited") or 0.0)


def hook_stage(plan: Optional[CudaPlan], target: "Target", stage: str, timings: Dict[str, float]) -> None:
    """Run the workload's ``stage`` callbacks (backup_pre, backup_post, restore_pre, restore_post) in the source.

    Nothing when the workload did not register the stage. A callback that raises or hangs past the
    timeout raises SnapshotError naming the stage and the callback: the caller's undo stack rolls back.
    """
    if plan is None or plan.request is None or stage not in plan.stages or not target.control_dir:
        return
    try:
        timings[f"hook_{stage}"] = ctl.run_stage(target.control_dir, stage, plan.request, plan.hook_timeout,
                                                 alive=target.pid)
    except ctl.StageFailed as exc:
        raise SnapshotError(f"checkpoint hooks: {stage}: {exc}; rolled back, the source keeps running") from None


def copy_stage(control: Optional[str], doc: Dict[str, Any], stage: str, pid: int, ns_pid: Optional[int],
               timings: Dict[str, float]) -> None:
    """Run a restored copy's ``stage`` callbacks (restore_pre / restore_post) when the snapshot's workload had them.

    Raises ctl.StageFailed (the stage and callback named); the caller kills the copy and writes restore-failed.
    """
    stages = (doc.get("hooks") or {}).get("stages") or [] if isinstance(doc.get("hooks"), dict) else []
    if not control or stage not in stages or not os.path.isdir(control):
        return
    extra = {"copy": "1", "snapshot": str(doc["id"]), "host_pid": str(pid)}
    if ns_pid is not None:
        extra["pid"] = str(ns_pid)
    timings[f"hook_{stage}"] = ctl.run_stage(control, stage, f"restore-{doc['id']}", ctl.STAGE_TIMEOUT,
                                             alive=pid, extra=extra)


def _finish_hooks(plan: Optional[CudaPlan], target: "Target", result: str, detail: str = "") -> None:
    if plan is None or plan.request is None or not target.control_dir:
        return
    try:
        ctl.finish_checkpoint(target.control_dir, plan.request, result, detail)
    except OSError:
        pass
    plan.request = None


# --- the guardian: resumes a stopped source if we die mid-checkpoint ------

GUARDIAN_DONE = b"done"
GUARDIAN_GRACE = 5.0  # seconds the tree must stay untraced before the guardian leaves


def _start_guardian(pid: int, on_abandon: Optional[Callable[[], Any]] = None) -> int:
    """Fork a detached watcher; returns the write end of its pipe.

    ``_release_guardian`` (the source is resumed or ended) lets it go at once.
    When the pipe closes without that (this process was killed or failed), the
    watcher waits until CRIU has let go of the tree (no task has a tracer: while
    CRIU's parasite runs, traced tasks show as S/R, not only 't'), sends SIGCONT
    to every stopped task, and keeps doing so until the tree has stayed
    untraced for GUARDIAN_GRACE s, so the source is never left frozen - not even
    by a CRIU that finishes its dump after we died. Then it runs ``on_abandon``
    (the CUDA rollback: restore + unlock of the processes locked for the dump).
    """
    rfd, wfd = os.pipe()

    def watch() -> None:  # pragma: no cover - runs in the detached watcher
        said = b""
        while True:
            data = os.read(rfd, 4096)
            if not data:
                break
            said += data
        if GUARDIAN_DONE not in said:
            _guard(pid)
            if on_abandon is not None:
                on_abandon()

    proc.detach(watch, keep=(rfd,))
    os.close(rfd)
    return wfd


def _release_guardian(wfd: int) -> None:
    """The source is resumed or ended: the guardian has nothing left to do."""
    try:
        os.write(wfd, GUARDIAN_DONE)
    finally:
        os.close(wfd)


def _guard(pid: int) -> None:  # pragma: no cover - runs in the forked watcher
    end = time.monotonic() + 3600
    quiet_since: Optional[float] = None
    while time.monotonic() < end:
        tree = proc.descendants(pid)
        if any(_traced(p) for p in tree):
            quiet_since = None
        else:
            for p in tree:
                if _state(p) == "T":
                    try:
                        os.kill(p, signal.SIGCONT)
                    except OSError:
                        pass
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= GUARDIAN_GRACE:
                return
        time.sleep(0.1)


def _traced(pid: int) -> bool:
    try:
        return proc.status(pid).get("TracerPid", "0") not in ("0", "")
    except OSError:
        return False


def _state(pid: int) -> str:
    try:
        return proc.stat_fields(pid)[0]
    except (OSError, IndexError):
        return "X"


LOCK_DIR = "/run/warmstart/locks"


def lock_target(pid: int, what: str, lock_dir: str = LOCK_DIR) -> int:
    """Hold the checkpoint lock of process ``pid`` (its start time in the name: a reused PID is another target).

    A second checkpoint of the same tree while one runs is refused: never two
    dumps of one tree, never two half-snapshots. The lock goes with the fd
    (also when this process dies).
    """
    os.makedirs(lock_dir, mode=0o700, exist_ok=True)
    try:
        start = proc.stat_fields(pid)[19]
    except (OSError, IndexError):
        start = "0"
    try:
        return rst.hold(os.path.join(lock_dir, f"checkpoint-{pid}-{start}.lock"))
    except rst.Busy as holder:
        raise SnapshotError(f"{what}: another checkpoint of it is running (warmstart pid {holder}); "
                            "run one at a time") from None


def _copy_workload_files(target: Target, dest: str) -> List[Dict[str, Any]]:
    """Copy the workload's own files (logs, control dir) as they are at dump time."""
    p = wl.paths(target.workloads_root, target.workload or "")
    out = []
    for rel in st.walk_files(p["dir"]):
        if rel in ("pid", "pid.tmp") or rel.endswith(".tmp") or ".tmp-" in rel:
            continue
        src = os.path.join(p["dir"], rel)
        dst = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(dst), mode=0o700, exist_ok=True)
        shutil.copyfile(src, dst)
        out.append({"path": rel, "mode": os.stat(src).st_mode & 0o777})
    return out


def checkpoint(store: Store, target: Target, name: str, labels: Dict[str, str], options: CriuOptions,
               leave_running: bool = True, wait_ready: bool = False, ready_timeout: float = 300.0,
               criu_path: Optional[str] = None, pod: Optional[Dict[str, Any]] = None, cuda: str = "auto",
               cuda_lock_timeout: int = cu.DEFAULT_LOCK_TIMEOUT_MS, gpu_node: Optional[GpuNode] = None,
               check_mode: bool = False) -> Dict[str, Any]:
    """Snapshot ``target`` into ``store``; ``cuda`` (auto | required | off) decides about GPU state (see CudaPlan).

    ``check_mode``: what the checkpoint would refuse before touching anything (the store, the GPU
    backend, the tree's CUDA processes), and ``{"cuda", "msg"}``; nothing is created or stopped.
    """
    if check_mode:
        return _would_checkpoint(store, target, name, cuda, cuda_lock_timeout, gpu_node)
    timings: Dict[str, float] = {}
    t_start = time.monotonic()
    mf.check_name(name)
    labels = mf.check_labels(labels)
    criu = _need_criu(criu_path)
    gpu_node = gpu_node or GpuNode()
    plan = cuda_plan(cuda, gpu_node, cuda_lock_timeout)
    if wait_ready:
        _wait_ready(target, ready_timeout, timings)
    proc.check_target(target.pid)
    find_cuda(plan, target.pid)
    what = _checkpoint_what(target)
    _refuse_io_uring(what, target.pid)
    streaming = lz.active(proc.descendants(target.pid))
    if streaming:
        raise SnapshotError(f"{what}: pid {streaming['pid']} was restored lazily and its memory is still loading "
                            f"(work dir {streaming.get('work_dir')}); a dump now would miss the pages not yet in - "
                            "checkpoint it once the lazy restore is complete (restore with lazy_wait to wait for it)")
    lock = lock_target(target.pid, what)
    try:
        _quiesce(plan, target, ready_timeout, timings)
        return _checkpoint_locked(store, target, name, labels, options, leave_running, criu, timings, t_start, pod,
                                  plan, gpu_node)
    finally:
        os.close(lock)


def _refuse_io_uring(what: str, pid: int) -> None:
    """Refuse a tree holding an io_uring instance before anything is touched (CRIU would fail mid-dump)."""
    problems = iou.problems(proc.descendants(pid))
    if problems:
        raise SnapshotError(f"{what}: cannot be checkpointed while it uses io_uring; nothing was touched",
                            reasons=problems)


def _need_criu(criu_path: Optional[str]) -> str:
    """This node's CRIU (``criu_path`` or found), or a CriuError saying how to get one."""
    criu = find_criu(criu_path)
    if not criu:
        raise CriuError("no CRIU found on this node; prepare it with warmstart.snapshot.node_prep")
    return criu


def _would_checkpoint(store: Store, target: Target, name: str, cuda: str, lock_timeout_ms: int,
                      gpu_node: Optional[GpuNode]) -> Dict[str, Any]:
    """Check mode: the refusals a checkpoint would meet before touching anything; creates nothing."""
    store.check_usable()
    plan = cuda_plan(cuda, gpu_node or GpuNode(), lock_timeout_ms)
    find_cuda(plan, target.pid)
    what = f"container {target.name} (workload pid {target.pid})" if target.capture else f"pid {target.pid}"
    _refuse_io_uring(what, target.pid)
    return {"cuda": plan.result(),
            "msg": f"would snapshot {what} as {name}" + (" with its GPU state" if plan.used else "")}


def _checkpoint_what(target: Target) -> str:
    """The target as error messages name it."""
    if target.capture:
        return f"container {target.name}"
    return f"workload {target.workload}" if target.workload else f"pid {target.pid}"


def _wait_ready(target: Target, timeout: float, timings: Dict[str, float]) -> None:
    """Wait until the workload says ready-for-snapshot in its control dir."""
    if not target.control_dir:
        raise SnapshotError(f"wait_ready: pid {target.pid} has no SNAPSHOT_CONTROL_DIR to signal readiness in")
    prog.phase("wait for ready-for-snapshot")
    try:
        timings["wait_ready"] = ctl.wait_for(target.control_dir, ctl.READY, timeout, alive=target.pid)
    except (TimeoutError, ProcessLookupError) as exc:
        raise SnapshotError(f"wait_ready: {exc}") from None


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
    extra: Dict[str, Any] = field(default_factory=dict)        # what the target kind captured while stopped
    mount_ns: Optional[Dict[str, Any]] = None                  # the tree's own mount namespace (_mountns)

    @property
    def images(self) -> str:
        return os.path.join(self.tdir, "criu")


def _checkpoint_locked(store: Store, target: Target, name: str, labels: Dict[str, str], options: CriuOptions,
                       leave_running: bool, criu: str, timings: Dict[str, float], t_start: float,
                       pod: Optional[Dict[str, Any]] = None, plan: Optional[CudaPlan] = None,
                       gpu_node: Optional[GpuNode] = None) -> Dict[str, Any]:
    """The checkpoint proper, under the target's lock.

    Rollback: each step that changes something pushes its undo onto ``undo`` as soon as it succeeded.
    Any failure before the snapshot is published unwinds them in reverse: the stopped tree gets its
    network back and is resumed (SIGCONT), then its CUDA processes are restored and unlocked (they
    need their own restore thread running), the guardian is let go (it keeps resuming a tree that
    CRIU lets go of late), the staging dir is removed and the workload's hooks are told ``failed``.
    Only a published snapshot clears the stack (``pop_all``): the source is never ended before.
    """
    plan = plan or CudaPlan("off", reason="cuda: off")
    notes: List[str] = []  # what the CUDA rollback says, added to the error
    try:
        with contextlib.ExitStack() as undo:
            undo.push(_hooks_failed(plan, target))
            job = _stage(store, target, name, labels, criu, pod, plan, gpu_node or GpuNode(), undo)
            guardian = _start_guardian(target.pid, (lambda: cu.rollback(plan.pids, plan.backend))
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
    _release_guardian(guardian)
    timings["total"] = time.monotonic() - t_start
    return _checkpoint_result(job, store, target, leave_running, timings, plan)


def _hooks_failed(plan: CudaPlan, target: Target) -> Callable[..., bool]:
    """An exit callback: on failure, the workload's pre-checkpoint hooks hear ``failed`` and why."""
    def tell(exc_type: Any, exc: Optional[BaseException], tb: Any) -> bool:
        del exc_type, tb
        _finish_hooks(plan, target, "failed", str(exc))
        return False
    return tell


def _rollback_error(exc: BaseException, notes: List[str]) -> Optional[BaseException]:
    """The error a failed checkpoint raises: a CUDA failure as a SnapshotError, with what the rollback did."""
    note = "".join(notes)
    if isinstance(exc, cu.CudaError):
        return SnapshotError(f"cuda: {exc}{note}")
    if note and isinstance(exc, (CriuError, SnapshotError)):
        return SnapshotError(f"{exc}{note}", reasons=exc.reasons, log_tail=exc.log_tail, **exc.details)
    return None


def _stage(store: Store, target: Target, name: str, labels: Dict[str, str], criu: str,
           pod: Optional[Dict[str, Any]], plan: CudaPlan, gpu_node: GpuNode, undo: contextlib.ExitStack) -> _Job:
    """The manifest and the staging dir (its removal pushed onto ``undo``); what the target is, while it runs."""
    source = describe_node(criu)
    snapshot_id = mf.new_id()
    manifest = mf.new_manifest(snapshot_id, name, labels, source)
    if plan.used:
        manifest["gpu"] = _gpu_section(plan, gpu_node)
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


def _stop_and_dump(job: _Job, target: Target, options: CriuOptions, criu: str, plan: CudaPlan,
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
        except cu.CudaError as exc:  # lock_and_checkpoint rolled back what it touched
            raise SnapshotError(f"cuda: {exc}") from None
        stopped.callback(_rollback_cuda, plan, notes)
    stopped.callback(_resume_tree, target, True)
    hook_stage(plan, target, "backup_pre", timings)  # locked, not yet frozen
    t0 = time.monotonic()
    hasher = st.StreamingHasher(job.images, os.path.relpath(job.images, job.staging.path))
    prog.phase("dump")
    hasher.start()
    try:
        with criu_plugins_off(plan.used):
            dump(criu, target.pid, job.images, dump_options, leave_stopped=True)
    finally:
        job.hashed = hasher.finish()
    timings["dump"] = time.monotonic() - t0


def _mount_options(job: _Job, target: Target, options: CriuOptions) -> CriuOptions:
    """A process tree in a mount namespace of its own (a workload's): what CRIU dumps of it (``_mountns``)."""
    try:
        mounts = mns.plan(target.pid, proc.descendants(target.pid))
    except mns.MountNsError as exc:
        raise SnapshotError(f"{_checkpoint_what(target)}: {exc}; nothing was touched") from None
    if mounts is None:
        return options
    job.mount_ns = mounts.record()
    return mounts.criu_options(options)


def _rollback_cuda(plan: CudaPlan, notes: List[str]) -> None:
    """Undo: the CUDA processes restored and unlocked after a failure (the tree runs again first)."""
    undone, problems = cu.rollback(plan.pids, plan.backend)
    notes.append(f"; rolling back CUDA failed, these may stay locked: {'; '.join(problems)}" if problems else
                 f"; CUDA pid(s) {', '.join(map(str, undone or plan.pids))} restored and unlocked, running again")


def _resume_tree(target: Target, failed: bool) -> None:
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


def _capture_stopped(job: _Job, target: Target, timings: Dict[str, float]) -> None:
    """What must match the memory image, taken while the tree is still stopped."""
    if target.capture:
        t0 = time.monotonic()
        job.extra = target.capture.while_stopped(job.tdir)
        timings["rootfs"] = time.monotonic() - t0
        return
    own_dir = wl.paths(target.workloads_root, target.workload)["dir"] + "/" if target.workload else None
    if target.workload:
        job.files = _copy_workload_files(target, os.path.join(job.tdir, "files"))
    # Sizes as CRIU saw them: taken while the tree is still stopped (a running
    # source may append to a file between any earlier look and the freeze).
    job.in_use = proc.files_in_use(target.pid, exclude=(own_dir,) if own_dir else ())


def _resume(target: Target, plan: CudaPlan, timings: Dict[str, float], stopped: contextlib.ExitStack) -> None:
    """``leave_running``: the source runs on before the checksums; its CUDA processes get their GPUs back.

    The rollback on ``stopped`` is dropped only once everything is back (a failed CUDA resume rolls back).
    """
    _resume_tree(target, False)
    hook_stage(plan, target, "backup_post", timings)  # running again, still locked
    hook_stage(plan, target, "restore_pre", timings)
    if plan.used:  # after SIGCONT: the driver's restore thread in each process must run
        t0 = time.monotonic()
        prog.phase("cuda resume")
        cu.restore_and_unlock(plan.pids, None, plan.backend)
        timings["cuda_resume"] = time.monotonic() - t0
    stopped.pop_all()
    hook_stage(plan, target, "restore_post", timings)  # unlocked: a failure here leaves nothing locked
    _finish_hooks(plan, target, "ok")  # unlock_post


def _publish(job: _Job, target: Target, options: CriuOptions, timings: Dict[str, float], t_start: float) -> None:
    """Checksums, the target's manifest entry, then the publish (by rename): the snapshot exists from here on."""
    t0 = time.monotonic()
    prog.phase("checksum")
    manifest = job.manifest
    manifest["files"] = st.record_files(job.staging.path, progress=prog.add, known=job.hashed)
    timings["checksum"] = time.monotonic() - t0
    manifest["size"] = sum(f["size"] for f in manifest["files"])
    manifest["targets"].append(_target_entry(job, target, options))
    timings["total"] = time.monotonic() - t_start
    manifest["timings"] = {k: round(v, 3) for k, v in timings.items()}
    t0 = time.monotonic()
    job.staging.publish(manifest)
    timings["publish"] = time.monotonic() - t0


def _target_entry(job: _Job, target: Target, options: CriuOptions) -> Dict[str, Any]:
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
    if target.capture:
        entry.update(target.capture.entry())
        entry.update(job.extra)
    return entry


def _end_source(target: Target) -> None:
    """``leave_running: false``, once the snapshot is published: the source is killed and its pidfile removed."""
    os.kill(target.pid, signal.SIGKILL)
    proc.wait_gone(target.pid, 10)
    if target.workload:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(wl.paths(target.workloads_root, target.workload)["pidfile"])


def _checkpoint_result(job: _Job, store: Store, target: Target, leave_running: bool, timings: Dict[str, float],
                       plan: CudaPlan) -> Dict[str, Any]:
    manifest = job.manifest
    return {
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


# --- restore ------------------------------------------------------------------

def _gpu_reasons(doc: Dict[str, Any], gpu_node: Optional[GpuNode], cuda: str, skip_compat: bool) -> List[str]:
    """GPU reasons against this node; probes it only for a snapshot with GPU state (or cuda=required)."""
    if gpu_node is None or (not doc.get("gpu") and cuda != "required"):
        return []
    return gpu_incompatibilities(doc.get("gpu"), gpu_node, cuda, hard_only=skip_compat)


def select(store: Store, snapshot_id: Optional[str], name: Optional[str], labels: Optional[Dict[str, str]],
           node: Dict[str, Any], skip_compat: bool, gpu_node: Optional[GpuNode] = None,
           cuda: str = "auto", skip_unreadable: bool = False,
           passed_over: Optional[List[Dict[str, str]]] = None) -> Dict[str, Any]:
    """The manifest to restore: by id, or the newest compatible one matching name/labels (GPUs too, given ``gpu_node``).

    Never falls back to an older snapshot silently: each newer one passed over is appended to ``passed_over``
    with the reason. A newer snapshot this node cannot read or trust (signature, schema) refuses the selection,
    since nothing it claims - its name, its labels - can be believed, unless ``skip_unreadable``: whoever can break
    the newest signature would otherwise pick which version runs.
    """
    if snapshot_id is not None:  # "" is refused, never a wildcard
        return store.load(mf.check_id(snapshot_id))
    if name is not None:
        mf.check_name(name)
    listed = store.list()
    unreadable = [d for d in listed if "error" in d]
    candidates = [d for d in listed if "error" not in d and mf.matches(d, name, labels)]
    rejected: List[Dict[str, str]] = []
    chosen: Optional[Dict[str, Any]] = None
    for doc in sorted(candidates, key=lambda d: d["created_at"], reverse=True):
        reasons = [] if skip_compat else incompatibilities(doc["source"], node)
        reasons += _gpu_reasons(doc, gpu_node, cuda, skip_compat)
        if not reasons:
            chosen = doc
            break
        rejected.append({"id": doc["id"], "reason": "; ".join(reasons)})
    newer_unreadable = [{"id": str(d.get("id")), "reason": f"unreadable: {d['error']}"} for d in unreadable
                        if chosen is None or str(d.get("id"))[:16] >= chosen["id"][:16]]  # same second: newer
    if newer_unreadable and not skip_unreadable:
        what = "every match" if chosen is None else f"{chosen['id']}, the newest usable match,"
        raise SnapshotError(f"{len(newer_unreadable)} snapshot(s) in {store.root} newer than {what} cannot be read or "
                            "trusted, so whether they are newer versions of name={name!r} labels={labels} cannot be "
                            "told; refusing to fall back to an older one silently (remove them with cleanup "
                            "remove_broken, or set skip_unreadable to pass over them)".format(
                                name=name, labels=labels or {}),
                            reasons=[f"{r['id']}: {r['reason']}" for r in newer_unreadable], outcome="incompatible")
    if passed_over is not None:
        passed_over.extend(rejected + newer_unreadable)
    if chosen is not None:
        return chosen
    if not candidates:
        raise SnapshotError(f"no published snapshot in {store.root} matches name={name!r} labels={labels or {}}")
    raise SnapshotError(f"no snapshot matching name={name!r} labels={labels or {}} is compatible with this node",
                        reasons=[f"{r['id']}: {r['reason']}" for r in rejected], outcome="incompatible")


def preflight(store: Store, doc: Dict[str, Any], node: Dict[str, Any], verify: bool,
              skip_compat: bool, fetch: bool = True, gpu_node: Optional[GpuNode] = None,
              cuda: str = "auto", workloads_root: str = wl.DEFAULT_ROOT,
              deferred: Optional[ov.Items] = None, copying: bool = False) -> List[str]:
    """Everything that stops this restore, before any process is touched (GPU checks with ``gpu_node``).

    Node-side locations come from this node (``workloads_root``); the manifest's are only compared with them.
    With ``deferred`` (an overlapped restore, ``_overlap``) the page images are checked for presence, type and
    size here, and handed to ``deferred`` to be hashed while CRIU restores the tree stopped.
    """
    problems = []
    if not skip_compat:
        problems += incompatibilities(doc["source"], node)
    problems += _gpu_reasons(doc, gpu_node, cuda, skip_compat)
    if verify:
        problems += [f"checksum: {p}" for p in _checksums(store, doc, fetch, deferred, copying)]
    if not skip_compat:
        for t in doc.get("targets") or []:
            problems += proc.file_mismatches(t.get("files_in_use") or {})
    targets = doc.get("targets") or []
    if targets and targets[0].get("kind") == "container":
        problems.append(f"snapshot: it holds container {targets[0]['name']}; restore it into a placeholder "
                        "container (option into)")
    elif len(targets) != 1 or targets[0].get("kind") != "process":
        problems.append("snapshot: not a single-process snapshot (restore it with the matching target kind)")
    else:
        t = targets[0]
        problems += _layout_problems(store, doc, t, verify)
        problems += mns.restore_problems(t.get("mount_namespace"))
        if t.get("workload"):
            if t.get("workloads_root") not in (None, workloads_root):
                problems.append(
                    f"workload {t['workload']}: it ran under {t['workloads_root']} at checkpoint and its open files "
                    f"are restored there, but this node's workloads_root is {workloads_root} (restore with "
                    f"workloads_root: {t['workloads_root']} if that is a workloads root of this node)")
            running = wl.running_pid(workloads_root, t["workload"])
            if running is not None:
                problems.append(
                    f"workload {t['workload']} is running on this node (pid {running}); a restored copy would "
                    "share its files and ports - stop it first")
    return problems


def _checksums(store: Store, doc: Dict[str, Any], fetch: bool, deferred: Optional[ov.Items],
               copying: bool = False) -> List[str]:
    """The snapshot's checksum problems (``Store.verify``); with ``deferred``, for a store read in place, the page
    images' hashing is left to the caller (the same check as ``FsStore.verify``, in two parts). ``copying``: only
    the layout and sizes here - the restore hashes what it copies (``_storecopy``)."""
    if copying:
        return st.verify_files(store.local_dir(doc["id"]), doc, phase=False, hashed=False)
    if deferred is None:
        return st.verify_local(store, doc, fetch=fetch, cached=True)
    return st.verify_files(store.local_dir(doc["id"]), doc, cache=st.VerifiedFiles(doc["id"], record=fetch),
                           defer=ov.deferrable(doc), deferred=deferred)


def _layout_problems(store: Store, doc: Dict[str, Any], target: Dict[str, Any], verified: bool) -> List[str]:
    """The target's images dir must be reached through real directories inside the snapshot (also unverified)."""
    if verified or not store.reads_in_place or "path" not in target or not mf.is_id(doc.get("id")):
        return []  # verify already refused any symlink or stray entry; an object store's copy is our own cache
    why = st.real_dirs(store.snapshot_dir(doc["id"]), f"{target['path']}/criu")
    return [f"snapshot layout: {why}"] if why else []


def stage_images(src: str, dst: str) -> None:
    """A local images dir of symlinks: CRIU's restore log and stats stay off the store."""
    os.makedirs(dst, mode=0o700)
    for fname in os.listdir(src):
        if fname in ("dump.log",):
            continue
        os.symlink(os.path.join(src, fname), os.path.join(dst, fname))


def _put_back_files(target: Dict[str, Any], snap_dir: str, workloads_root: str, src_within: List[str]) -> None:
    """The workload's own files, back into its dir under this node's ``workloads_root`` (never through a symlink;
    read through one only when it leads into ``src_within``: the links a page-server restore stages)."""
    base = wl.paths(workloads_root, target["workload"])["dir"]
    stamp = time.strftime("%Y%m%dT%H%M%S")
    os.makedirs(workloads_root, mode=0o700, exist_ok=True)
    os.close(safefs.open_dir(workloads_root, target["workload"]))
    for entry in target.get("workload_files", []):
        src = os.path.join(snap_dir, target["path"], "files", entry["path"])
        keep = f".pre-restore-{stamp}" if entry["path"].endswith(".log") else None
        safefs.copy_into(base, entry["path"], src, int(entry.get("mode", 0o600)), keep_old_suffix=keep,
                         src_within=src_within)


def _control_dir(target: Dict[str, Any], workloads_root: str, control_roots: List[str]) -> Any:
    """(control dir to use, note): a workload's is derived from this node's root; a process's is used only
    when it lies under one of this node's ``control_roots`` and is a real directory."""
    if target.get("workload"):
        return wl.paths(workloads_root, target["workload"])["control"], None
    wanted = target.get("control_dir")
    if not wanted:
        return None, None
    if not safefs.inside(wanted, control_roots) or os.path.realpath(wanted) != wanted:
        return None, (f"control dir {wanted} is not under this node's control_roots ({', '.join(control_roots)}) "
                      "or is reached through a symlink: restore-complete was not written there")
    return wanted, None


def _resume_cuda(root: int, gpu: Dict[str, Any], gpu_node: GpuNode, timings: Dict[str, float]) -> Dict[str, Any]:
    """After the CRIU restore: map the CUDA pids, restore them onto this node's GPUs, unlock them."""
    backend, why = gpu_node.backend()
    if backend is None:
        raise SnapshotError(f"cuda: this node cannot restore GPU state: {why}")
    t0 = time.monotonic()
    pids = gpl.restored_cuda_pids(root, list(gpu.get("pids") or []))
    pairs: Optional[List[Any]] = None
    if gpu.get("gpus"):
        try:
            pairs = cu.device_map(gpu["gpus"], gpu_node.gpus()[0])
        except cu.GpuMismatch:
            pairs = None  # skip_compat_check: let the driver try the same GPUs
    timings["cuda_map"] = time.monotonic() - t0
    prog.phase("cuda restore")
    timings.update(cu.restore_and_unlock(pids, pairs, backend))
    return {"used": True, "pids": pids, "gpu_pairs": [list(p) for p in pairs or []], "backend": backend.describe()}


def _lazy_plan(criu: str, doc: Dict[str, Any], wanted: bool) -> Dict[str, Any]:
    """Whether this restore runs lazily, and why (or why not)."""
    if not wanted:
        return {"used": False, "reason": "lazy: false - every page is loaded before the tree resumes"}
    if doc.get("gpu"):
        return {"used": False, "reason": "the snapshot holds GPU state: restored eagerly (the CUDA restore needs "
                                         "the process's whole memory)"}
    ok, why = lz.support(criu)
    if not ok:
        return {"used": False, "reason": f"{why}; restored eagerly instead"}
    return {"used": True, "reason": why}


def _stage_remote(store: Store, doc: Dict[str, Any], target: Dict[str, Any], images: str,
                  verify: bool) -> Any:
    """Images for a restore whose pages come from a page server: every image but the pages, verified, and
    each pages image as a sparse file holding only what CRIU restores itself, from checked pieces of the store's
    (``_pageranges``). (problems, bytes of pages read)."""
    prefix, files_prefix = f"{target['path']}/criu/", f"{target['path']}/files/"
    os.makedirs(images, mode=0o700)
    sizes, problems = {}, []
    prog.phase("fetch images (pages from the page server)")
    for entry in doc.get("files", []):
        fname = entry["path"][len(prefix):] if entry["path"].startswith(prefix) else None
        if fname is not None and fname.startswith("pages-"):
            sizes[fname] = zs.plain_size(doc, entry)  # served by the page server, but for what CRIU restores itself
            continue
        if fname is not None and "/" not in fname and fname != "dump.log":
            dst = os.path.join(images, fname)
        elif entry["path"].startswith(files_prefix):  # the workload's own files, put back before the restore
            dst = os.path.join(os.path.dirname(images), "snapshot", entry["path"])
            os.makedirs(os.path.dirname(dst), mode=0o700, exist_ok=True)
        else:
            continue
        try:
            store.fetch_file(doc["id"], entry, dst, verify)
        except (st.StoreError, OSError) as exc:
            problems.append(f"{entry['path']}: {exc}")
    if problems:
        return problems, 0
    ranges = pr.PageRanges(store, doc, prefix, os.path.join(os.path.dirname(images), "pages-fetch"), verify)
    try:
        fetched = lz.sparse_pages(images, sizes, ranges.read)
    except (lz.LazyError, st.StoreError, OSError) as exc:
        return [f"pages: {exc}"], 0
    finally:
        ranges.close()
    return [], fetched


DEFAULT_CONTROL_ROOTS = ("/var/lib/warmstart", "/run/warmstart", "/tmp")


def _restore_lock(target: Dict[str, Any], workloads_root: str) -> Optional[int]:
    """A workload is restored by one restore at a time on a node (from the running check to its pidfile)."""
    if not target.get("workload"):
        return None
    try:
        return rst.exclusive(f"workload {target['workload']} under {workloads_root}")
    except rst.Busy as exc:
        raise SnapshotError(str(exc)) from None


def _rebuild_error(report: Dict[str, Any]) -> BaseException:
    """The restorer child's failure, as the exception it raised."""
    if report.get("type") == "LazyError":
        return lz.LazyError(report["error"], report.get("log_tail"))
    return CriuError(report["error"], log_tail=report.get("log_tail"))


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
    passed_over: List[Dict[str, str]] = field(default_factory=list)  # newer snapshots select passed over
    t_start: float = field(default_factory=time.monotonic)
    t_wall: float = field(default_factory=time.time)


def restore(store: Store, snapshot_id: Optional[str] = None, name: Optional[str] = None,
            labels: Optional[Dict[str, str]] = None, verify: bool = True, skip_compat: bool = False,
            options: Optional[CriuOptions] = None, criu_path: Optional[str] = None,
            restore_root: str = DEFAULT_RESTORE_ROOT, cuda: str = "auto",
            gpu_node: Optional[GpuNode] = None, lazy: bool = False, lazy_wait: bool = False,
            lazy_timeout: float = lz.DEFAULT_TIMEOUT, page_server: Optional[str] = None,
            workloads_root: str = wl.DEFAULT_ROOT, control_roots: Optional[List[str]] = None,
            check_mode: bool = False, tcp: Optional[str] = None, tls: Any = None,
            skip_unreadable: bool = False, insecure: bool = False) -> Dict[str, Any]:
    """Restore a process snapshot; with GPU state (``cuda`` auto or required) the CUDA processes are restored too.

    ``lazy``: the tree resumes at once and CRIU's lazy-pages daemon streams its memory in (from the local
    images, or from ``page_server`` host:port, see ``_lazy``); without uffd on this node, or for a snapshot
    with GPU state, it is restored eagerly and ``result['lazy']['reason']`` says why. Node-side places
    (``workloads_root``, ``control_roots``) are this node's: a manifest never chooses where we write.

    ``tcp``: ``keep`` or ``close`` the snapshot's established TCP connections (it overrides ``options.tcp``);
    None: ``keep`` when this node took the snapshot, else ``close`` (``_tcp``). ``result['tcp']`` says which
    and why; ``keep`` of a snapshot taken with ``tcp: close`` is refused with the preflight's reasons.

    ``tls``: checked files (``_tls.TlsFiles``) for CRIU's mutual TLS with ``page_server``; without it a page server
    beyond loopback is refused unless ``insecure`` (pages in the clear, on a network the user trusts).

    ``skip_unreadable``: by name/labels, pass over newer snapshots that cannot be read or trusted instead of
    refusing (``select``); ``result['passed_over']`` names every newer snapshot passed over, and why.

    ``check_mode``: select and preflight (GPU checks included) and return {id, name, verified,
    compat_checked, gpu_state, tcp, passed_over}; no process, lock file, directory or store object is touched.

    Outcome, decided here once: the result says ``outcome: succeeded``; a failure's ``details`` say
    ``outcome: incompatible`` when it was refused before any process was touched because the snapshot
    does not fit this node (compatibility, checksums, schema), else ``outcome: failed``.
    """
    a = _RestoreArgs(verify, skip_compat, options, restore_root, cuda, gpu_node or GpuNode(), lazy, lazy_wait,
                     lazy_timeout, page_server, workloads_root, list(control_roots or DEFAULT_CONTROL_ROOTS), tcp,
                     tls=tls, skip_unreadable=skip_unreadable, insecure=insecure)
    try:
        criu, node, doc = _choose(store, snapshot_id, name, labels, criu_path, a)
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
        raise SnapshotError(f"cuda: {a.cuda!r} is not one of {', '.join(CUDA_MODES)}")
    if a.lazy_timeout <= 0:
        raise SnapshotError(f"lazy_timeout: {a.lazy_timeout:g} s is not positive")
    if tcpm.invalid(a.tcp):
        raise SnapshotError(str(tcpm.invalid(a.tcp)))
    a.remote = lz.parse_address(a.page_server) if a.page_server else None
    if a.tls is not None and not a.remote:
        raise SnapshotError("tls: applies to a lazy restore from a page_server only (none given)")
    if a.remote and a.tls is None and not a.insecure and not loopback(a.remote[0]):
        raise SnapshotError(f"page_server {a.page_server}: reading pages in the clear from beyond loopback is refused "
                            "(anyone on the path could read and change the process's memory): set tls: true, or "
                            "insecure: true on a network you trust")
    criu = _need_criu(criu_path)
    node = describe_node(criu)
    if snapshot_id is not None:
        mf.check_id(snapshot_id)
    if name is not None:
        mf.check_name(name)
    try:
        doc = select(store, snapshot_id, name, labels, node, a.skip_compat, a.gpu_node, a.cuda,
                     skip_unreadable=a.skip_unreadable, passed_over=a.passed_over)
    except mf.ManifestError as exc:
        exc.with_details(outcome="incompatible")
        raise
    return criu, node, doc


def _refusal(doc: Dict[str, Any], problems: List[str]) -> SnapshotError:
    """Refused before anything is touched: the snapshot does not fit this node; every reason listed."""
    return SnapshotError(f"refusing to restore snapshot {doc['id']} ({doc['name']}) on this node", reasons=problems,
                         outcome="incompatible")


def _would_restore(store: Store, doc: Dict[str, Any], node: Dict[str, Any], a: _RestoreArgs) -> Dict[str, Any]:
    """Check mode: the preflight without fetching anything; what a restore would do, or every reason it would not."""
    tcp, tcp_problems = _tcp_plan(doc, node, a)
    problems = preflight(store, doc, node, a.verify, a.skip_compat, fetch=False, gpu_node=a.gpu_node, cuda=a.cuda,
                         workloads_root=a.workloads_root) + tcp_problems
    if problems:
        raise _refusal(doc, problems)
    return {"id": doc["id"], "name": doc["name"], "verified": a.verify, "compat_checked": not a.skip_compat,
            "gpu_state": bool(doc.get("gpu")), "tcp": tcp.result(), "passed_over": a.passed_over}


def _tcp_plan(doc: Dict[str, Any], node: Dict[str, Any], a: _RestoreArgs) -> Tuple[tcpm.TcpPlan, List[str]]:
    """Keep or close the snapshot's TCP connections: a process comes back in this node's host network namespace,
    so the default keeps them when this node took the snapshot (its recorded hostname), else closes them."""
    target = doc["targets"][0] if doc.get("targets") else {}
    recorded = (target.get("criu") or {}).get("options", {}).get("tcp")
    return tcpm.plan(a.tcp, recorded, None, (doc.get("source") or {}).get("hostname"), str(node.get("hostname")))


def _prepare(store: Store, doc: Dict[str, Any], node: Dict[str, Any], a: _RestoreArgs,
             lazy_plan: Dict[str, Any], timings: Dict[str, float]) -> Any:
    """Preflight, then the work dir with the images: (work dir, snapshot dir, page server, overlapped verify or None).
    Nothing is touched on refusal."""
    remote = a.remote if lazy_plan["used"] else None
    t0 = time.monotonic()
    use, why = ov.usable(doc, a.verify, store.reads_in_place, lazy_plan["used"])
    a.overlap_note = "used" if use else why
    # a store read in place hands CRIU its own files unless we copy them; a compressed snapshot's local_dir is
    # already this node's plaintext copy, checked as it was decompressed (_zstore)
    copying = store.reads_in_place and a.verify and not remote and doc.get("compression") is None
    problems = preflight(store, doc, node, a.verify and not remote, a.skip_compat, fetch=not remote,
                         gpu_node=a.gpu_node, cuda=a.cuda, workloads_root=a.workloads_root,
                         copying=copying) + _tcp_plan(doc, node, a)[1]
    target = doc["targets"][0] if doc.get("targets") else {}
    work = os.path.join(a.restore_root, f"{doc['id']}-{uuid.uuid4().hex[:8]}")
    snap_dir = os.path.join(work, "snapshot")
    if remote and not problems:
        os.makedirs(a.restore_root, mode=0o700, exist_ok=True)
        os.makedirs(work, mode=0o700)
        try:
            problems, lazy_plan["eager_bytes"] = _stage_remote(store, doc, target, os.path.join(work, "images"),
                                                               a.verify)
        finally:
            if problems:
                shutil.rmtree(work, ignore_errors=True)
    timings["preflight"] = time.monotonic() - t0
    if problems:
        raise _refusal(doc, problems)
    deferred: ov.Items = []
    pins: Optional[sc.Pins] = None
    if not remote:
        snap_dir = store.local_dir(doc["id"])
        os.makedirs(a.restore_root, mode=0o700, exist_ok=True)
        os.makedirs(work, mode=0o700)
        if copying:
            t0 = time.monotonic()
            snap_dir, deferred, pins = _copy_verified(store, doc, target, work, ov.deferrable(doc) if use else set())
            timings["verified_copy"] = time.monotonic() - t0
        else:
            stage_images(os.path.join(snap_dir, target["path"], "criu"), os.path.join(work, "images"))
    return work, snap_dir, remote, (ov.Overlap(deferred, pins=pins) if deferred else None)


def _copy_verified(store: Store, doc: Dict[str, Any], target: Dict[str, Any], work: str,
                   defer: Any) -> Tuple[str, ov.Items, sc.Pins]:
    """A store read in place: the target's images copied into ``work/images`` and its workload files into
    ``work/snapshot``, hashed as they pass (``_storecopy``); CRIU and the put-back read only these copies, or
    page images pinned in the store under a read lease where the kernel allows (``_storecopy.pin``).
    Returns (the snapshot dir to read the workload files from, the page images left to the overlapped verify,
    the pinned ones among them). A mismatch or a shortage of space refuses the restore, the work dir removed."""
    images, files = f"{target['path']}/criu/", f"{target['path']}/files/"
    items = [(e, os.path.join(work, "images", e["path"][len(images):])) for e in doc.get("files", [])
             if e["path"].startswith(images) and e["path"][len(images):] != "dump.log" and "/" not in e["path"][len(images):]]
    items += [(e, os.path.join(work, "snapshot", e["path"])) for e in doc.get("files", [])
              if e["path"].startswith(files)]
    prog.phase("verified copy", sum(int(e["size"]) for e, _dest in items))
    pins, items = sc.pin(store.local_dir(doc["id"]), items, set(defer))
    problems = [p for p in [sc.space_problem(work, sum(int(e["size"]) for e, _dest in items))] if p]
    deferred: ov.Items = []
    if not problems:
        problems, deferred = sc.copy_verified(store.local_dir(doc["id"]), items, set(defer))
    if problems:
        pins.release()
        shutil.rmtree(work, ignore_errors=True)
        raise _refusal(doc, [f"checksum: {p}" for p in problems])
    os.makedirs(os.path.join(work, "images"), mode=0o700, exist_ok=True)
    return os.path.join(work, "snapshot"), pins.items + deferred, pins


def _restore_locked(store: Store, doc: Dict[str, Any], node: Dict[str, Any], criu: str,
                    a: _RestoreArgs) -> Dict[str, Any]:
    """Preflight and images, the workload's files and control dir, CRIU's restore, GPU state, the result."""
    timings: Dict[str, float] = {}
    target = doc["targets"][0] if doc.get("targets") else {}
    lazy_plan = _lazy_plan(criu, doc, a.lazy or bool(a.remote))
    work, snap_dir, remote, overlap = _prepare(store, doc, node, a, lazy_plan, timings)
    try:
        control, control_note = _control_dir(target, a.workloads_root, a.control_roots)
        pidfile = wl.paths(a.workloads_root, target["workload"])["pidfile"] if target.get("workload") else None
        if target.get("workload"):
            within = [store.snapshot_dir(doc["id"])] if remote and store.reads_in_place else []
            _put_back_files(target, snap_dir, a.workloads_root, within)
        if os.path.dirname(snap_dir) == work:  # our copy of the workload's files (verified): put back, not needed now
            shutil.rmtree(snap_dir, ignore_errors=True)
        if control and os.path.isdir(control):  # the source's checkpoint sentinels are not the copy's
            ctl.clear(control, ctl.RESTORE_COMPLETE, ctl.RESTORE_FAILED, *ctl.CHECKPOINT_SENTINELS)
        tcp = _tcp_plan(doc, node, a)[0]
        opts = dataclasses.replace(a.options or CriuOptions.from_manifest(target["criu"]["options"]), tcp=tcp.criu_tcp,
                                   leave_stopped=overlap is not None)
        opts = mns.restore_options(target.get("mount_namespace"), opts)
        t0 = time.monotonic()
        pid, session = _criu_phase(criu, work, opts, lazy_plan, a, control, doc, pidfile, remote, overlap)
        timings["restore"] = time.monotonic() - t0
        if overlap is not None:
            _settle(overlap, pid, pidfile, control, doc, timings)
        cuda_result = _after_criu(pid, doc.get("gpu"), a.gpu_node, timings, control, doc, pidfile)
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
            "ns_pid": ns_pid, "workload": target.get("workload"), "work_dir": work, "started_at": round(a.t_wall, 3),
            "timings": {k: round(v, 3) for k, v in timings.items()}, "criu_stats": stats,
            "transfer": dict(store.transfer), "cuda": cuda_result, "lazy": lazy_plan, "warnings": warnings,
            "tcp": tcp.result(), "passed_over": a.passed_over,
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
                               tls_args=a.tls.criu_args() if a.tls else ())
        if overlap is None:
            prog.phase("restore")
        else:
            overlap.start()
        with criu_plugins_off(bool(doc.get("gpu"))), lz.guard(session):
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
            raise SnapshotError(str(err), reasons=problems, outcome="failed")
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
    return SnapshotError(f"restore of snapshot {doc['id']} refused: its page images do not match the manifest "
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
        return SnapshotError(f"lazy restore of snapshot {doc['id']}: {exc}", log_tail=exc.log_tail)
    return exc


def _after_criu(pid: int, gpu: Optional[Dict[str, Any]], gpu_node: GpuNode, timings: Dict[str, float],
                control: Optional[str], doc: Dict[str, Any], pidfile: Optional[str]) -> Dict[str, Any]:
    """GPU state back into the restored tree between the copy's restore_pre and restore_post stages.

    On failure (a stage's callback included) the tree is killed (never half-restored) and forgotten.
    """
    ns_pid = proc.ns_pids(pid)[-1] if proc.alive(pid) else None
    try:
        copy_stage(control, doc, "restore_pre", pid, ns_pid, timings)
        result = _resume_cuda(pid, gpu, gpu_node, timings) if gpu else \
            {"used": False, "reason": "the snapshot holds no GPU state"}
        copy_stage(control, doc, "restore_post", pid, ns_pid, timings)
        return result
    except ctl.StageFailed as exc:
        raise _kill_copy(pid, pidfile, control, f"restore of snapshot {doc['id']} failed: {exc}") from None
    except (cu.CudaError, cu.CudaUnavailable, SnapshotError, gpl.GpuPlaceError, OSError) as exc:
        raise _kill_copy(pid, pidfile, control, f"cuda restore of snapshot {doc['id']} failed: {exc}") from None


def _kill_copy(pid: int, pidfile: Optional[str], control: Optional[str], text: str) -> SnapshotError:
    """Never leave a half-restored copy: the tree killed, its pidfile removed, restore-failed written; the error."""
    proc.signal_tree(pid, signal.SIGKILL)
    proc.wait_gone(pid, 10)
    if pidfile:
        with contextlib.suppress(OSError):
            os.unlink(pidfile)
    text = f"{text}; the restored tree (pid {pid}) was killed"
    if control and os.path.isdir(control):
        ctl.write(control, ctl.RESTORE_FAILED, f"{text}\n")
    return SnapshotError(text)


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
        raise SnapshotError(state.get("error") or f"lazy restore of snapshot {doc['id']}: memory not complete "
                            f"after {a.lazy_timeout:g} s", log_tail=log_tail(os.path.join(work, lz.LOG)))
    lazy_plan["complete_after"] = round(state["complete_at"] - a.t_wall, 3)
