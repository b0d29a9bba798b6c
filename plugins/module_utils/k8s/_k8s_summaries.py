# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Pod and snapshot summaries, label selectors and PodSnapshotPolicy settings, in the modules' terms.

Pure functions over what ``_k8s_client.Cluster`` read; nothing here talks to the cluster. ``summary`` and
``waiting_for`` are pod_info's (``WAIT_FOR`` its choices), ``snapshot_summary`` pod_snapshot_info's,
``selector_string`` and ``policy_settings`` what the k8s_snapshot playbook and a restore pod's
``restore-policy`` take from a PodSnapshotPolicy, ``expired`` what a policy's retention removes.
"""
from __future__ import annotations

from typing import List, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.catalog import _retention as ret
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _spechash as spechash
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import JSON, K8sError


WAIT_FOR = ("exists", "scheduled", "running")


def summary(pod: JSON) -> JSON:
    """The facts a snapshot or restore of this pod needs, in the checkpoint module's ``pod`` terms."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    by_name = {c.get("name"): c for c in status.get("containerStatuses") or []}
    restoring = pc.contract_annotations(meta.get("annotations") or {}, "pod")[0].get(podapi.ANN_RESTORE_FROM) is not None
    containers = []
    for c in spec.get("containers") or []:
        st = by_name.get(c.get("name")) or {}
        containers.append({"name": c.get("name"), "container_id": st.get("containerID"),
                           "running": "running" in (st.get("state") or {}), "ready": bool(st.get("ready")),
                           "restart_count": int(st.get("restartCount") or 0),
                           "volumes": podapi.emptydir_mounts(spec, c.get("name"), meta)})
    return {"namespace": meta.get("namespace"), "name": meta.get("name"), "uid": meta.get("uid"),
            "node_name": spec.get("nodeName"), "phase": status.get("phase"), "labels": meta.get("labels") or {},
            "annotations": meta.get("annotations") or {}, "spec_hash": spechash.pod_spec_hash(pod),
            "pod_outcome": pc.classify(pod) if restoring else None,
            "containers": containers}


def waiting_for(s: JSON, wait_for: str) -> Optional[str]:
    """Why pod summary ``s`` does not meet ``wait_for`` (one of ``WAIT_FOR``) yet (None: it does)."""
    if wait_for == "exists":
        return None
    if not s["node_name"]:
        return "not scheduled"
    if wait_for == "scheduled":
        return None
    down = [c["name"] for c in s["containers"] if not c["running"] or not c["container_id"]]
    if down:
        return f"containers not running: {', '.join(down)}"
    return None


def snapshot_summary(snap: JSON, content: Optional[JSON]) -> JSON:
    """A PodSnapshot and its content in pod_snapshot_info's terms."""
    meta = snap.get("metadata") or {}
    status = snap.get("status") or {}
    cspec = (content or {}).get("spec") or {}
    failed = podapi.get_condition(snap, podapi.FAILED_CONDITION) or {}
    return {"namespace": meta.get("namespace"), "name": meta.get("name"), "uid": meta.get("uid"),
            "labels": meta.get("labels") or {}, "ready": podapi.is_ready(snap),
            "failed": failed.get("status") == "True",
            "policy_name": (snap.get("spec") or {}).get("policyName"),
            "created_at": status.get("createdAt") or meta.get("creationTimestamp"),
            "last_access_time": status.get("lastAccessTime"), "attempts": int(status.get("attempts") or 0),
            "last_error": status.get("lastError"),
            "content_name": status.get("boundSnapshotContentName"), "size": status.get("size"),
            "pod_spec_hash": status.get("podSpecHash"),
            "source_pod": (((snap.get("spec") or {}).get("source") or {}).get("podRef") or {}).get("name"),
            "node_name": (cspec.get("source") or {}).get("nodeName"),
            "store": podapi.store_ref(cspec.get("store"))}


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
            raise K8sError(f"label selector operator {op!r} is not one of In, NotIn, Exists, DoesNotExist",
                           podapi.KIND_POLICY)
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
        "scope": spec.get("snapshotScope") or podapi.SCOPE_WHOLE_POD,
        "group_by": list(((grouping.get("groupByLabelValue") or {}).get("labels")) or []),
        "max_per_group": int(((grouping.get("groupRetentionPolicy") or {}).get("maxSnapshotCountPerGroup")) or 0),
        "last_access_timeout": (spec.get("retentionConfig") or {}).get("lastAccessTimeout"),
    }


def expired(summaries: List[JSON], keep_last: int, group_by: Optional[List[str]],
            last_access_timeout: ret.Duration = None) -> List[JSON]:
    """The summaries (``snapshot_summary``) retention removes, each with its ``reason``: Ready snapshots compete for
    the ``keep_last`` places of their group (the ``group_by`` label values; without them, one group per source
    pod), and go when not restored from (or, never restored from, not created) within ``last_access_timeout``."""
    pol = ret.policy(keep_last=keep_last, group_by=group_by or None, last_access_timeout=last_access_timeout)
    docs = [{"id": s["name"], "name": s["source_pod"], "labels": s["labels"], "created_at": s["created_at"],
             "last_access_at": s.get("last_access_time")}
            for s in summaries if s["ready"]]
    why = {e["id"]: e.get("reason") for e in ret.plan(docs, [], pol).remove}
    return [dict(s, reason=why[s["name"]]) for s in summaries if s["name"] in why]
