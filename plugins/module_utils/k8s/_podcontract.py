# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The restore-pod contract, the condensed pod-spec hash and snapshot selection.

Pure functions over plain dicts in the Kubernetes JSON shape (camelCase keys,
as the API returns them); nothing here talks to a cluster. Stdlib only.

Restore pod (``build`` / ``validate`` / ``classify``)
    A restore pod is an ordinary pod (or pod template) that carries the
    annotation ``snapshot.warmstart.io/restore-from: <PodSnapshot name>``, an
    ``emptyDir`` volume ``snapshot-control`` mounted in every container at
    ``/snapshot-control`` with ``subPath: <container name>``, the env
    ``SNAPSHOT_CONTROL_DIR=/snapshot-control``, the inert command
    ``/bin/sh -c 'exec sleep infinity'`` (no args) and the pod-level Localhost
    seccomp profile ``profiles/block-iouring.json``. Optional: the container
    map annotation ``src=dst,...``, the skip-compat annotation, and a startup
    probe ``cat /snapshot-control/restore-complete`` on each destination
    container. ``build`` records each container's own command/args in the
    annotation ``snapshot.warmstart.io/original-entrypoint`` (canonical JSON,
    ``{"<container>": {"command": [...], "args": [...]}}``) so that the pod
    hashes like the template it came from. Init containers are left alone.
    ``build(entrypoint="standby")`` keeps each container's command and sets
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

Reference names (ai-dynamo/snapshot ``api/podcontract``)
    ``nvidia.com/restore-from``, ``nvidia.com/restore-container-map`` and
    ``nvidia.com/snapshot-skip-compat-check`` are read as aliases of ours
    (``contract_annotations`` is the one reader; ours and an alias with
    different values is refused, naming both), ``nvidia.com/Restored`` as an
    alias of the ``Restored`` condition. Written names stay ours. ``classify``
    returns the reference's outcome names (Pending, Succeeded, Failed,
    PartiallySucceeded, Unknown) by its table; a restore in progress is status
    ``False``, reason ``RestoreInProgress``.

Condensed pod-spec hash (``pod_spec_fields`` / ``pod_spec_hash``)
    Exactly the fields of ANCHORS.md section 2, one digest per field path:
    ``containers[<name>].<field>`` and ``initContainers[<name>].<field>`` for
    name, image, command, args, workingDir, ports, volumeMounts,
    volumeDevices, lifecycle, terminationMessagePath, terminationMessagePolicy,
    securityContext, stdin, stdinOnce, tty; pod level ``volumes``,
    ``dnsPolicy``, ``automountServiceAccountToken``, ``hostNetwork``,
    ``hostPID``, ``hostIPC``, ``shareProcessNamespace``, ``securityContext``,
    ``dnsConfig``, ``runtimeClassName``, ``os``, ``hostUsers``; and
    ``labels[batch.kubernetes.io/job-completion-index]``. Every path is always
    present (an absent field has the digest of ``null``). Rules:

    * containers are keyed by name (their order does not count); ``volumes``
      is hashed as a map name -> source (order does not count); every other
      list (command, args, ports, volumeMounts, ...) keeps its order;
    * missing, ``null``, ``""``, ``[]`` and ``{}`` are the same (the API
      omits empty values when it serialises);
    * apiserver defaults equal their absence: ``terminationMessagePath:
      /dev/termination-log``, ``terminationMessagePolicy: File``, port
      ``protocol: TCP`` (and ``hostPort == containerPort`` under
      hostNetwork), ``readOnly: false``, ``stdin/stdinOnce/tty: false``,
      lifecycle ``httpGet.scheme: HTTP``, ``dnsPolicy: ClusterFirst``,
      ``hostNetwork/hostPID/hostIPC/shareProcessNamespace: false``,
      ``hostUsers: true``, volume ``defaultMode: 420``, downward API
      ``fieldRef.apiVersion: v1``, ``serviceAccountToken.expirationSeconds:
      3600``, a volume without source = ``emptyDir: {}``;
    * the service-account token volume the apiserver injects
      (``kube-api-access-xxxxx``, projected) and its mounts are ignored;
      ``automountServiceAccountToken`` itself is hashed;
    * the restore-contract additions are stripped: the ``snapshot-control``
      volume (whatever its source) and every mount of it or at
      ``/snapshot-control``, a pod-level Localhost seccomp profile named
      ``block-iouring.json``, and the inert command, which is replaced by the
      command/args recorded in the original-entrypoint annotation (annotations,
      env and probes are not hashed at all).

    ``pod_spec_hash`` is the sha256 of ``warmstart-podspec-v1`` followed by
    the sorted ``path=digest`` lines. A PodSnapshot records the hash in
    ``status.podSpecHash``; its PodSnapshotContent records the field digests in
    ``status.podSpecFields`` so that a mismatch can name the fields.
"""
from __future__ import annotations

import copy
import datetime
import hashlib
import json
import posixpath
import re
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

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
_TRUE_WORDS = ("1", "true", "yes", "on")

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
LEGACY_STATES = ("pending", "succeeded", "failed", "partial")  # classify's earlier names: the deprecated ``state``
READY_CONDITION = "Ready"
FAILED_CONDITION = "Failed"

SCOPE_WHOLE_POD = "whole-pod"
SCOPE_ROOTFS_ONLY = "rootfs-only"
SCOPES = (SCOPE_WHOLE_POD, SCOPE_ROOTFS_ONLY)

JOB_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
CONTAINER_FIELDS = (
    "name", "image", "command", "args", "workingDir", "ports", "volumeMounts", "volumeDevices", "lifecycle",
    "terminationMessagePath", "terminationMessagePolicy", "securityContext", "stdin", "stdinOnce", "tty",
)
POD_FIELDS = (
    "volumes", "dnsPolicy", "automountServiceAccountToken", "hostNetwork", "hostPID", "hostIPC",
    "shareProcessNamespace", "securityContext", "dnsConfig", "runtimeClassName", "os", "hostUsers",
)
HASHED_LABELS = (JOB_INDEX_LABEL,)
HASH_VERSION = "warmstart-podspec-v1"

_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_REASON_RE = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_SA_VOLUME_RE = re.compile(r"^kube-api-access-[a-z0-9]{5}$")
_SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
_CONTAINER_KEY_RE = re.compile(r"^((?:init)?[cC]ontainers\[[^\]]*\])\.")
_PROBE_DEFAULTS = {"successThreshold": 1, "initialDelaySeconds": 0}


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


def _mapping(value: Any) -> Dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _items(value: Any) -> List[Any]:
    return value if isinstance(value, list) else []


def _dicts(value: Any) -> List[Dict[str, Any]]:
    return [item for item in _items(value) if isinstance(item, dict)]


def object_ref(obj: Dict[str, Any], kind: Optional[str] = None) -> str:
    """'Kind namespace/name' (or 'Kind name' for cluster-scoped objects) for messages."""
    meta = _mapping(obj.get("metadata"))
    name = meta.get("name") or (str(meta["generateName"]) + "*" if meta.get("generateName") else "<unnamed>")
    ref = f"{meta['namespace']}/{name}" if meta.get("namespace") else str(name)
    kind = obj.get("kind") if kind is None else kind
    return f"{kind} {ref}" if kind else ref


def _parse_time(value: Any) -> Optional[datetime.datetime]:
    if not isinstance(value, str) or not value:
        return None
    try:
        stamp = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=datetime.timezone.utc)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _digest(value: Any) -> str:
    return hashlib.sha256(_canonical(value).encode("utf-8")).hexdigest()


def _norm_path(path: Any) -> Any:
    if not isinstance(path, str) or not path:
        return path
    return posixpath.normpath(path) if path.startswith("/") else path


# --- locating the pod in an object ----------------------------------------------

def _locate(obj: Any) -> Tuple[Dict[str, Any], str]:
    """The dict that holds ``metadata`` + ``spec`` of the pod in ``obj`` (not a copy) and how to name it.

    ``obj`` is a Pod, a pod template (``{metadata, spec}``) or a workload whose
    ``spec.template`` is one (Deployment, StatefulSet, Job, ...).
    """
    if not isinstance(obj, dict):
        raise ContractError(f"expected a Pod or pod template mapping, got {type(obj).__name__}")
    spec = obj.get("spec")
    if isinstance(spec, dict):
        template = spec.get("template")
        if obj.get("kind") != "Pod" and "containers" not in spec and isinstance(template, dict):
            if not isinstance(template.get("spec"), dict):
                raise ContractError(f"{object_ref(obj)} has no spec.template.spec")
            return template, "pod template of " + object_ref(obj)
        if obj.get("kind") == "Pod":
            return obj, object_ref(obj, "pod")
        name = _mapping(obj.get("metadata")).get("name")
        return obj, (f"pod template {name}" if name else "pod template")
    if "containers" in obj:
        raise ContractError("a bare PodSpec has no metadata to carry the restore annotations: pass a Pod or a pod template")
    raise ContractError("object is neither a Pod, a pod template nor a workload with spec.template (no spec)")


def _pod_parts(obj: Any) -> Tuple[Dict[str, Any], Dict[str, Any], str]:
    """(metadata, spec, description) of a Pod, pod template, workload or bare PodSpec (read only)."""
    if isinstance(obj, dict) and "spec" not in obj and "containers" in obj:
        return {}, obj, "pod spec"
    pod, what = _locate(obj)
    return _mapping(pod.get("metadata")), _mapping(pod.get("spec")), what


# --- container map ------------------------------------------------------------

def parse_container_map(value: Any) -> List[Tuple[str, str]]:
    """``src=dst,...`` (or a list of such strings / ``[src, dst]`` pairs / ``{src, dst}`` dicts, or a
    mapping ``{src: dst | [dst, ...]}``) -> [(src, dst), ...] in the given order.

    One source may fan out to several destinations; a destination appears once. Every malformed entry is a
    reason of one ContractError (``_map_entries`` reads the shape, ``_map_pairs`` checks the names).
    """
    if value is None:
        return []
    problems: List[str] = []
    pairs = _map_pairs(_map_entries(value, problems), problems)
    if problems:
        raise ContractError("invalid container map", problems)
    return pairs


def _map_entries(value: Any, problems: List[str]) -> List[Tuple[str, Any, Any]]:
    """The (text, src, dst) entries of a container map in any accepted shape; shape problems go to ``problems``."""
    raw: List[Tuple[str, Any, Any]] = []
    if isinstance(value, str):
        if value.strip():
            for part in value.split(","):
                if not part.strip():
                    problems.append(f"container map {value!r} has an empty entry")
                else:
                    _text_entry(part.strip(), raw, problems)
    elif isinstance(value, dict):
        for src, dsts in value.items():
            for dst in (dsts if isinstance(dsts, list) else [dsts]):
                raw.append((f"{src}={dst}", src, dst))
    elif isinstance(value, (list, tuple)):
        for item in value:
            if isinstance(item, str):
                _text_entry(item.strip(), raw, problems)
            elif isinstance(item, (list, tuple)) and len(item) == 2:
                raw.append((f"{item[0]}={item[1]}", item[0], item[1]))
            elif isinstance(item, dict) and set(item) == {"src", "dst"}:
                raw.append((f"{item['src']}={item['dst']}", item["src"], item["dst"]))
            else:
                problems.append(f"container map entry {item!r} is neither 'src=dst', a [src, dst] pair nor {{src, dst}}")
    else:
        raise ContractError(f"container map must be a string, list or mapping, not {type(value).__name__}")
    return raw


def _text_entry(text: str, raw: List[Tuple[str, Any, Any]], problems: List[str]) -> None:
    src, sep, dst = text.partition("=")
    if not sep:
        problems.append(f"container map entry {text!r} is not of the form src=dst")
    else:
        raw.append((text, src.strip(), dst.strip()))


def _map_pairs(raw: List[Tuple[str, Any, Any]], problems: List[str]) -> List[Tuple[str, str]]:
    """The entries whose source and destination are container names, each destination once."""
    pairs: List[Tuple[str, str]] = []
    seen: Dict[str, str] = {}
    for text, src, dst in raw:
        bad = False
        for role, name in (("source", src), ("destination", dst)):
            if name is None or (isinstance(name, str) and not name.strip()):
                problems.append(f"container map entry {text!r} has an empty {role}")
                bad = True
            elif not is_dns_label(name):
                problems.append(f"container map entry {text!r}: {role} {name!r} is not a valid container name (DNS-1123 label)")
                bad = True
        if bad:
            continue
        if dst in seen:
            problems.append(f"container map entry {text!r}: destination {dst!r} already receives {seen[dst]!r}")
            continue
        seen[dst] = src
        pairs.append((src, dst))
    return pairs


def format_container_map(pairs: Iterable[Tuple[str, str]]) -> str:
    """Canonical annotation value: ``src=dst`` entries sorted, joined by ','."""
    return ",".join(f"{src}={dst}" for src, dst in sorted(pairs))


# --- contract pieces shared by build and validate ---------------------------------

def _startup_probe(cold_start: bool = False) -> Dict[str, Any]:
    command = COLD_START_PROBE_COMMAND if cold_start else STARTUP_PROBE_COMMAND
    return {"exec": {"command": list(command)}, "periodSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 1800}


def _probe_equal(have: Any, want: Dict[str, Any]) -> bool:
    if not isinstance(have, dict):
        return False
    trimmed = {k: v for k, v in have.items() if v is not None and _PROBE_DEFAULTS.get(k, object()) != v}
    return trimmed == want


def _seccomp(profile: str) -> Dict[str, str]:
    return {"type": "Localhost", "localhostProfile": profile}


def _is_inert(container: Dict[str, Any]) -> bool:
    return container.get("command") == INERT_COMMAND and not container.get("args")


def _entrypoint_of(container: Dict[str, Any]) -> Dict[str, Any]:
    return {key: container[key] for key in ("command", "args") if container.get(key)}


def _container_names(spec: Dict[str, Any]) -> List[Any]:
    """The containers' names as written (a missing one is None: callers name it as invalid)."""
    return [c.get("name") for c in _dicts(spec.get("containers"))]


def _annotations(meta: Dict[str, Any]) -> Dict[str, Any]:
    return _mapping(meta.get("annotations"))


def _same_annotation(key: str, mine: Any, theirs: Any) -> bool:
    """Whether two values of one contract annotation say the same (a map in any order, a bool in any case)."""
    if key == ANN_CONTAINER_MAP:
        try:
            return format_container_map(parse_container_map(mine)) == format_container_map(parse_container_map(theirs))
        except ContractError:
            return bool(mine == theirs)
    if key == ANN_SKIP_COMPAT:
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
    for ours, theirs in ANNOTATION_ALIASES:
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
    meta, _spec, what = _pod_parts(obj)
    return contract_annotations(_annotations(meta), what)


def _label(raw: Dict[str, Any], ours: str) -> str:
    """The name under which a pod carries one contract annotation: ours, else its reference alias when only that is set."""
    for mine, theirs in ANNOTATION_ALIASES:
        if mine == ours and ours not in raw and theirs in raw:
            return theirs
    return ours


def skips_compat_check(annotations: Dict[str, Any]) -> bool:
    """Whether (merged) annotations ask to skip the compatibility and pod-spec checks."""
    return str(annotations.get(ANN_SKIP_COMPAT, "")).strip().lower() == "true"


def _map_annotation(annotations: Dict[str, Any], what: str, label: str = ANN_CONTAINER_MAP
                    ) -> Tuple[List[Tuple[str, str]], List[str]]:
    value = annotations.get(ANN_CONTAINER_MAP)
    if value is None:
        return [], []
    try:
        return parse_container_map(value), []
    except ContractError as exc:
        return [], [f"annotation {label} of {what} is invalid: " + "; ".join(exc.reasons or [exc.message])]


def _entrypoint_annotation(annotations: Dict[str, Any], what: str) -> Tuple[Dict[str, Dict[str, Any]], List[str]]:
    value = annotations.get(ANN_ORIGINAL_ENTRYPOINT)
    if value is None:
        return {}, []
    bad = [f"annotation {ANN_ORIGINAL_ENTRYPOINT} of {what} is not a JSON object of container -> {{command, args}}"]
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


def _container_conflicts(container: Dict[str, Any], what: str, profile: str) -> Tuple[List[str], bool, bool]:
    """Problems of a container's control mount / env / seccomp, and whether mount and env are already right."""
    name = container.get("name")
    cwhat = f"container {name!r} of {what}"
    problems: List[str] = []
    have_mount = have_env = False
    for mount in _dicts(container.get("volumeMounts")):
        path = _norm_path(mount.get("mountPath"))
        if mount.get("name") == CONTROL_VOLUME:
            if path != CONTROL_MOUNT:
                problems.append(f"{cwhat} mounts volume {CONTROL_VOLUME!r} at {mount.get('mountPath')!r}, not at {CONTROL_MOUNT}")
            elif mount.get("subPathExpr") or mount.get("subPath") != name:
                sub = mount.get("subPathExpr") or mount.get("subPath")
                problems.append(f"{cwhat} mounts volume {CONTROL_VOLUME!r} with subPath {sub!r}, not {name!r}")
            elif mount.get("readOnly"):
                problems.append(f"{cwhat} mounts volume {CONTROL_VOLUME!r} read-only")
            else:
                have_mount = True
        elif path == CONTROL_MOUNT:
            problems.append(f"{cwhat} already mounts volume {mount.get('name')!r} at {CONTROL_MOUNT}")
    for var in _dicts(container.get("env")):
        if var.get("name") != CONTROL_ENV:
            continue
        if var.get("valueFrom") is not None:
            problems.append(f"{cwhat} sets env {CONTROL_ENV} from valueFrom, not to {CONTROL_MOUNT}")
        elif var.get("value") != CONTROL_MOUNT:
            problems.append(f"{cwhat} sets env {CONTROL_ENV}={var.get('value')!r}, not {CONTROL_MOUNT}")
        else:
            have_env = True
    own = _mapping(container.get("securityContext")).get("seccompProfile")
    if own is not None and own != _seccomp(profile):
        problems.append(f"{cwhat} has its own seccompProfile {own!r}, which would override the pod's Localhost profile {profile!r}")
    return problems, have_mount, have_env


def _volume_conflicts(spec: Dict[str, Any], what: str) -> Tuple[List[str], bool]:
    control = [v for v in _dicts(spec.get("volumes")) if v.get("name") == CONTROL_VOLUME]
    if not control:
        return [], False
    problems = []
    if len(control) > 1:
        problems.append(f"{what} declares volume {CONTROL_VOLUME!r} {len(control)} times")
    sources = sorted(k for k, v in control[0].items() if k != "name" and v is not None)
    if sources != ["emptyDir"]:
        problems.append(f"volume {CONTROL_VOLUME!r} of {what} is {', '.join(sources) or 'without source'}, not an emptyDir")
    return problems, not problems


def _pod_seccomp_conflict(spec: Dict[str, Any], what: str, profile: str) -> Tuple[List[str], bool]:
    have = _mapping(spec.get("securityContext")).get("seccompProfile")
    if have is None:
        return [], False
    if have != _seccomp(profile):
        return [f"{what} already has seccompProfile {have!r}, not Localhost {profile!r}"], False
    return [], True


def _profile_problems(profile: Any) -> List[str]:
    if not isinstance(profile, str) or not profile or profile.startswith("/") or ".." in profile.split("/"):
        return [f"seccomp profile {profile!r} must be a path relative to the kubelet's seccomp directory"]
    return []


def _standby_value(container: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The container's env entry ``SNAPSHOT_RESTORE_STANDBY`` (the first), or None."""
    for var in _dicts(container.get("env")):
        if var.get("name") == STANDBY_ENV:
            return var
    return None


def _standby_problems(container: Dict[str, Any], cwhat: str) -> List[str]:
    """Why the container's ``SNAPSHOT_RESTORE_STANDBY`` does not ask for standby; [] when it does or is absent."""
    var = _standby_value(container)
    if var is None:
        return []
    if var.get("valueFrom") is not None:
        return [f"{cwhat} sets env {STANDBY_ENV} from valueFrom; a standby entrypoint needs the literal value "
                f"{STANDBY_VALUE!r}"]
    if str(var.get("value") or "").strip().lower() not in _TRUE_WORDS:
        return [f"{cwhat} sets env {STANDBY_ENV}={var.get('value')!r}, which does not ask its entrypoint to stay inert "
                f"(true values: {', '.join(_TRUE_WORDS)})"]
    return []


def _standby_conflicts(container: Dict[str, Any], what: str, recorded: bool) -> List[str]:
    """Why ``build(entrypoint=standby)`` cannot keep this container's own entrypoint in standby."""
    cwhat = f"container {container.get('name')!r} of {what}"
    problems = _standby_problems(container, cwhat)
    if recorded and _is_inert(container):
        problems.append(f"{cwhat} was made inert by an earlier build (annotation {ANN_ORIGINAL_ENTRYPOINT} records "
                        "its command): build the standby form from the original pod or template")
    return problems


def entrypoint_form(container: Dict[str, Any]) -> Optional[str]:
    """``inert`` (the inert command, no args), ``standby`` (own command, ``SNAPSHOT_RESTORE_STANDBY`` true) or None."""
    if _is_inert(container):
        return ENTRYPOINT_INERT
    if _standby_value(container) is not None and not _standby_problems(container, ""):
        return ENTRYPOINT_STANDBY
    return None


def entrypoint_forms(pod: Any) -> Dict[str, Optional[str]]:
    """Container name -> ``entrypoint_form`` of each container of a Pod, pod template or workload."""
    _meta, spec, _what = _pod_parts(pod)
    return {str(c.get("name")): entrypoint_form(c) for c in _dicts(spec.get("containers"))}


# --- build / validate / classify ----------------------------------------------------

def build(obj: Dict[str, Any], snapshot_name: Optional[str], container_map: Any = None,
          skip_compat_check: bool = False, startup_probe: bool = True, seccomp_profile: str = SECCOMP_PROFILE,
          entrypoint: str = ENTRYPOINT_INERT, fallback: Optional[str] = None,
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
    annotations (``nvidia.com/...``) count as ours (``contract_annotations``); the ones written are ours.
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
    pod, what = _locate(out)
    if not isinstance(pod.get("metadata"), dict):
        pod["metadata"] = {}
    plan = _BuildPlan(pod, what, snapshot_name, seccomp_profile, entrypoint)
    plan.restore_policy = restore_policy
    _plan_fallback(plan, fallback)
    _plan_build(plan, container_map, skip_compat_check, startup_probe)
    if plan.reasons:
        target = f"snapshot {snapshot_name!r}" if snapshot_name is not None else "a snapshot selected at restore"
        raise ContractError(f"cannot make {what} a restore pod for {target}", plan.reasons)
    _apply_build(plan, skip_compat_check, startup_probe)
    return out


class _BuildPlan:
    """What ``build`` found in the pod and will add: read by ``_plan_build``, written by ``_apply_build``."""

    def __init__(self, pod: Dict[str, Any], what: str, snapshot_name: Optional[str], profile: str,
                 entrypoint: str) -> None:
        self.meta: Dict[str, Any] = pod["metadata"]
        self.spec: Dict[str, Any] = pod["spec"]
        self.what, self.snapshot_name, self.profile = what, snapshot_name, profile
        self.standby = entrypoint == ENTRYPOINT_STANDBY
        self.raw = _annotations(self.meta)
        self.annotations, conflicts = contract_annotations(self.raw, what)
        self.names = _container_names(self.spec)
        self.reasons: List[str] = list(conflicts)
        if entrypoint not in ENTRYPOINTS:
            self.reasons.append(f"entrypoint {entrypoint!r} is not one of {', '.join(ENTRYPOINTS)}")
        self.pairs: List[Tuple[str, str]] = []
        self.entrypoints: Dict[str, Dict[str, Any]] = {}
        self.containers: List[Tuple[Dict[str, Any], bool, bool]] = []  # (container, has mount, has env)
        self.have_volume = self.have_seccomp = False
        self.restore_policy: Optional[str] = None
        self.fallback: Optional[str] = None
        self.cold_start = False


def _plan_fallback(plan: _BuildPlan, fallback: Optional[str]) -> None:
    """The restore-fallback annotation: the one asked for, else the one the pod has; cold-start needs standby."""
    have = plan.annotations.get(ANN_RESTORE_FALLBACK)
    if have is not None and have not in FALLBACKS:
        plan.reasons.append(f"annotation {ANN_RESTORE_FALLBACK} of {plan.what} is {have!r}, not one of {', '.join(FALLBACKS)}")
    if fallback is not None and fallback not in FALLBACKS:
        plan.reasons.append(f"fallback {fallback!r} is not one of {', '.join(FALLBACKS)}")
    elif fallback is not None and have is not None and have != fallback:
        plan.reasons.append(f"annotation {ANN_RESTORE_FALLBACK} of {plan.what} is already {have!r}, not {fallback!r}")
    plan.fallback = fallback
    plan.cold_start = (fallback or have) == FALLBACK_COLD_START
    if plan.cold_start and not plan.standby:
        plan.reasons.append(f"fallback {FALLBACK_COLD_START} needs entrypoint {ENTRYPOINT_STANDBY}: an inert "
                            "placeholder cannot start its app cold (it runs no entrypoint of its own)")


def _plan_build(plan: _BuildPlan, container_map: Any, skip_compat_check: bool, startup_probe: bool) -> None:
    """Every reason the pod cannot be made a restore pod, in a stable order, and the plan to make it one."""
    _plan_identity(plan)
    _plan_map(plan, container_map)
    skip, label = plan.annotations.get(ANN_SKIP_COMPAT), _label(plan.raw, ANN_SKIP_COMPAT)
    if skip is not None and str(skip).lower() not in ("true", "false"):
        plan.reasons.append(f"annotation {label} of {plan.what} is {skip!r}, not 'true' or 'false'")
    elif skip_compat_check and skip is not None and str(skip).lower() == "false":
        plan.reasons.append(f"annotation {label} of {plan.what} is already 'false'")
    recorded, problems = _entrypoint_annotation(plan.annotations, plan.what)
    plan.reasons.extend(problems)
    problems, plan.have_volume = _volume_conflicts(plan.spec, plan.what)
    plan.reasons.extend(problems)
    problems, plan.have_seccomp = _pod_seccomp_conflict(plan.spec, plan.what, plan.profile)
    plan.reasons.extend(problems)
    _plan_containers(plan, recorded, startup_probe)


def _plan_identity(plan: _BuildPlan) -> None:
    """The snapshot name, the seccomp profile, the containers and their names, the restore-from annotation."""
    what = plan.what
    if plan.snapshot_name is not None and not is_dns_subdomain(plan.snapshot_name):
        plan.reasons.append(f"snapshot name {plan.snapshot_name!r} is not a valid PodSnapshot name (DNS-1123 subdomain)")
    plan.reasons.extend(_profile_problems(plan.profile))
    if not _dicts(plan.spec.get("containers")):
        plan.reasons.append(f"{what} has no containers")
    for index, name in enumerate(plan.names):
        if not is_dns_label(name):
            plan.reasons.append(f"container #{index} of {what} has no valid name ({name!r})")
    current = plan.annotations.get(ANN_RESTORE_FROM)
    if plan.snapshot_name is None:
        _plan_selection(plan, current)
    elif current is not None and current != plan.snapshot_name:
        plan.reasons.append(f"annotation {_label(plan.raw, ANN_RESTORE_FROM)} of {what} is already {current!r}, not "
                            f"{plan.snapshot_name!r}")
    elif plan.annotations.get(ANN_RESTORE_SELECT) is not None:
        plan.reasons.append(f"{what} selects its snapshot at restore (annotation {ANN_RESTORE_SELECT}); it cannot "
                            f"also be pinned to {plan.snapshot_name!r}: build from the original template")
    if plan.restore_policy is not None and plan.snapshot_name is not None:
        plan.reasons.append(f"restore_policy {plan.restore_policy!r} applies only to a snapshot selected at restore, "
                            f"not to one pinned ({plan.snapshot_name!r})")


def _plan_selection(plan: _BuildPlan, current: Any) -> None:
    """Select at restore: no restore-from yet, restore-select true, the restore-policy as asked."""
    what = plan.what
    if current is not None:
        plan.reasons.append(f"annotation {_label(plan.raw, ANN_RESTORE_FROM)} of {what} already pins {current!r}; "
                            "a snapshot selected at restore needs a template without it")
    select = plan.annotations.get(ANN_RESTORE_SELECT)
    if select is not None and str(select).strip().lower() != "true":
        plan.reasons.append(f"annotation {ANN_RESTORE_SELECT} of {what} is {select!r}, not 'true'")
    have = plan.annotations.get(ANN_RESTORE_POLICY)
    if plan.restore_policy is not None and not is_dns_subdomain(plan.restore_policy):
        plan.reasons.append(f"restore_policy {plan.restore_policy!r} is not a valid PodSnapshotPolicy name")
    elif have is not None and plan.restore_policy is not None and have != plan.restore_policy:
        plan.reasons.append(f"annotation {ANN_RESTORE_POLICY} of {what} is already {have!r}, not "
                            f"{plan.restore_policy!r}")


def _plan_map(plan: _BuildPlan, container_map: Any) -> None:
    """The container map: the one asked for, else the one annotated; they must agree, each destination exist."""
    what, annotations = plan.what, plan.annotations
    pairs: List[Tuple[str, str]] = []
    if container_map is not None:
        try:
            pairs = parse_container_map(container_map)
        except ContractError as exc:
            plan.reasons.extend(exc.reasons or [exc.message])
    label = _label(plan.raw, ANN_CONTAINER_MAP)
    existing_pairs, problems = _map_annotation(annotations, what, label)
    plan.reasons.extend(problems)
    if ANN_CONTAINER_MAP in annotations and not problems and pairs:
        if format_container_map(existing_pairs) != format_container_map(pairs):
            plan.reasons.append(f"annotation {label} of {what} is already "
                                f"{annotations[ANN_CONTAINER_MAP]!r}, not {format_container_map(pairs)!r}")
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
    for container in _dicts(plan.spec.get("containers")):
        name = str(container.get("name"))
        problems, have_mount, have_env = _container_conflicts(container, plan.what, plan.profile)
        plan.reasons.extend(problems)
        plan.containers.append((container, have_mount, have_env))
        if plan.standby:
            plan.reasons.extend(_standby_conflicts(container, plan.what, name in recorded))
        elif name in recorded:
            if not _is_inert(container) and recorded[name] != _entrypoint_of(container):
                plan.reasons.append(f"annotation {ANN_ORIGINAL_ENTRYPOINT} of {plan.what} records another command "
                                    f"for container {name!r} than the one it has")
        elif not _is_inert(container):
            plan.entrypoints[name] = _entrypoint_of(container)
        if startup_probe and name in destinations and container.get("startupProbe") is not None:
            if not _probe_equal(container["startupProbe"], probe):
                plan.reasons.append(f"container {name!r} of {plan.what} already has another startupProbe")


def _apply_build(plan: _BuildPlan, skip_compat_check: bool, startup_probe: bool) -> None:
    """Write the plan into the (copied) pod: annotations, control volume, per-container mount, env, inert
    command and startup probe, pod seccomp profile. Adds only what is missing."""
    annotations, spec = plan.annotations, plan.spec
    if plan.snapshot_name is not None:
        annotations[ANN_RESTORE_FROM] = plan.snapshot_name
    else:
        annotations[ANN_RESTORE_SELECT] = "true"
        if plan.restore_policy is not None:
            annotations[ANN_RESTORE_POLICY] = plan.restore_policy
    if plan.fallback is not None:
        annotations[ANN_RESTORE_FALLBACK] = plan.fallback
    if plan.pairs:
        annotations[ANN_CONTAINER_MAP] = format_container_map(plan.pairs)
    if skip_compat_check:
        annotations[ANN_SKIP_COMPAT] = "true"
    if plan.entrypoints:
        annotations[ANN_ORIGINAL_ENTRYPOINT] = _canonical(plan.entrypoints)
    plan.meta["annotations"] = annotations
    if not plan.have_volume:
        spec["volumes"] = _items(spec.get("volumes")) + [{"name": CONTROL_VOLUME, "emptyDir": {}}]
    destinations = _destinations(plan)
    for container, have_mount, have_env in plan.containers:
        name = container.get("name")
        if not have_mount:
            container["volumeMounts"] = _items(container.get("volumeMounts")) + [
                {"name": CONTROL_VOLUME, "mountPath": CONTROL_MOUNT, "subPath": name}]
        if not have_env:
            container["env"] = _items(container.get("env")) + [{"name": CONTROL_ENV, "value": CONTROL_MOUNT}]
        if not plan.standby:
            container["command"] = list(INERT_COMMAND)
            container.pop("args", None)
        elif _standby_value(container) is None:
            container["env"] = _items(container.get("env")) + [{"name": STANDBY_ENV, "value": STANDBY_VALUE}]
        if startup_probe and name in destinations and container.get("startupProbe") is None:
            container["startupProbe"] = _startup_probe(plan.cold_start)
    if not plan.have_seccomp:
        context = dict(_mapping(spec.get("securityContext")))
        context["seccompProfile"] = _seccomp(plan.profile)
        spec["securityContext"] = context


def validate(pod: Dict[str, Any], seccomp_profile: str = SECCOMP_PROFILE) -> List[str]:
    """Every way ``pod`` (a Pod or pod template) falls short of being a restore pod; [] when it is one."""
    try:
        located, what = _locate(pod)
    except ContractError as exc:
        return [str(exc)]
    meta = _mapping(located.get("metadata"))
    spec = _mapping(located.get("spec"))
    raw = _annotations(meta)
    annotations, problems = contract_annotations(raw, what)
    problems.extend(_source_problems(annotations, raw, what))
    problems.extend(_fallback_problems(annotations, spec, what))
    names = _container_names(spec)
    pairs, found = _map_annotation(annotations, what, _label(raw, ANN_CONTAINER_MAP))
    problems.extend(found)
    for src, dst in pairs:
        if dst not in names:
            problems.append(f"container map destination {dst!r} (from {src!r}) is not a container of {what}")
    skip = annotations.get(ANN_SKIP_COMPAT)
    if skip is not None and str(skip).lower() not in ("true", "false"):
        problems.append(f"annotation {_label(raw, ANN_SKIP_COMPAT)} of {what} is {skip!r}, not 'true' or 'false'")
    recorded, found = _entrypoint_annotation(annotations, what)
    problems.extend(found)
    for name in sorted(set(recorded) - set(names)) if names else []:
        problems.append(f"annotation {ANN_ORIGINAL_ENTRYPOINT} of {what} names container {name!r}, which it does not have")
    if not names:
        problems.append(f"{what} has no containers")
    found, have_volume = _volume_conflicts(spec, what)
    problems.extend(found)
    if not found and not have_volume:
        problems.append(f"{what} has no emptyDir volume {CONTROL_VOLUME!r}")
    for container in _dicts(spec.get("containers")):
        problems.extend(_container_shortfalls(container, what, seccomp_profile))
    found, have_seccomp = _pod_seccomp_conflict(spec, what, seccomp_profile)
    problems.extend(found)
    if not found and not have_seccomp:
        problems.append(f"{what} has no pod-level seccompProfile Localhost {seccomp_profile!r} (blocks io_uring)")
    return problems


def _source_problems(annotations: Dict[str, Any], raw: Dict[str, Any], what: str) -> List[str]:
    """Where the pod restores from: a valid restore-from, or ``restore-select: "true"`` (the agent selects)."""
    source, select = annotations.get(ANN_RESTORE_FROM), annotations.get(ANN_RESTORE_SELECT)
    problems: List[str] = []
    if select is not None and str(select).strip().lower() != "true":
        problems.append(f"annotation {ANN_RESTORE_SELECT} of {what} is {select!r}, not 'true'")
    policy = annotations.get(ANN_RESTORE_POLICY)
    if policy is not None and not is_dns_subdomain(policy):
        problems.append(f"annotation {ANN_RESTORE_POLICY} of {what} is {policy!r}, not a valid PodSnapshotPolicy name")
    if source is None and select is None:
        problems.append(f"{what} has no annotation {ANN_RESTORE_FROM} (or {REF_ANN_RESTORE_FROM})")
    elif source is not None and not is_dns_subdomain(source):
        problems.append(f"annotation {_label(raw, ANN_RESTORE_FROM)} of {what} is {source!r}, not a valid PodSnapshot "
                        "name (DNS-1123 subdomain)")
    return problems


def _fallback_problems(annotations: Dict[str, Any], spec: Dict[str, Any], what: str) -> List[str]:
    """A valid restore-fallback annotation; with cold-start, every container in standby (it must be able to start cold)."""
    value = annotations.get(ANN_RESTORE_FALLBACK)
    if value is None:
        return []
    if value not in FALLBACKS:
        return [f"annotation {ANN_RESTORE_FALLBACK} of {what} is {value!r}, not one of {', '.join(FALLBACKS)}"]
    if value != FALLBACK_COLD_START:
        return []
    return [f"container {c.get('name')!r} of {what} is inert: annotation {ANN_RESTORE_FALLBACK} {FALLBACK_COLD_START} "
            f"needs the standby entrypoint ({STANDBY_ENV}={STANDBY_VALUE}) to start the app cold"
            for c in _dicts(spec.get("containers")) if _is_inert(c)]


def restore_mode(obj: Any) -> Dict[str, Any]:
    """How a Pod, pod template or workload restores: ``{"restore_from", "select", "policy", "fallback"}``.

    ``restore_from``: the pinned PodSnapshot (ours or the reference's annotation), else None; ``select``: the
    agent selects one at restore (``restore-select: "true"``) - a pod it pinned since has both; ``policy``:
    the ``restore-policy`` PodSnapshotPolicy of that selection; ``fallback``: ``none``, ``cold-start``, or None (the
    agent's own setting).
    A pod is a restore pod when ``restore_from`` is set or ``select`` is True (``is_restore_pod``).
    """
    annotations = restore_annotations(obj)[0]
    return {"restore_from": annotations.get(ANN_RESTORE_FROM),
            "select": str(annotations.get(ANN_RESTORE_SELECT, "")).strip().lower() == "true",
            "policy": annotations.get(ANN_RESTORE_POLICY),
            "fallback": annotations.get(ANN_RESTORE_FALLBACK)}


def is_restore_pod(obj: Any) -> bool:
    """Whether a Pod (or template) restores from a snapshot: pinned (restore-from) or selected at restore."""
    mode = restore_mode(obj)
    return mode["restore_from"] is not None or bool(mode["select"])


def _container_shortfalls(container: Dict[str, Any], what: str, profile: str) -> List[str]:
    """Every way one container of a restore pod falls short: conflicts, missing mount or env, neither inert nor
    in standby (its own entrypoint with ``SNAPSHOT_RESTORE_STANDBY`` true)."""
    name = container.get("name")
    problems, have_mount, have_env = _container_conflicts(container, what, profile)
    cwhat = f"container {name!r} of {what}"
    if not have_mount and not any(m.get("name") == CONTROL_VOLUME for m in _dicts(container.get("volumeMounts"))):
        problems.append(f"{cwhat} does not mount volume {CONTROL_VOLUME!r} at {CONTROL_MOUNT} (subPath {name!r})")
    if not have_env and not any(v.get("name") == CONTROL_ENV for v in _dicts(container.get("env"))):
        problems.append(f"{cwhat} has no env {CONTROL_ENV}={CONTROL_MOUNT}")
    standby = [] if _is_inert(container) else _standby_problems(container, cwhat)
    problems.extend(standby)
    form = entrypoint_form(container)
    if form is None and container.get("command") != INERT_COMMAND:
        problems.append(f"{cwhat} does not run the inert command {INERT_COMMAND!r}"
                        + ("" if standby else f" nor sets env {STANDBY_ENV}={STANDBY_VALUE} for a standby-aware entrypoint"))
    if form is None and container.get("args"):
        problems.append(f"{cwhat} has args; the inert placeholder takes none")
    return problems


def restore_destinations(pod: Dict[str, Any]) -> List[str]:
    """The containers a restore fills: the container map's destinations, else every container."""
    try:
        meta, spec, what = _pod_parts(pod)
    except ContractError:
        return []
    pairs, _problems = _map_annotation(contract_annotations(_annotations(meta), what)[0], what)
    return sorted({dst for _src, dst in pairs}) if pairs else [str(n) for n in _container_names(spec) if n]


def restore_condition(pod: Any) -> Optional[Dict[str, Any]]:
    """The pod's restore condition: ours (``Restored``), else the reference's (``nvidia.com/Restored``); None."""
    return get_condition(pod, RESTORE_CONDITION) or get_condition(pod, REF_RESTORE_CONDITION)


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
        return OUTCOME_PENDING
    status, reason = condition.get("status"), condition.get("reason")
    if status == "True":
        return OUTCOME_SUCCEEDED
    if status != "False":
        return OUTCOME_PENDING if (status, reason) == ("Unknown", REASON_IN_PROGRESS) else OUTCOME_UNKNOWN
    if reason in (REASON_FAILED, REASON_INCOMPATIBLE):
        return OUTCOME_FAILED
    if reason == REASON_PARTIAL:
        return OUTCOME_PARTIAL
    if reason == REASON_IN_PROGRESS:
        return OUTCOME_PENDING
    return OUTCOME_UNKNOWN


def result_outcome(result: str) -> str:
    """The outcome (``classify``) of a pod once the node's restore ``result`` (a key of ``RESULT_CONDITIONS``) is recorded."""
    status, reason = RESULT_CONDITIONS[result]
    return classify({"status": {"conditions": [{"type": RESTORE_CONDITION, "status": status, "reason": reason}]}})


def restore_losses(pod: Dict[str, Any]) -> List[str]:
    """Why the restore of ``pod`` is lost although its condition may not say so; [] when nothing is.

    The pod phase Failed; phase Succeeded without a succeeded restore (the placeholder exited); and, once a
    restore condition exists, each destination container (map destinations, else all) that is terminated
    now, or has restarted (restartCount > 0) unless its last termination finished before the condition's
    lastTransitionTime. A new pod is needed then: a restore is never replayed.
    """
    status = _mapping(pod.get("status"))
    phase = status.get("phase")
    if phase == "Failed":
        return ["the pod's phase is Failed"]
    if phase == "Succeeded":
        return [] if classify(pod) == OUTCOME_SUCCEEDED else ["the pod ended (phase Succeeded) without a restore"]
    condition = restore_condition(pod)
    if condition is None:
        return []
    started = _parse_time(condition.get("lastTransitionTime"))
    destinations = set(restore_destinations(pod))
    losses: List[str] = []
    for state in _dicts(status.get("containerStatuses")):
        name = state.get("name")
        if name not in destinations:
            continue
        if "terminated" in _mapping(state.get("state")):
            losses.append(f"container {name!r} is terminated")
        elif (state.get("restartCount") or 0) > 0:
            finished = _parse_time(_mapping(_mapping(state.get("lastState")).get("terminated")).get("finishedAt"))
            if not (started and finished and finished < started):
                losses.append(f"container {name!r} restarted ({state.get('restartCount')} times) after its restore began")
    return losses


def legacy_state(pod: Dict[str, Any]) -> str:
    """The deprecated ``state`` (one of ``LEGACY_STATES``): "failed" also when ``restore_losses`` finds any."""
    outcome = classify(pod)
    if outcome == OUTCOME_FAILED:
        return "failed"
    if outcome == OUTCOME_PARTIAL:
        return "partial"
    if restore_losses(pod):
        return "failed"
    return "succeeded" if outcome == OUTCOME_SUCCEEDED else "pending"


# --- conditions ---------------------------------------------------------------

def get_condition(obj: Any, type_: str) -> Optional[Dict[str, Any]]:
    """The condition of ``type_`` in an object's ``status.conditions`` (or a status, or a list); None if absent."""
    if isinstance(obj, list):
        conditions = obj
    elif isinstance(obj, dict) and "status" in obj and isinstance(obj.get("status"), dict):
        conditions = _items(obj["status"].get("conditions"))
    elif isinstance(obj, dict):
        conditions = _items(obj.get("conditions"))
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
    if _mapping(snapshot.get("metadata")).get("deletionTimestamp"):
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


# --- condensed pod-spec hash ------------------------------------------------------

def _prune(value: Any) -> Any:
    """Drop None, '', [] and {} recursively (the API omits them); list positions are kept."""
    if isinstance(value, dict):
        out = {k: _prune(v) for k, v in value.items()}
        out = {k: v for k, v in out.items() if v is not None}
        return out or None
    if isinstance(value, list):
        items = [_prune(v) for v in value]
        return items if items else None
    if value == "":
        return None
    return value


def _drop_defaults(value: Any) -> Any:
    """Apiserver defaults inside volume sources and lifecycle handlers."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if (key == "defaultMode" and item == 420) or (key == "readOnly" and item is False):
                continue
            if key == "fieldRef" and isinstance(item, dict) and item.get("apiVersion") == "v1":
                item = {k: v for k, v in item.items() if k != "apiVersion"}
            if key == "serviceAccountToken" and isinstance(item, dict) and item.get("expirationSeconds") == 3600:
                item = {k: v for k, v in item.items() if k != "expirationSeconds"}
            if key == "httpGet" and isinstance(item, dict) and item.get("scheme") == "HTTP":
                item = {k: v for k, v in item.items() if k != "scheme"}
            out[key] = _drop_defaults(item)
        return out
    if isinstance(value, list):
        return [_drop_defaults(v) for v in value]
    return value


def _is_contract_seccomp(profile: Any) -> bool:
    return (isinstance(profile, dict) and profile.get("type") == "Localhost"
            and posixpath.basename(str(profile.get("localhostProfile") or "")) == posixpath.basename(SECCOMP_PROFILE))


def _hidden_volumes(spec: Dict[str, Any]) -> Set[str]:
    """Volume names left out of the hash: the control volume and the injected service-account token."""
    hidden = {CONTROL_VOLUME}
    for volume in _items(spec.get("volumes")):
        if isinstance(volume, dict) and _SA_VOLUME_RE.match(str(volume.get("name"))) and "projected" in volume:
            hidden.add(volume["name"])
    return hidden


def _container_view(container: Dict[str, Any], hidden: Set[str], host_network: bool,
                    entrypoint: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    view: Dict[str, Any] = {field: copy.deepcopy(container.get(field)) for field in CONTAINER_FIELDS}
    if entrypoint is not None and _is_inert(container):
        view["command"] = copy.deepcopy(entrypoint.get("command"))
        view["args"] = copy.deepcopy(entrypoint.get("args"))
    mounts = []
    for mount in _items(view["volumeMounts"]):
        if not isinstance(mount, dict):
            mounts.append(mount)
            continue
        path = _norm_path(mount.get("mountPath"))
        if mount.get("name") in hidden and (mount.get("name") == CONTROL_VOLUME or path == _SA_MOUNT):
            continue
        if path == CONTROL_MOUNT:
            continue
        mounts.append({k: v for k, v in mount.items() if not (k == "readOnly" and v is False)})
    view["volumeMounts"] = mounts
    ports = []
    for port in _items(view["ports"]):
        if isinstance(port, dict):
            port = {k: v for k, v in port.items() if not (k == "protocol" and v == "TCP")}
            if host_network and port.get("hostPort") == port.get("containerPort"):
                port.pop("hostPort", None)
        ports.append(port)
    view["ports"] = ports
    view["lifecycle"] = _drop_defaults(view["lifecycle"])
    if view["terminationMessagePath"] == "/dev/termination-log":
        view["terminationMessagePath"] = None
    if view["terminationMessagePolicy"] == "File":
        view["terminationMessagePolicy"] = None
    for flag in ("stdin", "stdinOnce", "tty"):
        if view[flag] is False:
            view[flag] = None
    return {field: _prune(value) for field, value in view.items()}


def _pod_view(spec: Dict[str, Any], hidden: Set[str]) -> Dict[str, Any]:
    view: Dict[str, Any] = {field: copy.deepcopy(spec.get(field)) for field in POD_FIELDS}
    volumes: Dict[str, Any] = {}
    for volume in _items(spec.get("volumes")):
        if not isinstance(volume, dict) or volume.get("name") in hidden:
            continue
        source = {k: (_prune(_drop_defaults(v)) or {}) for k, v in volume.items() if k != "name" and v is not None}
        volumes[str(volume.get("name"))] = source or {"emptyDir": {}}
    view["volumes"] = volumes
    context = dict(_mapping(view["securityContext"]))
    if _is_contract_seccomp(context.get("seccompProfile")):
        context.pop("seccompProfile")
    view["securityContext"] = context
    defaults = {"dnsPolicy": "ClusterFirst", "hostNetwork": False, "hostPID": False, "hostIPC": False,
                "shareProcessNamespace": False, "hostUsers": True}
    for field, default in defaults.items():
        if view[field] == default:
            view[field] = None
    return {field: (value or None) if field == "volumes" else _prune(value) for field, value in view.items()}


def pod_spec_fields(pod_or_template: Dict[str, Any]) -> Dict[str, str]:
    """Field path -> sha256 of the canonical JSON of that field (the condensed pod spec, see the module docstring)."""
    meta, spec, _what = _pod_parts(pod_or_template)
    entrypoints, _problems = _entrypoint_annotation(_annotations(meta), "pod")
    hidden = _hidden_volumes(spec)
    host_network = spec.get("hostNetwork") is True
    fields: Dict[str, str] = {}
    for kind in ("containers", "initContainers"):
        seen: Set[str] = set()
        for index, container in enumerate(_items(spec.get(kind))):
            if not isinstance(container, dict):
                continue
            name = container.get("name")
            key = str(name) if name and str(name) not in seen else f"#{index}"
            seen.add(key)
            entry = entrypoints.get(str(name)) if kind == "containers" else None
            for field, value in _container_view(container, hidden, host_network, entry).items():
                fields[f"{kind}[{key}].{field}"] = _digest(value)
    for field, value in _pod_view(spec, hidden).items():
        fields[field] = _digest(value)
    labels = _mapping(meta.get("labels"))
    for label in HASHED_LABELS:
        value = labels.get(label)
        fields[f"labels[{label}]"] = _digest(None if value in (None, "") else str(value))
    return fields


def hash_fields(fields: Dict[str, str]) -> str:
    """The pod-spec hash of a field-digest map (as ``pod_spec_fields`` returns it)."""
    text = HASH_VERSION + "\n" + "".join(f"{path}={fields[path]}\n" for path in sorted(fields))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def pod_spec_hash(pod_or_template: Dict[str, Any]) -> str:
    """sha256 hex over the sorted ``path=digest`` lines of ``pod_spec_fields``."""
    return hash_fields(pod_spec_fields(pod_or_template))


def diff_fields(a: Dict[str, str], b: Dict[str, str]) -> List[str]:
    """Sorted field paths whose digests differ (a path present in one map only counts)."""
    return sorted(path for path in set(a) | set(b) if a.get(path) != b.get(path))


def describe_diff(pod_fields: Dict[str, str], snapshot_fields: Dict[str, str]) -> List[str]:
    """``diff_fields`` for people: a container present on one side only is one entry."""
    out: List[str] = []
    whole: Set[str] = set()
    for path in diff_fields(pod_fields, snapshot_fields):
        match = _CONTAINER_KEY_RE.match(path)
        if match:
            prefix = match.group(1)
            in_pod, in_snapshot = prefix + ".name" in pod_fields, prefix + ".name" in snapshot_fields
            if in_pod != in_snapshot:
                if prefix not in whole:
                    whole.add(prefix)
                    out.append(prefix + (" (only in the pod)" if in_pod else " (only in the snapshot)"))
                continue
        out.append(path)
    return out


# --- snapshot selection and binding ----------------------------------------------------

def _newness(snapshot: Dict[str, Any]) -> Tuple[float, float, str]:
    meta = _mapping(snapshot.get("metadata"))
    created = _parse_time(meta.get("creationTimestamp"))
    recorded = _parse_time(_mapping(snapshot.get("status")).get("createdAt")) or created
    return (recorded.timestamp() if recorded else float("-inf"), created.timestamp() if created else float("-inf"),
            str(meta.get("name") or ""))


def _names(snapshots: Sequence[Dict[str, Any]], limit: int = 5) -> str:
    refs = [object_ref(s, "") for s in snapshots]
    return ", ".join(refs[:limit]) + (f" and {len(refs) - limit} more" if len(refs) > limit else "")


def select_snapshot(snapshots: List[Dict[str, Any]], pod: Dict[str, Any], grouping_labels: Sequence[str] = (),
                    scope: str = SCOPE_WHOLE_POD, contents: Optional[Dict[str, Dict[str, Any]]] = None
                    ) -> Tuple[Optional[Dict[str, Any]], List[str]]:
    """The PodSnapshot to restore ``pod`` from, or (None, every reason none fits).

    A ``restore-from`` annotation pins the snapshot (used if Ready). Otherwise the
    newest (``status.createdAt``, then ``metadata.creationTimestamp``) Ready
    snapshot whose ``metadata.labels`` equal the pod's labels for each grouping
    label and whose ``status.podSpecHash`` equals the pod's hash (not compared
    when ``scope`` or the snapshot's ``spec.scope`` is rootfs-only). ``contents``
    (PodSnapshotContent by name) lets a mismatch name the differing fields of
    the nearest snapshot from ``status.podSpecFields``.
    """
    if scope not in SCOPES:
        raise ContractError(f"snapshot scope {scope!r} is not one of {', '.join(SCOPES)}")
    meta, _spec, what = _pod_parts(pod)
    namespace = meta.get("namespace")
    pool = [s for s in snapshots if isinstance(s, dict)
            and (namespace is None or _mapping(s.get("metadata")).get("namespace") in (None, namespace))]
    raw = _annotations(meta)
    annotations, conflicts = contract_annotations(raw, what)
    if conflicts:
        return None, conflicts
    pinned = annotations.get(ANN_RESTORE_FROM)
    where = f"namespace {namespace}" if namespace else "the given list"
    if pinned is not None:
        return _pinned(pool, pinned, what, where, _label(raw, ANN_RESTORE_FROM))
    if not pool:
        return None, [f"there is no PodSnapshot in {where}"]
    ready = [s for s in pool if is_ready(s)]
    not_ready = [s for s in pool if not is_ready(s)]
    pod_fields = pod_spec_fields(pod)
    matches, other_group, other_spec = _sort_ready(ready, _mapping(meta.get("labels")), hash_fields(pod_fields),
                                                   grouping_labels, scope)
    if matches:
        return max(matches, key=_newness), []
    reasons: List[str] = []
    if not_ready:
        reasons.append(f"{len(not_ready)} PodSnapshot(s) not Ready, ignored: {_names(not_ready)}")
    if not ready:
        reasons.append(f"no Ready PodSnapshot in {where}")
    if other_group:
        shown = other_group[:5] + ([f"{len(other_group) - 5} more"] if len(other_group) > 5 else [])
        reasons.append(f"{len(other_group)} Ready PodSnapshot(s) belong to another group: " + "; ".join(shown))
    if other_spec:
        reasons.append(f"{len(other_spec)} Ready PodSnapshot(s) of the pod's group were taken from another pod spec "
                       f"(podSpecHash differs from {hash_fields(pod_fields)[:12]})")
        reasons.append(_nearest(other_spec, pod_fields, contents or {}))
    return None, reasons


def _pinned(pool: List[Dict[str, Any]], pinned: Any, what: str, where: str, label: str
            ) -> Tuple[Optional[Dict[str, Any]], List[str]]:
    """The snapshot a restore-from annotation pins, if it exists and is Ready; else every reason."""
    found = [s for s in pool if _mapping(s.get("metadata")).get("name") == pinned]
    if not found:
        return None, [f"{what} is pinned to PodSnapshot {pinned!r} (annotation {label}), "
                      f"which does not exist in {where}"]
    problems = readiness_problems(found[0])
    if problems:
        return None, [f"{what} is pinned to PodSnapshot {pinned!r} (annotation {label}), which cannot be used"] + problems
    return found[0], []


def _sort_ready(ready: List[Dict[str, Any]], pod_labels: Dict[str, Any], pod_hash: str,
                grouping_labels: Sequence[str], scope: str
                ) -> Tuple[List[Dict[str, Any]], List[str], List[Dict[str, Any]]]:
    """Ready snapshots as (matches, other group (described), same group but another pod spec)."""
    matches: List[Dict[str, Any]] = []
    other_group: List[str] = []
    other_spec: List[Dict[str, Any]] = []
    for snapshot in ready:
        labels = _mapping(_mapping(snapshot.get("metadata")).get("labels"))
        differing = [key for key in grouping_labels if labels.get(key) != pod_labels.get(key)]
        if differing:
            other_group.append(object_ref(snapshot, "") + " (" + ", ".join(
                f"{key}={labels.get(key)!r}, pod has {pod_labels.get(key)!r}" for key in differing) + ")")
        elif scope == SCOPE_ROOTFS_ONLY or _mapping(snapshot.get("spec")).get("scope") == SCOPE_ROOTFS_ONLY:
            matches.append(snapshot)
        elif _mapping(snapshot.get("status")).get("podSpecHash") == pod_hash:
            matches.append(snapshot)
        else:
            other_spec.append(snapshot)
    return matches, other_group, other_spec


def _nearest(candidates: List[Dict[str, Any]], pod_fields: Dict[str, str], contents: Dict[str, Dict[str, Any]]) -> str:
    ranked: List[Tuple[int, Tuple[float, float, str], Dict[str, Any], List[str]]] = []
    for snapshot in candidates:
        bound = _mapping(snapshot.get("status")).get("boundSnapshotContentName")
        fields = _mapping(_mapping(_mapping(contents.get(bound) if bound else None).get("status")).get("podSpecFields"))
        if fields:
            diff = describe_diff(pod_fields, {str(k): str(v) for k, v in fields.items()})
            ranked.append((len(diff), _newness(snapshot), snapshot, diff))
    if ranked:
        best = min(ranked, key=lambda item: (item[0], -item[1][0], -item[1][1]))
        if not best[3]:
            return f"nearest PodSnapshot {object_ref(best[2], '')} has the same field digests but another podSpecHash"
        return f"nearest PodSnapshot {object_ref(best[2], '')} differs in {', '.join(best[3])}"
    newest = max(candidates, key=_newness)
    recorded = _mapping(newest.get("status")).get("podSpecHash")
    return (f"newest PodSnapshot {object_ref(newest, '')} has podSpecHash {str(recorded)[:12] if recorded else 'none'}; "
            "the fields that differ are unknown without its PodSnapshotContent's status.podSpecFields")


def check_pod_spec(snapshot: Dict[str, Any], pod: Dict[str, Any], content: Optional[Dict[str, Any]] = None) -> List[str]:
    """Why ``pod`` (a restore pod, typically pinned) does not match the source pod of ``snapshot``; [] when it does.

    Not checked (returns []) when the pod carries ``snapshot-skip-compat-check: "true"`` (ours or the
    reference's name) or the snapshot's scope is rootfs-only; annotations that disagree with their alias are
    the reasons then. Without a container map (or an
    identity map) the pod's hash must equal ``status.podSpecHash``; with one,
    each destination ``containers[dst].*`` is compared with ``containers[src].*``
    of the content's ``status.podSpecFields`` (needed then), pod-level fields and
    init containers as they are. ``content`` also lets the reason name the fields.
    """
    meta, _spec, what = _pod_parts(pod)
    raw = _annotations(meta)
    annotations, conflicts = contract_annotations(raw, what)
    if conflicts:
        return conflicts
    if skips_compat_check(annotations):
        return []
    if _mapping(snapshot.get("spec")).get("scope") == SCOPE_ROOTFS_ONLY:
        return []
    ref = object_ref(snapshot, KIND_SNAPSHOT)
    pairs, problems = _map_annotation(annotations, what, _label(raw, ANN_CONTAINER_MAP))
    if problems:
        return problems
    recorded = _mapping(_mapping(content).get("status")).get("podSpecFields") if content else None
    snapshot_fields = {str(k): str(v) for k, v in recorded.items()} if isinstance(recorded, dict) else {}
    pod_fields = pod_spec_fields(pod)
    if any(src != dst for src, dst in pairs):
        if not snapshot_fields:
            return [f"{what} maps containers ({format_container_map(pairs)}): comparing its spec with {ref} needs "
                    f"the PodSnapshotContent's status.podSpecFields"]
        differing = [path for path in sorted(set(pod_fields) | set(snapshot_fields))
                     if not path.startswith("containers[") and pod_fields.get(path) != snapshot_fields.get(path)]
        for src, dst in pairs:
            for field in CONTAINER_FIELDS[1:]:
                mine, theirs = f"containers[{dst}].{field}", f"containers[{src}].{field}"
                if theirs not in snapshot_fields:
                    differing.append(f"containers[{src}] (not in the snapshot)")
                    break
                if pod_fields.get(mine) != snapshot_fields[theirs]:
                    differing.append(f"{mine} (from {src})")
        if not differing:
            return []
        return [f"{what} does not match the pod spec of {ref}: differs in {', '.join(differing)}"]
    pod_hash = hash_fields(pod_fields)
    snapshot_hash = _mapping(snapshot.get("status")).get("podSpecHash")
    if pod_hash == snapshot_hash:
        return []
    if not snapshot_hash:
        return [f"{ref} records no podSpecHash to compare {what} with"]
    if snapshot_fields:
        diff = describe_diff(pod_fields, snapshot_fields)
        detail = "differs in " + ", ".join(diff) if diff else "has the same field digests but another podSpecHash"
    else:
        detail = f"podSpecHash {pod_hash[:12]} differs from {snapshot_hash[:12]}"
    return [f"{what} does not match the pod spec of {ref}: {detail} "
            f"(annotation {ANN_SKIP_COMPAT}: \"true\" skips this check)"]


def check_content_binding(snapshot: Dict[str, Any], content: Dict[str, Any]) -> List[str]:
    """Reasons to refuse restoring from ``snapshot`` through ``content``; [] when they belong together and are usable."""
    ref = object_ref(snapshot, KIND_SNAPSHOT)
    meta = _mapping(snapshot.get("metadata"))
    content_name = _mapping(content.get("metadata")).get("name")
    cref = f"{KIND_CONTENT} {content_name}"
    backlink = _mapping(_mapping(content.get("spec")).get("snapshotRef"))
    reasons = []
    for key in ("namespace", "name", "uid"):
        if backlink.get(key) != meta.get(key):
            note = " (the PodSnapshot was deleted and created again?)" if key == "uid" else ""
            reasons.append(f"{cref} points back to {key} {backlink.get(key)!r}, but {ref} has {key} {meta.get(key)!r}{note}")
    bound = _mapping(snapshot.get("status")).get("boundSnapshotContentName")
    if not bound:
        reasons.append(f"{ref} is not bound to any {KIND_CONTENT}")
    elif bound != content_name:
        reasons.append(f"{ref} is bound to {KIND_CONTENT} {bound!r}, not to {content_name!r}")
    reasons.extend(readiness_problems(snapshot))
    if _mapping(content.get("metadata")).get("deletionTimestamp"):
        reasons.append(f"{cref} is being deleted")
    failed = get_condition(content, FAILED_CONDITION)
    if failed and failed.get("status") == "True":
        reasons.append(f"{cref} has failed ({failed.get('reason')}: {failed.get('message')})")
    return reasons
