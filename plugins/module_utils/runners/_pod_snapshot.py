# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The pod_snapshot module's runner: the PodSnapshot + PodSnapshotContent records of a snapshot, a capture
attempt claimed or failed, or their deletion.

Keeps the runners' invariants (``_common``): ``failed_reason`` only with ``ready=false`` and ``state=failed``
only with ``failed_reason`` are refused here, before a connection is made.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_records as rec
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_requests as req
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import (
    JSON, Cluster, Params, cluster_from, object_diff)


def run(params: Params, check_mode: bool, diff: bool = False) -> JSON:
    """The PodSnapshot + PodSnapshotContent records of a snapshot (``state: present``), or their deletion; with
    ``diff``, each record before and after."""
    state = params["state"]
    if params.get("failed_reason") and params.get("ready") and state == "present":
        raise WarmstartError("failed_reason needs ready=false")
    if state == "failed" and not params.get("failed_reason"):
        raise WarmstartError("state=failed needs failed_reason (the CamelCase cause, e.g. CheckpointFailed)")
    cluster = cluster_from(params)
    before = _records(cluster, params) if diff else None
    result = _run(cluster, params, check_mode)
    if before is not None:
        result["diff"] = _diff(params, before, result)
    return result


def _records(cluster: Cluster, params: Params) -> Tuple[Optional[JSON], Optional[JSON]]:
    """The PodSnapshot and the PodSnapshotContent (the one named, or bound) as they are before the change."""
    snap = cluster.find(podapi.KIND_SNAPSHOT, params["name"], params["namespace"])
    cname = params.get("content_name") or ((snap or {}).get("status") or {}).get("boundSnapshotContentName")
    return snap, (cluster.find(podapi.KIND_CONTENT, cname) if cname else None)


def _diff(params: Params, before: Tuple[Optional[JSON], Optional[JSON]], result: JSON) -> List[JSON]:
    """The PodSnapshot before and after; the content too, except for a capture attempt (it touches none)."""
    out = [object_diff(podapi.KIND_SNAPSHOT, params["name"], params["namespace"], before[0], result["pod_snapshot"])]
    content = result["pod_snapshot_content"] or before[1]
    if params["state"] in ("present", "absent") and content:
        out.append(object_diff(podapi.KIND_CONTENT, content["metadata"]["name"], None, before[1],
                               result["pod_snapshot_content"]))
    return out


def _run(cluster: Cluster, params: Params, check_mode: bool) -> JSON:
    state = params["state"]
    if state in ("capturing", "failed"):
        return _capture_attempt(cluster, params, check_mode)
    if state == "absent":
        out = rec.delete_pod_snapshot(cluster, params["namespace"], params["name"], params.get("content_name"),
                                      check_mode)
        return {"changed": out["changed"], "actions": out["actions"], "pending": out["pending"],
                "pod_snapshot": None, "pod_snapshot_content": None, "status": {}}
    out = rec.ensure_pod_snapshot(cluster, params, check_mode)
    return {"changed": out["changed"], "actions": out["actions"], "pod_snapshot": out["snapshot"],
            "pod_snapshot_content": out["content"], "status": (out["snapshot"] or {}).get("status") or {},
            "warnings": out["warnings"]}


def _capture_attempt(cluster: Cluster, params: Params, check_mode: bool) -> JSON:
    """``state: capturing`` (claim the next attempt of a request) or ``state: failed`` (record a failed one)."""
    namespace, name, most = params["namespace"], params["name"], int(params.get("max_attempts") or 1)
    if params["state"] == "capturing":
        timeout = float(params.get("attempt_timeout") or req.DEFAULT_ATTEMPT_TIMEOUT)
        out = req.begin_capture(cluster, namespace, name, most, timeout, check_mode)
        extra: JSON = {"claimed": out["claimed"], "attempt": out["attempt"], "reason": out["reason"]}
    else:
        out = req.fail_capture(cluster, namespace, name, params["failed_reason"], params.get("failed_message") or "",
                               most, check_mode)
        extra = {"final": out["final"], "attempt": out["attempts"]}
    snap = out["snapshot"]
    return dict(extra, changed=out["changed"], max_attempts=most, pod_snapshot=snap, pod_snapshot_content=None,
                status=(snap or {}).get("status") or {}, actions=[f"{params['state']}: {name}"] if out["changed"] else [])
