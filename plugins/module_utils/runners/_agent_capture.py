# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The agent_capture module's runner: one PodSnapshot request (or a policy's ready source pod), captured here.

Keeps the runners' invariants (``_common``). Besides: a capture that ran (captured, failed, will retry) counts
itself in the node's metrics, never in check mode; a metrics problem is a warning, never the task's failure.
"""
from __future__ import annotations

from typing import Any, Dict

from ansible_collections.warmstart.snapshot.plugins.module_utils.agent import _agent_capture as capture
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_requests as requests
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _metrics as metrics
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.agent._agent_node import LocalNode
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import cluster_from


def run(params: Dict[str, Any], check_mode: bool) -> Dict[str, Any]:
    """One PodSnapshot request (or a policy's ready source pod), captured here."""
    cluster = cluster_from(params)
    settings = capture.CaptureSettings.of(params)
    asked = None
    if params.get("policy") and params.get("pod"):
        pod = cluster.find("Pod", params["pod"], settings.namespace)
        policy = cluster.find(podapi.KIND_POLICY, params["policy"], settings.namespace)
        if pod is None or policy is None:
            gone = f"Pod {settings.namespace}/{params['pod']}" if pod is None else f"policy {params['policy']}"
            return {"changed": False, "action": "skipped", "reason": f"{gone} no longer exists"}
        settings.name, created = capture.ask_for(cluster, settings.namespace, pod, policy, check_mode)
        asked = {"pod_snapshot_name": settings.name, "created": created}
    elif params.get("trigger"):
        reconciled = requests.reconcile_trigger(cluster, settings.namespace, params["trigger"], check_mode)
        if reconciled["phase"] != "pending" or not reconciled.get("snapshot_name"):
            return {"changed": bool(reconciled["changed"]), "action": "skipped", "trigger": params["trigger"],
                    "reason": f"the trigger is {reconciled['phase']}", "actions": reconciled["actions"]}
        settings.name = str(reconciled["snapshot_name"])
        asked = {"pod_snapshot_name": settings.name, "trigger": params["trigger"]}
    elif not params.get("name"):
        raise WarmstartError("agent_capture needs name (a PodSnapshot), pod and policy, or trigger")
    node = LocalNode(runtime=params.get("runtime") or "auto", criu_path=params.get("criu_path"))
    result = capture.capture(cluster, settings, node, check_mode)
    if asked:
        result["requested"] = asked
    if params.get("trigger") and not check_mode:  # Triggered Complete / Failed once the request settled
        result["trigger_phase"] = requests.reconcile_trigger(cluster, settings.namespace, params["trigger"])["phase"]
    if not check_mode and result["action"] in ("captured", "failed", "will retry"):
        outcome = "succeeded" if result["action"] == "captured" else "failed"
        warning = metrics.record_capture(metrics.resolve_dir(params.get("metrics_dir")), outcome,
                                         result.get("timings"), int(result.get("size") or 0))
        if warning:
            result.setdefault("warnings", []).append(warning)
    return result
