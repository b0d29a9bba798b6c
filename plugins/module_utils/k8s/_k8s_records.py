# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The warmstart records in a cluster: PodSnapshot + PodSnapshotContent, restore pods, policies, summaries.

Built on ``_k8s_client.Cluster``; the pure contract (hash, conditions, selection, binding checks) is
``_podcontract``. Invariants:

- A PodSnapshot and its PodSnapshotContent are bound only when the content's backlink names that
  PodSnapshot's namespace, name *and* uid; a content of another (or an earlier, deleted) PodSnapshot is
  refused with every reason before anything is created or changed, never rebound or overwritten.
- Specs are immutable: a record that exists with another spec is refused, never patched.
- ``check_mode`` reads everything a real run reads and reports the same actions, and writes nothing.
- A restore pod's restore runs at most once: ``begin_restore`` refuses a pod whose Restored condition already
  has an outcome; ``finish_restore`` records the outcome, then releases the finalizer.
- Deleting (``delete_pod_snapshot``) removes only the incarnation that was read (uid precondition) and only
  contents whose backlink names it; the artifact in the store is never touched here.
"""
from __future__ import annotations

import copy
import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc
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
        conds = pc.set_condition(current, pc.READY_CONDITION, True, "SnapshotReady",
                                 "the snapshot is stored and can be restored from", stamp)
        return pc.set_condition(conds, pc.FAILED_CONDITION, False, "NoFailure", "", stamp)
    reason, message = p.get("failed_reason"), p.get("failed_message")
    if reason:
        conds = pc.set_condition(current, pc.READY_CONDITION, False, reason, message or reason, stamp)
        return pc.set_condition(conds, pc.FAILED_CONDITION, True, reason, message or reason, stamp)
    conds = pc.set_condition(current, pc.READY_CONDITION, False, "SnapshotInProgress", "the snapshot is being taken",
                             stamp)
    return pc.set_condition(conds, pc.FAILED_CONDITION, False, "NoFailure", "", stamp)


def _status_changes(current: JSON, desired: JSON) -> JSON:
    """The keys of ``desired`` whose value differs from ``current``."""
    return {k: v for k, v in desired.items() if current.get(k) != v}


def _check_backlink(content: JSON, namespace: str, name: str, uid: Optional[str], sref: str) -> None:
    """Refuse a content whose spec.snapshotRef is not this PodSnapshot (namespace, name and uid)."""
    cref = ref(pc.KIND_CONTENT, content["metadata"]["name"])
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
        self.sref = ref(pc.KIND_SNAPSHOT, self.name, self.ns)
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
        return run.result(snapshot, None, [f"would create its {pc.KIND_CONTENT} and bind them"])
    uid = snapshot["metadata"].get("uid") or ""
    status = dict(snapshot.get("status") or {})
    cname = p.get("content_name") or content_name_for(run.ns, run.name, uid)
    bound = status.get("boundSnapshotContentName")
    if bound and bound != cname:
        raise K8sError(f"{run.sref} is bound to {pc.KIND_CONTENT} {bound!r}, not to {cname!r}: refusing to rebind "
                       "it", run.sref)
    content: Optional[JSON] = None
    if p.get("store"):
        content = _ensure_content(run, pod, uid, cname)
        content, fields = _record_content_status(run, content, pod, wanted, cname)
        spec_hash = pc.hash_fields(fields)
    else:
        spec_hash = status.get("podSpecHash") or pc.pod_spec_hash(pod)
    snapshot = _record_snapshot_status(run, snapshot, spec_hash, cname if content is not None else None)
    return run.result(snapshot, content)


def _source_pod(run: _Recording) -> Tuple[JSON, List[str]]:
    """The source pod, and the containers the snapshot holds (refused: one the pod lacks; Ready without store)."""
    p = run.p
    run.existing = run.cluster.find(pc.KIND_SNAPSHOT, run.name, run.ns)
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
    spec: JSON = {"source": source, "scope": p.get("scope") or pc.SCOPE_WHOLE_POD}
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
        early = cluster.find(pc.KIND_CONTENT, p["content_name"])
        if early is not None:
            _check_backlink(early, run.ns, run.name, (snapshot or {}).get("metadata", {}).get("uid"), run.sref)
    if snapshot is None:
        body: JSON = {"apiVersion": pc.API_VERSION, "kind": pc.KIND_SNAPSHOT,
                      "metadata": {"name": run.name, "namespace": run.ns, "labels": labels}, "spec": spec}
        run.actions.append(f"created {run.sref}")
        return (body if run.check_mode else cluster.create(pc.KIND_SNAPSHOT, body, run.ns)), True
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
            snapshot = cluster.patch(pc.KIND_SNAPSHOT, run.name, {"metadata": {"labels": labels}}, run.ns)
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
    cref = ref(pc.KIND_CONTENT, cname)
    content = run.cluster.find(pc.KIND_CONTENT, cname)
    if content is not None:
        _check_backlink(content, run.ns, run.name, uid, run.sref)
        differs = [k for k in sorted(cspec) if not subset(cspec[k], (content.get("spec") or {}).get(k))]
        if differs:
            raise K8sError(f"{cref} exists with another spec ({', '.join('spec.' + k for k in differs)}); its "
                           "spec is immutable", cref)
        return content
    body: JSON = {"apiVersion": pc.API_VERSION, "kind": pc.KIND_CONTENT,
                  "metadata": {"name": cname,
                               "labels": {LABEL_SNAPSHOT_NAMESPACE: run.ns, LABEL_SNAPSHOT_NAME: run.name}},
                  "spec": cspec}
    run.actions.append(f"created {cref}")
    return body if run.check_mode else run.cluster.create(pc.KIND_CONTENT, body)


def _node_name(p: Params, pod: JSON) -> Optional[str]:
    """The node the snapshot was taken on: the ``node`` option, else the source pod's."""
    node = p.get("node") or (pod.get("spec") or {}).get("nodeName")
    return str(node) if node else None


def _record_content_status(run: _Recording, content: JSON, pod: JSON, wanted: List[str], cname: str
                           ) -> Tuple[JSON, Dict[str, str]]:
    """The content's status (source node and image, pod-spec field digests, conditions); ``(content, fields)``.

    Field digests once recorded are kept (a pod that changed since is a warning, not a new record).
    """
    cref = ref(pc.KIND_CONTENT, cname)
    fields = pc.pod_spec_fields(pod)
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
            content = run.cluster.patch_status(pc.KIND_CONTENT, cname, changes)
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
            return run.cluster.patch_status(pc.KIND_SNAPSHOT, run.name, changes, run.ns)
        return dict(snapshot, status=dict(status, **changes))
    return snapshot


def delete_pod_snapshot(cluster: Cluster, namespace: str, name: str, content_name: Optional[str] = None,
                        check_mode: bool = False) -> JSON:
    """``state: absent``: the PodSnapshot first (only the incarnation that was read, by uid precondition), then
    every PodSnapshotContent whose backlink names this namespace/name (its bound one, ``content_name``, and
    orphans of earlier incarnations, found by label) - never one that points to another PodSnapshot.
    The artifact in the store is not touched."""
    sref = ref(pc.KIND_SNAPSHOT, name, namespace)
    actions: List[str] = []
    pending: List[str] = []
    snapshot = cluster.find(pc.KIND_SNAPSHOT, name, namespace)
    contents = _contents_of(cluster, namespace, name, snapshot, content_name)
    if snapshot is not None:
        actions.append(f"deleted {sref}")
        held = None if check_mode else _delete(cluster, pc.KIND_SNAPSHOT, name, namespace,
                                               snapshot.get("metadata", {}).get("uid"))
        if held is not None:
            pending.append(f"{sref} waits for its finalizers {held.get('finalizers')}")
    for cname, content in sorted(contents.items()):
        backlink = (content.get("spec") or {}).get("snapshotRef") or {}
        if backlink.get("namespace") != namespace or backlink.get("name") != name:
            continue  # named explicitly, but it is another PodSnapshot's content: never deleted here
        actions.append(f"deleted {ref(pc.KIND_CONTENT, cname)}")
        held = None if check_mode else _delete(cluster, pc.KIND_CONTENT, cname, None, content["metadata"].get("uid"))
        if held is not None:
            pending.append(f"{pc.KIND_CONTENT} {cname} waits for its finalizers")
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
    contents = {c["metadata"]["name"]: c for c in cluster.list(pc.KIND_CONTENT, label_selector=selector)}
    for cname in names - set(contents):
        found = cluster.find(pc.KIND_CONTENT, cname)
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
    content = cluster.find(pc.KIND_CONTENT, bound) if bound else None
    problems = pc.check_content_binding(snapshot, content or {"metadata": {"name": bound}})
    if content is None:
        problems.insert(0, f"{pc.object_ref(snapshot, pc.KIND_SNAPSHOT)} has no {pc.KIND_CONTENT}"
                           + (f" ({bound!r} does not exist)" if bound else ""))
    return content, problems


# --- restore pods -------------------------------------------------------------------

def select_for_pod(cluster: Cluster, pod: JSON, namespace: str, grouping_labels: Sequence[str] = (),
                   scope: str = pc.SCOPE_WHOLE_POD) -> Tuple[Optional[JSON], Optional[JSON], List[str]]:
    """The PodSnapshot (and its content) to restore ``pod`` from: ``(snapshot, content, reasons)``.

    Lists the namespace's PodSnapshots and the contents they are bound to, then ``select_snapshot``; the chosen
    one must also pass ``check_content_binding`` (backlink uid, bound name, Ready), and one the pod pins by its
    restore-from annotation ``check_pod_spec`` (unless ``scope`` is rootfs-only).
    """
    snapshots = cluster.list(pc.KIND_SNAPSHOT, namespace)
    contents: Dict[str, JSON] = {}
    for snap in snapshots:
        bound = (snap.get("status") or {}).get("boundSnapshotContentName")
        if bound and bound not in contents:
            found = cluster.find(pc.KIND_CONTENT, bound)
            if found is not None:
                contents[bound] = found
    target = copy.deepcopy(pod)
    target.setdefault("metadata", {})
    if not target["metadata"].get("namespace") and "template" not in (target.get("spec") or {}):
        target["metadata"]["namespace"] = namespace
    chosen, reasons = pc.select_snapshot(snapshots, target, grouping_labels, scope, contents)
    if chosen is None:
        return None, None, reasons
    bound = (chosen.get("status") or {}).get("boundSnapshotContentName")
    content = contents.get(bound) if bound else None
    if content is None:
        sref = pc.object_ref(chosen, pc.KIND_SNAPSHOT)
        return None, None, [f"{sref} is bound to {pc.KIND_CONTENT} {bound!r}, which does not exist" if bound
                            else f"{sref} is not bound to any {pc.KIND_CONTENT}"]
    problems = pc.check_content_binding(chosen, content)
    pinned = pc.restore_annotations(target)[0].get(pc.ANN_RESTORE_FROM) is not None
    if not problems and pinned and scope != pc.SCOPE_ROOTFS_ONLY:
        problems = pc.check_pod_spec(chosen, target, content)  # pinned: selection compared no hash
    if problems:
        return None, None, problems
    return chosen, content, []


def create_restore_pods(cluster: Cluster, built: JSON, namespace: str, count: int, name_prefix: Optional[str],
                        check_mode: bool = False) -> Tuple[bool, List[JSON], List[str]]:
    """Create ``count`` restore pods from the built pod: ``<name_prefix>-<i>`` (i from 0; idempotent by name), or
    ``generateName`` when no prefix is given (each run creates new ones). ``(changed, pods, actions)``."""
    pods: List[JSON] = []
    actions: List[str] = []
    source = pc.restore_annotations(built)[0].get(pc.ANN_RESTORE_FROM)
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
                have = pc.restore_annotations(existing)[0].get(pc.ANN_RESTORE_FROM)
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


OUTCOMES = pc.RESULT_CONDITIONS  # the node's restore result -> (condition status, reason)


def outcome_fields(pod: JSON) -> JSON:
    """What a result says about where restore pod ``pod`` stands: ``outcome`` (the reference's name, ``classify``),
    ``losses`` (``restore_losses``) and the deprecated ``state`` (``legacy_state``, kept for one release)."""
    return {"outcome": pc.classify(pod), "losses": pc.restore_losses(pod), "state": pc.legacy_state(pod)}


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
    if condition and condition.get("reason") not in (None, pc.REASON_IN_PROGRESS):
        raise K8sError(f"Pod {namespace}/{name}: its restore already ran ({condition.get('reason')}: "
                       f"{condition.get('message') or 'no message'}); a new pod is needed", "Pod")
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        raise K8sError(f"Pod {namespace}/{name} is being deleted", "Pod")
    pod, _pinned, reasons = pin_selected(cluster, pod, check_mode)
    if reasons:
        raise K8sError(f"Pod {namespace}/{name}: no PodSnapshot to restore from", "Pod", reasons=reasons)
    plan = restore_plan(cluster, pod)
    added = cluster.add_finalizer("Pod", name, pc.FINALIZER, namespace, check_mode)
    changed, pod = cluster.set_pod_condition(namespace, name, pc.RESTORE_CONDITION, "False", pc.REASON_IN_PROGRESS,
                                             message or f"restoring from PodSnapshot {plan['snapshot']}", check_mode)
    return dict(plan, changed=added or changed, pod=pod, **outcome_fields(pod))


def restore_plan(cluster: Cluster, pod: JSON) -> JSON:
    """What the node must do for restore pod ``pod``: the artifact, and (source, destination container) pairs.

    The PodSnapshot named by the pod's restore-from annotation (ours or the reference's) must be bound to its
    content (backlink uid, Ready) and taken from the pod's spec (``check_pod_spec``: the condensed pod-spec hash,
    unless the pod's skip-compat annotation says "true"); the pairs are ``restore_pairs``. Reads only.
    """
    meta = pod.get("metadata") or {}
    namespace, name = meta.get("namespace"), meta.get("name")
    annotations, conflicts = pc.restore_annotations(pod)
    if conflicts:
        raise K8sError(f"Pod {namespace}/{name}: its restore annotations disagree", "Pod", reasons=conflicts)
    source = annotations.get(pc.ANN_RESTORE_FROM)
    if not source:
        raise K8sError(f"Pod {namespace}/{name} has no {pc.ANN_RESTORE_FROM} (or {pc.REF_ANN_RESTORE_FROM}) "
                       "annotation: not a restore pod", "Pod")
    if not pc.is_dns_subdomain(source) or len(str(source)) > 253:
        raise K8sError(f"Pod {namespace}/{name}: its {pc.ANN_RESTORE_FROM} annotation {str(source)[:80]!r} is not a "
                       "PodSnapshot name (a DNS subdomain of its own namespace)", "Pod")
    snap = cluster.get(pc.KIND_SNAPSHOT, source, namespace)
    content, problems = binding_problems(cluster, snap)
    if not problems:
        problems = pc.check_pod_spec(snap, pod, content)
    if problems:
        raise K8sError(f"Pod {namespace}/{name}: PodSnapshot {namespace}/{source} cannot be restored from",
                       "Pod", reasons=problems)
    pairs = restore_pairs(pod, snap)
    ids = {c.get("name"): c.get("containerID") for c in (pod.get("status") or {}).get("containerStatuses") or []}
    for pair in pairs:
        pair["container_id"] = ids.get(pair["container"])
    return {"snapshot": source, "content": (snap.get("status") or {}).get("boundSnapshotContentName"),
            "store": ((content or {}).get("spec") or {}).get("store") or {},
            "node": (pod.get("spec") or {}).get("nodeName"), "pairs": pairs,
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
    mapped = pc.parse_container_map(annotations.get(pc.ANN_CONTAINER_MAP))
    pairs: List[JSON]
    if mapped:
        pairs = [{"source": src, "container": dst} for src, dst in mapped]
    elif len(held) == 1 and len(dests) == 1:
        pairs = [{"source": held[0], "container": dests[0]}]
    else:
        pairs = [{"source": d, "container": d} for d in dests if d in held]
    if not pairs:
        namespace, source = meta.get("namespace"), annotations.get(pc.ANN_RESTORE_FROM)
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
    changed, pod = cluster.set_pod_condition(namespace, name, pc.RESTORE_CONDITION, status, reason,
                                             message or outcome.replace("_", " "), check_mode)
    removed = cluster.remove_finalizer("Pod", name, pc.FINALIZER, namespace, check_mode)
    if removed and not check_mode:
        pod = cluster.find("Pod", name, namespace) or pod
    out = dict(outcome_fields(pod), changed=changed or removed, pod=pod, last_access_time=None, warnings=[])
    source = pc.restore_annotations(pod)[0].get(pc.ANN_RESTORE_FROM)
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
        cluster.get(pc.KIND_SNAPSHOT, name, namespace)
        return when
    cluster.patch_status(pc.KIND_SNAPSHOT, name, {"lastAccessTime": when}, namespace)
    return when


def pin_selected(cluster: Cluster, pod: JSON, check_mode: bool = False) -> Tuple[JSON, Optional[str], List[str]]:
    """For a pod that selects its snapshot at restore (``restore-select``) and has not pinned one yet: select it
    (``select_for_pod`` with the grouping labels and scope of its ``restore-policy``) and pin it on the pod
    (restore-from annotation, guarded by the resourceVersion read). ``(pod, snapshot name, reasons)``: the name is
    None with the reasons when none fits (the pod waits, or falls back); a pinned pod is returned as it is.
    A concurrent change of the pod (409) is a K8sError with ``conflict``: read it again and decide again."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    mode = pc.restore_mode(pod)
    if mode["restore_from"]:
        return pod, str(mode["restore_from"]), []
    if not mode["select"]:
        return pod, None, [f"Pod {namespace}/{meta.get('name')} is not a restore pod (neither "
                           f"{pc.ANN_RESTORE_FROM} nor {pc.ANN_RESTORE_SELECT})"]
    group_by: Sequence[str] = ()
    scope = pc.SCOPE_WHOLE_POD
    if mode["policy"]:
        settings = policy_settings(cluster.get(pc.KIND_POLICY, str(mode["policy"]), namespace))
        group_by, scope = settings["group_by"], settings["scope"]
    chosen, _content, reasons = select_for_pod(cluster, pod, namespace, group_by, scope)
    if chosen is None:
        return pod, None, reasons
    name = str(chosen["metadata"]["name"])
    if check_mode:
        pinned = copy.deepcopy(pod)
        pinned["metadata"].setdefault("annotations", {})[pc.ANN_RESTORE_FROM] = name
        return pinned, name, []
    patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": {pc.ANN_RESTORE_FROM: name}}}
    return cluster.patch("Pod", str(meta.get("name")), patch, namespace), name, []


# --- summaries and policies -------------------------------------------------------------------

WAIT_FOR = ("exists", "scheduled", "running")


def summary(pod: JSON) -> JSON:
    """The facts a snapshot or restore of this pod needs, in the checkpoint module's ``pod`` terms."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    by_name = {c.get("name"): c for c in status.get("containerStatuses") or []}
    restoring = pc.contract_annotations(meta.get("annotations") or {}, "pod")[0].get(pc.ANN_RESTORE_FROM) is not None
    containers = []
    for c in spec.get("containers") or []:
        st = by_name.get(c.get("name")) or {}
        containers.append({"name": c.get("name"), "container_id": st.get("containerID"),
                           "running": "running" in (st.get("state") or {}), "ready": bool(st.get("ready")),
                           "restart_count": int(st.get("restartCount") or 0)})
    return {"namespace": meta.get("namespace"), "name": meta.get("name"), "uid": meta.get("uid"),
            "node": spec.get("nodeName"), "phase": status.get("phase"), "labels": meta.get("labels") or {},
            "annotations": meta.get("annotations") or {}, "spec_hash": pc.pod_spec_hash(pod),
            "restore_outcome": pc.classify(pod) if restoring else None,
            "restore_state": pc.legacy_state(pod) if restoring else None,  # deprecated: restore_outcome
            "containers": containers}


def waiting_for(s: JSON, wait_for: str) -> Optional[str]:
    """Why pod summary ``s`` does not meet ``wait_for`` (one of ``WAIT_FOR``) yet (None: it does)."""
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


def snapshot_summary(snap: JSON, content: Optional[JSON]) -> JSON:
    """A PodSnapshot and its content in pod_snapshot_info's terms."""
    meta = snap.get("metadata") or {}
    status = snap.get("status") or {}
    cspec = (content or {}).get("spec") or {}
    failed = pc.get_condition(snap, pc.FAILED_CONDITION) or {}
    return {"namespace": meta.get("namespace"), "name": meta.get("name"), "uid": meta.get("uid"),
            "labels": meta.get("labels") or {}, "ready": pc.is_ready(snap),
            "failed": failed.get("status") == "True",
            "policy_name": (snap.get("spec") or {}).get("policyName"),
            "created_at": status.get("createdAt") or meta.get("creationTimestamp"),
            "last_access_time": status.get("lastAccessTime"), "attempts": int(status.get("attempts") or 0),
            "last_error": status.get("lastError"),
            "content": status.get("boundSnapshotContentName"), "size": status.get("size"),
            "pod_spec_hash": status.get("podSpecHash"),
            "source_pod": (((snap.get("spec") or {}).get("source") or {}).get("podRef") or {}).get("name"),
            "node": (cspec.get("source") or {}).get("nodeName"),
            "store": cspec.get("store") if cspec.get("store") else None}


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
