# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The agent_retention module's runner: every PodSnapshotPolicy's retention, applied to this node's snapshots
(``_agent_retention.sweep``).

Keeps the runners' invariants (``_common``). A snapshot is removed from the store the PodSnapshotContent names,
opened with the policy's store options (its storage config and credentials Secret), or with ``store_options``
when given; a problem with one snapshot is in RV(errors) and fails the task after the others were done.
"""
from __future__ import annotations

from typing import Any, Callable, Dict

from ansible_collections.warmstart.snapshot.plugins.module_utils.agent import _agent_retention as retention
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import cluster_from
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._stores import open_store


def run(params: Dict[str, Any], check_mode: bool) -> Dict[str, Any]:
    """Every PodSnapshotPolicy's retention in ``namespaces``, applied to the snapshots taken on ``node_name``."""
    node = params.get("node_name")
    if not node:
        raise WarmstartError("node_name is required (or the environment variable NODE_NAME): only the snapshots "
                             "taken on this node are removed here")
    given = params.get("store_options") or {}

    def remove(url: str, options: Dict[str, Any]) -> Callable[[str], int]:
        return open_store(url, given or options).delete

    namespaces = list(params.get("namespaces") or []) or [None]
    result = retention.sweep(cluster_from(params), str(node), remove, namespaces, check_mode)
    if result["errors"]:
        raise WarmstartError(f"retention on node {node}: {len(result['errors'])} problem(s)", reasons=result["errors"],
                             **{k: v for k, v in result.items() if k != "errors"})
    return result
