# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The Kubernetes modules' engine calls: one ``run_<module>(params, check_mode) -> result`` per module.

Each is what ``_adapter.run_module`` calls: the module's params in, its result dict out (always with
``changed``; ``warnings`` for ``module.warn``). Invariants:

- Every refusal is a ``WarmstartError`` (``K8sError``, ``ContractError``, ``RetentionError``) with every reason,
  raised before anything is written; the adapter makes it the module's one failure shape.
- Options that only make sense together are checked here, not in ``main()`` (``count`` at least 1,
  ``failed_reason`` only with ``ready=false``), so a module's ``main()`` is its argument spec and one call.
- build, validate and classify of a given pod never connect to an API server.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_records as rec
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_requests as req
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_storage as storage
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc
from ansible_collections.warmstart.snapshot.plugins.module_utils.catalog import _retention as ret
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import (
    JSON, Cluster, K8sError, Params, cluster_from, ref)


# --- k8s_crds -------------------------------------------------------------------------

def run_k8s_crds(params: Params, check_mode: bool, diff: bool = False) -> JSON:
    """Apply (or delete) every CRD of ``definitions``; with ``wait``, until each is Established."""
    definitions = _crd_definitions(params["definitions"])
    cluster = cluster_from(params)
    entries: List[JSON] = []
    diffs: List[JSON] = []
    for definition in definitions:
        name = str(definition["metadata"]["name"])
        if params["state"] == "absent":
            before = cluster.get_crd(name)
            action = "deleted" if cluster.delete_crd(name, check_mode) else "absent"
            if action == "deleted":
                diffs.append({"before_header": name, "before": (before or {}).get("spec"), "after_header": name,
                              "after": None})
        else:
            action, was, now = cluster.apply_crd(definition, check_mode)
            if action != "unchanged":
                diffs.append({"before_header": name, "before": (was or {}).get("spec") or {}, "after_header": name,
                              "after": now.get("spec") or {}})
        entries.append({"name": name, "action": action})
    if params["state"] == "present" and params.get("wait") and not check_mode:
        for entry in entries:
            cluster.wait_established(entry["name"], params.get("wait_timeout") or 60)
    result: JSON = {"changed": any(e["action"] in ("created", "updated", "deleted") for e in entries),
                    "crds": entries}
    if diff:
        result["diff"] = diffs
    return result


def _crd_definitions(items: List[JSON]) -> List[JSON]:
    """The definitions, a v1 List (kubectl's multi-object file) standing for its items.

    Refused before anything is applied: an object that is not a CRD, and one without ``metadata.name``.
    """
    definitions: List[JSON] = []
    for item in items:
        definitions.extend(item.get("items") or [] if item.get("kind") == "List" else [item])
    for definition in definitions:
        if (definition.get("kind") or "CustomResourceDefinition") != "CustomResourceDefinition":
            raise K8sError(f"definitions: {definition.get('kind')} {(definition.get('metadata') or {}).get('name')} "
                           "is not a CustomResourceDefinition", "CustomResourceDefinition")
        if not (definition.get("metadata") or {}).get("name"):
            raise K8sError("a CRD definition has no metadata.name", "CustomResourceDefinition")
    return definitions


# --- pod_info -------------------------------------------------------------------------

def run_pod_info(params: Params, check_mode: bool = False) -> JSON:  # pylint: disable=unused-argument
    """Pods by name or selectors, kept by a JMESPath ``filter``; with ``wait_for``, waited for until ``wait_timeout``."""
    cluster = cluster_from(params)
    namespace = params.get("namespace") or "default"
    expr = _jmespath().compile(params["filter"]) if params.get("filter") else None
    wait_for = params.get("wait_for")
    deadline = time.monotonic() + float(params.get("wait_timeout") or 0)
    while True:
        pods = _read_pods(cluster, params, namespace)
        if expr is not None:
            pods = [p for p in pods if expr.search(p)]
        summaries = [rec.summary(p) for p in pods]
        pending = {s["name"]: why for s in summaries for why in [rec.waiting_for(s, wait_for or "exists")] if why}
        if params.get("name") and not pods and wait_for:
            pending = {params["name"]: "not found"}
        if not wait_for or not pending:
            return {"changed": False, "pods": pods, "targets": summaries}
        if time.monotonic() >= deadline:
            raise K8sError(f"timed out after {params.get('wait_timeout')} s waiting for pods in namespace "
                           f"{namespace} to be {wait_for}", "pod_info",
                           reasons=[f"Pod {namespace}/{name}: {why}" for name, why in sorted(pending.items())])
        time.sleep(float(params.get("wait_sleep") or 1))


def _read_pods(cluster: Cluster, params: Params, namespace: str) -> List[JSON]:
    if params.get("name"):
        found = cluster.find("Pod", params["name"], namespace)
        return [found] if found else []
    return cluster.list_pods(namespace, params.get("label_selector"), params.get("field_selector"))


def _jmespath() -> Any:
    try:
        import jmespath  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise K8sError("filter needs the Python library jmespath for the module's interpreter "
                       "(python3 -m pip install jmespath, or apt-get install python3-jmespath)", "pod_info") from None
    return jmespath


# --- pod_snapshot and pod_snapshot_info -------------------------------------------------------------

def run_pod_snapshot(params: Params, check_mode: bool) -> JSON:
    """The PodSnapshot + PodSnapshotContent records of a snapshot (``state: present``), or their deletion."""
    state = params["state"]
    if params.get("failed_reason") and params.get("ready") and state == "present":
        raise WarmstartError("failed_reason needs ready=false")
    if state == "failed" and not params.get("failed_reason"):
        raise WarmstartError("state=failed needs failed_reason (the CamelCase cause, e.g. CheckpointFailed)")
    cluster = cluster_from(params)
    if state in ("capturing", "failed"):
        return _capture_attempt(cluster, params, check_mode)
    if state == "absent":
        out = rec.delete_pod_snapshot(cluster, params["namespace"], params["name"], params.get("content_name"),
                                      check_mode)
        return {"changed": out["changed"], "actions": out["actions"], "pending": out["pending"], "snapshot": None,
                "content": None, "status": {}}
    out = rec.ensure_pod_snapshot(cluster, params, check_mode)
    return {"changed": out["changed"], "actions": out["actions"], "snapshot": out["snapshot"],
            "content": out["content"], "status": (out["snapshot"] or {}).get("status") or {},
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
    return dict(extra, changed=out["changed"], max_attempts=most, snapshot=snap, content=None,
                status=(snap or {}).get("status") or {}, actions=[f"{params['state']}: {name}"] if out["changed"] else [])


def run_pod_snapshot_trigger(params: Params, check_mode: bool) -> JSON:
    """One pass over a PodSnapshotManualTrigger: its PodSnapshot request, then its Triggered condition."""
    return req.reconcile_trigger(cluster_from(params), params["namespace"], params["name"], check_mode)


def run_pod_snapshot_info(params: Params, check_mode: bool = False) -> JSON:  # pylint: disable=unused-argument
    """PodSnapshots of a namespace with their contents; with keep_last / last_access_timeout, which retention
    removes; with policy or storage_config, the store (and its options and credentials) snapshots go to."""
    cluster = cluster_from(params)
    namespace = params.get("namespace") or "default"
    policy: Optional[JSON] = None
    if params.get("policy"):
        doc = cluster.get(pc.KIND_POLICY, params["policy"], namespace)
        policy = dict(rec.policy_settings(doc), storage_config=(doc.get("spec") or {}).get("storageConfigName"))
    where: JSON = {"store": None, "store_options": {}, "storage_config": None, "credentials_secret": None}
    if params.get("policy") or params.get("storage_config"):
        where = storage.resolve_store(cluster, namespace, params.get("policy"), params.get("storage_config"))
        if policy is not None:
            policy["store_url"] = where["store"]
    if params.get("name"):
        found = cluster.find(pc.KIND_SNAPSHOT, params["name"], namespace)
        snaps = [found] if found else []
    else:
        snaps = cluster.list(pc.KIND_SNAPSHOT, namespace, params.get("label_selector"))
    summaries = []
    for snap in snaps:
        bound = (snap.get("status") or {}).get("boundSnapshotContentName")
        summaries.append(rec.snapshot_summary(snap, cluster.find(pc.KIND_CONTENT, bound) if bound else None))
    idle = params.get("last_access_timeout")
    expired = (_expired(summaries, params.get("keep_last") or 0, params.get("group_by"), idle)
               if params.get("keep_last") or idle else [])
    options = {k: v for k, v in where["store_options"].items()
               if params.get("include_credentials") or k not in storage.SECRET_OPTIONS}
    return {"changed": False, "snapshots": summaries, "expired": expired, "policy": policy, "store": where["store"],
            "store_options": options, "storage_config": where["storage_config"],
            "credentials_secret": where["credentials_secret"]}


def _expired(summaries: List[JSON], keep_last: int, group_by: Optional[List[str]],
             last_access_timeout: Optional[str] = None) -> List[JSON]:
    """The summaries retention removes: Ready snapshots compete for the ``keep_last`` places of their group (the
    ``group_by`` label values; without them, one group per source pod), and go when not restored from (or, never
    restored from, not created) within ``last_access_timeout``."""
    pol = ret.policy(keep_last=keep_last, group_by=group_by or None, last_access_timeout=last_access_timeout)
    docs = [{"id": s["name"], "name": s["source_pod"], "labels": s["labels"], "created_at": s["created_at"],
             "last_access_at": s.get("last_access_time")}
            for s in summaries if s["ready"]]
    why = {e["id"]: e.get("reason") for e in ret.plan(docs, [], pol).remove}
    return [dict(s, reason=why[s["name"]]) for s in summaries if s["name"] in why]


# --- restore_pod ---------------------------------------------------------------------------

def run_restore_pod(params: Params, check_mode: bool) -> JSON:
    """One action of the restore-pod contract (build, validate, classify, select, create, begin, finish)."""
    count = params.get("count")
    if count is not None and count < 1:
        raise WarmstartError("count must be at least 1")
    return _ACTIONS[params["action"]](params, check_mode)


def _build_pod(params: Params, check_mode: bool) -> JSON:  # pylint: disable=unused-argument
    if not params.get("snapshot"):
        raise K8sError("action build needs snapshot (the PodSnapshot name)", "restore_pod")
    return {"changed": False, "pod": _build(params, params["snapshot"])}


def _validate_pod(params: Params, check_mode: bool) -> JSON:  # pylint: disable=unused-argument
    pod = _input_pod(params)
    problems = pc.validate(pod, params.get("seccomp_profile") or pc.SECCOMP_PROFILE)
    if problems:
        raise K8sError(f"{pc.object_ref(pod, 'Pod')} is not a restore pod", "restore pod", reasons=problems,
                       problems=problems)
    return {"changed": False, "problems": [], "entrypoints": pc.entrypoint_forms(pod)}


def _classify_pod(params: Params, check_mode: bool) -> JSON:  # pylint: disable=unused-argument
    if params.get("pod") is not None:
        pod = params["pod"]
    elif not params.get("name"):
        raise K8sError("action classify needs pod, or namespace and name of a pod", "restore_pod")
    else:
        pod = cluster_from(params).get_pod(_namespace(params), params["name"])
    return dict(rec.outcome_fields(pod), changed=False, condition=pc.restore_condition(pod),
                pod_name=(pod.get("metadata") or {}).get("name"))


def _select_pod(params: Params, check_mode: bool) -> JSON:  # pylint: disable=unused-argument
    pod = _input_pod(params)
    snapshot, content = _selected(cluster_from(params), params, pod, _namespace(params, pod))
    return {"changed": False, "snapshot": snapshot, "content": content, "reasons": []}


def _create_pods(params: Params, check_mode: bool) -> JSON:
    """The restore pods from ``snapshot`` (checked: bound and Ready unless skip_binding_check, taken from the pod's spec
    unless skip_compat_check), else the selected one."""
    cluster = cluster_from(params)
    pod = _input_pod(params)
    namespace = _namespace(params, pod)
    name = params.get("snapshot")
    if name:
        snapshot = cluster.get(pc.KIND_SNAPSHOT, name, namespace)
        content: Optional[JSON] = None
        if not params.get("skip_binding_check"):
            content, problems = rec.binding_problems(cluster, snapshot)
            if problems:
                raise K8sError(f"{ref(pc.KIND_SNAPSHOT, name, namespace)} cannot be restored from", "restore_pod",
                               reasons=problems)
    else:
        snapshot, content = _selected(cluster, params, pod, namespace)
        name = snapshot["metadata"]["name"]
    built = _build(params, str(name))
    if params.get("snapshot") and params.get("scope") != pc.SCOPE_ROOTFS_ONLY:
        problems = pc.check_pod_spec(snapshot, built, content)  # pinned: no selection compared the hash
        if problems:
            raise K8sError(f"{ref(pc.KIND_SNAPSHOT, str(name), namespace)} cannot be restored into "
                           f"{pc.object_ref(pod, 'Pod')}", "restore_pod", reasons=problems)
    changed, pods, actions = rec.create_restore_pods(cluster, built, namespace, params.get("count") or 1,
                                                     params.get("name_prefix"), check_mode)
    return {"changed": changed, "pods": pods, "actions": actions, "pod": built, "snapshot": snapshot,
            "content": content}


def _begin(params: Params, check_mode: bool) -> JSON:
    return rec.begin_restore(cluster_from(params), params["namespace"], params["name"],
                             params.get("condition_message") or "", check_mode)


def _finish(params: Params, check_mode: bool) -> JSON:
    return rec.finish_restore(cluster_from(params), params["namespace"], params["name"], params["outcome"],
                              params.get("condition_message") or "", check_mode)


_ACTIONS: Dict[str, Callable[[Params, bool], JSON]] = {
    "build": _build_pod, "validate": _validate_pod, "classify": _classify_pod, "select": _select_pod,
    "create": _create_pods, "begin": _begin, "finish": _finish,
}


def _selected(cluster: Cluster, params: Params, pod: JSON, namespace: str) -> Tuple[JSON, Optional[JSON]]:
    """The PodSnapshot (and content) ``select_for_pod`` finds for ``pod``; none fitting is refused with the reasons."""
    snapshot, content, reasons = rec.select_for_pod(cluster, pod, namespace, params.get("grouping_labels") or (),
                                                    params.get("scope") or pc.SCOPE_WHOLE_POD)
    if snapshot is None:
        raise K8sError(f"no PodSnapshot in namespace {namespace} fits {pc.object_ref(pod, 'Pod')}", "restore_pod",
                       reasons=reasons)
    return snapshot, content


def _input_pod(params: Params) -> JSON:
    pod = params.get("pod") if params.get("pod") is not None else params.get("template")
    if pod is None:
        raise K8sError(f"action {params['action']} needs pod or template", "restore_pod")
    return dict(pod)


def _build(params: Params, snapshot_name: str) -> JSON:
    """``_podcontract.build`` with the module's options (its ContractError carries every reason)."""
    return pc.build(_input_pod(params), snapshot_name, container_map=params.get("container_map"),
                    skip_compat_check=bool(params.get("skip_compat_check")),
                    startup_probe=bool(params.get("startup_probe", True)),
                    seccomp_profile=params.get("seccomp_profile") or pc.SECCOMP_PROFILE,
                    entrypoint=params.get("entrypoint") or pc.ENTRYPOINT_INERT)


def _namespace(params: Params, pod: Optional[JSON] = None) -> str:
    ns = params.get("namespace") or ((pod or {}).get("metadata") or {}).get("namespace")
    if not ns:
        raise K8sError(f"action {params['action']} needs namespace (or metadata.namespace in the pod)", "restore_pod")
    return str(ns)
