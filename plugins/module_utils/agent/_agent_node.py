# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node side of the agent's restore (``_agent.Node``): this node's runtime, control dirs and CRIU.

Each destination of a ``Work`` is found by the CRI labels of its pod (``_runtime.pod_container``, cross-checked
with the container id of the pod's status), exactly as ``restore into.pod`` finds it. Invariants:

- ``restore`` is ``_container.restore_into`` (checksums and compatibility first, one restore per placeholder at a
  time, nothing half-done left running) and never raises for a failed restore: the result says it.
- ``attempt_state`` only reads: the sentinels in each placeholder's snapshot-control dir and whether a restore of
  it holds the node's restore lock.
- ``give_up`` writes ``cold-start`` into each placeholder's control dir (cold-start fallback) or SIGKILLs each
  placeholder (the kubelet restarts it; its restore attempt is spent).
"""
from __future__ import annotations

import dataclasses
import os
import signal
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.agent import _agent as agent
from ansible_collections.warmstart.snapshot.plugins.module_utils.agent import _agent_capture as capture
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._gpunode import GpuNode
from ansible_collections.warmstart.snapshot.plugins.module_utils.node._node import read_cpuinfo
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _checkpoint as ckpt
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _container as ctr
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _control as ctl
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _placeholder as ph
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _spechash as spechash
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _restoreinto as rinto
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _restorer as rst
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import CriuOptions
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._containerinfo import ContainerInfo
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._runtime import Runtime, get_runtime, pod_container
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._stores import open_store

COLD_START = "cold-start"


class LocalNode:
    """This node: ``runtime`` (podman, containerd or auto), the store override, CRIU and restore root; ``lazy``:
    restore lazily, the result (and so the pod's condition) once memory is complete."""

    def __init__(self, runtime: str = "auto", store: Optional[str] = None,
                 store_options: Optional[Dict[str, Any]] = None, criu_path: Optional[str] = None,
                 restore_root: Optional[str] = None, lazy: bool = False) -> None:
        self.lazy = lazy
        self.runtime_name = runtime
        self.store = store
        self.store_options = store_options or {}
        self.criu_path = criu_path
        self.restore_root = restore_root
        self._runtime: Optional[Runtime] = None

    def fit(self) -> Optional[Dict[str, Any]]:
        """This node for snapshot selection (``_selection.node_fit``): architecture, CPU vendor, and the GPU
        models NVML lists (none where it lists none: a GPU snapshot is passed over here, as its restore would be
        refused)."""
        gpus, why = GpuNode().gpus()
        return {"arch": os.uname().machine, "cpuVendor": read_cpuinfo().vendor,
                "gpuModels": [str(g.get("name")) for g in gpus if g.get("name")] if why is None else []}

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            self._runtime = get_runtime(self.runtime_name)
        return self._runtime

    # containers ------------------------------------------------------------------------------

    def _container_id(self, work: agent.Work, pair: Dict[str, Any]) -> str:
        target = {"namespace": work.namespace, "name": work.name, "container": pair["container"],
                  "container_id": pair.get("container_id"), "source": pair.get("source")}
        return pod_container(self.runtime, target)

    def _placeholders(self, work: agent.Work) -> List[Tuple[str, Optional[ContainerInfo], str]]:
        """(container name, its info or None, why not) of each destination."""
        out: List[Tuple[str, Optional[ContainerInfo], str]] = []
        for pair in work.pairs:
            try:
                out.append((pair["container"], self.runtime.inspect(self._container_id(work, pair)), ""))
            except WarmstartError as exc:
                out.append((pair["container"], None, str(exc)))
        return out

    @staticmethod
    def _control(info: ContainerInfo) -> Optional[str]:
        inside = ctl.process_control_dir(info.pid) if info.pid > 0 else None
        return ph.control_host_path(info, inside) if inside else None

    # the Node protocol ----------------------------------------------------------------------------

    def restore(self, work: agent.Work) -> agent.NodeResult:
        kwargs: Dict[str, Any] = {}
        if self.restore_root:
            kwargs["restore_root"] = self.restore_root
        try:
            spec = ",".join(f"{p['source']}={self._container_id(work, p)}" for p in work.pairs)
            # the node's own store wins; else the content's, with its policy's options (as the capture used them)
            store = open_store(self.store, self.store_options) if self.store else \
                open_store(work.store.get("url"), work.store_options or self.store_options)
            result = rinto.restore_into(store, spec, snapshot_id=work.snapshot_id, skip_compat=work.skip_compat_check,
                                        kill_on_failure=not work.cold_start, runtime_name=self.runtime_name,
                                        criu_path=self.criu_path, lazy=self.lazy, lazy_wait=self.lazy, **kwargs)
        except WarmstartError as exc:
            if exc.details.get("transient"):  # the store failed before anything was touched: try again later
                return agent.NodeResult(agent.RETRY, exc.full_message(), {})
            outcome = str(exc.details.get("outcome") or "failed")
            return self._failed(work, outcome, exc.full_message(), {"criu_log_tail": (exc.log_tail or "").splitlines()})
        except OSError as exc:
            return self._failed(work, "failed", f"{exc.filename or ''}: {exc.strerror or exc}", {})
        return self._outcome(work, result)

    def _outcome(self, work: agent.Work, result: Dict[str, Any]) -> agent.NodeResult:
        errors = [d["error"] for d in result["destinations"] if d.get("error")]
        outcome = result["outcome"]
        details = {"restore": result}
        if outcome == "succeeded":
            done = ", ".join(d["container"] for d in result["destinations"])
            return agent.NodeResult(outcome, f"restored snapshot {result['id']} into {done}", details)
        return self._failed(work, outcome, "; ".join(errors) or outcome, details)

    def _failed(self, work: agent.Work, outcome: str, message: str, details: Dict[str, Any]) -> agent.NodeResult:
        if work.cold_start:
            fate = self.give_up(work)
            message += f"; {fate}"
            details = dict(details, placeholder=fate)
        return agent.NodeResult(outcome, message, details)

    def attempt_state(self, work: agent.Work) -> str:
        states = []
        for info in (found for _name, found, _why in self._placeholders(work)):
            if info is None:
                states.append(agent.UNFINISHED)
                continue
            control = self._control(info)
            if control and ctl.present(control, ctl.RESTORE_COMPLETE):
                states.append(agent.COMPLETE)
            elif control and ctl.present(control, ctl.RESTORE_FAILED):
                states.append(agent.FAILED)
            elif _restore_running(info):
                states.append(agent.RUNNING)
            else:
                states.append(agent.UNFINISHED)
        for state in (agent.RUNNING, agent.FAILED, agent.UNFINISHED):
            if state in states:
                return state
        return agent.COMPLETE if states else agent.UNFINISHED

    def checkpoint(self, c: capture.Capture) -> Dict[str, Any]:
        """The ``_agent_capture.Capturer`` step: the pod's container, checkpointed as ``checkpoint pod:`` does."""
        meta = c.pod.get("metadata") or {}
        ids = {s.get("name"): s.get("containerID") for s in (c.pod.get("status") or {}).get("containerStatuses") or []}
        pod = {"namespace": c.namespace, "name": meta.get("name"), "uid": meta.get("uid"), "container": c.container,
               "container_id": ids.get(c.container), "spec_hash": spechash.pod_spec_hash(c.pod)}
        cid = pod_container(self.runtime, pod)
        volumes = podapi.emptydir_mounts(c.pod.get("spec"), c.container, meta)  # their contents go along
        target = dataclasses.replace(ctr.resolve(self.runtime_name, cid, name=c.container, volumes=volumes),
                                     profile=c.app_profile)
        record = dict(pod, container_id=cid)
        result = ckpt.checkpoint(open_store(c.store, c.store_options), target, str(meta.get("name")),
                                 dict(meta.get("labels") or {}), CriuOptions(), leave_running=c.leave_running,
                                 wait_ready=c.wait_ready, ready_timeout=c.ready_timeout, criu_path=self.criu_path,
                                 pod=record)
        return dict(result)

    def give_up(self, work: agent.Work) -> str:
        fates = []
        for name, info, why in self._placeholders(work):
            if info is None or not info.running or info.pid <= 0:
                fates.append(f"{name}: {why or 'not running'}")
            elif work.cold_start:
                fates.append(f"{name}: " + _cold_start(self._control(info)))
            else:
                fates.append(f"{name}: " + _kill(info.pid))
        if work.cold_start and all(f.endswith("started cold") for f in fates) and fates:
            return "started cold"
        return "; ".join(fates) or "none found"


def _restore_running(info: ContainerInfo) -> bool:
    """Whether a restore into ``info`` holds the node's restore lock now (the lock is taken and let go at once)."""
    try:
        fd = rst.exclusive(f"placeholder {info.id}")
    except rst.Busy:
        return True
    os.close(fd)
    return False


def _cold_start(control: Optional[str]) -> str:
    if not control:
        return "no snapshot-control dir to ask for a cold start; left running"
    ctl.write(control, COLD_START, "the restore did not succeed; start the app cold\n")
    return "started cold"


def _kill(pid: int) -> str:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return "already gone"
    proc.wait_gone(pid, 10)
    return "killed"
