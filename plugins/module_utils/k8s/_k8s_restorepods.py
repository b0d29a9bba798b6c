# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Restore pods in a cluster: the snapshot each restores from, creating them, and recording their one restore.

Built on ``_k8s_client.Cluster`` and the PodSnapshot records (``_k8s_records``); the pure contract is
``_podcontract``, selection and the binding checks ``_selection``. Invariants:

- A restore pod's restore runs at most once: ``begin_restore`` refuses a pod whose Restored condition already
  has an outcome; ``finish_restore`` records the outcome, then releases the finalizer.
- Every check (``restore_plan``: the binding, Ready, the pod spec) comes before the finalizer.
- A pod that selects its snapshot at restore is pinned to the one selected guarded by the resourceVersion read
  (``pin_selected``): a concurrent change is a conflict, decided again.
- ``check_mode`` reads everything a real run reads and reports the same, and writes nothing.
"""
from __future__ import annotations

import copy
from typing import Dict, List, Optional, Sequence, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_records as rec
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_summaries as summ
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _selection as selection
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import JSON, Cluster, K8sError, now


def select_for_pod(cluster: Cluster, pod: JSON, namespace: str, grouping_labels: Sequence[str] = (),
                   scope: str = podapi.SCOPE_WHOLE_POD, node: Optional[JSON] = None
                   ) -> Tuple[Optional[JSON], Optional[JSON], List[str]]:
    """The PodSnapshot (and its content) to restore ``pod`` from: ``(snapshot, content, reasons)``.

    Lists the namespace's PodSnapshots and the contents they are bound to, then ``select_snapshot``; the chosen
    one must also pass ``check_content_binding`` (backlink uid, bound name, Ready), and one the pod pins by its
    restore-from annotation ``check_pod_spec`` (unless ``scope`` is rootfs-only). ``node``: the restoring node
    (``status.source`` terms), whose misfits are passed over (``_selection.node_fit``).
    """
    snapshots = cluster.list(podapi.KIND_SNAPSHOT, namespace)
    contents: Dict[str, JSON] = {}
    for snap in snapshots:
        bound = (snap.get("status") or {}).get("boundSnapshotContentName")
        if bound and bound not in contents:
            found = cluster.find(podapi.KIND_CONTENT, bound)
            if found is not None:
                contents[bound] = found
    target = copy.deepcopy(pod)
    target.setdefault("metadata", {})
    if not target["metadata"].get("namespace") and "template" not in (target.get("spec") or {}):
        target["metadata"]["namespace"] = namespace
    chosen, reasons = selection.select_snapshot(snapshots, target, grouping_labels, scope, contents, node)
    if chosen is None:
        return None, None, reasons
    bound = (chosen.get("status") or {}).get("boundSnapshotContentName")
    content = contents.get(bound) if bound else None
    if content is None:
        sref = podapi.object_ref(chosen, podapi.KIND_SNAPSHOT)
        return None, None, [f"{sref} is bound to {podapi.KIND_CONTENT} {bound!r}, which does not exist" if bound
                            else f"{sref} is not bound to any {podapi.KIND_CONTENT}"]
    problems = selection.check_content_binding(chosen, content)
    pinned = pc.restore_annotations(target)[0].get(podapi.ANN_RESTORE_FROM) is not None
    if not problems and pinned and scope != podapi.SCOPE_ROOTFS_ONLY:
        problems = selection.check_pod_spec(chosen, target, content)  # pinned: selection compared no hash
    if problems:
        return None, None, problems
    return chosen, content, []


def create_restore_pods(cluster: Cluster, built: JSON, namespace: str, count: int, name_prefix: Optional[str],
                        check_mode: bool = False) -> Tuple[bool, List[JSON], List[str]]:
    """Create ``count`` restore pods from the built pod: ``<name_prefix>-<i>`` (i from 0; idempotent by name), or
    ``generateName`` when no prefix is given (each run creates new ones). ``(changed, pods, actions)``."""
    pods: List[JSON] = []
    actions: List[str] = []
    source = pc.restore_annotations(built)[0].get(podapi.ANN_RESTORE_FROM)
    for index in range(count):
        body = copy.deepcopy(built)
        meta = body.setdefault("metadata", {})
        meta["namespace"] = namespace
        for key in ("resourceVersion", "uid", "creationTimestamp", "selfLink", "managedFields", "ownerReferences"):
            meta.pop(key, None)
        body.pop("status", None)
        body["apiVersion"], body["kind"] = "v1", "Pod"
        if name_prefix:
            meta.pop("generateName", None)
            meta["name"] = f"{name_prefix}-{index}"
            existing = cluster.find("Pod", meta["name"], namespace)
            if existing is not None:
                have = pc.restore_annotations(existing)[0].get(podapi.ANN_RESTORE_FROM)
                if have != source:
                    raise K8sError(f"Pod {namespace}/{meta['name']} exists and restores from {have!r}, not "
                                   f"{source!r}: delete it or use another name_prefix", "Pod")
                pods.append(existing)
                continue
        else:
            meta.pop("name", None)
            meta["generateName"] = meta.get("generateName") or f"{source}-restore-"
        actions.append(f"created Pod {namespace}/{meta.get('name') or meta['generateName'] + '*'}")
        pods.append(body if check_mode else cluster.create_pod(namespace, body))
    return bool(actions), pods, actions


OUTCOMES = podapi.RESULT_CONDITIONS  # the node's restore result -> (condition status, reason)


def outcome_fields(pod: JSON) -> JSON:
    """What a result says about where restore pod ``pod`` stands: ``pod_outcome`` (the reference's name, ``classify``)
    and ``losses`` (``restore_losses``)."""
    return {"pod_outcome": pc.classify(pod), "losses": pc.restore_losses(pod)}


def begin_restore(cluster: Cluster, namespace: str, name: str, message: str = "", check_mode: bool = False) -> JSON:
    """Before the node touches restore pod ``namespace/name``: hold it with the finalizer, say RestoreInProgress
    (status False, as the reference contract does).

    A pod whose restore already ran (any Restored reason but RestoreInProgress, ours or the reference's condition)
    is refused: a restore is never replayed over a pod whose one attempt is spent. Every check (``restore_plan``)
    comes before the finalizer. A pod that selects its snapshot at restore (``restore-select``) gets the one
    selected pinned first (``pin_selected``); none fitting is refused with the reasons.
    """
    pod = cluster.get_pod(namespace, name)
    condition = pc.restore_condition(pod)
    if condition and condition.get("reason") not in (None, podapi.REASON_IN_PROGRESS):
        raise K8sError(f"Pod {namespace}/{name}: its restore already ran ({condition.get('reason')}: "
                       f"{condition.get('message') or 'no message'}); a new pod is needed", "Pod")
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        raise K8sError(f"Pod {namespace}/{name} is being deleted", "Pod")
    pod, _pinned, reasons = pin_selected(cluster, pod, check_mode)
    if reasons:
        raise K8sError(f"Pod {namespace}/{name}: no PodSnapshot to restore from", "Pod", reasons=reasons)
    plan = restore_plan(cluster, pod)
    added = cluster.add_finalizer("Pod", name, podapi.FINALIZER, namespace, check_mode)
    changed, pod = cluster.set_pod_condition(namespace, name, podapi.RESTORE_CONDITION, "False", podapi.REASON_IN_PROGRESS,
                                             message or f"restoring from PodSnapshot {plan['pod_snapshot_name']}", check_mode,
                                             also=pc.reference_conditions(pod))
    return dict(plan, changed=added or changed, pod=pod, **outcome_fields(pod))


def restore_plan(cluster: Cluster, pod: JSON) -> JSON:
    """What the node must do for restore pod ``pod``: the artifact, and (source, destination container) pairs.

    The pod must be a restore pod (``_podcontract.validate``: every problem of it is a reason too); the
    PodSnapshot named by its restore-from annotation (ours or the reference's) must be bound to its
    content (backlink uid, Ready) and taken from the pod's spec (``check_pod_spec``: the condensed pod-spec hash,
    unless the pod's skip-compat annotation says "true"); the pairs are ``restore_pairs``. Reads only.
    """
    meta = pod.get("metadata") or {}
    namespace, name = meta.get("namespace"), meta.get("name")
    annotations, conflicts = pc.restore_annotations(pod)
    if conflicts:
        raise K8sError(f"Pod {namespace}/{name}: its restore annotations disagree", "Pod", reasons=conflicts)
    source = annotations.get(podapi.ANN_RESTORE_FROM)
    if not source:
        raise K8sError(f"Pod {namespace}/{name} has no {podapi.ANN_RESTORE_FROM} (or {podapi.REF_ANN_RESTORE_FROM}) "
                       "annotation: not a restore pod", "Pod")
    if not podapi.is_dns_subdomain(source) or len(str(source)) > 253:
        raise K8sError(f"Pod {namespace}/{name}: its {podapi.ANN_RESTORE_FROM} annotation {str(source)[:80]!r} is not a "
                       "PodSnapshot name (a DNS subdomain of its own namespace)", "Pod")
    problems = pc.validate(pod)  # the pod itself is a restore pod (placeholders, control volume, map) ...
    snap = cluster.get(podapi.KIND_SNAPSHOT, source, namespace)
    content, bound = rec.binding_problems(cluster, snap)  # ... and its snapshot fits it: every reason at once
    problems += bound or selection.check_pod_spec(snap, pod, content)
    if problems:
        raise K8sError(f"Pod {namespace}/{name}: PodSnapshot {namespace}/{source} cannot be restored from",
                       "Pod", reasons=problems)
    pairs = restore_pairs(pod, snap)
    ids = {c.get("name"): c.get("containerID") for c in (pod.get("status") or {}).get("containerStatuses") or []}
    for pair in pairs:
        pair["container_id"] = ids.get(pair["container"])
    return {"pod_snapshot_name": source,
            "content_name": (snap.get("status") or {}).get("boundSnapshotContentName"),
            "policy_name": (snap.get("spec") or {}).get("policyName"),
            "store": podapi.store_ref(((content or {}).get("spec") or {}).get("store")) or {},
            "node_name": (pod.get("spec") or {}).get("nodeName"), "pairs": pairs,
            "skip_compat_check": pc.skips_compat_check(annotations)}


def restore_pairs(pod: JSON, snap: JSON) -> List[JSON]:
    """(source, destination container) pairs of restore pod ``pod`` from PodSnapshot ``snap``.

    From the container-map annotation, else each container of the pod that the snapshot holds, else - one
    container on each side - that one into that one. None at all is refused.
    """
    meta = pod.get("metadata") or {}
    annotations = pc.restore_annotations(pod)[0]
    held = list(((snap.get("spec") or {}).get("source") or {}).get("containers") or [])
    dests = pc.restore_destinations(pod)
    mapped = pc.parse_container_map(annotations.get(podapi.ANN_CONTAINER_MAP))
    pairs: List[JSON]
    if mapped:
        pairs = [{"source": src, "container": dst} for src, dst in mapped]
    elif len(held) == 1 and len(dests) == 1:
        pairs = [{"source": held[0], "container": dests[0]}]
    else:
        pairs = [{"source": d, "container": d} for d in dests if d in held]
    if not pairs:
        namespace, source = meta.get("namespace"), annotations.get(podapi.ANN_RESTORE_FROM)
        raise K8sError(f"Pod {namespace}/{meta.get('name')}: none of its containers ({', '.join(dests)}) is in "
                       f"PodSnapshot {namespace}/{source} ({', '.join(held) or 'none'}); set a container map", "Pod")
    return pairs


ACCESSED = ("succeeded", "partially_succeeded")  # restore results that count as an access of the snapshot


def finish_restore(cluster: Cluster, namespace: str, name: str, outcome: str, message: str = "",
                   check_mode: bool = False) -> JSON:
    """After the node's restore: the Restored condition for ``outcome``, the finalizer released, and - for a
    restore that (partly) succeeded - the PodSnapshot's ``status.lastAccessTime`` (``touch_snapshot``)."""
    status, reason = OUTCOMES[outcome]
    pod = cluster.find("Pod", name, namespace)
    if pod is None:
        raise K8sError(f"Pod {namespace}/{name} not found (deleted during its restore?)", "Pod")
    changed, pod = cluster.set_pod_condition(namespace, name, podapi.RESTORE_CONDITION, status, reason,
                                             message or outcome.replace("_", " "), check_mode,
                                             also=pc.reference_conditions(pod))
    removed = cluster.remove_finalizer("Pod", name, podapi.FINALIZER, namespace, check_mode)
    if removed and not check_mode:
        pod = cluster.find("Pod", name, namespace) or pod
    out = dict(outcome_fields(pod), changed=changed or removed, pod=pod, last_access_time=None, warnings=[])
    source = pc.restore_annotations(pod)[0].get(podapi.ANN_RESTORE_FROM)
    if outcome in ACCESSED and source:
        try:
            out["last_access_time"] = touch_snapshot(cluster, namespace, str(source), check_mode=check_mode)
        except K8sError as exc:  # the restore is recorded; a snapshot deleted since is the retention's business
            out["warnings"] = [f"lastAccessTime of PodSnapshot {namespace}/{source} not recorded: {exc}"]
        out["changed"] = out["changed"] or out["last_access_time"] is not None
    return out


def touch_snapshot(cluster: Cluster, namespace: str, name: str, stamp: Optional[str] = None,
                   check_mode: bool = False) -> str:
    """Record that a pod was restored from PodSnapshot ``namespace/name`` now: its ``status.lastAccessTime``
    (retention's ``lastAccessTimeout`` counts from it). Returns the time written (or that would be)."""
    when = stamp or now()
    if check_mode:
        cluster.get(podapi.KIND_SNAPSHOT, name, namespace)
        return when
    cluster.patch_status(podapi.KIND_SNAPSHOT, name, {"lastAccessTime": when}, namespace)
    return when


def pin_selected(cluster: Cluster, pod: JSON, check_mode: bool = False, node: Optional[JSON] = None
                 ) -> Tuple[JSON, Optional[str], List[str]]:
    """For a pod that selects its snapshot at restore (``restore-select``) and has not pinned one yet: select it
    (``select_for_pod`` with the grouping labels and scope of its ``restore-policy``, and the restoring ``node``)
    and pin it on the pod (restore-from annotation, guarded by the resourceVersion read). ``(pod, snapshot name,
    reasons)``: the name is
    None with the reasons when none fits (the pod waits, or falls back); a pinned pod is returned as it is.
    A concurrent change of the pod (409) is a K8sError with ``conflict``: read it again and decide again."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    mode = pc.restore_mode(pod)
    if mode["restore_from"]:
        return pod, str(mode["restore_from"]), []
    if not mode["select"]:
        return pod, None, [f"Pod {namespace}/{meta.get('name')} is not a restore pod (neither "
                           f"{podapi.ANN_RESTORE_FROM} nor {podapi.ANN_RESTORE_SELECT})"]
    group_by: Sequence[str] = ()
    scope = podapi.SCOPE_WHOLE_POD
    if mode["policy"]:
        settings = summ.policy_settings(cluster.get(podapi.KIND_POLICY, str(mode["policy"]), namespace))
        group_by, scope = settings["group_by"], settings["scope"]
    chosen, _content, reasons = select_for_pod(cluster, pod, namespace, group_by, scope, node)
    if chosen is None:
        return pod, None, reasons
    name = str(chosen["metadata"]["name"])
    if check_mode:
        pinned = copy.deepcopy(pod)
        pinned["metadata"].setdefault("annotations", {})[podapi.ANN_RESTORE_FROM] = name
        return pinned, name, []
    patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": {podapi.ANN_RESTORE_FROM: name}}}
    return cluster.patch("Pod", str(meta.get("name")), patch, namespace), name, []
