# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node agent's retention: each PodSnapshotPolicy's grouping rules and ``retentionConfig.lastAccessTimeout``
applied as time passes (the node agent's ``retention`` events), not only when the k8s_snapshot playbook runs.

Invariants:

- Every agent computes the same expired set from the API (``_k8s_summaries.expired`` over the policy's Ready
  PodSnapshots, as pod_snapshot_info does) and removes only the snapshots taken on its own node (the content's
  ``source.nodeName``), so no two agents remove one snapshot, and the node that wrote a snapshot removes it.
- The store is opened first (a store that cannot be opened leaves the record as it is), then the record goes
  (``delete_pod_snapshot``: the PodSnapshot, then its contents), then the snapshot in the store: a restore never
  finds a record whose snapshot is gone.
- A PodSnapshot that a restore pod still waits for or restores from (restore-from names it, no outcome yet) is
  kept, and the result says so.
- Check mode removes nothing and says what it would remove. A problem with one snapshot or policy is listed and
  does not stop the others.

The store side is ``Remover`` (the runner opens the store with the policy's options); no Ansible import here.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_records as rec
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_storage as storage
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_summaries as summ
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import Cluster
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

JSON = Dict[str, Any]
# (the store's URL, its options) -> that store's delete (a snapshot id -> bytes freed); raises when the store
# cannot be opened - before the record is touched
Remover = Callable[[str, JSON], Callable[[str], int]]


def sweep(cluster: Cluster, node_name: str, remove: Remover, namespaces: Sequence[Optional[str]] = (None,),
          check_mode: bool = False) -> JSON:
    """Apply every PodSnapshotPolicy's retention in ``namespaces`` (None: all) to this node's snapshots."""
    removed: List[JSON] = []
    kept: List[JSON] = []
    errors: List[str] = []
    policies: List[JSON] = []
    for namespace in namespaces or (None,):
        policies += cluster.list(podapi.KIND_POLICY, namespace)
    for policy in policies:
        try:
            _policy(cluster, policy, node_name, remove, check_mode, removed, kept, errors)
        except WarmstartError as exc:
            errors.append(f"{podapi.object_ref(policy, podapi.KIND_POLICY)}: {exc.full_message()}")
    return {"changed": bool(removed) and not check_mode, "removed": removed, "kept": kept, "errors": errors,
            "policies": len(policies)}


def _policy(cluster: Cluster, policy: JSON, node_name: str, remove: Remover, check_mode: bool,
            removed: List[JSON], kept: List[JSON], errors: List[str]) -> None:
    settings = summ.policy_settings(policy)
    if not settings["max_per_group"] and not settings["last_access_timeout"]:
        return
    namespace = str((policy.get("metadata") or {}).get("namespace") or "")
    summaries = []
    for snap in cluster.list(podapi.KIND_SNAPSHOT, namespace):
        if (snap.get("spec") or {}).get("policyName") != settings["name"]:
            continue
        bound = (snap.get("status") or {}).get("boundSnapshotContentName")
        summaries.append(summ.snapshot_summary(snap, cluster.find(podapi.KIND_CONTENT, bound) if bound else None))
    expired = summ.expired(summaries, settings["max_per_group"], settings["group_by"],
                           settings["last_access_timeout"])
    mine = [s for s in expired if s.get("node_name") == node_name]
    if not mine:
        return
    in_use = _restoring_from(cluster, namespace)
    where = storage.resolve_store(cluster, namespace, settings["name"]) if any(s.get("store") for s in mine) else {}
    for s in mine:
        ref = f"{namespace}/{s['name']}"
        entry = {"namespace": namespace, "name": s["name"], "policy_name": settings["name"], "reason": s["reason"],
                 "store": s.get("store")}
        if s["name"] in in_use:
            kept.append(dict(entry, reason=f"{s['reason']}; kept: restore pod {in_use[s['name']]} still restores "
                                           "from it"))
            continue
        if check_mode:
            removed.append(entry)
            continue
        store = s.get("store") or {}
        try:
            delete = remove(str(store["url"]), dict(where.get("store_options") or {})) \
                if store.get("url") and store.get("snapshot_id") else None
            rec.delete_pod_snapshot(cluster, namespace, s["name"], s.get("content_name"))
            if delete is not None:
                entry["bytes_freed"] = delete(str(store["snapshot_id"]))
        except FileNotFoundError:
            entry.update(bytes_freed=0, note="its snapshot was gone from the store already")
        except (WarmstartError, OSError) as exc:
            text = exc.full_message() if isinstance(exc, WarmstartError) else f"{exc.strerror or exc}"
            errors.append(f"PodSnapshot {ref}: {text}")
            continue
        removed.append(entry)


def _restoring_from(cluster: Cluster, namespace: str) -> Dict[str, str]:
    """{PodSnapshot name: a restore pod of ``namespace`` that names it and has no outcome yet}."""
    out: Dict[str, str] = {}
    for pod in cluster.list("Pod", namespace):
        if not pc.is_restore_pod(pod) or pc.classify(pod) != podapi.OUTCOME_PENDING:
            continue
        source = pc.restore_annotations(pod)[0].get(podapi.ANN_RESTORE_FROM)
        if source:
            out.setdefault(str(source), str((pod.get("metadata") or {}).get("name")))
    return out
