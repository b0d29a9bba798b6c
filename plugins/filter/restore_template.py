# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""``restore_template``: a workload manifest whose pod template(s) become restore templates (``_podbuild.build``).

So that every replica a controller creates - scaling a Deployment, an HPA, a StatefulSet's next ordinal, a
LeaderWorkerSet group - is a placeholder pod the node agent restores. Everything else of the manifest (its
metadata, owner references, selector, replicas, strategy) is kept; the input is not changed; applying the filter
to its own output changes nothing.
"""
from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional, Tuple

from ansible.errors import AnsibleFilterError
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podbuild as podbuild
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc

# kind -> paths of its pod templates (each a list of keys from the manifest's top)
TEMPLATE_PATHS: Dict[str, List[Tuple[str, ...]]] = {
    "Deployment": [("spec", "template")],
    "StatefulSet": [("spec", "template")],
    "ReplicaSet": [("spec", "template")],
    "ReplicationController": [("spec", "template")],
    "DaemonSet": [("spec", "template")],
    "Job": [("spec", "template")],
    "CronJob": [("spec", "jobTemplate", "spec", "template")],
    "PodTemplate": [("template",)],
    "LeaderWorkerSet": [("spec", "leaderWorkerTemplate", "leaderTemplate"),
                        ("spec", "leaderWorkerTemplate", "workerTemplate")],
}
OPTIONAL_PATHS = {("spec", "leaderWorkerTemplate", "leaderTemplate")}  # without it LWS leaders use workerTemplate


def _describe(manifest: Dict[str, Any]) -> str:
    kind = manifest.get("kind") or "pod template"
    return podapi.object_ref(manifest, str(kind)) if isinstance(manifest.get("metadata"), dict) else str(kind)


def _at(doc: Any, path: Tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc


def _templates(manifest: Dict[str, Any]) -> List[Tuple[Tuple[str, ...], Dict[str, Any]]]:
    """``(path, template)`` of each pod template of ``manifest`` (path () for a Pod or a bare template)."""
    kind = manifest.get("kind")
    what = _describe(manifest)
    if kind == "Pod" or (not kind and isinstance((manifest.get("spec") or {}).get("containers"), list)):
        return [((), manifest)]
    paths = TEMPLATE_PATHS.get(str(kind))
    if paths is None:
        known = ", ".join(sorted(TEMPLATE_PATHS) + ["Pod", "a pod template ({metadata, spec})"])
        raise AnsibleFilterError(f"restore_template: {what} is not a kind whose pod template it knows ({known})")
    found = []
    for path in paths:
        template = _at(manifest, path)
        if template is None and path in OPTIONAL_PATHS:
            continue
        if not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
            raise AnsibleFilterError(f"restore_template: {what} has no pod template at {'.'.join(path)}")
        found.append((path, template))
    return found


def _entrypoint(templates: List[Tuple[Tuple[str, ...], Dict[str, Any]]], entrypoint: Optional[str],
                fallback: Optional[str]) -> str:
    """The entrypoint asked for; else standby for a cold-start fallback (asked for or annotated) or a template
    in standby already, else inert."""
    if entrypoint:
        return entrypoint
    for _path, template in templates:
        mode = pc.restore_mode(template)
        forms = set(pc.entrypoint_forms(template).values())
        if (fallback or mode["fallback"]) == podapi.FALLBACK_COLD_START or forms == {podapi.ENTRYPOINT_STANDBY}:
            return podapi.ENTRYPOINT_STANDBY
    return podapi.ENTRYPOINT_INERT


def restore_template(manifest: Any, snapshot: Optional[str] = None, container_map: Any = None,
                     skip_compat_check: bool = False, entrypoint: Optional[str] = None,
                     fallback: Optional[str] = None, policy: Optional[str] = None, startup_probe: bool = True,
                     seccomp_profile: str = podapi.SECCOMP_PROFILE) -> Dict[str, Any]:
    """``manifest`` with each pod template made a restore template (see the plugin's documentation).

    ``snapshot`` pins a PodSnapshot (restore-from); None selects one at restore (restore-select, with
    ``policy`` as restore-policy). ``fallback`` ``cold-start`` | ``none`` (``cold_start`` is read as ``cold-start``).
    A template the contract refuses raises AnsibleFilterError naming the manifest, the template and every reason.
    """
    if not isinstance(manifest, dict):
        raise AnsibleFilterError(f"restore_template: expected a manifest (mapping), got {type(manifest).__name__}")
    if fallback is not None:
        fallback = str(fallback).replace("_", "-")
    out = copy.deepcopy(dict(manifest))
    templates = _templates(out)
    form = _entrypoint(templates, entrypoint, fallback)
    what = _describe(out)
    reasons: List[str] = []
    built: List[Tuple[Tuple[str, ...], Dict[str, Any]]] = []
    for path, template in templates:
        try:
            built.append((path, podbuild.build(template, snapshot, container_map=container_map,
                                               skip_compat_check=bool(skip_compat_check), startup_probe=bool(startup_probe),
                                               seccomp_profile=seccomp_profile, entrypoint=form, fallback=fallback,
                                               restore_policy=policy)))
        except podapi.ContractError as exc:
            where = f"{'.'.join(path)}: " if path else ""
            reasons.extend(where + r for r in (exc.reasons or [exc.message]))
    if reasons:
        raise AnsibleFilterError(f"restore_template: {what} cannot restore its pods from "
                                 f"{repr(snapshot) if snapshot else 'a snapshot selected at restore'}: "
                                 + "; ".join(reasons))
    for path, template in built:
        if not path:
            return template
        parent = _at(out, path[:-1])
        parent[path[-1]] = template
    return out


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"restore_template": restore_template}
