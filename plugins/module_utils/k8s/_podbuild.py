# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Building a restore pod: ``build`` adds the restore-pod contract (``_podcontract``) to a pod.

Pure functions over plain dicts in the Kubernetes JSON shape (camelCase keys,
as the API returns them); nothing here talks to a cluster. Stdlib only.

``build`` makes a Pod, a pod template or a workload (its ``spec.template``) a
restore pod as ``_podcontract.validate`` checks it, on a deep copy: the
restore-from annotation, the ``snapshot-control`` emptyDir volume, its mount
(``subPath: <container name>``) and env in every container, the inert command,
the pod-level Localhost seccomp profile and a startup probe on each destination
container. What is there already and conflicts is refused with every reason,
never overwritten. ``build`` records each container's own command/args in the
annotation ``snapshot.warmstart.io/original-entrypoint`` (canonical JSON,
``{"<container>": {"command": [...], "args": [...]}}``) so that the pod
hashes like the template it came from (``_spechash``). Init containers are left
alone. ``build(entrypoint="standby")`` keeps each container's command and sets
``SNAPSHOT_RESTORE_STANDBY=1`` instead, for a standby-aware entrypoint that
blocks without initialising; ``validate`` accepts either form.
``build(snapshot_name=None)`` selects at restore: instead of restore-from the
pod carries ``snapshot.warmstart.io/restore-select: "true"`` (and
``restore-policy: <PodSnapshotPolicy>``, whose grouping labels and scope the
selection uses); the agent pins the snapshot it selects (restore-from) before
it restores. ``build(fallback="cold-start")`` writes
``snapshot.warmstart.io/restore-fallback: cold-start`` (the agent starts the
app cold when the restore fails or is refused, by writing the control file
``cold-start``); it needs the standby entrypoint, and the startup probe is
``/bin/sh -c 'cat .../restore-complete || cat .../cold-start'``.
"""
from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional, Set, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc

_PROBE_DEFAULTS = {"successThreshold": 1, "initialDelaySeconds": 0}


def _startup_probe(cold_start: bool = False) -> Dict[str, Any]:
    command = podapi.COLD_START_PROBE_COMMAND if cold_start else podapi.STARTUP_PROBE_COMMAND
    return {"exec": {"command": list(command)}, "periodSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 1800}


def _probe_equal(have: Any, want: Dict[str, Any]) -> bool:
    if not isinstance(have, dict):
        return False
    trimmed = {k: v for k, v in have.items() if v is not None and _PROBE_DEFAULTS.get(k, object()) != v}
    return trimmed == want


def _entrypoint_of(container: Dict[str, Any]) -> Dict[str, Any]:
    return {key: container[key] for key in ("command", "args") if container.get(key)}


def _profile_problems(profile: Any) -> List[str]:
    if not isinstance(profile, str) or not profile or profile.startswith("/") or ".." in profile.split("/"):
        return [f"seccomp profile {profile!r} must be a path relative to the kubelet's seccomp directory"]
    return []


def _standby_conflicts(container: Dict[str, Any], what: str, recorded: bool) -> List[str]:
    """Why ``build(entrypoint=standby)`` cannot keep this container's own entrypoint in standby."""
    cwhat = f"container {container.get('name')!r} of {what}"
    problems = pc.standby_problems(container, cwhat)
    if recorded and pc.is_inert(container):
        problems.append(f"{cwhat} was made inert by an earlier build (annotation {podapi.ANN_ORIGINAL_ENTRYPOINT} records "
                        "its command): build the standby form from the original pod or template")
    return problems


# --- build ------------------------------------------------------------------------

def build(obj: Dict[str, Any], snapshot_name: Optional[str], container_map: Any = None,
          skip_compat_check: bool = False, startup_probe: bool = True, seccomp_profile: str = podapi.SECCOMP_PROFILE,
          entrypoint: str = podapi.ENTRYPOINT_INERT, fallback: Optional[str] = None,
          restore_policy: Optional[str] = None) -> Dict[str, Any]:
    """A restore pod from a Pod, a pod template or a workload (its ``spec.template``): a deep copy with the contract added.

    Idempotent (``build(build(x)) == build(x)``); ``obj`` is never changed. Whatever is
    already there and conflicts (another restore-from or container map, a
    ``snapshot-control`` volume that is no emptyDir, another mount at
    ``/snapshot-control``, another ``SNAPSHOT_CONTROL_DIR``, another seccomp
    profile or startup probe, a map destination that is no container) raises
    ContractError with every reason; nothing is overwritten. ``container_map``
    None (or empty) keeps the map annotation the pod may already carry;
    ``skip_compat_check`` False does not remove an existing annotation. The reference contract's
    annotations (``nvidia.com/...``) count as ours (``_podcontract.contract_annotations``); the ones written are ours.
    ``entrypoint`` ``inert`` (default) replaces each container's command with the inert one; ``standby``
    keeps it and sets ``SNAPSHOT_RESTORE_STANDBY=1``, for images whose entrypoint then blocks without
    initialising (the reference publishes the variable; it never injects it).

    ``snapshot_name`` None selects at restore: no restore-from, but ``restore-select: "true"`` (and
    ``restore-policy: <restore_policy>`` when given), so that the agent picks the newest compatible Ready
    PodSnapshot when the pod runs. ``fallback`` ``cold-start`` (annotation ``restore-fallback``) asks the agent
    to start the app cold when the restore fails or is refused: it needs ``entrypoint`` standby, and the startup
    probe then accepts the control file ``cold-start`` as well as ``restore-complete``; ``none`` writes the
    opt-out; None keeps what the pod says (absent: the agent's own setting).

    Two phases: ``_plan_build`` decides everything and collects every reason on the copy it only reads;
    ``_apply_build`` writes the plan into the copy, and runs only when there is no reason.
    """
    out = copy.deepcopy(obj)
    pod, what = podapi.locate(out)
    if not isinstance(pod.get("metadata"), dict):
        pod["metadata"] = {}
    plan = _BuildPlan(pod, what, snapshot_name, seccomp_profile, entrypoint)
    plan.restore_policy = restore_policy
    _plan_fallback(plan, fallback)
    _plan_build(plan, container_map, skip_compat_check, startup_probe)
    if plan.reasons:
        target = f"snapshot {snapshot_name!r}" if snapshot_name is not None else "a snapshot selected at restore"
        raise podapi.ContractError(f"cannot make {what} a restore pod for {target}", plan.reasons)
    _apply_build(plan, skip_compat_check, startup_probe)
    return out


class _BuildPlan:
    """What ``build`` found in the pod and will add: read by ``_plan_build``, written by ``_apply_build``."""

    def __init__(self, pod: Dict[str, Any], what: str, snapshot_name: Optional[str], profile: str,
                 entrypoint: str) -> None:
        self.meta: Dict[str, Any] = pod["metadata"]
        self.spec: Dict[str, Any] = pod["spec"]
        self.what, self.snapshot_name, self.profile = what, snapshot_name, profile
        self.standby = entrypoint == podapi.ENTRYPOINT_STANDBY
        self.raw = pc.annotations_of(self.meta)
        self.annotations, conflicts = pc.contract_annotations(self.raw, what)
        self.names = pc.container_names(self.spec)
        self.reasons: List[str] = list(conflicts)
        if entrypoint not in podapi.ENTRYPOINTS:
            self.reasons.append(f"entrypoint {entrypoint!r} is not one of {', '.join(podapi.ENTRYPOINTS)}")
        self.pairs: List[Tuple[str, str]] = []
        self.entrypoints: Dict[str, Dict[str, Any]] = {}
        self.containers: List[Tuple[Dict[str, Any], bool, bool]] = []  # (container, has mount, has env)
        self.have_volume = self.have_seccomp = False
        self.restore_policy: Optional[str] = None
        self.fallback: Optional[str] = None
        self.cold_start = False


def _plan_fallback(plan: _BuildPlan, fallback: Optional[str]) -> None:
    """The restore-fallback annotation: the one asked for, else the one the pod has; cold-start needs standby."""
    have = plan.annotations.get(podapi.ANN_RESTORE_FALLBACK)
    if have is not None and have not in podapi.FALLBACKS:
        plan.reasons.append(f"annotation {podapi.ANN_RESTORE_FALLBACK} of {plan.what} is {have!r}, not one of "
                            f"{', '.join(podapi.FALLBACKS)}")
    if fallback is not None and fallback not in podapi.FALLBACKS:
        plan.reasons.append(f"fallback {fallback!r} is not one of {', '.join(podapi.FALLBACKS)}")
    elif fallback is not None and have is not None and have != fallback:
        plan.reasons.append(f"annotation {podapi.ANN_RESTORE_FALLBACK} of {plan.what} is already {have!r}, not {fallback!r}")
    plan.fallback = fallback
    plan.cold_start = (fallback or have) == podapi.FALLBACK_COLD_START
    if plan.cold_start and not plan.standby:
        plan.reasons.append(f"fallback {podapi.FALLBACK_COLD_START} needs entrypoint {podapi.ENTRYPOINT_STANDBY}: an inert "
                            "placeholder cannot start its app cold (it runs no entrypoint of its own)")


def _plan_build(plan: _BuildPlan, container_map: Any, skip_compat_check: bool, startup_probe: bool) -> None:
    """Every reason the pod cannot be made a restore pod, in a stable order, and the plan to make it one."""
    _plan_identity(plan)
    _plan_map(plan, container_map)
    skip, label = plan.annotations.get(podapi.ANN_SKIP_COMPAT), pc.annotation_label(plan.raw, podapi.ANN_SKIP_COMPAT)
    if skip is not None and str(skip).lower() not in ("true", "false"):
        plan.reasons.append(f"annotation {label} of {plan.what} is {skip!r}, not 'true' or 'false'")
    elif skip_compat_check and skip is not None and str(skip).lower() == "false":
        plan.reasons.append(f"annotation {label} of {plan.what} is already 'false'")
    recorded, problems = pc.entrypoint_annotation(plan.annotations, plan.what)
    plan.reasons.extend(problems)
    problems, plan.have_volume = pc.volume_conflicts(plan.spec, plan.what)
    plan.reasons.extend(problems)
    problems, plan.have_seccomp = pc.pod_seccomp_conflict(plan.spec, plan.what, plan.profile)
    plan.reasons.extend(problems)
    _plan_containers(plan, recorded, startup_probe)


def _plan_identity(plan: _BuildPlan) -> None:
    """The snapshot name, the seccomp profile, the containers and their names, the restore-from annotation."""
    what = plan.what
    if plan.snapshot_name is not None and not podapi.is_dns_subdomain(plan.snapshot_name):
        plan.reasons.append(f"snapshot name {plan.snapshot_name!r} is not a valid PodSnapshot name (DNS-1123 subdomain)")
    plan.reasons.extend(_profile_problems(plan.profile))
    if not podapi.dicts_of(plan.spec.get("containers")):
        plan.reasons.append(f"{what} has no containers")
    for index, name in enumerate(plan.names):
        if not podapi.is_dns_label(name):
            plan.reasons.append(f"container #{index} of {what} has no valid name ({name!r})")
    current = plan.annotations.get(podapi.ANN_RESTORE_FROM)
    if plan.snapshot_name is None:
        _plan_selection(plan, current)
    elif current is not None and current != plan.snapshot_name:
        label = pc.annotation_label(plan.raw, podapi.ANN_RESTORE_FROM)
        plan.reasons.append(f"annotation {label} of {what} is already {current!r}, not {plan.snapshot_name!r}")
    elif plan.annotations.get(podapi.ANN_RESTORE_SELECT) is not None:
        plan.reasons.append(f"{what} selects its snapshot at restore (annotation {podapi.ANN_RESTORE_SELECT}); it cannot "
                            f"also be pinned to {plan.snapshot_name!r}: build from the original template")
    if plan.restore_policy is not None and plan.snapshot_name is not None:
        plan.reasons.append(f"restore_policy {plan.restore_policy!r} applies only to a snapshot selected at restore, "
                            f"not to one pinned ({plan.snapshot_name!r})")


def _plan_selection(plan: _BuildPlan, current: Any) -> None:
    """Select at restore: no restore-from yet, restore-select true, the restore-policy as asked."""
    what = plan.what
    if current is not None:
        label = pc.annotation_label(plan.raw, podapi.ANN_RESTORE_FROM)
        plan.reasons.append(f"annotation {label} of {what} already pins {current!r}; "
                            "a snapshot selected at restore needs a template without it")
    select = plan.annotations.get(podapi.ANN_RESTORE_SELECT)
    if select is not None and str(select).strip().lower() != "true":
        plan.reasons.append(f"annotation {podapi.ANN_RESTORE_SELECT} of {what} is {select!r}, not 'true'")
    have = plan.annotations.get(podapi.ANN_RESTORE_POLICY)
    if plan.restore_policy is not None and not podapi.is_dns_subdomain(plan.restore_policy):
        plan.reasons.append(f"restore_policy {plan.restore_policy!r} is not a valid PodSnapshotPolicy name")
    elif have is not None and plan.restore_policy is not None and have != plan.restore_policy:
        plan.reasons.append(f"annotation {podapi.ANN_RESTORE_POLICY} of {what} is already {have!r}, not "
                            f"{plan.restore_policy!r}")


def _plan_map(plan: _BuildPlan, container_map: Any) -> None:
    """The container map: the one asked for, else the one annotated; they must agree, each destination exist."""
    what, annotations = plan.what, plan.annotations
    pairs: List[Tuple[str, str]] = []
    if container_map is not None:
        try:
            pairs = pc.parse_container_map(container_map)
        except podapi.ContractError as exc:
            plan.reasons.extend(exc.reasons or [exc.message])
    label = pc.annotation_label(plan.raw, podapi.ANN_CONTAINER_MAP)
    existing_pairs, problems = pc.map_annotation(annotations, what, label)
    plan.reasons.extend(problems)
    if podapi.ANN_CONTAINER_MAP in annotations and not problems and pairs:
        if pc.format_container_map(existing_pairs) != pc.format_container_map(pairs):
            plan.reasons.append(f"annotation {label} of {what} is already "
                                f"{annotations[podapi.ANN_CONTAINER_MAP]!r}, not {pc.format_container_map(pairs)!r}")
    plan.pairs = pairs or existing_pairs
    for src, dst in plan.pairs:
        if dst not in plan.names:
            plan.reasons.append(f"container map destination {dst!r} (from {src!r}) is not a container of {what} "
                                f"(containers: {', '.join(str(n) for n in plan.names) or 'none'})")


def _destinations(plan: _BuildPlan) -> Set[str]:
    return {dst for _src, dst in plan.pairs} or {str(n) for n in plan.names}


def _plan_containers(plan: _BuildPlan, recorded: Dict[str, Dict[str, Any]], startup_probe: bool) -> None:
    """Per container: its conflicts, its original entrypoint (recorded once, never rewritten), its startup probe."""
    probe = _startup_probe(plan.cold_start)
    destinations = _destinations(plan)
    plan.entrypoints = dict(recorded)
    for container in podapi.dicts_of(plan.spec.get("containers")):
        name = str(container.get("name"))
        problems, have_mount, have_env = pc.container_conflicts(container, plan.what, plan.profile)
        plan.reasons.extend(problems)
        plan.containers.append((container, have_mount, have_env))
        if plan.standby:
            plan.reasons.extend(_standby_conflicts(container, plan.what, name in recorded))
        elif name in recorded:
            if not pc.is_inert(container) and recorded[name] != _entrypoint_of(container):
                plan.reasons.append(f"annotation {podapi.ANN_ORIGINAL_ENTRYPOINT} of {plan.what} records another command "
                                    f"for container {name!r} than the one it has")
        elif not pc.is_inert(container):
            plan.entrypoints[name] = _entrypoint_of(container)
        if startup_probe and name in destinations and container.get("startupProbe") is not None:
            if not _probe_equal(container["startupProbe"], probe):
                plan.reasons.append(f"container {name!r} of {plan.what} already has another startupProbe")


def _apply_build(plan: _BuildPlan, skip_compat_check: bool, startup_probe: bool) -> None:
    """Write the plan into the (copied) pod: annotations, control volume, per-container mount, env, inert
    command and startup probe, pod seccomp profile. Adds only what is missing."""
    annotations, spec = plan.annotations, plan.spec
    if plan.snapshot_name is not None:
        annotations[podapi.ANN_RESTORE_FROM] = plan.snapshot_name
    else:
        annotations[podapi.ANN_RESTORE_SELECT] = "true"
        if plan.restore_policy is not None:
            annotations[podapi.ANN_RESTORE_POLICY] = plan.restore_policy
    if plan.fallback is not None:
        annotations[podapi.ANN_RESTORE_FALLBACK] = plan.fallback
    if plan.pairs:
        annotations[podapi.ANN_CONTAINER_MAP] = pc.format_container_map(plan.pairs)
    if skip_compat_check:
        annotations[podapi.ANN_SKIP_COMPAT] = "true"
    if plan.entrypoints:
        annotations[podapi.ANN_ORIGINAL_ENTRYPOINT] = podapi.canonical(plan.entrypoints)
    plan.meta["annotations"] = annotations
    if not plan.have_volume:
        spec["volumes"] = podapi.as_list(spec.get("volumes")) + [{"name": podapi.CONTROL_VOLUME, "emptyDir": {}}]
    destinations = _destinations(plan)
    for container, have_mount, have_env in plan.containers:
        name = container.get("name")
        if not have_mount:
            container["volumeMounts"] = podapi.as_list(container.get("volumeMounts")) + [
                {"name": podapi.CONTROL_VOLUME, "mountPath": podapi.CONTROL_MOUNT, "subPath": name}]
        if not have_env:
            container["env"] = podapi.as_list(container.get("env")) + [
                {"name": podapi.CONTROL_ENV, "value": podapi.CONTROL_MOUNT}]
        if not plan.standby:
            container["command"] = list(podapi.INERT_COMMAND)
            container.pop("args", None)
        elif pc.standby_value(container) is None:
            container["env"] = podapi.as_list(container.get("env")) + [
                {"name": podapi.STANDBY_ENV, "value": podapi.STANDBY_VALUE}]
        if startup_probe and name in destinations and container.get("startupProbe") is None:
            container["startupProbe"] = _startup_probe(plan.cold_start)
    if not plan.have_seccomp:
        context = dict(podapi.as_dict(spec.get("securityContext")))
        context["seccompProfile"] = pc.localhost_seccomp(plan.profile)
        spec["securityContext"] = context
