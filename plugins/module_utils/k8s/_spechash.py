# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The condensed pod-spec hash: which fields of a pod spec must match for a snapshot to restore into a pod.

Pure functions over plain dicts in the Kubernetes JSON shape (camelCase keys,
as the API returns them); nothing here talks to a cluster. Stdlib only.
``_selection`` compares the hashes (and names the differing fields) when it
selects a snapshot or checks a pinned one.

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
import hashlib
import posixpath
import re
from typing import Any, Dict, List, Optional, Set

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc

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

_SA_VOLUME_RE = re.compile(r"^kube-api-access-[a-z0-9]{5}$")
_SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
_CONTAINER_KEY_RE = re.compile(r"^((?:init)?[cC]ontainers\[[^\]]*\])\.")


def _digest(value: Any) -> str:
    return hashlib.sha256(podapi.canonical(value).encode("utf-8")).hexdigest()


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
            and posixpath.basename(str(profile.get("localhostProfile") or "")) == posixpath.basename(podapi.SECCOMP_PROFILE))


def _hidden_volumes(spec: Dict[str, Any]) -> Set[str]:
    """Volume names left out of the hash: the control volume and the injected service-account token."""
    hidden = {podapi.CONTROL_VOLUME}
    for volume in podapi.as_list(spec.get("volumes")):
        if isinstance(volume, dict) and _SA_VOLUME_RE.match(str(volume.get("name"))) and "projected" in volume:
            hidden.add(volume["name"])
    return hidden


def _container_view(container: Dict[str, Any], hidden: Set[str], host_network: bool,
                    entrypoint: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    view: Dict[str, Any] = {field: copy.deepcopy(container.get(field)) for field in CONTAINER_FIELDS}
    if entrypoint is not None and pc.is_inert(container):
        view["command"] = copy.deepcopy(entrypoint.get("command"))
        view["args"] = copy.deepcopy(entrypoint.get("args"))
    mounts = []
    for mount in podapi.as_list(view["volumeMounts"]):
        if not isinstance(mount, dict):
            mounts.append(mount)
            continue
        path = podapi.norm_path(mount.get("mountPath"))
        if mount.get("name") in hidden and (mount.get("name") == podapi.CONTROL_VOLUME or path == _SA_MOUNT):
            continue
        if path == podapi.CONTROL_MOUNT:
            continue
        mounts.append({k: v for k, v in mount.items() if not (k == "readOnly" and v is False)})
    view["volumeMounts"] = mounts
    ports = []
    for port in podapi.as_list(view["ports"]):
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
    for volume in podapi.as_list(spec.get("volumes")):
        if not isinstance(volume, dict) or volume.get("name") in hidden:
            continue
        source = {k: (_prune(_drop_defaults(v)) or {}) for k, v in volume.items() if k != "name" and v is not None}
        volumes[str(volume.get("name"))] = source or {"emptyDir": {}}
    view["volumes"] = volumes
    context = dict(podapi.as_dict(view["securityContext"]))
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
    meta, spec, _what = podapi.pod_parts(pod_or_template)
    entrypoints, _problems = pc.entrypoint_annotation(pc.annotations_of(meta), "pod")
    hidden = _hidden_volumes(spec)
    host_network = spec.get("hostNetwork") is True
    fields: Dict[str, str] = {}
    for kind in ("containers", "initContainers"):
        seen: Set[str] = set()
        for index, container in enumerate(podapi.as_list(spec.get(kind))):
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
    labels = podapi.as_dict(meta.get("labels"))
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
