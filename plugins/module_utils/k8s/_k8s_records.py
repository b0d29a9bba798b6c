# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The PodSnapshot records in a cluster: a PodSnapshot and its PodSnapshotContent, made, bound, checked, deleted.

Built on ``_k8s_client.Cluster``; the pure contract (hash, conditions, binding checks) is ``_podapi``,
``_spechash`` and ``_selection``; restore pods are ``_k8s_restorepods``, summaries and policies
``_k8s_summaries``. Invariants:

- A PodSnapshot and its PodSnapshotContent are bound only when the content's backlink names that
  PodSnapshot's namespace, name *and* uid; a content of another (or an earlier, deleted) PodSnapshot is
  refused with every reason before anything is created or changed, never rebound or overwritten.
- Specs are immutable: a record that exists with another spec is refused, never patched.
- ``check_mode`` reads everything a real run reads and reports the same actions, and writes nothing.
- Deleting (``delete_pod_snapshot``) removes only the incarnation that was read (uid precondition) and only
  contents whose backlink names it; the artifact in the store is never touched here.
"""
from __future__ import annotations

import copy
import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _selection as selection
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _spechash as spechash
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import (
    JSON, LABEL_SNAPSHOT_NAME, LABEL_SNAPSHOT_NAMESPACE, Cluster, K8sError, Params, now, ref, subset)


# --- PodSnapshot + PodSnapshotContent ------------------------------------------------

def content_name_for(namespace: str, name: str, uid: str) -> str:
    """``<namespace>-<name>-<uid[:8]>``: one content per incarnation of a PodSnapshot."""
    return f"{namespace}-{name}-{uid.replace('-', '')[:8]}"[:253].strip("-.")


def _clean(value: Any) -> Any:
    """Drop None values (recursively) so that a record never carries nulls."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def source_status(source_node: Optional[JSON], pod: JSON, containers: Sequence[str], node_name: Optional[str]
                  ) -> JSON:
    """PodSnapshotContent ``status.source`` from a manifest's ``source`` section (or camelCase keys) and the pod."""
    src = dict(source_node or {})
    gpu: JSON = src["gpu"] if isinstance(src.get("gpu"), dict) else {}
    models = src.get("gpu_models", src.get("gpuModels", gpu.get("models")))
    if models is None and isinstance(src.get("gpus"), list):
        models = [g.get("name") or g.get("model") if isinstance(g, dict) else g for g in src["gpus"]]
    spec_containers = {c.get("name"): c for c in (pod.get("spec") or {}).get("containers") or []}
    statuses = {c.get("name"): c for c in (pod.get("status") or {}).get("containerStatuses") or []}
    first = containers[0] if containers else next(iter(spec_containers), None)
    out = {
        "nodeName": node_name or src.get("hostname") or src.get("nodeName"),
        "arch": src.get("arch"),
        "kernel": src.get("kernel"),
        "cpuHash": src.get("cpu_flags_hash", src.get("cpuHash")),
        "cpuVendor": src.get("cpu_vendor", src.get("cpuVendor")),
        "image": (spec_containers.get(first) or {}).get("image") or (statuses.get(first) or {}).get("image"),
        "imageId": (statuses.get(first) or {}).get("imageID") or None,
        "gpuDriver": src.get("gpu_driver", src.get("gpuDriver", gpu.get("driver") or gpu.get("driver_version"))),
        "gpuModels": [str(m) for m in models if m] if isinstance(models, list) else None,
    }
    cleaned: JSON = _clean(out)
    return cleaned


def _conditions(current: List[JSON], p: Params, stamp: str) -> List[JSON]:
    """Ready and Failed as ``p`` says: ready; failed with ``failed_reason``; else in progress."""
    if p.get("ready"):
        conds = podapi.set_condition(current, podapi.READY_CONDITION, True, "SnapshotReady",
                                     "the snapshot is stored and can be restored from", stamp)
        return podapi.set_condition(conds, podapi.FAILED_CONDITION, False, "NoFailure", "", stamp)
    reason, message = p.get("failed_reason"), p.get("failed_message")
    if reason:
        conds = podapi.set_condition(current, podapi.READY_CONDITION, False, reason, message or reason, stamp)
        return podapi.set_condition(conds, podapi.FAILED_CONDITION, True, reason, message or reason, stamp)
    conds = podapi.set_condition(current, podapi.READY_CONDITION, False, "SnapshotInProgress", "the snapshot is being taken",
                                 stamp)
    return podapi.set_condition(conds, podapi.FAILED_CONDITION, False, "NoFailure", "", stamp)


def _status_changes(current: JSON, desired: JSON) -> JSON:
    """The keys of ``desired`` whose value differs from ``current``."""
    return {k: v for k, v in desired.items() if current.get(k) != v}


def _check_backlink(content: JSON, namespace: str, name: str, uid: Optional[str], sref: str) -> None:
    """Refuse a content whose spec.snapshotRef is not this PodSnapshot (namespace, name and uid)."""
    cref = ref(podapi.KIND_CONTENT, content["metadata"]["name"])
    backlink = (content.get("spec") or {}).get("snapshotRef") or {}
    have = {"namespace": namespace, "name": name, "uid": uid}
    problems = []
    for key in ("namespace", "name", "uid"):
        if backlink.get(key) == have[key]:
            continue
        if key == "uid" and have["uid"] is None:
            problems.append(f"{cref} points back to uid {backlink.get('uid')!r}, but {sref} does not exist any more "
                            "(it was deleted; a new one would have another uid)")
        else:
            problems.append(f"{cref} points back to {key} {backlink.get(key)!r}, but {sref} has {key} {have[key]!r}"
                            + (" (the PodSnapshot was deleted and created again)" if key == "uid" else ""))
    if problems:
        raise K8sError(f"{cref} belongs to another PodSnapshot: refusing to bind it to {sref}", cref,
                       reasons=problems)


class _Recording:
    """One ``ensure_pod_snapshot`` run: its options, what it did so far, and the words for its records."""

    def __init__(self, cluster: Cluster, p: Params, check_mode: bool) -> None:
        self.cluster, self.p, self.check_mode = cluster, p, check_mode
        self.ns, self.name = str(p["namespace"]), str(p["name"])
        self.sref = ref(podapi.KIND_SNAPSHOT, self.name, self.ns)
        self.stamp = now()
        self.actions: List[str] = []
        self.warnings: List[str] = []
        self.existing: Optional[JSON] = None  # the PodSnapshot as read first (a request, or an earlier record)

    def result(self, snapshot: JSON, content: Optional[JSON], more: Sequence[str] = ()) -> JSON:
        actions = self.actions + list(more)
        return {"changed": bool(actions), "actions": actions, "snapshot": snapshot, "content": content,
                "warnings": self.warnings}


def ensure_pod_snapshot(cluster: Cluster, p: Params, check_mode: bool = False) -> JSON:
    """``state: present`` of pod_snapshot: the PodSnapshot, its PodSnapshotContent, bound, with conditions.

    ``p`` holds the module options (namespace, name, source_pod, containers, scope, policy_name, labels,
    content_name, store, node, source_node, size, created_at, ready, failed_reason, failed_message).
    Phases: read and check the source pod; create (or check) the PodSnapshot; create (or check) the content and
    record its status; record the PodSnapshot's status. Every refusal comes before the phase that would write.
    Returns ``{"changed", "actions", "snapshot", "content", "warnings"}``; raises K8sError with every reason
    when the records cannot be made to agree.
    """
    run = _Recording(cluster, p, check_mode)
    pod, wanted = _source_pod(run)
    spec, labels = _snapshot_spec(p, pod, wanted)
    snapshot, created = _ensure_snapshot(run, spec, labels)
    if created and check_mode:
        return run.result(snapshot, None, [f"would create its {podapi.KIND_CONTENT} and bind them"])
    uid = snapshot["metadata"].get("uid") or ""
    status = dict(snapshot.get("status") or {})
    cname = p.get("content_name") or content_name_for(run.ns, run.name, uid)
    bound = status.get("boundSnapshotContentName")
    if bound and bound != cname:
        raise K8sError(f"{run.sref} is bound to {podapi.KIND_CONTENT} {bound!r}, not to {cname!r}: refusing to rebind "
                       "it", run.sref)
    content: Optional[JSON] = None
    if p.get("store"):
        content = _ensure_content(run, pod, uid, cname)
        content, fields = _record_content_status(run, content, pod, wanted, cname)
        spec_hash = spechash.hash_fields(fields)
    else:
        spec_hash = status.get("podSpecHash") or spechash.pod_spec_hash(pod)
    snapshot = _record_snapshot_status(run, snapshot, spec_hash, cname if content is not None else None)
    return run.result(snapshot, content)


def _source_pod(run: _Recording) -> Tuple[JSON, List[str]]:
    """The source pod, and the containers the snapshot holds (refused: one the pod lacks; Ready without store)."""
    p = run.p
    run.existing = run.cluster.find(podapi.KIND_SNAPSHOT, run.name, run.ns)
    pod = run.cluster.get_pod(run.ns, p["source_pod"])
    pod_containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
    requested = (((run.existing or {}).get("spec") or {}).get("source") or {}).get("containers") or []
    wanted = list(p.get("containers") or requested)
    unknown = [c for c in wanted if c not in pod_containers]
    if unknown:
        raise K8sError(f"{run.sref}: Pod {run.ns}/{p['source_pod']} has no container "
                       f"{', '.join(map(repr, unknown))} (it has {', '.join(map(str, pod_containers))})", "Pod")
    if p.get("ready") and not p.get("store"):
        raise K8sError(f"{run.sref}: a Ready snapshot needs store (url and snapshot_id of the artifact)", run.sref)
    return pod, wanted


def _snapshot_spec(p: Params, pod: JSON, wanted: List[str]) -> Tuple[JSON, JSON]:
    """The PodSnapshot's spec and labels (default: the source pod's labels)."""
    source: JSON = {"podRef": {"name": p["source_pod"], "uid": pod["metadata"]["uid"]}}
    spec: JSON = {"source": source, "scope": p.get("scope") or podapi.SCOPE_WHOLE_POD}
    if wanted:
        source["containers"] = wanted
    if p.get("policy_name"):
        spec["policyName"] = p["policy_name"]
    labels = dict(p["labels"]) if p.get("labels") is not None else dict(pod["metadata"].get("labels") or {})
    return spec, labels


def _ensure_snapshot(run: _Recording, spec: JSON, labels: JSON) -> Tuple[JSON, bool]:
    """The PodSnapshot, created when missing (in check mode: the body it would have); ``(snapshot, created)``.

    A named content is checked first: it must not belong to another PodSnapshot (or to an earlier one of this
    name, deleted since). An existing PodSnapshot with another spec is refused; its labels are merged in.
    """
    cluster, p = run.cluster, run.p
    snapshot = run.existing
    if p.get("content_name") and p.get("store"):
        early = cluster.find(podapi.KIND_CONTENT, p["content_name"])
        if early is not None:
            _check_backlink(early, run.ns, run.name, (snapshot or {}).get("metadata", {}).get("uid"), run.sref)
    if snapshot is None:
        body: JSON = {"apiVersion": podapi.API_VERSION, "kind": podapi.KIND_SNAPSHOT,
                      "metadata": {"name": run.name, "namespace": run.ns, "labels": labels}, "spec": spec}
        run.actions.append(f"created {run.sref}")
        return (body if run.check_mode else cluster.create(podapi.KIND_SNAPSHOT, body, run.ns)), True
    have = snapshot.get("spec") or {}
    spec = _as_request(spec, have, run)
    differs = [k for k in sorted(spec) if not subset(spec[k], have.get(k))]
    if differs:
        raise K8sError(f"{run.sref} exists with another spec ({', '.join('spec.' + k for k in differs)}: have "
                       f"{json.dumps({k: have.get(k) for k in differs}, sort_keys=True)}, want "
                       f"{json.dumps({k: spec.get(k) for k in differs}, sort_keys=True)}); its spec is immutable: "
                       "delete it (state=absent) or use another name", run.sref)
    if not subset(labels, snapshot["metadata"].get("labels") or {}):
        run.actions.append(f"updated the labels of {run.sref}")
        if not run.check_mode:
            snapshot = cluster.patch(podapi.KIND_SNAPSHOT, run.name, {"metadata": {"labels": labels}}, run.ns)
    return snapshot, False


def _as_request(spec: JSON, have: JSON, run: _Recording) -> JSON:
    """The spec an existing PodSnapshot must have: a request (made by a user, a trigger or the agent) may leave the
    source pod's uid out - any incarnation of that pod then fills it - but one that names a uid is refused for
    another incarnation (the pod was deleted and created again)."""
    want_ref = (spec.get("source") or {}).get("podRef") or {}
    have_ref = (have.get("source") or {}).get("podRef") or {}
    if have_ref.get("uid"):
        if have_ref.get("name") == want_ref.get("name") and have_ref["uid"] != want_ref.get("uid"):
            raise K8sError(f"{run.sref} asks for a snapshot of Pod {run.ns}/{have_ref.get('name')} uid "
                           f"{have_ref['uid']}, but that pod now has uid {want_ref.get('uid')} (it was deleted and "
                           "created again): refusing to snapshot another pod", run.sref)
        return spec
    out = copy.deepcopy(spec)
    out["source"]["podRef"].pop("uid", None)
    return out


def _ensure_content(run: _Recording, pod: JSON, uid: str, cname: str) -> JSON:
    """The PodSnapshotContent ``cname`` pointing back to the PodSnapshot (uid ``uid``), created when missing.

    An existing one must point back to this incarnation and have the same spec (immutable).
    """
    store = run.p["store"]
    cspec = _clean({"snapshotRef": {"namespace": run.ns, "name": run.name, "uid": uid},
                    "source": {"podRef": {"namespace": run.ns, "name": run.p["source_pod"],
                                          "uid": pod["metadata"]["uid"]},
                               "nodeName": _node_name(run.p, pod)},
                    "store": {"url": store["url"], "snapshotId": store["snapshot_id"], "path": store.get("path")}})
    cref = ref(podapi.KIND_CONTENT, cname)
    content = run.cluster.find(podapi.KIND_CONTENT, cname)
    if content is not None:
        _check_backlink(content, run.ns, run.name, uid, run.sref)
        differs = [k for k in sorted(cspec) if not subset(cspec[k], (content.get("spec") or {}).get(k))]
        if differs:
            raise K8sError(f"{cref} exists with another spec ({', '.join('spec.' + k for k in differs)}); its "
                           "spec is immutable", cref)
        return content
    body: JSON = {"apiVersion": podapi.API_VERSION, "kind": podapi.KIND_CONTENT,
                  "metadata": {"name": cname,
                               "labels": {LABEL_SNAPSHOT_NAMESPACE: run.ns, LABEL_SNAPSHOT_NAME: run.name}},
                  "spec": cspec}
    run.actions.append(f"created {cref}")
    return body if run.check_mode else run.cluster.create(podapi.KIND_CONTENT, body)


def _node_name(p: Params, pod: JSON) -> Optional[str]:
    """The node the snapshot was taken on: the ``node`` option, else the source pod's."""
    node = p.get("node") or (pod.get("spec") or {}).get("nodeName")
    return str(node) if node else None


def _record_content_status(run: _Recording, content: JSON, pod: JSON, wanted: List[str], cname: str
                           ) -> Tuple[JSON, Dict[str, str]]:
    """The content's status (source node and image, pod-spec field digests, conditions); ``(content, fields)``.

    Field digests once recorded are kept (a pod that changed since is a warning, not a new record).
    """
    cref = ref(podapi.KIND_CONTENT, cname)
    fields = spechash.pod_spec_fields(pod)
    cstatus = content.get("status") or {}
    recorded = cstatus.get("podSpecFields")
    if recorded and recorded != fields:
        run.warnings.append(f"Pod {run.ns}/{run.p['source_pod']} changed since {cref} recorded its pod spec; the "
                            "recorded fields are kept")
        fields = recorded
    desired = {"source": source_status(run.p.get("source_node"), pod, wanted, _node_name(run.p, pod)),
               "podSpecFields": fields,
               "conditions": _conditions(cstatus.get("conditions") or [], run.p, run.stamp)}
    changes = _status_changes(cstatus, desired)
    if changes:
        run.actions.append(f"recorded the status of {cref} ({', '.join(sorted(changes))})")
        if not run.check_mode and "metadata" in content and content["metadata"].get("uid"):
            content = run.cluster.patch_status(podapi.KIND_CONTENT, cname, changes)
        else:
            content = dict(content, status=dict(cstatus, **changes))
    return content, fields


def _record_snapshot_status(run: _Recording, snapshot: JSON, spec_hash: str, bound: Optional[str]) -> JSON:
    """The PodSnapshot's status: spec hash, creation time, conditions, the bound content and size."""
    status = dict(snapshot.get("status") or {})
    desired: JSON = {"podSpecHash": spec_hash,
                     "createdAt": run.p.get("created_at") or status.get("createdAt") or run.stamp,
                     "conditions": _conditions(status.get("conditions") or [], run.p, run.stamp)}
    if bound is not None:
        desired["boundSnapshotContentName"] = bound
    if run.p.get("size") is not None:
        desired["size"] = int(run.p["size"])
    changes = _status_changes(status, desired)
    if changes:
        run.actions.append(f"recorded the status of {run.sref} ({', '.join(sorted(changes))})")
        if not run.check_mode and snapshot["metadata"].get("uid"):
            return run.cluster.patch_status(podapi.KIND_SNAPSHOT, run.name, changes, run.ns)
        return dict(snapshot, status=dict(status, **changes))
    return snapshot


def delete_pod_snapshot(cluster: Cluster, namespace: str, name: str, content_name: Optional[str] = None,
                        check_mode: bool = False) -> JSON:
    """``state: absent``: the PodSnapshot first (only the incarnation that was read, by uid precondition), then
    every PodSnapshotContent whose backlink names this namespace/name (its bound one, ``content_name``, and
    orphans of earlier incarnations, found by label) - never one that points to another PodSnapshot.
    The artifact in the store is not touched."""
    sref = ref(podapi.KIND_SNAPSHOT, name, namespace)
    actions: List[str] = []
    pending: List[str] = []
    snapshot = cluster.find(podapi.KIND_SNAPSHOT, name, namespace)
    contents = _contents_of(cluster, namespace, name, snapshot, content_name)
    if snapshot is not None:
        actions.append(f"deleted {sref}")
        held = None if check_mode else _delete(cluster, podapi.KIND_SNAPSHOT, name, namespace,
                                               snapshot.get("metadata", {}).get("uid"))
        if held is not None:
            pending.append(f"{sref} waits for its finalizers {held.get('finalizers')}")
    for cname, content in sorted(contents.items()):
        backlink = (content.get("spec") or {}).get("snapshotRef") or {}
        if backlink.get("namespace") != namespace or backlink.get("name") != name:
            continue  # named explicitly, but it is another PodSnapshot's content: never deleted here
        actions.append(f"deleted {ref(podapi.KIND_CONTENT, cname)}")
        held = None if check_mode else _delete(cluster, podapi.KIND_CONTENT, cname, None, content["metadata"].get("uid"))
        if held is not None:
            pending.append(f"{podapi.KIND_CONTENT} {cname} waits for its finalizers")
    return {"changed": bool(actions), "actions": actions, "pending": pending}


def _contents_of(cluster: Cluster, namespace: str, name: str, snapshot: Optional[JSON],
                 content_name: Optional[str]) -> Dict[str, JSON]:
    """The contents that may belong to PodSnapshot namespace/name: labelled for it, bound to it, or named."""
    names = set()
    bound = ((snapshot or {}).get("status") or {}).get("boundSnapshotContentName")
    if bound:
        names.add(bound)
    if content_name:
        names.add(content_name)
    selector = f"{LABEL_SNAPSHOT_NAMESPACE}={namespace},{LABEL_SNAPSHOT_NAME}={name}"
    contents = {c["metadata"]["name"]: c for c in cluster.list(podapi.KIND_CONTENT, label_selector=selector)}
    for cname in names - set(contents):
        found = cluster.find(podapi.KIND_CONTENT, cname)
        if found is not None:
            contents[cname] = found
    return contents


def _delete(cluster: Cluster, kind: str, name: str, namespace: Optional[str], uid: Optional[str]) -> Optional[JSON]:
    """Delete that incarnation (gone already counts as deleted); its metadata while finalizers hold it, else None."""
    try:
        gone = cluster.delete(kind, name, namespace, uid=uid)
    except K8sError as exc:
        if not exc.not_found:
            raise
        return None
    meta = (gone.get("metadata") or {}) if isinstance(gone, dict) else {}
    return meta if meta.get("deletionTimestamp") else None


def binding_problems(cluster: Cluster, snapshot: JSON) -> Tuple[Optional[JSON], List[str]]:
    """The content ``snapshot`` is bound to, and every reason not to restore through them (``check_content_binding``
    plus a content that is missing); ``(content, [])`` when they belong together and are Ready."""
    bound = (snapshot.get("status") or {}).get("boundSnapshotContentName")
    content = cluster.find(podapi.KIND_CONTENT, bound) if bound else None
    problems = selection.check_content_binding(snapshot, content or {"metadata": {"name": bound}})
    if content is None:
        problems.insert(0, f"{podapi.object_ref(snapshot, podapi.KIND_SNAPSHOT)} has no {podapi.KIND_CONTENT}"
                           + (f" ({bound!r} does not exist)" if bound else ""))
    return content, problems
