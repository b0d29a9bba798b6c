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

import os
import signal
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.agent import _agent as agent
from ansible_collections.warmstart.snapshot.plugins.module_utils.agent import _agent_capture as capture
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _container as ctr
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _control as ctl
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_requests as requests
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _metrics as metrics
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _restorer as rst
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import CriuOptions
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._containerinfo import ContainerInfo
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import cluster_from
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._runtime import Runtime, get_runtime, pod_container
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._stores import open_store

COLD_START = "cold-start"


class LocalNode:
    """This node: ``runtime`` (podman, containerd or auto), the store override, CRIU and restore root."""

    def __init__(self, runtime: str = "auto", store: Optional[str] = None,
                 store_options: Optional[Dict[str, Any]] = None, criu_path: Optional[str] = None,
                 restore_root: Optional[str] = None) -> None:
        self.runtime_name = runtime
        self.store = store
        self.store_options = store_options or {}
        self.criu_path = criu_path
        self.restore_root = restore_root
        self._runtime: Optional[Runtime] = None

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
        return ctr.control_host_path(info, inside) if inside else None

    # the Node protocol ----------------------------------------------------------------------------

    def restore(self, work: agent.Work) -> agent.NodeResult:
        kwargs: Dict[str, Any] = {}
        if self.restore_root:
            kwargs["restore_root"] = self.restore_root
        try:
            spec = ",".join(f"{p['source']}={self._container_id(work, p)}" for p in work.pairs)
            store = open_store(self.store or work.store.get("url"), self.store_options)
            result = ctr.restore_into(store, spec, snapshot_id=work.snapshot_id, skip_compat=work.skip_compat_check,
                                      kill_on_failure=not work.cold_start, runtime_name=self.runtime_name,
                                      criu_path=self.criu_path, **kwargs)
        except WarmstartError as exc:
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
               "container_id": ids.get(c.container), "spec_hash": pc.pod_spec_hash(c.pod)}
        cid = pod_container(self.runtime, pod)
        target = ctr.resolve(self.runtime_name, cid, name=c.container)
        record = dict(pod, container_id=cid)
        result = snap.checkpoint(open_store(c.store, c.store_options), target, str(meta.get("name")),
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


def run_agent_restore(params: Dict[str, Any], check_mode: bool) -> Dict[str, Any]:
    """The ``agent_restore`` module: one restore pod, handled once by this node (``_agent.restore_pod``)."""
    if params.get("fallback") not in agent.FALLBACKS:
        raise WarmstartError(f"fallback must be one of {', '.join(agent.FALLBACKS)}, not {params.get('fallback')!r}")
    node = LocalNode(runtime=params.get("runtime") or "auto", store=params.get("store"),
                     store_options=params.get("store_options"), criu_path=params.get("criu_path"),
                     restore_root=params.get("restore_root"))
    settings = agent.Settings.of(params)
    settings.running_timeout = float(params.get("running_timeout") or settings.running_timeout)
    result = agent.restore_pod(cluster_from(params), settings, node, check_mode)
    if not check_mode and result["action"] in ("restored", "refused", "recovered"):
        warning = record_metrics(metrics.resolve_dir(params.get("metrics_dir")), result)
        if warning:
            result.setdefault("warnings", []).append(warning)
    return result


def record_metrics(directory: Optional[str], result: Dict[str, Any]) -> Optional[str]:
    """Count the pod's restore in the node's metrics (outcome, phases, bytes, snapshot age, ready latency)."""
    restore = result.get("restore") or {}
    phases: Dict[str, Any] = {}
    for dest in restore.get("destinations") or []:
        for phase, seconds in (dest.get("timings") or {}).items():
            phases[phase] = phases.get(phase, 0.0) + float(seconds)
    size = int(result.get("snapshot_bytes") or 0) if result.get("outcome") == "succeeded" else 0
    namespace = str(result.get("pod", "/")).split("/", 1)[0]
    return metrics.record_restore(directory, str(result.get("outcome") or "failed"), phases, size,
                                  result.get("snapshot_age_seconds"), namespace, str(result.get("snapshot") or ""),
                                  result.get("ready_seconds"))


def run_agent_capture(params: Dict[str, Any], check_mode: bool) -> Dict[str, Any]:
    """The ``agent_capture`` module: one PodSnapshot request (or a policy's ready source pod), captured here."""
    cluster = cluster_from(params)
    settings = capture.CaptureSettings.of(params)
    asked = None
    if params.get("policy") and params.get("pod"):
        pod = cluster.find("Pod", params["pod"], settings.namespace)
        policy = cluster.find(pc.KIND_POLICY, params["policy"], settings.namespace)
        if pod is None or policy is None:
            gone = f"Pod {settings.namespace}/{params['pod']}" if pod is None else f"policy {params['policy']}"
            return {"changed": False, "action": "skipped", "reason": f"{gone} no longer exists"}
        settings.name, created = capture.ask_for(cluster, settings.namespace, pod, policy, check_mode)
        asked = {"snapshot": settings.name, "created": created}
    elif params.get("trigger"):
        reconciled = requests.reconcile_trigger(cluster, settings.namespace, params["trigger"], check_mode)
        if reconciled["phase"] != "pending" or not reconciled.get("snapshot_name"):
            return {"changed": bool(reconciled["changed"]), "action": "skipped", "trigger": params["trigger"],
                    "reason": f"the trigger is {reconciled['phase']}", "actions": reconciled["actions"]}
        settings.name = str(reconciled["snapshot_name"])
        asked = {"snapshot": settings.name, "trigger": params["trigger"]}
    elif not params.get("name"):
        raise WarmstartError("agent_capture needs name (a PodSnapshot), pod and policy, or trigger")
    node = LocalNode(runtime=params.get("runtime") or "auto", criu_path=params.get("criu_path"))
    result = capture.capture(cluster, settings, node, check_mode)
    if asked:
        result["requested"] = asked
    if params.get("trigger") and not check_mode:  # Triggered Complete / Failed once the request settled
        result["trigger_phase"] = requests.reconcile_trigger(cluster, settings.namespace, params["trigger"])["phase"]
    if not check_mode and result["action"] in ("captured", "failed", "will retry"):
        outcome = "succeeded" if result["action"] == "captured" else "failed"
        warning = metrics.record_capture(metrics.resolve_dir(params.get("metrics_dir")), outcome,
                                         result.get("timings"), int(result.get("size") or 0))
        if warning:
            result.setdefault("warnings", []).append(warning)
    return result
