# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""GPU state and the workload's lifecycle stages in a checkpoint: the ``cuda`` decision and the hooks.

GPU state (option ``cuda``): warmstart itself locks and checkpoints the CUDA
processes of the tree through the driver API (``_cuda``) before the CRIU dump,
and restores and unlocks them after the CRIU restore. CRIU's own
``cuda_plugin.so`` (in the bundle's plugin dir, loaded by every ``criu swrk``)
must not act too: whenever warmstart handles CUDA, CRIU runs with
``CRIU_LIBS_DIR`` pointing at an empty directory (``criu_plugins_off``), so it
loads no plugin and the images do not ask for one at restore. With ``cuda: off``
warmstart leaves CRIU as it is.

``CudaPlan`` is that decision for one checkpoint: ``cuda_plan`` before anything is
touched (is there a backend?), ``find_cuda`` once the tree is ready (which of its
processes hold GPU state), ``gpu_section`` the manifest's record of it.

Lifecycle stages: a workload that registered callbacks (``_control``) quiesces
before anything is locked (``quiesce``), hears each stage of its checkpoint
(``hook_stage``) and its end (``finish_hooks``); a restored copy runs its
restore_pre / restore_post stages (``copy_stage``).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _control as ctl
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cuda as cu
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cudaabi as cuabi
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cudabackends as cubk
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _gpuplace as gpl
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _progress as prog
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._gpunode import GpuNode
from ansible_collections.warmstart.snapshot.plugins.module_utils.node._compat import CUDA_MODES
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._gpu import cuda_version_string

DEFAULT_LOCK_TIMEOUT = cu.DEFAULT_LOCK_TIMEOUT_MS / 1000  # seconds: cuda_lock_timeout
CRIU_LIBS_DIR = "CRIU_LIBS_DIR"


@dataclass
class CudaPlan:
    """The ``cuda`` decision of one checkpoint: the backend, the CUDA pids of the tree, and why."""

    mode: str = "auto"
    backend: Optional[cubk.Backend] = None
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


def cuda_plan(mode: str, gpu_node: GpuNode, lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> CudaPlan:
    """Step 1, before anything is touched: is there a CUDA checkpoint backend? ``required`` without one fails here.

    ``lock_timeout``: seconds the lock waits for running GPU work (0: no limit); the driver takes milliseconds."""
    if mode not in CUDA_MODES:
        raise snap.SnapshotError(f"cuda: {mode!r} is not one of {', '.join(CUDA_MODES)}")
    if lock_timeout < 0:
        raise snap.SnapshotError(f"cuda_lock_timeout: {lock_timeout:g} s is negative (0 waits without limit)")
    lock_timeout_ms = int(round(lock_timeout * 1000))
    if mode == "off":
        return CudaPlan(mode, reason="cuda: off - GPU state is not checkpointed by warmstart", lock_timeout_ms=lock_timeout_ms)
    backend, why = gpu_node.backend()
    if backend is None:
        if mode == "required":
            needs = f" (needs {cuabi.MIN_DRIVER})" if gpu_node.accelerator == "cuda" else ""
            raise snap.SnapshotError(f"{gpu_node.asked(mode)}, but this node cannot checkpoint {gpu_node.device_word} "
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
    except cuabi.CudaError as exc:
        raise snap.SnapshotError(f"{node.asked(plan.mode)}: cannot tell which processes of pid {root}'s tree use "
                                 f"{node.process_word}: {exc}; nothing was touched") from None
    shown = ", ".join(map(str, tree[:16])) + (f" and {len(tree) - 16} more" if len(tree) > 16 else "")
    mig = gpl.mig_problems(plan.pids)               # before anything is locked: see _gpuplace
    shared = gpl.shared_memory_problems(plan.pids)
    if mig or shared:
        what = "run on a MIG instance" if mig and not shared else \
            "share GPU memory" if shared and not mig else "run on a MIG instance and share GPU memory"
        raise snap.SnapshotError(f"cuda: the CUDA processes of pid {root}'s tree {what}; nothing was touched",
                                 reasons=mig + shared)
    if plan.pids:
        plan.reason = f"CUDA process(es) {', '.join(map(str, plan.pids))} checkpointed through {plan.backend.describe()}"
    elif plan.mode == "required":
        kind, absent = node.process_word, node.absent()
        article = "an" if kind[:1] in "AEIOU" else "a"
        raise snap.SnapshotError(f"{node.asked(plan.mode)}, but pid {root} is not {article} {kind} process (no process of "
                                 f"its tree - {shown} - has {kind} state){'; ' + absent if absent else ''}; "
                                 "nothing was touched")
    else:
        plan.reason = f"no CUDA process in the tree ({shown})"


def gpu_section(plan: CudaPlan, gpu_node: GpuNode) -> Dict[str, Any]:
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


def quiesce(plan: CudaPlan, target: snap.Target, timeout: float, timings: Dict[str, float]) -> None:
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
        raise snap.SnapshotError(f"checkpoint hooks: lock_pre: {exc}") from None
    plan.request = answer["request"]
    plan.hooks = True
    plan.stages = stages
    plan.hook_timeout = timeout
    timings["quiesce"] = float(answer.get("waited") or 0.0)


def hook_stage(plan: Optional[CudaPlan], target: snap.Target, stage: str, timings: Dict[str, float]) -> None:
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
        raise snap.SnapshotError(f"checkpoint hooks: {stage}: {exc}; rolled back, the source keeps running") from None


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


def finish_hooks(plan: Optional[CudaPlan], target: snap.Target, result: str, detail: str = "") -> None:
    if plan is None or plan.request is None or not target.control_dir:
        return
    try:
        ctl.finish_checkpoint(target.control_dir, plan.request, result, detail)
    except OSError:
        pass
    plan.request = None
