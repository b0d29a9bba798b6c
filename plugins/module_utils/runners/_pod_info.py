# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The pod_info module's runner: pods by name or selectors, kept by a JMESPath ``filter``, waited for.

Keeps the runners' invariants (``_common``); it only reads.
"""
from __future__ import annotations

import time
from typing import Any, List

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_summaries as summ
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import JSON, Cluster, K8sError, Params, cluster_from


def run(params: Params, check_mode: bool = False) -> JSON:  # pylint: disable=unused-argument
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
        summaries = [summ.summary(p) for p in pods]
        pending = {s["name"]: why for s in summaries for why in [summ.waiting_for(s, wait_for or "exists")] if why}
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
