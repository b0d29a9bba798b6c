# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The k8s_crds module's runner: apply (or delete) CRDs; with ``wait``, until each is Established.

Keeps the runners' invariants (``_common``): every definition is checked before anything is applied.
"""
from __future__ import annotations

from typing import List

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import JSON, K8sError, Params, cluster_from


def run(params: Params, check_mode: bool, diff: bool = False) -> JSON:
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
