# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Restores without annotations: what the admission webhook answers for a new pod. Pure, stdlib only.

A PodSnapshotPolicy with ``spec.restoreConfig.mode: auto`` restores every new pod it selects, so that a
Deployment scaled by hand or by an HPA needs no change. The pod must be a placeholder from its start (the
restore contract), so the decision is taken when the pod is created, by a mutating admission webhook
(``_admission_server`` serves it; the ``k8s_agent`` role deploys it): ``admit`` answers an
``admission.k8s.io/v1`` AdmissionReview of a pod CREATE. It always allows the pod - warmstart never blocks a
workload - and, when

- exactly one auto-restore policy of the pod's namespace selects the pod's labels,
- the pod is no restore pod already, does not opt out (annotation ``snapshot.warmstart.io/auto-restore:
  "false"``), and
- a Ready PodSnapshot of the namespace fits it now (``_selection.select_snapshot``: the condensed pod-spec hash,
  the policy's grouping labels and scope),

patches it into a restore pod with ``_podbuild.build``: the snapshot is selected when the pod runs
(``restore-select``, ``restore-policy``: the node agent pins the newest fitting one, ``pin_selected``), with
the policy's ``entrypoint`` and ``fallback``. Otherwise the pod starts as it is: the first replica of a
workload, which the policy's workload trigger then captures, or a pod the contract refuses (a warning names
why). Either way the pod carries the verdict in ``snapshot.warmstart.io/auto-restore`` so that ``kubectl
describe`` says what was decided and why.
"""
from __future__ import annotations

import base64
import copy
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.agent._agent_events import selector_matches
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podbuild as podbuild
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _selection as selection

JSON = Dict[str, Any]

ANN_AUTO_RESTORE = podapi.GROUP + "/auto-restore"  # the verdict, written; "false" on a new pod opts it out
OPT_OUT = "false"
MODE_AUTO, MODE_MANUAL = "auto", "manual"
MAX_VERDICT = 1024  # characters of the verdict annotation (the reasons are cut, the decision never)


@dataclass
class Decision:
    """What ``decide`` made of a new pod: the pod as admitted, and why."""
    pod: JSON
    restore: bool = False
    policy: Optional[str] = None
    verdict: str = ""
    warnings: List[str] = field(default_factory=list)


def restore_config(policy: JSON) -> JSON:
    """A PodSnapshotPolicy's ``spec.restoreConfig`` with its defaults: ``mode`` manual; ``entrypoint`` and
    ``fallback`` None (``_entrypoint`` and the agent's own fallback decide)."""
    conf = podapi.as_dict(podapi.as_dict(policy.get("spec")).get("restoreConfig"))
    return {"mode": str(conf.get("mode") or MODE_MANUAL), "entrypoint": conf.get("entrypoint"),
            "fallback": conf.get("fallback")}


def _entrypoint(conf: JSON) -> str:
    """The policy's entrypoint; standby when it asks for a cold-start fallback (which needs it), else inert."""
    if conf["entrypoint"]:
        return str(conf["entrypoint"])
    return podapi.ENTRYPOINT_STANDBY if conf["fallback"] == podapi.FALLBACK_COLD_START else podapi.ENTRYPOINT_INERT


def _auto_policies(pod: JSON, policies: List[JSON]) -> List[JSON]:
    labels = podapi.as_dict(podapi.as_dict(pod.get("metadata")).get("labels"))
    return sorted((p for p in policies if restore_config(p)["mode"] == MODE_AUTO
                   and selector_matches(podapi.as_dict(p.get("spec")).get("selector"), labels)),
                  key=lambda p: str(podapi.as_dict(p.get("metadata")).get("name")))


def _verdict(pod: JSON, text: str) -> JSON:
    out = copy.deepcopy(pod)
    meta = out.setdefault("metadata", {})
    annotations = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
    meta["annotations"] = dict(annotations, **{ANN_AUTO_RESTORE: text[:MAX_VERDICT]})
    return out


def decide(pod: JSON, namespace: str, policies: List[JSON], snapshots: List[JSON]) -> Decision:
    """The new ``pod`` of ``namespace`` as it should be admitted, given the namespace's PodSnapshotPolicies and
    PodSnapshots (see the module docstring). A pod no auto-restore policy selects is returned unchanged."""
    meta = podapi.as_dict(pod.get("metadata"))
    annotations = podapi.as_dict(meta.get("annotations"))
    chosen = _auto_policies(pod, policies)
    if not chosen:
        return Decision(pod)
    names = [str(podapi.as_dict(p.get("metadata")).get("name")) for p in chosen]
    if str(annotations.get(ANN_AUTO_RESTORE, "")).strip().lower() == OPT_OUT:
        return Decision(pod, policy=names[0], verdict="opted out")
    mode = pc.restore_mode(pod)
    if mode["restore_from"] or mode["select"]:
        return Decision(pod, policy=names[0], verdict="a restore pod already")
    if len(chosen) > 1:
        why = f"started as it is: {len(chosen)} auto-restore policies select it ({', '.join(names)}); one must"
        return Decision(_verdict(pod, why), policy=None, verdict=why, warnings=[f"warmstart: {why}"])
    policy, name = chosen[0], names[0]
    conf = restore_config(policy)
    spec = podapi.as_dict(policy.get("spec"))
    group_by = list(podapi.as_dict(podapi.as_dict(spec.get("snapshotGroupingRules")).get("groupByLabelValue"))
                    .get("labels") or [])
    scope = str(spec.get("snapshotScope") or podapi.SCOPE_WHOLE_POD)
    target = copy.deepcopy(pod)
    target.setdefault("metadata", {})["namespace"] = namespace
    fitting, reasons = selection.select_snapshot(snapshots, target, group_by, scope)
    if fitting is None:
        why = f"started as it is (policy {name}): no Ready PodSnapshot fits it yet: " + "; ".join(reasons)
        return Decision(_verdict(pod, why), policy=name, verdict=why)
    try:
        built = podbuild.build(pod, None, entrypoint=_entrypoint(conf), fallback=conf["fallback"],
                               restore_policy=name)
    except podapi.ContractError as exc:
        why = f"started as it is (policy {name}): it cannot be a restore pod: " + "; ".join(exc.reasons or [exc.message])
        return Decision(_verdict(pod, why), policy=name, verdict=why, warnings=[f"warmstart: {why}"])
    fit = str(podapi.as_dict(fitting.get("metadata")).get("name"))
    why = f"restore pod (policy {name}): the node agent restores it from the newest fitting snapshot (now {fit})"
    return Decision(_verdict(built, why), restore=True, policy=name, verdict=why)


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def json_patch(old: JSON, new: JSON) -> List[JSON]:
    """RFC 6902 operations that make ``old`` into ``new``, member by member under ``metadata`` and ``spec``
    (``add`` replaces a member that exists); other top-level members are left as they are."""
    ops: List[JSON] = []
    for part in ("metadata", "spec"):
        have, want = podapi.as_dict(old.get(part)), podapi.as_dict(new.get(part))
        if part not in old and want:
            ops.append({"op": "add", "path": f"/{part}", "value": want})
            continue
        for key in sorted(set(have) | set(want)):
            path = f"/{part}/{_escape(key)}"
            if key not in want:
                ops.append({"op": "remove", "path": path})
            elif key not in have or have[key] != want[key]:
                ops.append({"op": "add", "path": path, "value": want[key]})
    return ops


def review_request(review: Any) -> Tuple[Optional[JSON], List[str]]:
    """The ``request`` of an AdmissionReview v1 about a pod CREATE, or (None, every problem)."""
    problems: List[str] = []
    if not isinstance(review, dict):
        return None, [f"an AdmissionReview is a JSON object, not {type(review).__name__}"]
    if review.get("apiVersion") != "admission.k8s.io/v1" or review.get("kind") != "AdmissionReview":
        problems.append(f"not an admission.k8s.io/v1 AdmissionReview (apiVersion {review.get('apiVersion')!r}, "
                        f"kind {review.get('kind')!r})")
    request = review.get("request")
    if not isinstance(request, dict) or not request.get("uid"):
        return None, problems + ["the review has no request with a uid"]
    kind = podapi.as_dict(request.get("kind"))
    if (kind.get("group"), kind.get("kind")) != ("", "Pod") or request.get("operation") != "CREATE":
        problems.append(f"the review is about {request.get('operation')} of {kind.get('group')}/{kind.get('kind')}, "
                        "not CREATE of a Pod")
    if not isinstance(request.get("object"), dict):
        problems.append("the review's request has no object")
    return (None, problems) if problems else (request, [])


def response(uid: str, decision: Optional[Decision], original: Optional[JSON],
             warnings: Optional[List[str]] = None) -> JSON:
    """The AdmissionReview answering request ``uid``: allowed, with the patch from ``original`` to the decided
    pod when it changed and the warnings (kubectl prints them)."""
    answer: JSON = {"uid": uid, "allowed": True}
    if decision is not None and original is not None:
        ops = json_patch(original, decision.pod)
        if ops:
            answer["patchType"] = "JSONPatch"
            answer["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
    shown = list(warnings or []) + (decision.warnings if decision else [])
    if shown:
        answer["warnings"] = [w[:MAX_VERDICT] for w in shown]
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": answer}
