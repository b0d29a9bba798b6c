# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Pods as snapshot and restore targets: find them, wait for them, summarise them.

``run_pod_info`` backs the pod_info module: pods by name or label selector,
kept by a JMESPath filter, optionally waited for (scheduled, running, every
container running), each summarised as the node-side target the checkpoint
and restore modules take (namespace, name, uid, node, spec hash, containers
with their runtime ids).
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils import _k8s
from ansible_collections.warmstart.snapshot.plugins.module_utils import _podcontract as pc

JSON = Dict[str, Any]
WAIT_FOR = ("exists", "scheduled", "running")


def _jmespath() -> Any:
    try:
        import jmespath  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise _k8s.K8sError("filter needs the Python library jmespath for the module's interpreter "
                            "(python3 -m pip install jmespath, or apt-get install python3-jmespath)", "pod_info") from None
    return jmespath


def summary(pod: JSON) -> JSON:
    """The facts a snapshot or restore of this pod needs, in the checkpoint module's ``pod`` terms."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    by_name = {c.get("name"): c for c in status.get("containerStatuses") or []}
    containers = []
    for c in spec.get("containers") or []:
        st = by_name.get(c.get("name")) or {}
        containers.append({"name": c.get("name"), "container_id": st.get("containerID"),
                           "running": "running" in (st.get("state") or {}), "ready": bool(st.get("ready")),
                           "restart_count": int(st.get("restartCount") or 0)})
    return {"namespace": meta.get("namespace"), "name": meta.get("name"), "uid": meta.get("uid"),
            "node": spec.get("nodeName"), "phase": status.get("phase"), "labels": meta.get("labels") or {},
            "annotations": meta.get("annotations") or {}, "spec_hash": pc.pod_spec_hash(pod),
            "restore_state": pc.classify(pod) if (meta.get("annotations") or {}).get(pc.ANN_RESTORE_FROM) else None,
            "containers": containers}


def _waiting_for(s: JSON, wait_for: str) -> Optional[str]:
    """Why pod summary ``s`` does not meet ``wait_for`` yet (None: it does)."""
    if wait_for == "exists":
        return None
    if not s["node"]:
        return "not scheduled"
    if wait_for == "scheduled":
        return None
    down = [c["name"] for c in s["containers"] if not c["running"] or not c["container_id"]]
    if down:
        return f"containers not running: {', '.join(down)}"
    return None


def run_pod_info(params: JSON) -> JSON:
    cluster = _k8s.cluster_from(params)
    namespace = params.get("namespace") or "default"
    expr = _jmespath().compile(params["filter"]) if params.get("filter") else None
    wait_for = params.get("wait_for")
    deadline = time.monotonic() + float(params.get("wait_timeout") or 0)
    while True:
        if params.get("name"):
            found = cluster.find("Pod", params["name"], namespace)
            pods = [found] if found else []
        else:
            pods = cluster.list_pods(namespace, params.get("label_selector"), params.get("field_selector"))
        if expr is not None:
            pods = [p for p in pods if expr.search(p)]
        summaries = [summary(p) for p in pods]
        pending = {s["name"]: why for s in summaries for why in [_waiting_for(s, wait_for or "exists")] if why}
        if params.get("name") and not pods and wait_for:
            pending = {params["name"]: "not found"}
        if not wait_for or not pending:
            break
        if time.monotonic() >= deadline:
            raise _k8s.K8sError(f"timed out after {params.get('wait_timeout')} s waiting for pods in namespace "
                                f"{namespace} to be {wait_for}", "pod_info",
                                reasons=[f"Pod {namespace}/{name}: {why}" for name, why in sorted(pending.items())])
        time.sleep(float(params.get("wait_sleep") or 1))
    return {"changed": False, "pods": pods, "targets": summaries}


OUTCOMES = {
    # outcome -> (condition status, reason)
    "succeeded": ("True", pc.REASON_SUCCEEDED),
    "failed": ("False", pc.REASON_FAILED),
    "partially_succeeded": ("False", pc.REASON_PARTIAL),
    "incompatible": ("False", pc.REASON_INCOMPATIBLE),
}


def begin_restore(cluster: _k8s.Cluster, namespace: str, name: str, message: str = "",
                  check_mode: bool = False) -> JSON:
    """Before the node touches restore pod ``namespace/name``: hold it with the finalizer, say RestoreInProgress.

    A pod whose restore already ran (any Restored reason but RestoreInProgress) is refused: a restore is never
    replayed over a pod whose one attempt is spent.
    """
    pod = cluster.get_pod(namespace, name)
    condition = pc.get_condition(pod, pc.RESTORE_CONDITION)
    if condition and condition.get("reason") not in (None, pc.REASON_IN_PROGRESS):
        raise _k8s.K8sError(f"Pod {namespace}/{name}: its restore already ran ({condition.get('reason')}: "
                            f"{condition.get('message') or 'no message'}); a new pod is needed", "Pod")
    if ((pod.get("metadata") or {}).get("deletionTimestamp")):
        raise _k8s.K8sError(f"Pod {namespace}/{name} is being deleted", "Pod")
    plan = restore_plan(cluster, pod)
    added = cluster.add_finalizer("Pod", name, pc.FINALIZER, namespace, check_mode)
    changed, pod = cluster.set_pod_condition(namespace, name, pc.RESTORE_CONDITION, "Unknown", pc.REASON_IN_PROGRESS,
                                             message or f"restoring from PodSnapshot {plan['snapshot']}", check_mode)
    return dict(plan, changed=added or changed, state="pending", pod=pod)


def restore_plan(cluster: _k8s.Cluster, pod: JSON) -> JSON:
    """What the node must do for restore pod ``pod``: the artifact, and (source, destination container) pairs.

    The PodSnapshot named by the pod's restore-from annotation must be bound to its content (backlink uid,
    Ready); the pairs come from the container-map annotation, else each container of the pod that the snapshot
    holds, else - one container on each side - that one into that one.
    """
    meta = pod.get("metadata") or {}
    namespace, name = meta.get("namespace"), meta.get("name")
    source = (meta.get("annotations") or {}).get(pc.ANN_RESTORE_FROM)
    if not source:
        raise _k8s.K8sError(f"Pod {namespace}/{name} has no {pc.ANN_RESTORE_FROM} annotation: not a restore pod", "Pod")
    snap = cluster.get(pc.KIND_SNAPSHOT, source, namespace)
    bound = (snap.get("status") or {}).get("boundSnapshotContentName")
    content = cluster.find(pc.KIND_CONTENT, bound) if bound else None
    problems = pc.check_content_binding(snap, content or {"metadata": {"name": bound}})
    if content is None:
        problems.insert(0, f"PodSnapshot {namespace}/{source} has no {pc.KIND_CONTENT}")
    if problems:
        raise _k8s.K8sError(f"Pod {namespace}/{name}: PodSnapshot {namespace}/{source} cannot be restored from",
                            "Pod", reasons=problems)
    held = list(((snap.get("spec") or {}).get("source") or {}).get("containers") or [])
    dests = pc.restore_destinations(pod)
    mapped = pc.parse_container_map((meta.get("annotations") or {}).get(pc.ANN_CONTAINER_MAP))
    if mapped:
        pairs = [{"source": src, "container": dst} for src, dst in mapped]
    elif len(held) == 1 and len(dests) == 1:
        pairs = [{"source": held[0], "container": dests[0]}]
    else:
        pairs = [{"source": d, "container": d} for d in dests if d in held]
    if not pairs:
        raise _k8s.K8sError(f"Pod {namespace}/{name}: none of its containers ({', '.join(dests)}) is in PodSnapshot "
                            f"{namespace}/{source} ({', '.join(held) or 'none'}); set a container map", "Pod")
    ids = {c.get("name"): c.get("containerID") for c in (pod.get("status") or {}).get("containerStatuses") or []}
    for pair in pairs:
        pair["container_id"] = ids.get(pair["container"])
    store = ((content.get("spec") or {}).get("store") or {}) if content else {}
    return {"snapshot": source, "content": bound, "store": store, "node": (pod.get("spec") or {}).get("nodeName"),
            "pairs": pairs, "skip_compat_check": str((meta.get("annotations") or {}).get(pc.ANN_SKIP_COMPAT, "")).lower() == "true"}


def finish_restore(cluster: _k8s.Cluster, namespace: str, name: str, outcome: str, message: str = "",
                   check_mode: bool = False) -> JSON:
    """After the node's restore: the Restored condition for ``outcome``, then the finalizer released."""
    status, reason = OUTCOMES[outcome]
    pod = cluster.find("Pod", name, namespace)
    if pod is None:
        raise _k8s.K8sError(f"Pod {namespace}/{name} not found (deleted during its restore?)", "Pod")
    changed, pod = cluster.set_pod_condition(namespace, name, pc.RESTORE_CONDITION, status, reason,
                                             message or outcome.replace("_", " "), check_mode)
    removed = cluster.remove_finalizer("Pod", name, pc.FINALIZER, namespace, check_mode)
    if removed and not check_mode:
        pod = cluster.find("Pod", name, namespace) or pod
    return {"changed": changed or removed, "state": pc.classify(pod), "pod": pod}


def _snapshot_summary(snap: JSON, content: Optional[JSON]) -> JSON:
    meta = snap.get("metadata") or {}
    status = snap.get("status") or {}
    cspec = (content or {}).get("spec") or {}
    return {"namespace": meta.get("namespace"), "name": meta.get("name"), "uid": meta.get("uid"),
            "labels": meta.get("labels") or {}, "ready": pc.is_ready(snap),
            "created_at": status.get("createdAt") or meta.get("creationTimestamp"),
            "content": status.get("boundSnapshotContentName"), "size": status.get("size"),
            "pod_spec_hash": status.get("podSpecHash"),
            "source_pod": (((snap.get("spec") or {}).get("source") or {}).get("podRef") or {}).get("name"),
            "node": (cspec.get("source") or {}).get("nodeName"),
            "store": cspec.get("store") if cspec.get("store") else None}


def run_pod_snapshot_info(params: JSON) -> JSON:
    """PodSnapshots of a namespace with their contents; with keep_last, which grouping retention removes."""
    from ansible_collections.warmstart.snapshot.plugins.module_utils import _retention as ret  # pylint: disable=import-outside-toplevel
    cluster = _k8s.cluster_from(params)
    namespace = params.get("namespace") or "default"
    policy: Optional[JSON] = None
    if params.get("policy"):
        policy = policy_settings(cluster.get(pc.KIND_POLICY, params["policy"], namespace))
    if params.get("name"):
        found = cluster.find(pc.KIND_SNAPSHOT, params["name"], namespace)
        snaps = [found] if found else []
    else:
        snaps = cluster.list(pc.KIND_SNAPSHOT, namespace, params.get("label_selector"))
    summaries = []
    for snap in snaps:
        bound = (snap.get("status") or {}).get("boundSnapshotContentName")
        content = cluster.find(pc.KIND_CONTENT, bound) if bound else None
        summaries.append(_snapshot_summary(snap, content))
    expired: List[JSON] = []
    if params.get("keep_last"):
        try:
            pol = ret.policy(keep_last=params["keep_last"], group_by=params.get("group_by") or None)
        except ret.RetentionError as exc:
            raise _k8s.K8sError(str(exc), "pod_snapshot_info") from None
        # Ready snapshots compete for the places of their group; without group_by, one group per source pod
        docs = [{"id": s["name"], "name": s["source_pod"], "labels": s["labels"], "created_at": s["created_at"]}
                for s in summaries if s["ready"]]
        decision = ret.plan(docs, [], pol)
        why = {e["id"]: e.get("reason") for e in decision.remove}
        expired = [dict(s, reason=why[s["name"]]) for s in summaries if s["name"] in why]
    return {"changed": False, "snapshots": summaries, "expired": expired, "policy": policy}


def selector_string(selector: Optional[JSON]) -> str:
    """A metav1.LabelSelector as the ``labelSelector`` query string (``k=v,k in (a,b),!k``)."""
    sel = selector or {}
    parts = [f"{k}={v}" for k, v in sorted((sel.get("matchLabels") or {}).items())]
    for expr in sel.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), list(expr.get("values") or [])
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(str(key))
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            raise _k8s.K8sError(f"label selector operator {op!r} is not one of In, NotIn, Exists, DoesNotExist",
                                pc.KIND_POLICY)
    return ",".join(parts)


def policy_settings(policy: JSON) -> JSON:
    """What a PodSnapshotPolicy asks of a snapshot run, in the k8s_snapshot playbook's terms."""
    spec = policy.get("spec") or {}
    trigger = spec.get("triggerConfig") or {}
    grouping = spec.get("snapshotGroupingRules") or {}
    return {
        "name": (policy.get("metadata") or {}).get("name"),
        "selector": selector_string(spec.get("selector")),
        "store_url": spec.get("storeUrl"),
        "wait_ready": (trigger.get("type") or "workload") == "workload",
        "leave_running": (trigger.get("postCheckpoint") or "resume") == "resume",
        "scope": spec.get("snapshotScope") or pc.SCOPE_WHOLE_POD,
        "group_by": list(((grouping.get("groupByLabelValue") or {}).get("labels")) or []),
        "max_per_group": int(((grouping.get("groupRetentionPolicy") or {}).get("maxSnapshotCountPerGroup")) or 0),
        "last_access_timeout": (spec.get("retentionConfig") or {}).get("lastAccessTimeout"),
    }
