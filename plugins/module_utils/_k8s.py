# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Kubernetes API access for the pod_snapshot, restore_pod and k8s_crds modules.

``connect(params)`` builds a ``kubernetes`` ``ApiClient`` from the module's auth
options (kubeconfig / context / host / api_key / validate_certs / ca_cert, with
the K8S_AUTH_* environment fallbacks of kubernetes.core; default
``~/.kube/config``, then the in-cluster service account). ``Cluster`` sends
plain JSON through that client (its auth, TLS and proxy settings) and returns
plain dicts in the API's own shape, so that ``_podcontract`` sees exactly what
the API server stored. Every failure is a ``K8sError`` naming the object and
the cause (``PodSnapshot default/embed-1 not found``, ``API server https://...
unreachable: ...``). Credentials are never put into a message.

The engine of the modules is here too: ``ensure_pod_snapshot`` /
``delete_pod_snapshot`` (PodSnapshot + PodSnapshotContent records, bound and
with conditions), ``apply_crd`` / ``delete_crd``, ``select_for_pod`` and
``create_restore_pods``.
"""
from __future__ import annotations

import copy
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils import _podcontract as pc
from ansible_collections.warmstart.snapshot.plugins.module_utils._errors import WarmstartError

JSON = Dict[str, Any]

AUTH_ENV = {
    "kubeconfig": "K8S_AUTH_KUBECONFIG",
    "context": "K8S_AUTH_CONTEXT",
    "host": "K8S_AUTH_HOST",
    "api_key": "K8S_AUTH_API_KEY",
    "validate_certs": "K8S_AUTH_VERIFY_SSL",
    "ca_cert": "K8S_AUTH_SSL_CA_CERT",
}
DEFAULT_KUBECONFIG = "~/.kube/config"

CORE = ("", "v1")
CRD_API = ("apiextensions.k8s.io", "v1", "customresourcedefinitions")
# kind -> (plural, namespaced)
KINDS: Dict[str, Tuple[str, bool]] = {
    pc.KIND_SNAPSHOT: ("podsnapshots", True),
    pc.KIND_CONTENT: ("podsnapshotcontents", False),
    pc.KIND_POLICY: ("podsnapshotpolicies", True),
    "Pod": ("pods", True),
}
LABEL_SNAPSHOT_NAMESPACE = pc.GROUP + "/snapshot-namespace"
LABEL_SNAPSHOT_NAME = pc.GROUP + "/snapshot-name"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
RETRIES = 5


class K8sError(WarmstartError):
    """An API call that failed: ``what`` names the object, ``status``/``reason`` come from the API's Status."""

    def __init__(self, message: str, what: str = "", status: Optional[int] = None, reason: str = "",
                 reasons: Optional[Sequence[str]] = None) -> None:
        super().__init__(message, reasons)
        self.what, self.status, self.reason = what, status, reason

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


def auth_argument_spec() -> JSON:
    """The auth options, as the doc fragment warmstart.snapshot.k8s_auth documents them."""
    return dict(
        kubeconfig=dict(type="path"),
        context=dict(type="str"),
        host=dict(type="str"),
        api_key=dict(type="str", no_log=True),
        validate_certs=dict(type="bool", aliases=["verify_ssl"]),
        ca_cert=dict(type="path", aliases=["ssl_ca_cert"]),
        request_timeout=dict(type="int", default=30),
    )


def _kubernetes() -> Any:
    try:
        import kubernetes  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise K8sError(
            f"the Python library kubernetes is not installed for {sys.executable}, the interpreter this module runs "
            "with: install it there (python3 -m pip install kubernetes) or point ansible_python_interpreter at an "
            "interpreter that has it") from None
    return kubernetes


def _setting(params: JSON, key: str) -> Any:
    value = params.get(key)
    if value is None:
        value = os.environ.get(AUTH_ENV[key]) or None
        if value is not None and key == "validate_certs":
            value = str(value).strip().lower() in ("1", "true", "yes", "on")
    return value


def connect(params: JSON) -> Any:
    """A kubernetes ``ApiClient`` for the module's auth options (see the module docstring for the order)."""
    kubernetes = _kubernetes()
    from kubernetes.config.config_exception import ConfigException  # pylint: disable=import-outside-toplevel

    kubeconfig = _setting(params, "kubeconfig")
    context = _setting(params, "context")
    host = _setting(params, "host")
    api_key = _setting(params, "api_key")
    validate_certs = _setting(params, "validate_certs")
    ca_cert = _setting(params, "ca_cert")
    conf = kubernetes.client.Configuration()
    if kubeconfig or not host:
        path = os.path.expanduser(kubeconfig or DEFAULT_KUBECONFIG)
        if os.path.exists(path):
            try:
                kubernetes.config.load_kube_config(config_file=path, context=context, client_configuration=conf,
                                                   persist_config=False)
            except (ConfigException, ValueError, KeyError, TypeError) as exc:
                raise K8sError(f"kubeconfig {path}{' context ' + context if context else ''} cannot be used: "
                               f"{exc}") from None
        elif kubeconfig:
            raise K8sError(f"kubeconfig {path} does not exist")
        elif not host:
            try:
                kubernetes.config.load_incluster_config(client_configuration=conf)
            except ConfigException as exc:
                raise K8sError(f"no kubeconfig at {path} and not running in a cluster ({exc}): set kubeconfig or "
                               "host (or K8S_AUTH_KUBECONFIG / K8S_AUTH_HOST)") from None
    if host:
        conf.host = host.rstrip("/")
    if api_key:
        conf.api_key = {"BearerToken": api_key if api_key.lower().startswith("bearer ") else f"Bearer {api_key}"}
    if validate_certs is not None:
        conf.verify_ssl = bool(validate_certs)
    if ca_cert:
        conf.ssl_ca_cert = ca_cert
    conf.retries = 1
    return kubernetes.client.ApiClient(configuration=conf)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def ref(kind: str, name: str, namespace: Optional[str] = None) -> str:
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


def _status_message(body: Any) -> Tuple[str, str]:
    try:
        doc = json.loads(body) if isinstance(body, (str, bytes)) else body
    except ValueError:
        return str(body or "").strip()[:500], ""
    if isinstance(doc, dict):
        return str(doc.get("message") or ""), str(doc.get("reason") or "")
    return "", ""


class Cluster:
    """Plain-JSON requests to one API server through a kubernetes ``ApiClient``."""

    def __init__(self, api_client: Any, request_timeout: Optional[int] = 30) -> None:
        self.client = api_client
        self.host = api_client.configuration.host
        self.timeout = request_timeout

    # transport -----------------------------------------------------------------

    def request(self, method: str, path: str, what: str, body: Any = None, query: Optional[Dict[str, Any]] = None,
                content_type: Optional[str] = None) -> Any:
        from kubernetes.client.exceptions import ApiException  # pylint: disable=import-outside-toplevel
        import urllib3  # pylint: disable=import-outside-toplevel

        headers = {"Accept": "application/json", "Content-Type": content_type or "application/json"}
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        try:
            req = self.client.param_serialize(method, path, query_params=params, header_params=headers, body=body,
                                              auth_settings=["BearerToken"])
            resp = self.client.call_api(*req, _request_timeout=self.timeout)
            resp.read()
            if not 200 <= resp.status <= 299:
                raise ApiException(http_resp=resp)
            return json.loads(resp.data) if resp.data else None
        except ApiException as exc:
            message, reason = _status_message(exc.body)
            code = exc.status
            if code == 404 and reason == "NotFound" and what:
                text = f"{what} not found"
            elif code == 401:
                text = f"{what}: the API server {self.host} refused the credentials (401 Unauthorized)"
            elif code == 403:
                text = f"{what}: forbidden ({message or 'no permission'})"
            else:
                text = f"{what}: {message or exc.reason} ({code} {reason or exc.reason})"
            raise K8sError(text, what, code, reason) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            cause = getattr(exc, "reason", None) or exc
            raise K8sError(f"API server {self.host} unreachable: {cause}", what) from None

    # paths ---------------------------------------------------------------------

    @staticmethod
    def path(kind: str, namespace: Optional[str] = None, name: Optional[str] = None, status: bool = False) -> str:
        plural, namespaced = KINDS[kind]
        base = "/api/v1" if kind == "Pod" else f"/apis/{pc.GROUP}/{pc.VERSION}"
        out = base + (f"/namespaces/{namespace}" if namespaced and namespace else "") + f"/{plural}"
        if name:
            out += f"/{name}" + ("/status" if status else "")
        return out

    @staticmethod
    def _ns(kind: str, namespace: Optional[str]) -> Optional[str]:
        return namespace if KINDS[kind][1] else None

    # generic verbs over KINDS ----------------------------------------------------------

    def get(self, kind: str, name: str, namespace: Optional[str] = None) -> JSON:
        ns = self._ns(kind, namespace)
        return self.request("GET", self.path(kind, ns, name), ref(kind, name, ns))

    def find(self, kind: str, name: str, namespace: Optional[str] = None) -> Optional[JSON]:
        """``get``, or None when it does not exist."""
        try:
            return self.get(kind, name, namespace)
        except K8sError as exc:
            if exc.not_found:
                return None
            raise

    def list(self, kind: str, namespace: Optional[str] = None, label_selector: Optional[str] = None,
             field_selector: Optional[str] = None) -> List[JSON]:
        ns = self._ns(kind, namespace)
        what = f"{kind} list" + (f" in namespace {ns}" if ns else "")
        doc = self.request("GET", self.path(kind, ns), what,
                           query={"labelSelector": label_selector or None, "fieldSelector": field_selector or None})
        return list(doc.get("items") or [])

    def create(self, kind: str, body: JSON, namespace: Optional[str] = None, dry_run: bool = False) -> JSON:
        ns = self._ns(kind, namespace)
        meta = body.get("metadata") or {}
        name = meta.get("name") or (str(meta.get("generateName", "")) + "*")
        return self.request("POST", self.path(kind, ns), ref(kind, name, ns), body=body,
                            query={"dryRun": "All" if dry_run else None})

    def patch(self, kind: str, name: str, patch: Any, namespace: Optional[str] = None, status: bool = False,
              content_type: str = MERGE_PATCH) -> JSON:
        ns = self._ns(kind, namespace)
        what = ref(kind, name, ns) + (" status" if status else "")
        return self.request("PATCH", self.path(kind, ns, name, status), what, body=patch, content_type=content_type)

    def patch_status(self, kind: str, name: str, status: JSON, namespace: Optional[str] = None,
                     resource_version: Optional[str] = None) -> JSON:
        """Merge ``status`` into the object's status (through the status subresource)."""
        patch: JSON = {"status": status}
        if resource_version:
            patch["metadata"] = {"resourceVersion": resource_version}
        return self.patch(kind, name, patch, namespace, status=True)

    def delete(self, kind: str, name: str, namespace: Optional[str] = None, uid: Optional[str] = None) -> Any:
        """Delete; with ``uid`` only that incarnation of the object (409 Conflict for another one)."""
        ns = self._ns(kind, namespace)
        body: JSON = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        return self.request("DELETE", self.path(kind, ns, name), ref(kind, name, ns), body=body)

    # pods ------------------------------------------------------------------------

    def get_pod(self, namespace: str, name: str) -> JSON:
        return self.get("Pod", name, namespace)

    def list_pods(self, namespace: Optional[str], label_selector: Optional[str] = None,
                  field_selector: Optional[str] = None) -> List[JSON]:
        return self.list("Pod", namespace, label_selector, field_selector)

    def create_pod(self, namespace: str, body: JSON, dry_run: bool = False) -> JSON:
        return self.create("Pod", body, namespace, dry_run)

    def delete_pod(self, namespace: str, name: str, uid: Optional[str] = None) -> Any:
        return self.delete("Pod", name, namespace, uid)

    def set_pod_condition(self, namespace: str, name: str, type_: str, status: Any, reason: str, message: str,
                          check_mode: bool = False) -> Tuple[bool, JSON]:
        """Set one condition in the pod's status.conditions (status subresource); ``(changed, pod)``.

        The whole list is sent with the resourceVersion it was computed from; a concurrent change (409) is
        read again and retried.
        """
        for _attempt in range(RETRIES):
            pod = self.get_pod(namespace, name)
            conditions = (pod.get("status") or {}).get("conditions") or []
            new = pc.set_condition(conditions, type_, status, reason, message, now())
            if new == conditions:
                return False, pod
            if check_mode:
                return True, pod
            try:
                return True, self.patch_status("Pod", name, {"conditions": new}, namespace,
                                               pod["metadata"]["resourceVersion"])
            except K8sError as exc:
                if not exc.conflict:
                    raise
        raise K8sError(f"{ref('Pod', name, namespace)}: condition {type_} not set: the pod kept changing", "Pod")

    # finalizers --------------------------------------------------------------------

    def add_finalizer(self, kind: str, name: str, finalizer: str, namespace: Optional[str] = None,
                      check_mode: bool = False) -> bool:
        """Add ``finalizer`` (JSON patch guarded by a test of the list); True if it was not there."""
        for _attempt in range(RETRIES):
            obj = self.get(kind, name, namespace)
            current = list((obj.get("metadata") or {}).get("finalizers") or [])
            if finalizer in current:
                return False
            if check_mode:
                return True
            if current:
                ops = [{"op": "test", "path": "/metadata/finalizers", "value": current},
                       {"op": "add", "path": "/metadata/finalizers/-", "value": finalizer}]
            else:
                ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": obj["metadata"]["resourceVersion"]},
                       {"op": "add", "path": "/metadata/finalizers", "value": [finalizer]}]
            try:
                self.patch(kind, name, ops, namespace, content_type=JSON_PATCH)
                return True
            except K8sError as exc:
                if exc.status not in (409, 422):
                    raise
        raise K8sError(f"{ref(kind, name, self._ns(kind, namespace))}: finalizer {finalizer} not added: the object "
                       "kept changing", kind)

    def remove_finalizer(self, kind: str, name: str, finalizer: str, namespace: Optional[str] = None,
                         check_mode: bool = False) -> bool:
        """Remove ``finalizer``; True if it was there. An object already gone counts as done (False)."""
        for _attempt in range(RETRIES):
            obj = self.find(kind, name, namespace)
            if obj is None:
                return False
            current = list((obj.get("metadata") or {}).get("finalizers") or [])
            if finalizer not in current:
                return False
            if check_mode:
                return True
            index = current.index(finalizer)
            ops = [{"op": "test", "path": f"/metadata/finalizers/{index}", "value": finalizer},
                   {"op": "remove", "path": f"/metadata/finalizers/{index}"}]
            try:
                self.patch(kind, name, ops, namespace, content_type=JSON_PATCH)
                return True
            except K8sError as exc:
                if exc.not_found:
                    return True
                if exc.status not in (409, 422):
                    raise
        raise K8sError(f"{ref(kind, name, self._ns(kind, namespace))}: finalizer {finalizer} not removed: the "
                       "object kept changing", kind)

    # CRDs ----------------------------------------------------------------------------

    def _crd_path(self, name: Optional[str] = None) -> str:
        group, version, plural = CRD_API
        return f"/apis/{group}/{version}/{plural}" + (f"/{name}" if name else "")

    def get_crd(self, name: str) -> Optional[JSON]:
        try:
            return self.request("GET", self._crd_path(name), ref("CustomResourceDefinition", name))
        except K8sError as exc:
            if exc.not_found:
                return None
            raise

    def apply_crd(self, definition: JSON, check_mode: bool = False) -> Tuple[str, Optional[JSON], JSON]:
        """Create or update one CRD: ``(action, before, after)``, action created / updated / unchanged.

        Unchanged when every field of the definition's spec (and its labels and annotations) already has that
        value on the server (server-side defaults are not differences).
        """
        name = (definition.get("metadata") or {}).get("name")
        if not name:
            raise K8sError("a CRD definition has no metadata.name", "CustomResourceDefinition")
        what = ref("CustomResourceDefinition", name)
        for _attempt in range(RETRIES):
            before = self.get_crd(name)
            if before is None:
                if check_mode:
                    return "created", None, definition
                try:
                    return "created", None, self.request("POST", self._crd_path(), what, body=definition)
                except K8sError as exc:
                    if exc.status == 409:
                        continue
                    raise
            if crd_up_to_date(definition, before):
                return "unchanged", before, before
            desired = copy.deepcopy(definition)
            meta = copy.deepcopy(before.get("metadata") or {})
            for key in ("labels", "annotations"):
                if (definition.get("metadata") or {}).get(key):
                    meta[key] = dict(meta.get(key) or {}, **definition["metadata"][key])
            desired["metadata"] = meta
            desired.setdefault("apiVersion", "apiextensions.k8s.io/v1")
            desired.setdefault("kind", "CustomResourceDefinition")
            if check_mode:
                return "updated", before, desired
            try:
                return "updated", before, self.request("PUT", self._crd_path(name), what, body=desired)
            except K8sError as exc:
                if not exc.conflict:
                    raise
        raise K8sError(f"{what}: not applied: it kept changing", "CustomResourceDefinition")

    def delete_crd(self, name: str, check_mode: bool = False) -> bool:
        if self.get_crd(name) is None:
            return False
        if not check_mode:
            try:
                self.request("DELETE", self._crd_path(name), ref("CustomResourceDefinition", name))
            except K8sError as exc:
                if not exc.not_found:
                    raise
        return True

    def wait_established(self, name: str, timeout: float) -> JSON:
        deadline = time.monotonic() + timeout
        while True:
            crd = self.get_crd(name)
            if crd is not None and (pc.get_condition(crd, "Established") or {}).get("status") == "True":
                return crd
            if time.monotonic() >= deadline:
                raise K8sError(f"{ref('CustomResourceDefinition', name)} is not Established after {timeout:g} s",
                               "CustomResourceDefinition")
            time.sleep(0.5)


def _subset(want: Any, have: Any) -> bool:
    """Every value of ``want`` is in ``have`` (dicts recursively; lists element-wise, same length)."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(_subset(v, have.get(k)) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(_subset(w, h) for w, h in zip(want, have))
    return want == have


def crd_up_to_date(definition: JSON, current: JSON) -> bool:
    meta_want = definition.get("metadata") or {}
    meta_have = current.get("metadata") or {}
    return (_subset(definition.get("spec") or {}, current.get("spec") or {})
            and _subset(meta_want.get("labels") or {}, meta_have.get("labels") or {})
            and _subset(meta_want.get("annotations") or {}, meta_have.get("annotations") or {}))


# --- PodSnapshot + PodSnapshotContent ------------------------------------------------

def content_name_for(namespace: str, name: str, uid: str) -> str:
    """``<namespace>-<name>-<uid[:8]>``: one content per incarnation of a PodSnapshot."""
    return f"{namespace}-{name}-{uid.replace('-', '')[:8]}"[:253].strip("-.")


def _clean(value: Any) -> Any:
    """Drop None values (recursively) so that a record never carries nulls."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def source_status(source_node: Optional[JSON], pod: JSON, containers: Sequence[str], node_name: Optional[str]
                  ) -> JSON:
    """PodSnapshotContent ``status.source`` from a manifest's ``source`` section (or camelCase keys) and the pod."""
    src = dict(source_node or {})
    gpu = src.get("gpu") if isinstance(src.get("gpu"), dict) else {}
    models = src.get("gpu_models", src.get("gpuModels", gpu.get("models")))
    if models is None and isinstance(src.get("gpus"), list):
        models = [g.get("name") or g.get("model") if isinstance(g, dict) else g for g in src["gpus"]]
    spec_containers = {c.get("name"): c for c in (pod.get("spec") or {}).get("containers") or []}
    statuses = {c.get("name"): c for c in (pod.get("status") or {}).get("containerStatuses") or []}
    first = containers[0] if containers else next(iter(spec_containers), None)
    out = {
        "nodeName": node_name or src.get("hostname") or src.get("nodeName"),
        "arch": src.get("arch"),
        "kernel": src.get("kernel"),
        "cpuHash": src.get("cpu_flags_hash", src.get("cpuHash")),
        "cpuVendor": src.get("cpu_vendor", src.get("cpuVendor")),
        "image": (spec_containers.get(first) or {}).get("image") or (statuses.get(first) or {}).get("image"),
        "imageId": (statuses.get(first) or {}).get("imageID") or None,
        "gpuDriver": src.get("gpu_driver", src.get("gpuDriver", gpu.get("driver") or gpu.get("driver_version"))),
        "gpuModels": [str(m) for m in models if m] if isinstance(models, list) else None,
    }
    return _clean(out)


def _conditions(current: List[JSON], ready: bool, failed_reason: Optional[str], failed_message: Optional[str],
                ready_reason: Optional[str], ready_message: Optional[str], stamp: str) -> List[JSON]:
    if ready:
        conds = pc.set_condition(current, pc.READY_CONDITION, True, ready_reason or "SnapshotReady",
                                 ready_message or "the snapshot is stored and can be restored from", stamp)
        return pc.set_condition(conds, pc.FAILED_CONDITION, False, "NoFailure", "", stamp)
    if failed_reason:
        conds = pc.set_condition(current, pc.READY_CONDITION, False, failed_reason, failed_message or failed_reason,
                                 stamp)
        return pc.set_condition(conds, pc.FAILED_CONDITION, True, failed_reason, failed_message or failed_reason,
                                stamp)
    conds = pc.set_condition(current, pc.READY_CONDITION, False, ready_reason or "SnapshotInProgress",
                             ready_message or "the snapshot is being taken", stamp)
    return pc.set_condition(conds, pc.FAILED_CONDITION, False, "NoFailure", "", stamp)


def _status_changes(current: JSON, desired: JSON) -> JSON:
    """The keys of ``desired`` whose value differs from ``current``."""
    return {k: v for k, v in desired.items() if current.get(k) != v}


def _check_backlink(content: JSON, namespace: str, name: str, uid: Optional[str], sref: str) -> None:
    """Refuse a content whose spec.snapshotRef is not this PodSnapshot (namespace, name and uid)."""
    cref = ref(pc.KIND_CONTENT, content["metadata"]["name"])
    backlink = (content.get("spec") or {}).get("snapshotRef") or {}
    have = {"namespace": namespace, "name": name, "uid": uid}
    problems = []
    for key in ("namespace", "name", "uid"):
        if backlink.get(key) == have[key]:
            continue
        if key == "uid" and have["uid"] is None:
            problems.append(f"{cref} points back to uid {backlink.get('uid')!r}, but {sref} does not exist any more "
                            "(it was deleted; a new one would have another uid)")
        else:
            problems.append(f"{cref} points back to {key} {backlink.get(key)!r}, but {sref} has {key} {have[key]!r}"
                            + (" (the PodSnapshot was deleted and created again)" if key == "uid" else ""))
    if problems:
        raise K8sError(f"{cref} belongs to another PodSnapshot: refusing to bind it to {sref}", cref,
                       reasons=problems)


def ensure_pod_snapshot(cluster: Cluster, p: JSON, check_mode: bool = False) -> JSON:
    """``state: present`` of pod_snapshot: the PodSnapshot, its PodSnapshotContent, bound, with conditions.

    ``p`` holds the module options (namespace, name, source_pod, containers, scope, policy_name, labels,
    content_name, store, node, source_node, size, created_at, ready, failed_reason, failed_message).
    Returns ``{"changed", "actions", "snapshot", "content", "warnings"}``; raises K8sError with every reason
    when the records cannot be made to agree.
    """
    ns, name = p["namespace"], p["name"]
    sref = ref(pc.KIND_SNAPSHOT, name, ns)
    actions: List[str] = []
    warnings: List[str] = []
    stamp = now()
    pod = cluster.get_pod(ns, p["source_pod"])
    pod_containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
    wanted = list(p.get("containers") or [])
    unknown = [c for c in wanted if c not in pod_containers]
    if unknown:
        raise K8sError(f"{sref}: Pod {ns}/{p['source_pod']} has no container {', '.join(map(repr, unknown))} "
                       f"(it has {', '.join(pod_containers)})", "Pod")
    if p.get("ready") and not p.get("store"):
        raise K8sError(f"{sref}: a Ready snapshot needs store (url and snapshot_id of the artifact)", sref)
    pod_uid = pod["metadata"]["uid"]
    spec: JSON = {"source": {"podRef": {"name": p["source_pod"], "uid": pod_uid}}, "scope": p.get("scope") or
                  pc.SCOPE_WHOLE_POD}
    if wanted:
        spec["source"]["containers"] = wanted
    if p.get("policy_name"):
        spec["policyName"] = p["policy_name"]
    labels = dict(p["labels"]) if p.get("labels") is not None else dict(pod["metadata"].get("labels") or {})

    snapshot = cluster.find(pc.KIND_SNAPSHOT, name, ns)
    if p.get("content_name") and p.get("store"):
        # a named content is checked before anything is created: it must not belong to another PodSnapshot
        # (or to an earlier one of this name, deleted since)
        early = cluster.find(pc.KIND_CONTENT, p["content_name"])
        if early is not None:
            _check_backlink(early, ns, name, (snapshot or {}).get("metadata", {}).get("uid"), sref)
    if snapshot is None:
        body = {"apiVersion": pc.API_VERSION, "kind": pc.KIND_SNAPSHOT,
                "metadata": {"name": name, "namespace": ns, "labels": labels}, "spec": spec}
        actions.append(f"created {sref}")
        if check_mode:
            return {"changed": True, "actions": actions + [f"would create its {pc.KIND_CONTENT} and bind them"],
                    "snapshot": body, "content": None, "warnings": warnings}
        snapshot = cluster.create(pc.KIND_SNAPSHOT, body, ns)
    else:
        differs = [k for k in sorted(spec) if not _subset(spec[k], (snapshot.get("spec") or {}).get(k))]
        if differs:
            raise K8sError(f"{sref} exists with another spec ({', '.join('spec.' + k for k in differs)}: have "
                           f"{json.dumps({k: (snapshot.get('spec') or {}).get(k) for k in differs}, sort_keys=True)}"
                           f", want {json.dumps({k: spec.get(k) for k in differs}, sort_keys=True)}); its spec is "
                           "immutable: delete it (state=absent) or use another name", sref)
        if not _subset(labels, snapshot["metadata"].get("labels") or {}):
            actions.append(f"updated the labels of {sref}")
            if not check_mode:
                snapshot = cluster.patch(pc.KIND_SNAPSHOT, name, {"metadata": {"labels": labels}}, ns)
    uid = snapshot["metadata"].get("uid") or ""
    status = dict(snapshot.get("status") or {})
    cname = p.get("content_name") or content_name_for(ns, name, uid)
    bound = status.get("boundSnapshotContentName")
    if bound and bound != cname:
        raise K8sError(f"{sref} is bound to {pc.KIND_CONTENT} {bound!r}, not to {cname!r}: refusing to rebind it",
                       sref)

    content = None
    if p.get("store"):
        content = cluster.find(pc.KIND_CONTENT, cname)
        store = p["store"]
        cspec = _clean({"snapshotRef": {"namespace": ns, "name": name, "uid": uid},
                        "source": {"podRef": {"namespace": ns, "name": p["source_pod"], "uid": pod_uid},
                                   "nodeName": p.get("node") or (pod.get("spec") or {}).get("nodeName")},
                        "store": {"url": store["url"], "snapshotId": store["snapshot_id"], "path": store.get("path")}})
        cref = ref(pc.KIND_CONTENT, cname)
        if content is not None:
            _check_backlink(content, ns, name, uid, sref)
            differs = [k for k in sorted(cspec) if not _subset(cspec[k], (content.get("spec") or {}).get(k))]
            if differs:
                raise K8sError(f"{cref} exists with another spec ({', '.join('spec.' + k for k in differs)}); its "
                               "spec is immutable", cref)
        else:
            body = {"apiVersion": pc.API_VERSION, "kind": pc.KIND_CONTENT,
                    "metadata": {"name": cname, "labels": {LABEL_SNAPSHOT_NAMESPACE: ns, LABEL_SNAPSHOT_NAME: name}},
                    "spec": cspec}
            actions.append(f"created {cref}")
            content = body if check_mode else cluster.create(pc.KIND_CONTENT, body)

        fields = pc.pod_spec_fields(pod)
        recorded = (content.get("status") or {}).get("podSpecFields")
        if recorded and recorded != fields:
            warnings.append(f"Pod {ns}/{p['source_pod']} changed since {cref} recorded its pod spec; the recorded "
                            "fields are kept")
            fields = recorded
        cstatus = content.get("status") or {}
        cdesired = {"source": source_status(p.get("source_node"), pod, wanted, cspec["source"].get("nodeName")),
                    "podSpecFields": fields,
                    "conditions": _conditions(cstatus.get("conditions") or [], bool(p.get("ready")),
                                              p.get("failed_reason"), p.get("failed_message"), None, None, stamp)}
        changes = _status_changes(cstatus, cdesired)
        if changes:
            actions.append(f"recorded the status of {cref} ({', '.join(sorted(changes))})")
            if not check_mode and "metadata" in content and content["metadata"].get("uid"):
                content = cluster.patch_status(pc.KIND_CONTENT, cname, changes)
            else:
                content = dict(content, status=dict(cstatus, **changes))
        spec_hash = pc.hash_fields(fields)
    else:
        spec_hash = status.get("podSpecHash") or pc.pod_spec_hash(pod)

    desired: JSON = {"podSpecHash": spec_hash,
                     "createdAt": p.get("created_at") or status.get("createdAt") or stamp,
                     "conditions": _conditions(status.get("conditions") or [], bool(p.get("ready")),
                                               p.get("failed_reason"), p.get("failed_message"), None, None, stamp)}
    if content is not None:
        desired["boundSnapshotContentName"] = cname
    if p.get("size") is not None:
        desired["size"] = int(p["size"])
    changes = _status_changes(status, desired)
    if changes:
        actions.append(f"recorded the status of {sref} ({', '.join(sorted(changes))})")
        if not check_mode and snapshot["metadata"].get("uid"):
            snapshot = cluster.patch_status(pc.KIND_SNAPSHOT, name, changes, ns)
        else:
            snapshot = dict(snapshot, status=dict(status, **changes))
    return {"changed": bool(actions), "actions": actions, "snapshot": snapshot, "content": content,
            "warnings": warnings}


def delete_pod_snapshot(cluster: Cluster, namespace: str, name: str, content_name: Optional[str] = None,
                        check_mode: bool = False) -> JSON:
    """``state: absent``: the PodSnapshot first (only the incarnation that was read, by uid precondition), then
    every PodSnapshotContent whose backlink names this namespace/name (its bound one, ``content_name``, and
    orphans of earlier incarnations, found by label) - never one that points to another PodSnapshot.
    The artifact in the store is not touched."""
    sref = ref(pc.KIND_SNAPSHOT, name, namespace)
    actions: List[str] = []
    pending: List[str] = []
    snapshot = cluster.find(pc.KIND_SNAPSHOT, name, namespace)
    uid = (snapshot or {}).get("metadata", {}).get("uid")
    names = set()
    if snapshot is not None:
        bound = (snapshot.get("status") or {}).get("boundSnapshotContentName")
        if bound:
            names.add(bound)
    if content_name:
        names.add(content_name)
    selector = f"{LABEL_SNAPSHOT_NAMESPACE}={namespace},{LABEL_SNAPSHOT_NAME}={name}"
    contents = {c["metadata"]["name"]: c for c in cluster.list(pc.KIND_CONTENT, label_selector=selector)}
    for cname in names - set(contents):
        found = cluster.find(pc.KIND_CONTENT, cname)
        if found is not None:
            contents[cname] = found
    if snapshot is not None:
        actions.append(f"deleted {sref}")
        if not check_mode:
            try:
                gone = cluster.delete(pc.KIND_SNAPSHOT, name, namespace, uid=uid)
                if isinstance(gone, dict) and (gone.get("metadata") or {}).get("deletionTimestamp"):
                    pending.append(f"{sref} waits for its finalizers {gone['metadata'].get('finalizers')}")
            except K8sError as exc:
                if not exc.not_found:
                    raise
    for cname, content in sorted(contents.items()):
        backlink = (content.get("spec") or {}).get("snapshotRef") or {}
        if backlink.get("namespace") != namespace or backlink.get("name") != name:
            continue  # named explicitly, but it is another PodSnapshot's content: never deleted here
        actions.append(f"deleted {ref(pc.KIND_CONTENT, cname)}")
        if not check_mode:
            try:
                gone = cluster.delete(pc.KIND_CONTENT, cname, uid=content["metadata"].get("uid"))
                if isinstance(gone, dict) and (gone.get("metadata") or {}).get("deletionTimestamp"):
                    pending.append(f"{pc.KIND_CONTENT} {cname} waits for its finalizers")
            except K8sError as exc:
                if not exc.not_found:
                    raise
    return {"changed": bool(actions), "actions": actions, "pending": pending}


# --- restore pods -------------------------------------------------------------------

def select_for_pod(cluster: Cluster, pod: JSON, namespace: str, grouping_labels: Sequence[str] = (),
                   scope: str = pc.SCOPE_WHOLE_POD) -> Tuple[Optional[JSON], Optional[JSON], List[str]]:
    """The PodSnapshot (and its content) to restore ``pod`` from: ``(snapshot, content, reasons)``.

    Lists the namespace's PodSnapshots and the contents they are bound to, then ``select_snapshot``; the chosen
    one must also pass ``check_content_binding`` (backlink uid, bound name, Ready).
    """
    snapshots = cluster.list(pc.KIND_SNAPSHOT, namespace)
    contents: Dict[str, JSON] = {}
    for snap in snapshots:
        bound = (snap.get("status") or {}).get("boundSnapshotContentName")
        if bound and bound not in contents:
            found = cluster.find(pc.KIND_CONTENT, bound)
            if found is not None:
                contents[bound] = found
    target = copy.deepcopy(pod)
    target.setdefault("metadata", {})
    if not target["metadata"].get("namespace") and "template" not in (target.get("spec") or {}):
        target["metadata"]["namespace"] = namespace
    chosen, reasons = pc.select_snapshot(snapshots, target, grouping_labels, scope, contents)
    if chosen is None:
        return None, None, reasons
    bound = (chosen.get("status") or {}).get("boundSnapshotContentName")
    content = contents.get(bound) if bound else None
    if content is None:
        sref = pc.object_ref(chosen, pc.KIND_SNAPSHOT)
        return None, None, [f"{sref} is bound to {pc.KIND_CONTENT} {bound!r}, which does not exist" if bound
                            else f"{sref} is not bound to any {pc.KIND_CONTENT}"]
    problems = pc.check_content_binding(chosen, content)
    if problems:
        return None, None, problems
    return chosen, content, []


def create_restore_pods(cluster: Cluster, built: JSON, namespace: str, count: int, name_prefix: Optional[str],
                        check_mode: bool = False) -> Tuple[bool, List[JSON], List[str]]:
    """Create ``count`` restore pods from the built pod: ``<name_prefix>-<i>`` (i from 0; idempotent by name), or
    ``generateName`` when no prefix is given (each run creates new ones). ``(changed, pods, actions)``."""
    pods: List[JSON] = []
    actions: List[str] = []
    source = ((built.get("metadata") or {}).get("annotations") or {}).get(pc.ANN_RESTORE_FROM)
    for index in range(count):
        body = copy.deepcopy(built)
        meta = body.setdefault("metadata", {})
        meta["namespace"] = namespace
        for key in ("resourceVersion", "uid", "creationTimestamp", "selfLink", "managedFields", "ownerReferences"):
            meta.pop(key, None)
        body.pop("status", None)
        body["apiVersion"], body["kind"] = "v1", "Pod"
        if name_prefix:
            meta.pop("generateName", None)
            meta["name"] = f"{name_prefix}-{index}"
            existing = cluster.find("Pod", meta["name"], namespace)
            if existing is not None:
                have = ((existing.get("metadata") or {}).get("annotations") or {}).get(pc.ANN_RESTORE_FROM)
                if have != source:
                    raise K8sError(f"Pod {namespace}/{meta['name']} exists and restores from {have!r}, not "
                                   f"{source!r}: delete it or use another name_prefix", "Pod")
                pods.append(existing)
                continue
        else:
            meta.pop("name", None)
            meta["generateName"] = meta.get("generateName") or f"{source}-restore-"
        actions.append(f"created Pod {namespace}/{meta.get('name') or meta['generateName'] + '*'}")
        pods.append(body if check_mode else cluster.create_pod(namespace, body))
    return bool(actions), pods, actions


# --- the modules' entry points (params dict in, result dict out, K8sError on failure) ---------------

def cluster_from(params: JSON) -> Cluster:
    return Cluster(connect(params), params.get("request_timeout") or 30)


def run_k8s_crds(params: JSON, check_mode: bool = False, diff: bool = False) -> JSON:
    cluster = cluster_from(params)
    entries: List[JSON] = []
    diffs: List[JSON] = []
    definitions: List[JSON] = []
    for item in params["definitions"]:
        # a v1 List (kubectl's multi-object file) stands for its items
        definitions.extend(item.get("items") or [] if item.get("kind") == "List" else [item])
    for definition in definitions:
        if (definition.get("kind") or "CustomResourceDefinition") != "CustomResourceDefinition":
            raise K8sError(f"definitions: {definition.get('kind')} {(definition.get('metadata') or {}).get('name')} "
                           "is not a CustomResourceDefinition", "CustomResourceDefinition")
        name = (definition.get("metadata") or {}).get("name")
        if params["state"] == "absent":
            before = cluster.get_crd(name) if name else None
            action = "deleted" if cluster.delete_crd(name, check_mode) else "absent"
            entries.append({"name": name, "action": action})
            if action == "deleted":
                diffs.append({"before_header": name, "before": (before or {}).get("spec"), "after_header": name,
                              "after": None})
            continue
        action, before, after = cluster.apply_crd(definition, check_mode)
        entries.append({"name": name, "action": action})
        if action != "unchanged":
            diffs.append({"before_header": name, "before": (before or {}).get("spec") or {}, "after_header": name,
                          "after": after.get("spec") or {}})
    if params["state"] == "present" and params.get("wait") and not check_mode:
        for entry in entries:
            cluster.wait_established(entry["name"], params.get("wait_timeout") or 60)
    result: JSON = {"changed": any(e["action"] in ("created", "updated", "deleted") for e in entries),
                    "crds": entries}
    if diff:
        result["diff"] = diffs
    return result


def run_pod_snapshot(params: JSON, check_mode: bool = False) -> JSON:
    cluster = cluster_from(params)
    if params["state"] == "absent":
        out = delete_pod_snapshot(cluster, params["namespace"], params["name"], params.get("content_name"),
                                  check_mode)
        return {"changed": out["changed"], "actions": out["actions"], "pending": out["pending"], "snapshot": None,
                "content": None, "status": {}}
    out = ensure_pod_snapshot(cluster, params, check_mode)
    return {"changed": out["changed"], "actions": out["actions"], "snapshot": out["snapshot"],
            "content": out["content"], "status": (out["snapshot"] or {}).get("status") or {},
            "warnings": out["warnings"]}


def _input_pod(params: JSON) -> JSON:
    pod = params.get("pod") if params.get("pod") is not None else params.get("template")
    if pod is None:
        raise K8sError(f"action {params['action']} needs pod or template", "restore_pod")
    return pod


def _build(params: JSON, snapshot_name: str) -> JSON:
    try:
        return pc.build(_input_pod(params), snapshot_name, container_map=params.get("container_map"),
                        skip_compat_check=bool(params.get("skip_compat_check")),
                        startup_probe=bool(params.get("startup_probe", True)),
                        seccomp_profile=params.get("seccomp_profile") or pc.SECCOMP_PROFILE)
    except pc.ContractError as exc:
        raise K8sError(exc.message, "restore pod", reasons=exc.reasons) from None


def _namespace(params: JSON, pod: Optional[JSON] = None) -> str:
    ns = params.get("namespace") or ((pod or {}).get("metadata") or {}).get("namespace")
    if not ns:
        raise K8sError(f"action {params['action']} needs namespace (or metadata.namespace in the pod)", "restore_pod")
    return ns


def run_restore_pod(params: JSON, check_mode: bool = False) -> JSON:
    action = params["action"]
    if action in ("begin", "finish"):
        from ansible_collections.warmstart.snapshot.plugins.module_utils import _k8s_pods  # pylint: disable=import-outside-toplevel
        cluster = cluster_from(params)
        if action == "begin":
            return _k8s_pods.begin_restore(cluster, params["namespace"], params["name"],
                                           params.get("condition_message") or "", check_mode)
        return _k8s_pods.finish_restore(cluster, params["namespace"], params["name"], params["outcome"],
                                        params.get("condition_message") or "", check_mode)
    if action == "build":
        if not params.get("snapshot"):
            raise K8sError("action build needs snapshot (the PodSnapshot name)", "restore_pod")
        return {"changed": False, "pod": _build(params, params["snapshot"])}
    if action == "validate":
        pod = _input_pod(params)
        problems = pc.validate(pod, params.get("seccomp_profile") or pc.SECCOMP_PROFILE)
        if problems:
            raise K8sError(f"{pc.object_ref(pod, 'Pod')} is not a restore pod", "restore pod", reasons=problems)
        return {"changed": False, "problems": []}
    if action == "classify":
        if params.get("pod") is not None:
            pod = params["pod"]
        else:
            if not params.get("name"):
                raise K8sError("action classify needs pod, or namespace and name of a pod", "restore_pod")
            pod = cluster_from(params).get_pod(_namespace(params), params["name"])
        condition = pc.get_condition(pod, pc.RESTORE_CONDITION)
        return {"changed": False, "state": pc.classify(pod), "condition": condition,
                "pod_name": (pod.get("metadata") or {}).get("name")}
    cluster = cluster_from(params)
    pod = _input_pod(params)
    namespace = _namespace(params, pod)
    snapshot: Optional[JSON] = None
    content: Optional[JSON] = None
    if action == "select" or not params.get("snapshot"):
        snapshot, content, reasons = select_for_pod(cluster, pod, namespace, params.get("grouping_labels") or (),
                                                    params.get("scope") or pc.SCOPE_WHOLE_POD)
        if snapshot is None:
            raise K8sError(f"no PodSnapshot in namespace {namespace} fits {pc.object_ref(pod, 'Pod')}", "restore_pod",
                           reasons=reasons)
        if action == "select":
            return {"changed": False, "snapshot": snapshot, "content": content, "reasons": []}
    name = params.get("snapshot") or snapshot["metadata"]["name"]  # type: ignore[index]
    if snapshot is None:
        snapshot = cluster.get(pc.KIND_SNAPSHOT, name, namespace)
        if not params.get("skip_binding_check"):
            bound = (snapshot.get("status") or {}).get("boundSnapshotContentName")
            content = cluster.find(pc.KIND_CONTENT, bound) if bound else None
            problems = pc.check_content_binding(snapshot, content or {"metadata": {"name": bound}})
            if content is None:
                problems.insert(0, f"{ref(pc.KIND_SNAPSHOT, name, namespace)} has no {pc.KIND_CONTENT}"
                                   + (f" ({bound!r} does not exist)" if bound else ""))
            if problems:
                raise K8sError(f"{ref(pc.KIND_SNAPSHOT, name, namespace)} cannot be restored from", "restore_pod",
                               reasons=problems)
    built = _build(params, name)
    changed, pods, actions = create_restore_pods(cluster, built, namespace, params.get("count") or 1,
                                                 params.get("name_prefix"), check_mode)
    return {"changed": changed, "pods": pods, "actions": actions, "pod": built, "snapshot": snapshot,
            "content": content}
