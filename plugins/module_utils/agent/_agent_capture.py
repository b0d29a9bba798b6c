# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node agent's capture of one requested PodSnapshot: claim, checkpoint the source pod here, bind or fail it.

A PodSnapshot created without a bound content is a *request* (by a user, a PodSnapshotManualTrigger, or the
agent for a policy's source pod that is ready). Invariants:

- The request is decided from the PodSnapshot as the API server has it now: one that is bound, Ready or Failed
  is left alone, so a repeated or replayed event does nothing.
- One capture at a time per request: ``_k8s_requests.begin_capture`` claims the next attempt (``status.attempts``,
  a status write guarded by the resourceVersion); of two agents only one captures, and an attempt whose agent
  stopped counts as failed once it is older than the attempt timeout.
- The source always keeps running after a failed capture (the checkpoint resumes it on every failure path).
  ``_k8s_requests.fail_capture`` records the failure: the next event for the request (a resync) tries again,
  until ``max_attempts`` attempts failed; then the request is Failed with the last cause. A request that can
  never succeed (its source pod is gone or was replaced) is Failed at once.
- A capture that succeeded binds the request: a PodSnapshotContent pointing back to it, the store location,
  the source node, and Ready (``_k8s_records.ensure_pod_snapshot``).

The node's checkpoint is the ``Capturer`` protocol (``_agent_node.LocalNode`` on a real node). No Ansible import.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Protocol, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_records as rec
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_requests as req
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_summaries as summ
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as podcontract
from ansible_collections.warmstart.snapshot.plugins.module_utils.node._profile import Profile, ProfileError
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_storage as stg
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import Cluster, K8sError

JSON = Dict[str, Any]

REASON_FAILED = "CaptureFailed"
REASON_SOURCE_GONE = "SourcePodGone"


@dataclass
class Capture:
    """What the node checkpoints for one request."""

    namespace: str
    snapshot: str
    pod: JSON
    container: str
    store: str
    store_options: JSON
    wait_ready: bool
    leave_running: bool
    ready_timeout: float = 300.0
    app_profile: Optional[Profile] = None  # the pod's annotation app-profile, read (and checked) by the agent


class Capturer(Protocol):
    """The node-side checkpoint (``_agent_node.LocalNode``)."""

    def checkpoint(self, c: Capture) -> JSON:
        """Checkpoint ``c.container`` of ``c.pod`` into ``c.store``; the checkpoint result (``id``, ``size``,
        ``path``, ``source_node``, ``timings``). Raises WarmstartError when it failed (the source resumed)."""


@dataclass
class CaptureSettings:
    """The agent's settings for one request (module options)."""

    namespace: str
    name: str
    agent: str = "agent"
    node_name: Optional[str] = None
    max_attempts: int = 3
    store: Optional[str] = None
    store_options: Optional[JSON] = None
    ready_timeout: float = 300.0

    @classmethod
    def of(cls, p: Mapping[str, Any]) -> "CaptureSettings":
        return cls(namespace=p.get("namespace") or "default", name=p.get("name") or "",
                   agent=p.get("agent_id") or p.get("node_name") or "agent", node_name=p.get("node_name") or None,
                   max_attempts=int(p.get("max_attempts") or 3), store=p.get("store") or None,
                   store_options=p.get("store_options") or {}, ready_timeout=float(p.get("ready_timeout") or 300))


def request_name(pod: str, policy: str, pod_uid: str) -> str:
    """The PodSnapshot the agent asks for on behalf of ``policy`` for one incarnation of ``pod`` (DNS-1123)."""
    digest = hashlib.sha256(pod_uid.encode()).hexdigest()[:8]
    return f"{pod[:200]}-{policy[:40]}-{digest}".lower()


def ask_for(cluster: Cluster, namespace: str, pod: JSON, policy: JSON, check_mode: bool = False) -> Tuple[str, bool]:
    """The PodSnapshot request for a policy's source ``pod`` (created when missing); ``(name, created)``."""
    meta = pod.get("metadata") or {}
    pname = str((policy.get("metadata") or {}).get("name") or "")
    name = request_name(str(meta.get("name")), pname, str(meta.get("uid") or ""))
    if cluster.find(podapi.KIND_SNAPSHOT, name, namespace) is not None:
        return name, False
    body = {"apiVersion": podapi.API_VERSION, "kind": podapi.KIND_SNAPSHOT,
            "metadata": {"name": name, "namespace": namespace, "labels": dict(meta.get("labels") or {})},
            "spec": {"source": {"podRef": {"name": meta.get("name"), "uid": meta.get("uid")}}, "policyName": pname,
                     "scope": (policy.get("spec") or {}).get("snapshotScope") or podapi.SCOPE_WHOLE_POD}}
    if not check_mode:
        try:
            cluster.create(podapi.KIND_SNAPSHOT, body, namespace)
        except K8sError as exc:
            if exc.status != 409:  # another agent asked first: the same request
                raise
            return name, False
    return name, True


# --- deciding ---------------------------------------------------------------------------------

def settled(snapshot: JSON) -> Optional[str]:
    """Why the request needs no capture (bound, Ready or Failed), or None."""
    status = snapshot.get("status") or {}
    if status.get("boundSnapshotContentName"):
        return f"it is bound to {status['boundSnapshotContentName']}"
    for ctype in (podapi.READY_CONDITION, podapi.FAILED_CONDITION):
        cond = podapi.get_condition(snapshot, ctype)
        if cond and cond.get("status") == "True":
            return f"it is {ctype} ({cond.get('reason')})"
    return None


def source_problems(snapshot: JSON, pod: Optional[JSON]) -> List[str]:
    """Why the request can never be captured: its source pod is gone or is another incarnation."""
    meta = snapshot.get("metadata") or {}
    ref = ((snapshot.get("spec") or {}).get("source") or {}).get("podRef") or {}
    where = f"Pod {meta.get('namespace')}/{ref.get('name')}"
    if pod is None:
        return [f"its source {where} does not exist"]
    if ref.get("uid") and ref["uid"] != (pod.get("metadata") or {}).get("uid"):
        return [f"its source {where} was deleted and created again (uid {ref['uid']} is gone)"]
    return []


def _container(snapshot: JSON, pod: JSON) -> str:
    wanted = ((snapshot.get("spec") or {}).get("source") or {}).get("containers") or []
    names = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
    return str(wanted[0] if wanted else (names[0] if names else ""))


# --- writing -------------------------------------------------------------------------------------

def _record(cluster: Cluster, s: CaptureSettings, snapshot: JSON, pod: JSON, **status: Any) -> JSON:
    """``ensure_pod_snapshot`` for the request: in progress, Ready and bound, or Failed."""
    spec = snapshot.get("spec") or {}
    params = {"namespace": s.namespace, "name": s.name, "source_pod": (pod.get("metadata") or {}).get("name"),
              "containers": ((spec.get("source") or {}).get("containers") or None), "scope": spec.get("scope"),
              "policy_name": spec.get("policyName"), "labels": None, "content_name": None, "store": None,
              "node": (pod.get("spec") or {}).get("nodeName"), "source_node": None, "size": None,
              "created_at": None, "ready": False, "failed_reason": None, "failed_message": None}
    params.update(status)
    return rec.ensure_pod_snapshot(cluster, params)


# --- one request --------------------------------------------------------------------------------

def capture(cluster: Cluster, s: CaptureSettings, node: Capturer, check_mode: bool = False) -> JSON:
    """Handle one PodSnapshot request once (see the module docstring)."""
    ref = f"{s.namespace}/{s.name}"
    snapshot = cluster.find(podapi.KIND_SNAPSHOT, s.name, s.namespace)
    if snapshot is None:
        return {"changed": False, "action": "skipped", "pod_snapshot_ref": ref, "reason": "the PodSnapshot no longer exists"}
    why = settled(snapshot)
    if why:
        return {"changed": False, "action": "skipped", "pod_snapshot_ref": ref, "reason": why}
    pname = (((snapshot.get("spec") or {}).get("source") or {}).get("podRef") or {}).get("name")
    pod = cluster.find("Pod", str(pname), s.namespace)
    node_of = ((pod or {}).get("spec") or {}).get("nodeName")
    if pod is not None and s.node_name and node_of != s.node_name:
        return {"changed": False, "action": "skipped", "pod_snapshot_ref": ref,
                "reason": f"its source pod runs on node {node_of}, not on this agent's node {s.node_name}"}
    problems = source_problems(snapshot, pod)
    if check_mode:
        return {"changed": True, "action": "would fail" if problems else "would capture", "pod_snapshot_ref": ref,
                "reasons": problems}
    if problems or pod is None:
        req.fail_capture(cluster, s.namespace, s.name, REASON_SOURCE_GONE, "; ".join(problems), max_attempts=1)
        return {"changed": True, "action": "failed", "pod_snapshot_ref": ref, "reasons": problems}
    claimed = req.begin_capture(cluster, s.namespace, s.name, max_attempts=s.max_attempts)
    if not claimed["claimed"]:
        return {"changed": bool(claimed["changed"]), "action": "skipped", "pod_snapshot_ref": ref,
                "reason": claimed["reason"]}
    return _capture(cluster, s, snapshot, pod, node, int(claimed["attempt"]))


def _policy(cluster: Cluster, s: CaptureSettings, snapshot: JSON) -> JSON:
    """The request's policy settings (``policy_settings``), or {} without a policy."""
    pname = (snapshot.get("spec") or {}).get("policyName")
    policy = cluster.find(podapi.KIND_POLICY, str(pname), s.namespace) if pname else None
    return summ.policy_settings(policy) if policy else {}


def _store(cluster: Cluster, s: CaptureSettings, policy: JSON) -> Tuple[str, JSON]:
    """Where to capture: the agent's store, else the policy's (storeUrl, or its PodSnapshotStorageConfig and the
    credentials Secret that names); refused when there is none."""
    if s.store:
        return s.store, dict(s.store_options or {})
    if policy.get("name"):
        resolved = stg.resolve_store(cluster, s.namespace, policy=str(policy["name"]))
        return str(resolved["store"]), dict(resolved.get("store_options") or {})
    raise WarmstartError(f"PodSnapshot {s.namespace}/{s.name}: no store to capture into (it names no policy, and "
                         "the agent has no store)")


def _configmap_reader(cluster: Cluster) -> podcontract.ConfigMapReader:
    """Reads the ConfigMap a pod's app-profile annotation names; a failure says what lets the agent read it."""
    def read(namespace: str, name: str) -> Dict[str, Any]:
        try:
            return dict(cluster.get("ConfigMap", name, namespace).get("data") or {})
        except K8sError as exc:
            raise ProfileError(f"ConfigMap {namespace}/{name}: the agent cannot read it ({exc.message}); it may read "
                               "the ConfigMaps its role's k8s_agent_profile_configmaps names, no other") from None
    return read


def _capture(cluster: Cluster, s: CaptureSettings, snapshot: JSON, pod: JSON, node: Capturer, attempt: int) -> JSON:
    """Claimed: checkpoint on the node, then bind the request or record the failed attempt."""
    ref = f"{s.namespace}/{s.name}"
    policy = _policy(cluster, s, snapshot)
    try:
        store, options = _store(cluster, s, policy)
        c = Capture(s.namespace, s.name, pod, _container(snapshot, pod), store, options,
                    wait_ready=bool(policy.get("wait_ready", False)),
                    leave_running=bool(policy.get("leave_running", True)), ready_timeout=s.ready_timeout,
                    app_profile=podcontract.app_profile_of(pod, _configmap_reader(cluster)))
        done = node.checkpoint(c)
    except WarmstartError as exc:
        failed = req.fail_capture(cluster, s.namespace, s.name, REASON_FAILED, exc.full_message(),
                                  max_attempts=s.max_attempts)
        return {"changed": True, "action": "failed" if failed["final"] else "will retry", "pod_snapshot_ref": ref,
                "reasons": [f"attempt {attempt} of {s.max_attempts}: {exc.full_message()}"], "attempts": attempt}
    _record(cluster, s, snapshot, pod, ready=True, size=done.get("size"), created_at=done.get("created_at"),
            source_node=dict(done.get("source_node") or {}, gpus=(done.get("gpu") or {}).get("gpus") or []),
            store={"url": store, "snapshot_id": done["id"], "path": done.get("path")})
    return {"changed": True, "action": "captured", "pod_snapshot_ref": ref, "snapshot_id": done["id"], "attempts": attempt,
            "size": done.get("size"), "timings": done.get("timings") or {}, "container": c.container}
