# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The pod_snapshot_trigger module's runner: one pass over a PodSnapshotManualTrigger.

Keeps the runners' invariants (``_common``). Its own file, not pod_snapshot's: the two share no code, and
this one ships without ``_k8s_records``.
"""
from __future__ import annotations

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_requests as req
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import JSON, Params, cluster_from, object_diff


def run(params: Params, check_mode: bool, diff: bool = False) -> JSON:
    """One pass over a PodSnapshotManualTrigger: its PodSnapshot request, then its Triggered condition; with
    ``diff``, the trigger and its PodSnapshot before and after."""
    cluster = cluster_from(params)
    ns, name = params["namespace"], params["name"]
    trigger = cluster.find(podapi.KIND_TRIGGER, name, ns) if diff else None
    sname = (((trigger or {}).get("status") or {}).get("snapshotCreated") or {}).get("name") or \
        (req.trigger_snapshot_name(trigger) if trigger else None)
    snap = cluster.find(podapi.KIND_SNAPSHOT, sname, ns) if sname else None
    result = req.reconcile_trigger(cluster, ns, name, check_mode)
    result["pod_snapshot"] = result.pop("snapshot")
    result["pod_snapshot_name"] = result.pop("snapshot_name")
    if diff and sname:
        result["diff"] = [object_diff(podapi.KIND_TRIGGER, name, ns, trigger, result["trigger"]),
                          object_diff(podapi.KIND_SNAPSHOT, sname, ns, snap, result["pod_snapshot"])]
    return result
