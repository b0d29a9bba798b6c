# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The names of the warmstart Kubernetes API, and the small pieces every part of the pod contract shares.

Pure functions over plain dicts in the Kubernetes JSON shape (camelCase keys,
as the API returns them); nothing here talks to a cluster. Stdlib only, and
nothing else of the package: ``_k8s_client`` and the rest take their names
from here without loading the contract.

Names
    The API group ``snapshot.warmstart.io/v1alpha1`` and its kinds (PodSnapshot,
    PodSnapshotContent, PodSnapshotPolicy, PodSnapshotManualTrigger,
    PodSnapshotStorageConfig); the restore pod's annotations (``ANN_*``), its
    fixed pieces (the ``snapshot-control`` volume, mount and env, the inert
    command, the seccomp profile, the startup probes, the finalizer), its
    entrypoint forms and fallbacks; the condition, reason and outcome names
    (``Restored`` and its reasons, the reference's outcome names, a node's
    restore result -> the condition it records); the snapshot scopes.

Reference names (ai-dynamo/snapshot ``api/podcontract``)
    ``nvidia.com/restore-from``, ``nvidia.com/restore-container-map`` and
    ``nvidia.com/snapshot-skip-compat-check`` (``REF_ANN_*``,
    ``ANNOTATION_ALIASES``) are read as aliases of ours, never written
    (``_podcontract.contract_annotations`` is the one reader);
    ``nvidia.com/Restored`` is an alias of the ``Restored`` condition.

Shared pieces
    ``ContractError`` (every reason at once); DNS-1123 names; ``object_ref``
    for messages; the dict helpers that read a field of the wrong type as
    empty; ``locate`` / ``pod_parts``, which find the pod in a Pod, a pod
    template or a workload; and the conditions: ``get_condition``,
    ``set_condition`` (metav1.Condition shape), the readiness of a
    PodSnapshot (``readiness_problems`` / ``is_ready``), and where a container
    mounts the pod's emptyDir volumes (``emptydir_mounts``).
"""
from __future__ import annotations

import copy
import datetime
import json
import posixpath
import re
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

GROUP = "snapshot.warmstart.io"
VERSION = "v1alpha1"
API_VERSION = GROUP + "/" + VERSION
KIND_SNAPSHOT = "PodSnapshot"
KIND_CONTENT = "PodSnapshotContent"
KIND_POLICY = "PodSnapshotPolicy"
KIND_TRIGGER = "PodSnapshotManualTrigger"
KIND_STORAGE_CONFIG = "PodSnapshotStorageConfig"
TRIGGERED_CONDITION = "Triggered"

ANN_RESTORE_FROM = GROUP + "/restore-from"
ANN_CONTAINER_MAP = GROUP + "/restore-container-map"
ANN_SKIP_COMPAT = GROUP + "/snapshot-skip-compat-check"
ANN_ORIGINAL_ENTRYPOINT = GROUP + "/original-entrypoint"
# A restore template without a pinned snapshot: the agent selects the newest compatible Ready PodSnapshot when the
# pod runs (``restore-select: "true"``; the grouping labels and scope of the ``restore-policy`` PodSnapshotPolicy,
# when named) and then pins it on the pod (restore-from).
ANN_RESTORE_SELECT = GROUP + "/restore-select"
ANN_RESTORE_POLICY = GROUP + "/restore-policy"
# What a failed or refused restore does (the agent's ``fallback``): ``cold-start`` - the agent writes the control
# file ``cold-start`` and the standby entrypoint starts the app from scratch; ``none`` - the placeholder is killed
# (the pod's one attempt is spent); absent - the agent's own setting.
ANN_RESTORE_FALLBACK = GROUP + "/restore-fallback"
# The application profile of the pod's server (``node/_profile``): a shipped profile's name, or a JSON object - a
# whole profile, or {"name": <shipped>, "vars": {...}}. A checkpoint of the pod's container quiesces it and the
# snapshot records it; a restore releases the copy with it. Never a path: a pod names no file on the node.
ANN_APP_PROFILE = GROUP + "/app-profile"
# emptyDir volumes a snapshot of the pod leaves out (comma-separated names): say, weights an init container
# downloads, which the restore pod's init container fetches again; every other emptyDir goes along.
ANN_SKIP_VOLUMES = GROUP + "/skip-volumes"
FALLBACK_NONE = "none"
FALLBACK_COLD_START = "cold-start"
FALLBACKS = (FALLBACK_NONE, FALLBACK_COLD_START)

CONTROL_VOLUME = "snapshot-control"
CONTROL_MOUNT = "/snapshot-control"
CONTROL_ENV = "SNAPSHOT_CONTROL_DIR"
INERT_COMMAND = ["/bin/sh", "-c", "exec sleep infinity"]
SECCOMP_PROFILE = "profiles/block-iouring.json"
STARTUP_PROBE_COMMAND = ["cat", CONTROL_MOUNT + "/restore-complete"]
COLD_START_FILE = "cold-start"
# The startup probe of a pod with the cold-start fallback: restored, or told to start cold.
COLD_START_PROBE_COMMAND = ["/bin/sh", "-c", f"cat {CONTROL_MOUNT}/restore-complete || cat {CONTROL_MOUNT}/{COLD_START_FILE}"]
FINALIZER = GROUP + "/restore"

# The reference contract's names (ai-dynamo/snapshot ``api/podcontract``): read as aliases of ours, never written.
REFERENCE_GROUP = "nvidia.com"
REF_ANN_RESTORE_FROM = REFERENCE_GROUP + "/restore-from"
REF_ANN_CONTAINER_MAP = REFERENCE_GROUP + "/restore-container-map"
REF_ANN_SKIP_COMPAT = REFERENCE_GROUP + "/snapshot-skip-compat-check"
ANNOTATION_ALIASES = ((ANN_RESTORE_FROM, REF_ANN_RESTORE_FROM), (ANN_CONTAINER_MAP, REF_ANN_CONTAINER_MAP),
                      (ANN_SKIP_COMPAT, REF_ANN_SKIP_COMPAT))
STANDBY_ENV = "SNAPSHOT_RESTORE_STANDBY"
STANDBY_VALUE = "1"
ENTRYPOINT_INERT = "inert"
ENTRYPOINT_STANDBY = "standby"
ENTRYPOINTS = (ENTRYPOINT_INERT, ENTRYPOINT_STANDBY)

RESTORE_CONDITION = "Restored"
REF_RESTORE_CONDITION = REFERENCE_GROUP + "/Restored"
REASON_IN_PROGRESS = "RestoreInProgress"
REASON_SUCCEEDED = "RestoreSucceeded"
REASON_FAILED = "RestoreFailed"
REASON_PARTIAL = "RestorePartiallySucceeded"
REASON_INCOMPATIBLE = "RestoreIncompatible"
OUTCOME_PENDING = "Pending"
OUTCOME_SUCCEEDED = "Succeeded"
OUTCOME_FAILED = "Failed"
OUTCOME_PARTIAL = "PartiallySucceeded"
OUTCOME_UNKNOWN = "Unknown"
OUTCOMES = (OUTCOME_PENDING, OUTCOME_SUCCEEDED, OUTCOME_FAILED, OUTCOME_PARTIAL, OUTCOME_UNKNOWN)
# A node's restore result (the restore module's ``outcome``, restore_pod action=finish's option) -> the Restored
# condition finish records (status, reason).
RESULT_CONDITIONS = {
    "succeeded": ("True", REASON_SUCCEEDED),
    "failed": ("False", REASON_FAILED),
    "partially_succeeded": ("False", REASON_PARTIAL),
    "incompatible": ("False", REASON_INCOMPATIBLE),
}
READY_CONDITION = "Ready"
FAILED_CONDITION = "Failed"

SCOPE_WHOLE_POD = "whole-pod"
SCOPE_ROOTFS_ONLY = "rootfs-only"
SCOPES = (SCOPE_WHOLE_POD, SCOPE_ROOTFS_ONLY)

_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_REASON_RE = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")


class ContractError(WarmstartError, ValueError):
    """A pod, container map or object that breaks the restore contract; ``reasons`` lists every cause."""

    def __str__(self) -> str:  # the reasons too: callers log it alone
        return self.full_message()


# --- names and small helpers ----------------------------------------------------

def is_dns_label(value: Any) -> bool:
    """RFC 1123 label (container names): lower-case alphanumerics and '-', at most 63."""
    return isinstance(value, str) and len(value) <= 63 and bool(_DNS_LABEL_RE.match(value))


def is_dns_subdomain(value: Any) -> bool:
    """RFC 1123 subdomain (object names): labels joined by '.', at most 253."""
    return isinstance(value, str) and len(value) <= 253 and bool(_DNS_SUBDOMAIN_RE.match(value))


def as_dict(value: Any) -> Dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> List[Any]:
    return value if isinstance(value, list) else []


def dicts_of(value: Any) -> List[Dict[str, Any]]:
    return [item for item in as_list(value) if isinstance(item, dict)]


def store_ref(spec_store: Any) -> Optional[Dict[str, Any]]:
    """A PodSnapshotContent's ``spec.store`` in the modules' terms - ``url``, ``snapshot_id``, ``path`` - or None
    when it names no store."""
    store = as_dict(spec_store)
    if not store.get("url"):
        return None
    return {"url": store.get("url"), "snapshot_id": store.get("snapshotId"), "path": store.get("path")}


def object_ref(obj: Dict[str, Any], kind: Optional[str] = None) -> str:
    """'Kind namespace/name' (or 'Kind name' for cluster-scoped objects) for messages."""
    meta = as_dict(obj.get("metadata"))
    name = meta.get("name") or (str(meta["generateName"]) + "*" if meta.get("generateName") else "<unnamed>")
    ref = f"{meta['namespace']}/{name}" if meta.get("namespace") else str(name)
    kind = obj.get("kind") if kind is None else kind
    return f"{kind} {ref}" if kind else ref


def parse_time(value: Any) -> Optional[datetime.datetime]:
    if not isinstance(value, str) or not value:
        return None
    try:
        stamp = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=datetime.timezone.utc)


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def norm_path(path: Any) -> Any:
    if not isinstance(path, str) or not path:
        return path
    return posixpath.normpath(path) if path.startswith("/") else path


# --- locating the pod in an object ----------------------------------------------

def locate(obj: Any) -> Tuple[Dict[str, Any], str]:
    """The dict that holds ``metadata`` + ``spec`` of the pod in ``obj`` (not a copy) and how to name it.

    ``obj`` is a Pod, a pod template (``{metadata, spec}``), a workload whose
    ``spec.template`` is one (Deployment, StatefulSet, DaemonSet, ReplicaSet, Job) or a
    CronJob (``spec.jobTemplate.spec.template``).
    """
    if not isinstance(obj, dict):
        raise ContractError(f"expected a Pod or pod template mapping, got {type(obj).__name__}")
    spec = obj.get("spec")
    if obj.get("kind") == "CronJob" and isinstance(spec, dict):
        job = as_dict(as_dict(spec.get("jobTemplate")).get("spec")).get("template")
        if not isinstance(job, dict) or not isinstance(job.get("spec"), dict):
            raise ContractError(f"{object_ref(obj)} has no spec.jobTemplate.spec.template.spec")
        return job, "pod template of " + object_ref(obj)
    if isinstance(spec, dict):
        template = spec.get("template")
        if obj.get("kind") != "Pod" and "containers" not in spec and isinstance(template, dict):
            if not isinstance(template.get("spec"), dict):
                raise ContractError(f"{object_ref(obj)} has no spec.template.spec")
            return template, "pod template of " + object_ref(obj)
        if obj.get("kind") == "Pod":
            return obj, object_ref(obj, "pod")
        name = as_dict(obj.get("metadata")).get("name")
        return obj, (f"pod template {name}" if name else "pod template")
    if "containers" in obj:
        raise ContractError("a bare PodSpec has no metadata to carry the restore annotations: pass a Pod or a pod template")
    raise ContractError("object is neither a Pod, a pod template nor a workload with spec.template (no spec)")


def pod_parts(obj: Any) -> Tuple[Dict[str, Any], Dict[str, Any], str]:
    """(metadata, spec, description) of a Pod, pod template, workload or bare PodSpec (read only)."""
    if isinstance(obj, dict) and "spec" not in obj and "containers" in obj:
        return {}, obj, "pod spec"
    pod, what = locate(obj)
    return as_dict(pod.get("metadata")), as_dict(pod.get("spec")), what


# --- conditions ---------------------------------------------------------------

def emptydir_mounts(spec: Any, container: Any, meta: Any = None) -> List[str]:
    """Where container ``container`` of pod spec ``spec`` mounts the pod's ``emptyDir`` volumes (what a snapshot
    takes along, checkpoint's ``volumes``), the ``snapshot-control`` volume, ``subPath`` mounts and the volumes
    the pod's ``skip-volumes`` annotation (``meta``: its metadata) names left out; in the order of its
    ``volumeMounts``."""
    empty = {v.get("name") for v in dicts_of(as_dict(spec).get("volumes")) if "emptyDir" in v}
    skipped = str(as_dict(as_dict(meta).get("annotations")).get(ANN_SKIP_VOLUMES) or "")
    empty -= {CONTROL_VOLUME} | {name.strip() for name in skipped.split(",")}
    for c in dicts_of(as_dict(spec).get("containers")):
        if c.get("name") == container:
            return [str(m["mountPath"]) for m in dicts_of(c.get("volumeMounts"))
                    if m.get("name") in empty and isinstance(m.get("mountPath"), str) and not m.get("subPath")]
    return []


def get_condition(obj: Any, type_: str) -> Optional[Dict[str, Any]]:
    """The condition of ``type_`` in an object's ``status.conditions`` (or a status, or a list); None if absent."""
    if isinstance(obj, list):
        conditions = obj
    elif isinstance(obj, dict) and "status" in obj and isinstance(obj.get("status"), dict):
        conditions = as_list(obj["status"].get("conditions"))
    elif isinstance(obj, dict):
        conditions = as_list(obj.get("conditions"))
    else:
        conditions = []
    for condition in conditions:
        if isinstance(condition, dict) and condition.get("type") == type_:
            return condition
    return None


def set_condition(conditions: Optional[List[Dict[str, Any]]], type_: str, status: Any, reason: str, message: str,
                  now: str, generation: Optional[int] = None) -> List[Dict[str, Any]]:
    """A new conditions list with ``type_`` set (metav1.Condition shape); the input is not changed.

    ``lastTransitionTime`` becomes ``now`` only when the status changes (or the
    condition is new); ``observedGeneration`` is kept when ``generation`` is None.
    """
    if isinstance(status, bool):
        status = "True" if status else "False"
    if status not in ("True", "False", "Unknown"):
        raise ContractError(f"condition {type_!r}: status {status!r} is not True, False or Unknown")
    if not isinstance(reason, str) or not _REASON_RE.match(reason):
        raise ContractError(f"condition {type_!r}: reason {reason!r} is not CamelCase (letters, digits, '_', ',', ':')")
    out: List[Dict[str, Any]] = []
    placed = False
    for condition in conditions or []:
        if not isinstance(condition, dict) or condition.get("type") != type_:
            out.append(copy.deepcopy(condition))
            continue
        if placed:
            continue
        placed = True
        since = condition.get("lastTransitionTime") if condition.get("status") == status else None
        entry = {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": since or now}
        observed = generation if generation is not None else condition.get("observedGeneration")
        if observed is not None:
            entry["observedGeneration"] = observed
        out.append(entry)
    if not placed:
        entry = {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": now}
        if generation is not None:
            entry["observedGeneration"] = generation
        out.append(entry)
    return out


def readiness_problems(snapshot: Dict[str, Any]) -> List[str]:
    """Why a PodSnapshot cannot be restored from: being deleted, Failed condition True, not Ready; [] if usable."""
    ref = object_ref(snapshot, KIND_SNAPSHOT)
    problems = []
    if as_dict(snapshot.get("metadata")).get("deletionTimestamp"):
        problems.append(f"{ref} is being deleted")
    failed = get_condition(snapshot, FAILED_CONDITION)
    if failed and failed.get("status") == "True":
        problems.append(f"{ref} has failed ({failed.get('reason')}: {failed.get('message')})")
    ready = get_condition(snapshot, READY_CONDITION)
    if ready is None:
        problems.append(f"{ref} has no Ready condition yet")
    elif ready.get("status") != "True":
        problems.append(f"{ref} is not Ready ({ready.get('reason')}: {ready.get('message')})")
    return problems


def is_ready(snapshot: Dict[str, Any]) -> bool:
    return not readiness_problems(snapshot)
