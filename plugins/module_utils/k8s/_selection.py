# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Snapshot selection and binding: which PodSnapshot a restore pod restores from, and whether it may.

Pure functions over plain dicts in the Kubernetes JSON shape (camelCase keys,
as the API returns them); nothing here talks to a cluster. Stdlib only.
``_k8s_restorepods`` and the agent run these over what they read from the
cluster.

- ``select_snapshot``: the snapshot a pod pins (restore-from, ours or the
  reference's annotation), else the newest Ready one of the pod's group
  (grouping labels) taken from the pod's spec (``_spechash``: equal
  ``status.podSpecHash``, unless the scope is rootfs-only); when none fits,
  every reason, naming the fields in which the nearest one differs; given
  the restoring node (``node``, in ``status.source`` terms), a newer snapshot
  taken on a node this one does not match (``node_fit``: architecture, CPU
  vendor, GPU models) is passed over for an older one that fits, and said so;
- ``check_pod_spec``: whether a pinned pod matches the pod spec of its
  snapshot (through the container map, field by field), unless it skips the
  check (``snapshot-skip-compat-check: "true"``) or the scope is rootfs-only;
- ``check_content_binding``: whether a PodSnapshot and its
  PodSnapshotContent belong together (the content's backlink names the
  snapshot's namespace, name and uid; the snapshot is bound to it) and are
  usable (Ready, not Failed, not being deleted).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _spechash as spechash


# --- selection -------------------------------------------------------------------------

def _newness(snapshot: Dict[str, Any]) -> Tuple[float, float, str]:
    meta = podapi.as_dict(snapshot.get("metadata"))
    created = podapi.parse_time(meta.get("creationTimestamp"))
    recorded = podapi.parse_time(podapi.as_dict(snapshot.get("status")).get("createdAt")) or created
    return (recorded.timestamp() if recorded else float("-inf"), created.timestamp() if created else float("-inf"),
            str(meta.get("name") or ""))


def _names(snapshots: Sequence[Dict[str, Any]], limit: int = 5) -> str:
    refs = [podapi.object_ref(s, "") for s in snapshots]
    return ", ".join(refs[:limit]) + (f" and {len(refs) - limit} more" if len(refs) > limit else "")


NODE_MISFIT = "was taken on a node this one does not match"  # in a reason: a Ready snapshot fits all but the node


def node_fit(source: Any, node: Any) -> List[str]:
    """Why a snapshot taken on ``source`` (a PodSnapshotContent's ``status.source``) does not fit ``node`` (the
    same keys, of the restoring node): architecture, CPU vendor, GPU models (count included). What either side
    does not say is not compared (the restore's preflight checks everything once more, kernel and CRIU too)."""
    src, here = podapi.as_dict(source), podapi.as_dict(node)
    reasons: List[str] = []
    for key, what in (("arch", "architecture"), ("cpuVendor", "CPU vendor")):
        if src.get(key) and here.get(key) and src[key] != here[key]:
            reasons.append(f"{what}: snapshot {src[key]}, this node {here[key]}")
    models, have = podapi.as_list(src.get("gpuModels")), here.get("gpuModels")
    if models and isinstance(have, list) and sorted(map(str, models)) != sorted(map(str, have)):
        reasons.append(f"GPUs: snapshot {', '.join(sorted(map(str, models)))}, this node "
                       f"{', '.join(sorted(map(str, have))) or 'none'}")
    return reasons


def _fitting(matches: List[Dict[str, Any]], contents: Dict[str, Dict[str, Any]], node: Optional[Dict[str, Any]]
             ) -> Tuple[Optional[Dict[str, Any]], List[str]]:
    """The newest of ``matches`` whose content's source fits ``node`` (every one without ``node``), and the
    newer ones passed over, each with why."""
    passed: List[str] = []
    for snapshot in sorted(matches, key=_newness, reverse=True):
        bound = podapi.as_dict(snapshot.get("status")).get("boundSnapshotContentName")
        source = podapi.as_dict(podapi.as_dict(contents.get(str(bound))).get("status")).get("source")
        problems = node_fit(source, node) if node is not None else []
        if not problems:
            return snapshot, passed
        passed.append(f"{podapi.object_ref(snapshot, '')} {NODE_MISFIT}: "
                      + "; ".join(problems))
    return None, passed


def select_snapshot(snapshots: List[Dict[str, Any]], pod: Dict[str, Any], grouping_labels: Sequence[str] = (),
                    scope: str = podapi.SCOPE_WHOLE_POD, contents: Optional[Dict[str, Dict[str, Any]]] = None,
                    node: Optional[Dict[str, Any]] = None) -> Tuple[Optional[Dict[str, Any]], List[str]]:
    """The PodSnapshot to restore ``pod`` from, or (None, every reason none fits).

    A ``restore-from`` annotation pins the snapshot (used if Ready). Otherwise the
    newest (``status.createdAt``, then ``metadata.creationTimestamp``) Ready
    snapshot whose ``metadata.labels`` equal the pod's labels for each grouping
    label and whose ``status.podSpecHash`` equals the pod's hash (not compared
    when ``scope`` or the snapshot's ``spec.scope`` is rootfs-only). ``contents``
    (PodSnapshotContent by name) lets a mismatch name the differing fields of
    the nearest snapshot from ``status.podSpecFields``; with ``node`` (the
    restoring node in ``status.source`` terms) a match whose content's source
    does not fit it (``node_fit``) is passed over for the next newest.
    """
    if scope not in podapi.SCOPES:
        raise podapi.ContractError(f"snapshot scope {scope!r} is not one of {', '.join(podapi.SCOPES)}")
    meta, _spec, what = podapi.pod_parts(pod)
    namespace = meta.get("namespace")
    pool = [s for s in snapshots if isinstance(s, dict)
            and (namespace is None or podapi.as_dict(s.get("metadata")).get("namespace") in (None, namespace))]
    raw = pc.annotations_of(meta)
    annotations, conflicts = pc.contract_annotations(raw, what)
    if conflicts:
        return None, conflicts
    pinned = annotations.get(podapi.ANN_RESTORE_FROM)
    where = f"namespace {namespace}" if namespace else "the given list"
    if pinned is not None:
        return _pinned(pool, pinned, what, where, pc.annotation_label(raw, podapi.ANN_RESTORE_FROM))
    if not pool:
        return None, [f"there is no PodSnapshot in {where}"]
    ready = [s for s in pool if podapi.is_ready(s)]
    not_ready = [s for s in pool if not podapi.is_ready(s)]
    pod_fields = spechash.pod_spec_fields(pod)
    matches, other_group, other_spec = _sort_ready(ready, podapi.as_dict(meta.get("labels")), spechash.hash_fields(pod_fields),
                                                   grouping_labels, scope)
    chosen, passed = _fitting(matches, contents or {}, node)
    if chosen is not None:
        return chosen, []
    reasons: List[str] = list(passed)
    if not_ready:
        reasons.append(f"{len(not_ready)} PodSnapshot(s) not Ready, ignored: {_names(not_ready)}")
    if not ready:
        reasons.append(f"no Ready PodSnapshot in {where}")
    if other_group:
        shown = other_group[:5] + ([f"{len(other_group) - 5} more"] if len(other_group) > 5 else [])
        reasons.append(f"{len(other_group)} Ready PodSnapshot(s) belong to another group: " + "; ".join(shown))
    if other_spec:
        reasons.append(f"{len(other_spec)} Ready PodSnapshot(s) of the pod's group were taken from another pod spec "
                       f"(podSpecHash differs from {spechash.hash_fields(pod_fields)[:12]})")
        reasons.append(_nearest(other_spec, pod_fields, contents or {}))
    return None, reasons


def _pinned(pool: List[Dict[str, Any]], pinned: Any, what: str, where: str, label: str
            ) -> Tuple[Optional[Dict[str, Any]], List[str]]:
    """The snapshot a restore-from annotation pins, if it exists and is Ready; else every reason."""
    found = [s for s in pool if podapi.as_dict(s.get("metadata")).get("name") == pinned]
    if not found:
        return None, [f"{what} is pinned to PodSnapshot {pinned!r} (annotation {label}), "
                      f"which does not exist in {where}"]
    problems = podapi.readiness_problems(found[0])
    if problems:
        return None, [f"{what} is pinned to PodSnapshot {pinned!r} (annotation {label}), which cannot be used"] + problems
    return found[0], []


def _sort_ready(ready: List[Dict[str, Any]], pod_labels: Dict[str, Any], pod_hash: str,
                grouping_labels: Sequence[str], scope: str
                ) -> Tuple[List[Dict[str, Any]], List[str], List[Dict[str, Any]]]:
    """Ready snapshots as (matches, other group (described), same group but another pod spec)."""
    matches: List[Dict[str, Any]] = []
    other_group: List[str] = []
    other_spec: List[Dict[str, Any]] = []
    for snapshot in ready:
        labels = podapi.as_dict(podapi.as_dict(snapshot.get("metadata")).get("labels"))
        differing = [key for key in grouping_labels if labels.get(key) != pod_labels.get(key)]
        if differing:
            other_group.append(podapi.object_ref(snapshot, "") + " (" + ", ".join(
                f"{key}={labels.get(key)!r}, pod has {pod_labels.get(key)!r}" for key in differing) + ")")
        elif scope == podapi.SCOPE_ROOTFS_ONLY or podapi.as_dict(snapshot.get("spec")).get("scope") == podapi.SCOPE_ROOTFS_ONLY:
            matches.append(snapshot)
        elif podapi.as_dict(snapshot.get("status")).get("podSpecHash") == pod_hash:
            matches.append(snapshot)
        else:
            other_spec.append(snapshot)
    return matches, other_group, other_spec


def _nearest(candidates: List[Dict[str, Any]], pod_fields: Dict[str, str], contents: Dict[str, Dict[str, Any]]) -> str:
    ranked: List[Tuple[int, Tuple[float, float, str], Dict[str, Any], List[str]]] = []
    for snapshot in candidates:
        bound = podapi.as_dict(snapshot.get("status")).get("boundSnapshotContentName")
        content = podapi.as_dict(contents.get(bound) if bound else None)
        fields = podapi.as_dict(podapi.as_dict(content.get("status")).get("podSpecFields"))
        if fields:
            diff = spechash.describe_diff(pod_fields, {str(k): str(v) for k, v in fields.items()})
            ranked.append((len(diff), _newness(snapshot), snapshot, diff))
    if ranked:
        best = min(ranked, key=lambda item: (item[0], -item[1][0], -item[1][1]))
        if not best[3]:
            return f"nearest PodSnapshot {podapi.object_ref(best[2], '')} has the same field digests but another podSpecHash"
        return f"nearest PodSnapshot {podapi.object_ref(best[2], '')} differs in {', '.join(best[3])}"
    newest = max(candidates, key=_newness)
    recorded = podapi.as_dict(newest.get("status")).get("podSpecHash")
    return (f"newest PodSnapshot {podapi.object_ref(newest, '')} has podSpecHash {str(recorded)[:12] if recorded else 'none'}; "
            "the fields that differ are unknown without its PodSnapshotContent's status.podSpecFields")


# --- pinned pod vs snapshot spec -----------------------------------------------------------

def check_pod_spec(snapshot: Dict[str, Any], pod: Dict[str, Any], content: Optional[Dict[str, Any]] = None) -> List[str]:
    """Why ``pod`` (a restore pod, typically pinned) does not match the source pod of ``snapshot``; [] when it does.

    Not checked (returns []) when the pod carries ``snapshot-skip-compat-check: "true"`` (ours or the
    reference's name) or the snapshot's scope is rootfs-only; annotations that disagree with their alias are
    the reasons then. Without a container map (or an
    identity map) the pod's hash must equal ``status.podSpecHash``; with one,
    each destination ``containers[dst].*`` is compared with ``containers[src].*``
    of the content's ``status.podSpecFields`` (needed then), pod-level fields and
    init containers as they are. ``content`` also lets the reason name the fields.
    """
    meta, _spec, what = podapi.pod_parts(pod)
    raw = pc.annotations_of(meta)
    annotations, conflicts = pc.contract_annotations(raw, what)
    if conflicts:
        return conflicts
    if pc.skips_compat_check(annotations):
        return []
    if podapi.as_dict(snapshot.get("spec")).get("scope") == podapi.SCOPE_ROOTFS_ONLY:
        return []
    ref = podapi.object_ref(snapshot, podapi.KIND_SNAPSHOT)
    pairs, problems = pc.map_annotation(annotations, what, pc.annotation_label(raw, podapi.ANN_CONTAINER_MAP))
    if problems:
        return problems
    recorded = podapi.as_dict(podapi.as_dict(content).get("status")).get("podSpecFields") if content else None
    snapshot_fields = {str(k): str(v) for k, v in recorded.items()} if isinstance(recorded, dict) else {}
    pod_fields = spechash.pod_spec_fields(pod)
    if any(src != dst for src, dst in pairs):
        if not snapshot_fields:
            return [f"{what} maps containers ({pc.format_container_map(pairs)}): comparing its spec with {ref} needs "
                    f"the PodSnapshotContent's status.podSpecFields"]
        differing = [path for path in sorted(set(pod_fields) | set(snapshot_fields))
                     if not path.startswith("containers[") and pod_fields.get(path) != snapshot_fields.get(path)]
        for src, dst in pairs:
            for field in spechash.CONTAINER_FIELDS[1:]:
                mine, theirs = f"containers[{dst}].{field}", f"containers[{src}].{field}"
                if theirs not in snapshot_fields:
                    differing.append(f"containers[{src}] (not in the snapshot)")
                    break
                if pod_fields.get(mine) != snapshot_fields[theirs]:
                    differing.append(f"{mine} (from {src})")
        if not differing:
            return []
        return [f"{what} does not match the pod spec of {ref}: differs in {', '.join(differing)}"]
    pod_hash = spechash.hash_fields(pod_fields)
    snapshot_hash = podapi.as_dict(snapshot.get("status")).get("podSpecHash")
    if pod_hash == snapshot_hash:
        return []
    if not snapshot_hash:
        return [f"{ref} records no podSpecHash to compare {what} with"]
    if snapshot_fields:
        diff = spechash.describe_diff(pod_fields, snapshot_fields)
        detail = "differs in " + ", ".join(diff) if diff else "has the same field digests but another podSpecHash"
    else:
        detail = f"podSpecHash {pod_hash[:12]} differs from {snapshot_hash[:12]}"
    return [f"{what} does not match the pod spec of {ref}: {detail} "
            f"(annotation {podapi.ANN_SKIP_COMPAT}: \"true\" skips this check)"]


# --- content binding ---------------------------------------------------------------------

def check_content_binding(snapshot: Dict[str, Any], content: Dict[str, Any]) -> List[str]:
    """Reasons to refuse restoring from ``snapshot`` through ``content``; [] when they belong together and are usable."""
    ref = podapi.object_ref(snapshot, podapi.KIND_SNAPSHOT)
    meta = podapi.as_dict(snapshot.get("metadata"))
    content_name = podapi.as_dict(content.get("metadata")).get("name")
    cref = f"{podapi.KIND_CONTENT} {content_name}"
    backlink = podapi.as_dict(podapi.as_dict(content.get("spec")).get("snapshotRef"))
    reasons = []
    for key in ("namespace", "name", "uid"):
        if backlink.get(key) != meta.get(key):
            note = " (the PodSnapshot was deleted and created again?)" if key == "uid" else ""
            reasons.append(f"{cref} points back to {key} {backlink.get(key)!r}, but {ref} has {key} {meta.get(key)!r}{note}")
    bound = podapi.as_dict(snapshot.get("status")).get("boundSnapshotContentName")
    if not bound:
        reasons.append(f"{ref} is not bound to any {podapi.KIND_CONTENT}")
    elif bound != content_name:
        reasons.append(f"{ref} is bound to {podapi.KIND_CONTENT} {bound!r}, not to {content_name!r}")
    reasons.extend(podapi.readiness_problems(snapshot))
    if podapi.as_dict(content.get("metadata")).get("deletionTimestamp"):
        reasons.append(f"{cref} is being deleted")
    failed = podapi.get_condition(content, podapi.FAILED_CONDITION)
    if failed and failed.get("status") == "True":
        reasons.append(f"{cref} has failed ({failed.get('reason')}: {failed.get('message')})")
    return reasons
