# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The pod_snapshot_info module's runner: PodSnapshots of a namespace with their contents, what retention
removes, and the store snapshots go to.

Keeps the runners' invariants (``_common``); it only reads.
"""
from __future__ import annotations

from typing import Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_storage as storage
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_summaries as summ
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import JSON, Params, cluster_from


def run(params: Params, check_mode: bool = False) -> JSON:  # pylint: disable=unused-argument
    """PodSnapshots of a namespace with their contents; with keep_last / last_access_timeout, which retention
    removes; with policy or storage_config, the store (and its options and credentials) snapshots go to."""
    cluster = cluster_from(params)
    namespace = params.get("namespace") or "default"
    policy: Optional[JSON] = None
    if params.get("policy"):
        doc = cluster.get(podapi.KIND_POLICY, params["policy"], namespace)
        policy = dict(summ.policy_settings(doc), storage_config=(doc.get("spec") or {}).get("storageConfigName"))
    where: JSON = {"store": None, "store_options": {}, "storage_config": None, "credentials_secret": None}
    if params.get("policy") or params.get("storage_config"):
        where = storage.resolve_store(cluster, namespace, params.get("policy"), params.get("storage_config"))
        if policy is not None:
            policy["store_url"] = where["store"]
    if params.get("name"):
        found = cluster.find(podapi.KIND_SNAPSHOT, params["name"], namespace)
        snaps = [found] if found else []
    else:
        snaps = cluster.list(podapi.KIND_SNAPSHOT, namespace, params.get("label_selector"))
    summaries = []
    for snap in snaps:
        bound = (snap.get("status") or {}).get("boundSnapshotContentName")
        summaries.append(summ.snapshot_summary(snap, cluster.find(podapi.KIND_CONTENT, bound) if bound else None))
    idle = params.get("last_access_timeout")
    expired = (summ.expired(summaries, params.get("keep_last") or 0, params.get("group_by"), idle)
               if params.get("keep_last") or idle else [])
    options = {k: v for k, v in where["store_options"].items()
               if params.get("include_credentials") or k not in storage.SECRET_OPTIONS}
    return {"changed": False, "snapshots": summaries, "expired": expired, "policy": policy, "store_url": where["store"],
            "store_options": options, "storage_config": where["storage_config"],
            "credentials_secret": where["credentials_secret"]}
