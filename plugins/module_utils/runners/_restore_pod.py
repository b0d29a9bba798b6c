# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The restore_pod module's runner: one action of the restore-pod contract that reads or writes the cluster
(select, create, begin, finish). Its pure steps are filters: ``restore_template`` builds, ``restore_pod_problems``
validates, ``restore_pod_outcome`` classifies.

Keeps the runners' invariants (``_common``). Besides: ``count`` below 1 is refused here, before a connection is made.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_records as rec
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_restorepods as rpods
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podbuild as podbuild
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _selection as selection
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import (
    JSON, Cluster, K8sError, Params, cluster_from, ref)


def run(params: Params, check_mode: bool) -> JSON:
    """One action of the restore-pod contract (select, create, begin, finish)."""
    count = params.get("count")
    if count is not None and count < 1:
        raise WarmstartError("count must be at least 1")
    return _ACTIONS[params["action"]](params, check_mode)


def _select_pod(params: Params, check_mode: bool) -> JSON:  # pylint: disable=unused-argument
    pod = _input_pod(params)
    snapshot, content = _selected(cluster_from(params), params, pod, _namespace(params, pod))
    return {"changed": False, "pod_snapshot": snapshot, "pod_snapshot_content": content, "reasons": []}


def _create_pods(params: Params, check_mode: bool) -> JSON:
    """The restore pods from ``snapshot`` (checked: bound and Ready unless skip_binding_check, taken from the pod's spec
    unless skip_compat_check), else the selected one."""
    cluster = cluster_from(params)
    pod = _input_pod(params)
    namespace = _namespace(params, pod)
    name = params.get("snapshot")
    if name:
        snapshot = cluster.get(podapi.KIND_SNAPSHOT, name, namespace)
        content: Optional[JSON] = None
        if not params.get("skip_binding_check"):
            content, problems = rec.binding_problems(cluster, snapshot)
            if problems:
                raise K8sError(f"{ref(podapi.KIND_SNAPSHOT, name, namespace)} cannot be restored from", "restore_pod",
                               reasons=problems)
    else:
        snapshot, content = _selected(cluster, params, pod, namespace)
        name = snapshot["metadata"]["name"]
    built = _build(params, str(name))
    if params.get("snapshot") and params.get("scope") != podapi.SCOPE_ROOTFS_ONLY:
        problems = selection.check_pod_spec(snapshot, built, content)  # pinned: no selection compared the hash
        if problems:
            raise K8sError(f"{ref(podapi.KIND_SNAPSHOT, str(name), namespace)} cannot be restored into "
                           f"{podapi.object_ref(pod, 'Pod')}", "restore_pod", reasons=problems)
    changed, pods, actions = rpods.create_restore_pods(cluster, built, namespace, params.get("count") or 1,
                                                       params.get("name_prefix"), check_mode)
    return {"changed": changed, "pods": pods, "actions": actions, "pod": built, "pod_snapshot": snapshot,
            "pod_snapshot_content": content}


def _begin(params: Params, check_mode: bool) -> JSON:
    return rpods.begin_restore(cluster_from(params), params["namespace"], params["name"],
                               params.get("condition_message") or "", check_mode)


def _finish(params: Params, check_mode: bool) -> JSON:
    return rpods.finish_restore(cluster_from(params), params["namespace"], params["name"], params["outcome"],
                                params.get("condition_message") or "", check_mode)


_ACTIONS: Dict[str, Callable[[Params, bool], JSON]] = {
    "select": _select_pod, "create": _create_pods, "begin": _begin, "finish": _finish,
}


def _selected(cluster: Cluster, params: Params, pod: JSON, namespace: str) -> Tuple[JSON, Optional[JSON]]:
    """The PodSnapshot (and content) ``select_for_pod`` finds for ``pod``; none fitting is refused with the reasons."""
    snapshot, content, reasons = rpods.select_for_pod(cluster, pod, namespace, params.get("grouping_labels") or (),
                                                      params.get("scope") or podapi.SCOPE_WHOLE_POD)
    if snapshot is None:
        raise K8sError(f"no PodSnapshot in namespace {namespace} fits {podapi.object_ref(pod, 'Pod')}", "restore_pod",
                       reasons=reasons)
    return snapshot, content


def _input_pod(params: Params) -> JSON:
    pod = params.get("pod") if params.get("pod") is not None else params.get("template")
    if pod is None:
        raise K8sError(f"action {params['action']} needs pod or template", "restore_pod")
    return dict(pod)


def _build(params: Params, snapshot_name: str) -> JSON:
    """``_podbuild.build`` with the module's options (its ContractError carries every reason)."""
    return podbuild.build(_input_pod(params), snapshot_name, container_map=params.get("container_map"),
                          skip_compat_check=bool(params.get("skip_compat_check")),
                          startup_probe=bool(params.get("startup_probe", True)),
                          seccomp_profile=params.get("seccomp_profile") or podapi.SECCOMP_PROFILE,
                          entrypoint=params.get("entrypoint") or podapi.ENTRYPOINT_INERT)


def _namespace(params: Params, pod: Optional[JSON] = None) -> str:
    ns = params.get("namespace") or ((pod or {}).get("metadata") or {}).get("namespace")
    if not ns:
        raise K8sError(f"action {params['action']} needs namespace (or metadata.namespace in the pod)", "restore_pod")
    return str(ns)
