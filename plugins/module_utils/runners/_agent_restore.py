# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The agent_restore module's runner: one restore pod, handled once by this node (``_agent.restore_pod``).

Keeps the runners' invariants (``_common``). Besides: a restore that ran (restored, refused, recovered) counts
itself in the node's metrics, never in check mode; a metrics problem is a warning, never the task's failure.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.agent import _agent as agent
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _metrics as metrics
from ansible_collections.warmstart.snapshot.plugins.module_utils.agent._agent_node import LocalNode
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import cluster_from


def run(params: Dict[str, Any], check_mode: bool) -> Dict[str, Any]:
    """One restore pod, handled once by this node (``_agent.restore_pod``)."""
    if params.get("fallback") not in agent.FALLBACKS:
        raise WarmstartError(f"fallback must be one of {', '.join(agent.FALLBACKS)}, not {params.get('fallback')!r}")
    node = LocalNode(runtime=params.get("runtime") or "auto", store=params.get("store"),
                     store_options=params.get("store_options"), criu_path=params.get("criu_path"),
                     restore_root=params.get("restore_root"), lazy=bool(params.get("lazy")))
    settings = agent.Settings.of(params)
    settings.running_timeout = float(params.get("running_timeout") or settings.running_timeout)
    result = agent.restore_pod(cluster_from(params), settings, node, check_mode)
    if not check_mode and result["action"] in ("restored", "refused", "recovered"):
        warning = record_metrics(metrics.resolve_dir(params.get("metrics_dir")), result)
        if warning:
            result.setdefault("warnings", []).append(warning)
    return result


def record_metrics(directory: Optional[str], result: Dict[str, Any]) -> Optional[str]:
    """Count the pod's restore in the node's metrics (outcome, phases, bytes, snapshot age, ready latency)."""
    restore = result.get("restore") or {}
    phases: Dict[str, Any] = {}
    for dest in restore.get("destinations") or []:
        for phase, seconds in (dest.get("timings") or {}).items():
            phases[phase] = phases.get(phase, 0.0) + float(seconds)
    size = int(result.get("snapshot_bytes") or 0) if result.get("outcome") == "succeeded" else 0
    namespace = str(result.get("pod_ref", "/")).split("/", 1)[0]
    return metrics.record_restore(directory, str(result.get("outcome") or "failed"), phases, size,
                                  result.get("snapshot_age_seconds"), namespace,
                                  str(result.get("pod_snapshot_name") or ""), result.get("ready_seconds"))
