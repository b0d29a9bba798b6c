# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The restore-pod contract: what makes a pod a restore pod, and how its restore ended.

Pure functions over plain dicts in the Kubernetes JSON shape (camelCase keys,
as the API returns them); nothing here talks to a cluster. Stdlib only. The
names are ``_podapi``'s; ``_podbuild.build`` makes a restore pod, ``_spechash``
hashes its spec and ``_selection`` picks the snapshot it restores from.

Restore pod (``validate`` / ``restore_mode`` / ``classify``)
    A restore pod is an ordinary pod (or pod template) that carries the
    annotation ``snapshot.warmstart.io/restore-from: <PodSnapshot name>``, an
    ``emptyDir`` volume ``snapshot-control`` mounted in every container at
    ``/snapshot-control`` with ``subPath: <container name>``, the env
    ``SNAPSHOT_CONTROL_DIR=/snapshot-control``, the inert command
    ``/bin/sh -c 'exec sleep infinity'`` (no args) and the pod-level Localhost
    seccomp profile ``profiles/block-iouring.json``. Optional: the container
    map annotation ``src=dst,...``, the skip-compat annotation, and a startup
    probe ``cat /snapshot-control/restore-complete`` on each destination
    container. Init containers are left alone. Instead of the inert command a
    container may keep its own and set ``SNAPSHOT_RESTORE_STANDBY=1``, for a
    standby-aware entrypoint that blocks without initialising
    (``entrypoint_form``); ``validate`` accepts either form. Instead of
    restore-from the pod may carry ``snapshot.warmstart.io/restore-select:
    "true"`` (and ``restore-policy: <PodSnapshotPolicy>``): the agent selects
    the snapshot and pins it (restore-from) before it restores
    (``restore_mode``). ``snapshot.warmstart.io/restore-fallback: cold-start``
    (the agent starts the app cold when the restore fails or is refused, by
    writing the control file ``cold-start``) needs the standby entrypoint.
    The checks of the pieces (``container_conflicts``, ``volume_conflicts``,
    ``pod_seccomp_conflict``, the annotation readers) are shared by
    ``validate`` and ``_podbuild.build``.

Reference names (ai-dynamo/snapshot ``api/podcontract``)
    ``nvidia.com/restore-from``, ``nvidia.com/restore-container-map`` and
    ``nvidia.com/snapshot-skip-compat-check`` are read as aliases of ours
    (``contract_annotations`` is the one reader; ours and an alias with
    different values is refused, naming both), ``nvidia.com/Restored`` as an
    alias of the ``Restored`` condition. Written names stay ours. ``classify``
    returns the reference's outcome names (Pending, Succeeded, Failed,
    PartiallySucceeded, Unknown) by its table; a restore in progress is status
    ``False``, reason ``RestoreInProgress``.
"""
from __future__ import annotations

import json
import re
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _containermap as cmap
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _profile as appprofile

_TRUE_WORDS = ("1", "true", "yes", "on")


# --- container map ------------------------------------------------------------

def parse_container_map(value: Any) -> List[Tuple[str, str]]:
    """A container map (``_containermap``'s syntax) whose names are container names -> [(src, dst), ...].

    Every malformed entry is a reason of one ContractError.
    """
    pairs, problems = cmap.read(value, is_name=podapi.is_dns_label, name_rule="a valid container name (DNS-1123 label)")
    if problems:
        raise podapi.ContractError("invalid container map", problems)
    return pairs


def format_container_map(pairs: Iterable[Tuple[str, str]]) -> str:
    """Canonical annotation value: ``src=dst`` entries sorted, joined by ','."""
    return cmap.format_map(pairs)


# --- contract pieces shared by validate and build ---------------------------------

def localhost_seccomp(profile: str) -> Dict[str, str]:
    """The pod's (or a container's) ``seccompProfile`` for a Localhost ``profile``."""
    return {"type": "Localhost", "localhostProfile": profile}


def is_inert(container: Dict[str, Any]) -> bool:
    """Whether the container runs the inert command (and no args)."""
    return container.get("command") == podapi.INERT_COMMAND and not container.get("args")


def container_names(spec: Dict[str, Any]) -> List[Any]:
    """The containers' names as written (a missing one is None: callers name it as invalid)."""
    return [c.get("name") for c in podapi.dicts_of(spec.get("containers"))]


def annotations_of(meta: Dict[str, Any]) -> Dict[str, Any]:
    """The annotations of ``metadata`` as they are (``contract_annotations`` reads the reference's names too)."""
    return podapi.as_dict(meta.get("annotations"))


def _same_annotation(key: str, mine: Any, theirs: Any) -> bool:
    """Whether two values of one contract annotation say the same (a map in any order, a bool in any case)."""
    if key == podapi.ANN_CONTAINER_MAP:
        try:
            return format_container_map(parse_container_map(mine)) == format_container_map(parse_container_map(theirs))
        except podapi.ContractError:
            return bool(mine == theirs)
    if key == podapi.ANN_SKIP_COMPAT:
        return str(mine).strip().lower() == str(theirs).strip().lower()
    return bool(mine == theirs)


def contract_annotations(annotations: Dict[str, Any], what: str) -> Tuple[Dict[str, Any], List[str]]:
    """A pod's annotations with the reference contract's names read as ours, and every conflict between them.

    The one reader of the restore-from, container-map and skip-compat annotations: each of ours
    (``snapshot.warmstart.io/...``) that is absent takes the value of its alias (``nvidia.com/...``,
    ``ANNOTATION_ALIASES``); both set to different values is a problem naming both annotations and both
    values (equal values are fine). The input is not changed.
    """
    merged = dict(annotations)
    problems: List[str] = []
    for ours, theirs in podapi.ANNOTATION_ALIASES:
        mine, other = annotations.get(ours), annotations.get(theirs)
        if other is None:
            continue
        if mine is None:
            merged[ours] = other
        elif not _same_annotation(ours, mine, other):
            problems.append(f"{what} has annotation {ours}: {mine!r} and annotation {theirs}: {other!r}, which "
                            "disagree: remove one or make them equal")
    return merged, problems


def restore_annotations(obj: Any) -> Tuple[Dict[str, Any], List[str]]:
    """``contract_annotations`` of a Pod, pod template or workload: ``(annotations, conflicts)``."""
    meta, _spec, what = podapi.pod_parts(obj)
    return contract_annotations(annotations_of(meta), what)


def annotation_label(raw: Dict[str, Any], ours: str) -> str:
    """The name under which a pod carries one contract annotation: ours, else its reference alias when only that is set."""
    for mine, theirs in podapi.ANNOTATION_ALIASES:
        if mine == ours and ours not in raw and theirs in raw:
            return theirs
    return ours


def skips_compat_check(annotations: Dict[str, Any]) -> bool:
    """Whether (merged) annotations ask to skip the compatibility and pod-spec checks."""
    return str(annotations.get(podapi.ANN_SKIP_COMPAT, "")).strip().lower() == "true"


def map_annotation(annotations: Dict[str, Any], what: str, label: str = podapi.ANN_CONTAINER_MAP
                   ) -> Tuple[List[Tuple[str, str]], List[str]]:
    """The container map of (merged) annotations, or the reason it is invalid (named ``label``)."""
    value = annotations.get(podapi.ANN_CONTAINER_MAP)
    if value is None:
        return [], []
    try:
        return parse_container_map(value), []
    except podapi.ContractError as exc:
        return [], [f"annotation {label} of {what} is invalid: " + "; ".join(exc.reasons or [exc.message])]


def entrypoint_annotation(annotations: Dict[str, Any], what: str) -> Tuple[Dict[str, Dict[str, Any]], List[str]]:
    """The original-entrypoint annotation: container -> {command, args} as ``build`` recorded it, or why it is invalid."""
    value = annotations.get(podapi.ANN_ORIGINAL_ENTRYPOINT)
    if value is None:
        return {}, []
    bad = [f"annotation {podapi.ANN_ORIGINAL_ENTRYPOINT} of {what} is not a JSON object of container -> {{command, args}}"]
    try:
        data = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return {}, bad
    if not isinstance(data, dict):
        return {}, bad
    for entry in data.values():
        if not isinstance(entry, dict) or set(entry) - {"command", "args"}:
            return {}, bad
        for part in entry.values():
            if not isinstance(part, list) or not all(isinstance(word, str) for word in part):
                return {}, bad
    return data, []


def container_conflicts(container: Dict[str, Any], what: str, profile: str) -> Tuple[List[str], bool, bool]:
    """Problems of a container's control mount / env / seccomp, and whether mount and env are already right."""
    name = container.get("name")
    cwhat = f"container {name!r} of {what}"
    problems: List[str] = []
    have_mount = have_env = False
    for mount in podapi.dicts_of(container.get("volumeMounts")):
        path = podapi.norm_path(mount.get("mountPath"))
        if mount.get("name") == podapi.CONTROL_VOLUME:
            if path != podapi.CONTROL_MOUNT:
                problems.append(f"{cwhat} mounts volume {podapi.CONTROL_VOLUME!r} at {mount.get('mountPath')!r}, "
                                f"not at {podapi.CONTROL_MOUNT}")
            elif mount.get("subPathExpr") or mount.get("subPath") != name:
                sub = mount.get("subPathExpr") or mount.get("subPath")
                problems.append(f"{cwhat} mounts volume {podapi.CONTROL_VOLUME!r} with subPath {sub!r}, not {name!r}")
            elif mount.get("readOnly"):
                problems.append(f"{cwhat} mounts volume {podapi.CONTROL_VOLUME!r} read-only")
            else:
                have_mount = True
        elif path == podapi.CONTROL_MOUNT:
            problems.append(f"{cwhat} already mounts volume {mount.get('name')!r} at {podapi.CONTROL_MOUNT}")
    for var in podapi.dicts_of(container.get("env")):
        if var.get("name") != podapi.CONTROL_ENV:
            continue
        if var.get("valueFrom") is not None:
            problems.append(f"{cwhat} sets env {podapi.CONTROL_ENV} from valueFrom, not to {podapi.CONTROL_MOUNT}")
        elif var.get("value") != podapi.CONTROL_MOUNT:
            problems.append(f"{cwhat} sets env {podapi.CONTROL_ENV}={var.get('value')!r}, not {podapi.CONTROL_MOUNT}")
        else:
            have_env = True
    own = podapi.as_dict(container.get("securityContext")).get("seccompProfile")
    if own is not None and own != localhost_seccomp(profile):
        problems.append(f"{cwhat} has its own seccompProfile {own!r}, which would override the pod's Localhost profile "
                        f"{profile!r}")
    return problems, have_mount, have_env


def volume_conflicts(spec: Dict[str, Any], what: str) -> Tuple[List[str], bool]:
    """Problems of the ``snapshot-control`` volume, and whether it is already there and right."""
    control = [v for v in podapi.dicts_of(spec.get("volumes")) if v.get("name") == podapi.CONTROL_VOLUME]
    if not control:
        return [], False
    problems = []
    if len(control) > 1:
        problems.append(f"{what} declares volume {podapi.CONTROL_VOLUME!r} {len(control)} times")
    sources = sorted(k for k, v in control[0].items() if k != "name" and v is not None)
    if sources != ["emptyDir"]:
        problems.append(f"volume {podapi.CONTROL_VOLUME!r} of {what} is {', '.join(sources) or 'without source'}, "
                        "not an emptyDir")
    return problems, not problems


def pod_seccomp_conflict(spec: Dict[str, Any], what: str, profile: str) -> Tuple[List[str], bool]:
    """A pod-level seccomp profile other than Localhost ``profile``, and whether that one is already set."""
    have = podapi.as_dict(spec.get("securityContext")).get("seccompProfile")
    if have is None:
        return [], False
    if have != localhost_seccomp(profile):
        return [f"{what} already has seccompProfile {have!r}, not Localhost {profile!r}"], False
    return [], True


def standby_value(container: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The container's env entry ``SNAPSHOT_RESTORE_STANDBY`` (the first), or None."""
    for var in podapi.dicts_of(container.get("env")):
        if var.get("name") == podapi.STANDBY_ENV:
            return var
    return None


def standby_problems(container: Dict[str, Any], cwhat: str) -> List[str]:
    """Why the container's ``SNAPSHOT_RESTORE_STANDBY`` does not ask for standby; [] when it does or is absent."""
    var = standby_value(container)
    if var is None:
        return []
    if var.get("valueFrom") is not None:
        return [f"{cwhat} sets env {podapi.STANDBY_ENV} from valueFrom; a standby entrypoint needs the literal value "
                f"{podapi.STANDBY_VALUE!r}"]
    if str(var.get("value") or "").strip().lower() not in _TRUE_WORDS:
        return [f"{cwhat} sets env {podapi.STANDBY_ENV}={var.get('value')!r}, which does not ask its entrypoint to stay inert "
                f"(true values: {', '.join(_TRUE_WORDS)})"]
    return []


def entrypoint_form(container: Dict[str, Any]) -> Optional[str]:
    """``inert`` (the inert command, no args), ``standby`` (own command, ``SNAPSHOT_RESTORE_STANDBY`` true) or None."""
    if is_inert(container):
        return podapi.ENTRYPOINT_INERT
    if standby_value(container) is not None and not standby_problems(container, ""):
        return podapi.ENTRYPOINT_STANDBY
    return None


def entrypoint_forms(pod: Any) -> Dict[str, Optional[str]]:
    """Container name -> ``entrypoint_form`` of each container of a Pod, pod template or workload."""
    _meta, spec, _what = podapi.pod_parts(pod)
    return {str(c.get("name")): entrypoint_form(c) for c in podapi.dicts_of(spec.get("containers"))}


# --- validate / classify ----------------------------------------------------

def validate(pod: Dict[str, Any], seccomp_profile: str = podapi.SECCOMP_PROFILE) -> List[str]:
    """Every way ``pod`` (a Pod or pod template) falls short of being a restore pod; [] when it is one."""
    try:
        located, what = podapi.locate(pod)
    except podapi.ContractError as exc:
        return [str(exc)]
    meta = podapi.as_dict(located.get("metadata"))
    spec = podapi.as_dict(located.get("spec"))
    raw = annotations_of(meta)
    annotations, problems = contract_annotations(raw, what)
    problems.extend(_source_problems(annotations, raw, what))
    problems.extend(_fallback_problems(annotations, spec, what))
    names = container_names(spec)
    pairs, found = map_annotation(annotations, what, annotation_label(raw, podapi.ANN_CONTAINER_MAP))
    problems.extend(found)
    for src, dst in pairs:
        if dst not in names:
            problems.append(f"container map destination {dst!r} (from {src!r}) is not a container of {what}")
    skip = annotations.get(podapi.ANN_SKIP_COMPAT)
    if skip is not None and str(skip).lower() not in ("true", "false"):
        label = annotation_label(raw, podapi.ANN_SKIP_COMPAT)
        problems.append(f"annotation {label} of {what} is {skip!r}, not 'true' or 'false'")
    recorded, found = entrypoint_annotation(annotations, what)
    problems.extend(found)
    for name in sorted(set(recorded) - set(names)) if names else []:
        problems.append(f"annotation {podapi.ANN_ORIGINAL_ENTRYPOINT} of {what} names container {name!r}, which it does not have")
    if not names:
        problems.append(f"{what} has no containers")
    found, have_volume = volume_conflicts(spec, what)
    problems.extend(found)
    if not found and not have_volume:
        problems.append(f"{what} has no emptyDir volume {podapi.CONTROL_VOLUME!r}")
    for container in podapi.dicts_of(spec.get("containers")):
        problems.extend(_container_shortfalls(container, what, seccomp_profile))
    found, have_seccomp = pod_seccomp_conflict(spec, what, seccomp_profile)
    problems.extend(found)
    if not found and not have_seccomp:
        problems.append(f"{what} has no pod-level seccompProfile Localhost {seccomp_profile!r} (blocks io_uring)")
    return problems


def _source_problems(annotations: Dict[str, Any], raw: Dict[str, Any], what: str) -> List[str]:
    """Where the pod restores from: a valid restore-from, or ``restore-select: "true"`` (the agent selects)."""
    source, select = annotations.get(podapi.ANN_RESTORE_FROM), annotations.get(podapi.ANN_RESTORE_SELECT)
    problems: List[str] = []
    if select is not None and str(select).strip().lower() != "true":
        problems.append(f"annotation {podapi.ANN_RESTORE_SELECT} of {what} is {select!r}, not 'true'")
    policy = annotations.get(podapi.ANN_RESTORE_POLICY)
    if policy is not None and not podapi.is_dns_subdomain(policy):
        problems.append(f"annotation {podapi.ANN_RESTORE_POLICY} of {what} is {policy!r}, not a valid PodSnapshotPolicy name")
    if source is None and select is None:
        problems.append(f"{what} has no annotation {podapi.ANN_RESTORE_FROM} (or {podapi.REF_ANN_RESTORE_FROM})")
    elif source is not None and not podapi.is_dns_subdomain(source):
        label = annotation_label(raw, podapi.ANN_RESTORE_FROM)
        problems.append(f"annotation {label} of {what} is {source!r}, not a valid PodSnapshot name (DNS-1123 subdomain)")
    return problems


def _fallback_problems(annotations: Dict[str, Any], spec: Dict[str, Any], what: str) -> List[str]:
    """A valid restore-fallback annotation; with cold-start, every container in standby (it must be able to start cold)."""
    value = annotations.get(podapi.ANN_RESTORE_FALLBACK)
    if value is None:
        return []
    if value not in podapi.FALLBACKS:
        return [f"annotation {podapi.ANN_RESTORE_FALLBACK} of {what} is {value!r}, not one of {', '.join(podapi.FALLBACKS)}"]
    if value != podapi.FALLBACK_COLD_START:
        return []
    return [f"container {c.get('name')!r} of {what} is inert: annotation {podapi.ANN_RESTORE_FALLBACK} "
            f"{podapi.FALLBACK_COLD_START} needs the standby entrypoint ({podapi.STANDBY_ENV}={podapi.STANDBY_VALUE}) "
            "to start the app cold"
            for c in podapi.dicts_of(spec.get("containers")) if is_inert(c)]


def restore_mode(obj: Any) -> Dict[str, Any]:
    """How a Pod, pod template or workload restores: ``{"restore_from", "select", "policy", "fallback"}``.

    ``restore_from``: the pinned PodSnapshot (ours or the reference's annotation), else None; ``select``: the
    agent selects one at restore (``restore-select: "true"``) - a pod it pinned since has both; ``policy``:
    the ``restore-policy`` PodSnapshotPolicy of that selection; ``fallback``: ``none``, ``cold-start``, or None (the
    agent's own setting).
    A pod is a restore pod when ``restore_from`` is set or ``select`` is True (``is_restore_pod``).
    """
    annotations = restore_annotations(obj)[0]
    return {"restore_from": annotations.get(podapi.ANN_RESTORE_FROM),
            "select": str(annotations.get(podapi.ANN_RESTORE_SELECT, "")).strip().lower() == "true",
            "policy": annotations.get(podapi.ANN_RESTORE_POLICY),
            "fallback": annotations.get(podapi.ANN_RESTORE_FALLBACK)}


def is_restore_pod(obj: Any) -> bool:
    """Whether a Pod (or template) restores from a snapshot: pinned (restore-from) or selected at restore."""
    mode = restore_mode(obj)
    return mode["restore_from"] is not None or bool(mode["select"])


def _container_shortfalls(container: Dict[str, Any], what: str, profile: str) -> List[str]:
    """Every way one container of a restore pod falls short: conflicts, missing mount or env, neither inert nor
    in standby (its own entrypoint with ``SNAPSHOT_RESTORE_STANDBY`` true)."""
    name = container.get("name")
    problems, have_mount, have_env = container_conflicts(container, what, profile)
    cwhat = f"container {name!r} of {what}"
    if not have_mount and not any(m.get("name") == podapi.CONTROL_VOLUME for m in podapi.dicts_of(container.get("volumeMounts"))):
        problems.append(f"{cwhat} does not mount volume {podapi.CONTROL_VOLUME!r} at {podapi.CONTROL_MOUNT} (subPath {name!r})")
    if not have_env and not any(v.get("name") == podapi.CONTROL_ENV for v in podapi.dicts_of(container.get("env"))):
        problems.append(f"{cwhat} has no env {podapi.CONTROL_ENV}={podapi.CONTROL_MOUNT}")
    standby = [] if is_inert(container) else standby_problems(container, cwhat)
    problems.extend(standby)
    form = entrypoint_form(container)
    if form is None and container.get("command") != podapi.INERT_COMMAND:
        problems.append(f"{cwhat} does not run the inert command {podapi.INERT_COMMAND!r}" + (
            "" if standby else f" nor sets env {podapi.STANDBY_ENV}={podapi.STANDBY_VALUE} for a standby-aware entrypoint"))
    if form is None and container.get("args"):
        problems.append(f"{cwhat} has args; the inert placeholder takes none")
    return problems


def restore_destinations(pod: Dict[str, Any]) -> List[str]:
    """The containers a restore fills: the container map's destinations, else every container."""
    try:
        meta, spec, what = podapi.pod_parts(pod)
    except podapi.ContractError:
        return []
    pairs, _problems = map_annotation(contract_annotations(annotations_of(meta), what)[0], what)
    return sorted({dst for _src, dst in pairs}) if pairs else [str(n) for n in container_names(spec) if n]


def reference_conditions(pod: Any) -> List[str]:
    """``[nvidia.com/Restored]`` for a pod that speaks the reference contract (one of its annotations, or its
    condition already there), so that tools written for it see the outcome too; else ``[]``."""
    try:
        meta = podapi.pod_parts(pod)[0]
    except podapi.ContractError:
        return []
    refs = {theirs for _mine, theirs in podapi.ANNOTATION_ALIASES}
    if refs & set(annotations_of(meta)) or podapi.get_condition(pod, podapi.REF_RESTORE_CONDITION):
        return [podapi.REF_RESTORE_CONDITION]
    return []


def restore_condition(pod: Any) -> Optional[Dict[str, Any]]:
    """The pod's restore condition: ours (``Restored``), else the reference's (``nvidia.com/Restored``); None."""
    return podapi.get_condition(pod, podapi.RESTORE_CONDITION) or podapi.get_condition(pod, podapi.REF_RESTORE_CONDITION)


def classify(pod: Dict[str, Any]) -> str:
    """The outcome of a restore pod, by the reference's table (``ClassifyRestoreOutcome``), from its restore condition.

    No condition -> Pending; status True -> Succeeded; status neither True nor False -> Unknown, except
    ``Unknown`` with reason RestoreInProgress, which our earlier versions wrote while restoring -> Pending;
    status False with reason RestoreFailed or RestoreIncompatible -> Failed, RestorePartiallySucceeded ->
    PartiallySucceeded, RestoreInProgress -> Pending, any other -> Unknown. The condition is ``Restored`` or
    the reference's ``nvidia.com/Restored`` (``restore_condition``). Whether the restored processes are still
    there is ``restore_losses``.
    """
    condition = restore_condition(pod)
    if condition is None:
        return podapi.OUTCOME_PENDING
    status, reason = condition.get("status"), condition.get("reason")
    if status == "True":
        return podapi.OUTCOME_SUCCEEDED
    if status != "False":
        return podapi.OUTCOME_PENDING if (status, reason) == ("Unknown", podapi.REASON_IN_PROGRESS) else podapi.OUTCOME_UNKNOWN
    if reason in (podapi.REASON_FAILED, podapi.REASON_INCOMPATIBLE):
        return podapi.OUTCOME_FAILED
    if reason == podapi.REASON_PARTIAL:
        return podapi.OUTCOME_PARTIAL
    if reason == podapi.REASON_IN_PROGRESS:
        return podapi.OUTCOME_PENDING
    return podapi.OUTCOME_UNKNOWN


def result_outcome(result: str) -> str:
    """The outcome (``classify``) of a pod once the node's restore ``result`` (a key of ``RESULT_CONDITIONS``) is recorded."""
    status, reason = podapi.RESULT_CONDITIONS[result]
    return classify({"status": {"conditions": [{"type": podapi.RESTORE_CONDITION, "status": status, "reason": reason}]}})


def restore_losses(pod: Dict[str, Any]) -> List[str]:
    """Why the restore of ``pod`` is lost although its condition may not say so; [] when nothing is.

    The pod phase Failed; phase Succeeded without a succeeded restore (the placeholder exited); and, once a
    restore condition exists, each destination container (map destinations, else all) that is terminated
    now, or has restarted (restartCount > 0) unless its last termination finished before the condition's
    lastTransitionTime. A new pod is needed then: a restore is never replayed.
    """
    status = podapi.as_dict(pod.get("status"))
    phase = status.get("phase")
    if phase == "Failed":
        return ["the pod's phase is Failed"]
    if phase == "Succeeded":
        return [] if classify(pod) == podapi.OUTCOME_SUCCEEDED else ["the pod ended (phase Succeeded) without a restore"]
    condition = restore_condition(pod)
    if condition is None:
        return []
    started = podapi.parse_time(condition.get("lastTransitionTime"))
    destinations = set(restore_destinations(pod))
    losses: List[str] = []
    for state in podapi.dicts_of(status.get("containerStatuses")):
        name = state.get("name")
        if name not in destinations:
            continue
        if "terminated" in podapi.as_dict(state.get("state")):
            losses.append(f"container {name!r} is terminated")
        elif (state.get("restartCount") or 0) > 0:
            last = podapi.as_dict(podapi.as_dict(state.get("lastState")).get("terminated"))
            finished = podapi.parse_time(last.get("finishedAt"))
            if not (started and finished and finished < started):
                losses.append(f"container {name!r} restarted ({state.get('restartCount')} times) after its restore began")
    return losses


CONFIGMAP_PREFIX = "configmap:"
CONFIGMAP_DEFAULT_KEY = "profile"
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_CONFIGMAP_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")
ConfigMapReader = Callable[[str, str], Dict[str, Any]]  # (namespace, name) -> the ConfigMap's data


def app_profile_of(pod: Any, read_configmap: Optional[ConfigMapReader] = None) -> Optional[appprofile.Profile]:
    """The application profile a Pod's annotation ``app-profile`` names (None without it), checked; a
    ProfileError names the pod, the annotation and every problem.

    The annotation holds a shipped profile's name, a JSON object, or ``configmap:<name>[/<key>]``: the profile
    (JSON, or YAML where PyYAML is installed) in that key (default ``profile``) of a ConfigMap in the pod's
    namespace, read with ``read_configmap``. Never a path: a pod names no file on the node."""
    meta, _spec, what = podapi.pod_parts(pod)
    value = annotations_of(meta).get(podapi.ANN_APP_PROFILE)
    if value is None or value == "":
        return None
    label = f"annotation {podapi.ANN_APP_PROFILE} of {what}"
    if not isinstance(value, str):
        raise appprofile.ProfileError(f"{label} is not a string")
    given: Any = value.strip()
    if given.startswith(CONFIGMAP_PREFIX):
        return _configmap_profile(given[len(CONFIGMAP_PREFIX):], str(meta.get("namespace") or "default"), label,
                                  read_configmap)
    if given.startswith("{"):
        try:
            given = json.loads(given)
        except ValueError as exc:
            raise appprofile.ProfileError(f"{label} is not valid JSON: {exc}") from None
    elif not appprofile.NAME_RE.match(given):
        raise appprofile.ProfileError(f"{label} is {value!r}: neither a shipped profile's name, a JSON object nor "
                                      f"{CONFIGMAP_PREFIX}<name>[/<key>]")
    return appprofile.resolve(given, label)


def _configmap_profile(ref: str, namespace: str, label: str,
                       read_configmap: Optional[ConfigMapReader]) -> Optional[appprofile.Profile]:
    name, _sep, key = ref.partition("/")
    key = key or CONFIGMAP_DEFAULT_KEY
    if not (_DNS_SUBDOMAIN.match(name) and len(name) <= 253) or not _CONFIGMAP_KEY.match(key):
        raise appprofile.ProfileError(f"{label} names {CONFIGMAP_PREFIX}{ref!r}: not a ConfigMap name and key "
                                      f"({CONFIGMAP_PREFIX}<name>[/<key>])")
    where = f"{label}: ConfigMap {namespace}/{name}, key {key}"
    if read_configmap is None:
        raise appprofile.ProfileError(f"{where}: only the node agent reads ConfigMaps; give the profile to the "
                                      "checkpoint module as app_profile")
    try:
        data = read_configmap(namespace, name)
    except appprofile.ProfileError as exc:
        raise appprofile.ProfileError(f"{label}: {exc}", reasons=exc.reasons) from None
    text = data.get(key) if isinstance(data, dict) else None
    if not isinstance(text, str):
        raise appprofile.ProfileError(f"{where}: the ConfigMap has no such key (keys: "
                                      f"{', '.join(sorted(data)) if isinstance(data, dict) and data else 'none'})")
    return appprofile.resolve(appprofile.load_text(text, where), where)
