# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The Kubernetes API client of the pod_snapshot, restore_pod, pod_info, pod_snapshot_info and k8s_crds modules.

``connect(params)`` builds a ``kubernetes`` ``ApiClient`` from the module's auth
options (kubeconfig / context / host / api_key / validate_certs / ca_cert, with
the K8S_AUTH_* environment fallbacks of kubernetes.core; default
``~/.kube/config``, then the in-cluster service account). ``Cluster`` sends
plain JSON through that client (its auth, TLS and proxy settings) and returns
plain dicts in the API's own shape, so that ``_podcontract`` sees exactly what
the API server stored.

Invariants:

- Every failure is a ``K8sError`` naming the object and the cause (``PodSnapshot default/embed-1 not found``,
  ``API server https://... unreachable: ...``), with the API's HTTP status; credentials never go into a message.
- A read-modify-write (conditions, finalizers, CRDs) sends what it computed guarded by what it read
  (resourceVersion or a JSON-patch test) and reads again on a conflict, at most ``RETRIES`` times.
- ``check_mode`` methods read and report, and never write.
- A request the API server did not take (429 Too Many Requests, 503, no connection) is sent again after a
  backoff (``Retry-After`` when the server gives one, else doubling from ``BACKOFF`` s), at most ``SENDS`` times
  in all; a read (GET) also after a 500/502/504 or a lost answer. A write whose answer was lost is not resent:
  whether it was applied is unknown, and the caller's guarded retry reads again.

The domain records built on it live in ``_k8s_records`` (PodSnapshot + PodSnapshotContent),
``_k8s_restorepods`` and ``_k8s_summaries``, the modules' entry points in ``runners/_<module>.py`` and the
auth options' argument spec in ``runners/_specs`` (imports go client <- records <- restore pods, then up a layer
to the runners). The API's names come from ``_podapi``.
"""
from __future__ import annotations

import copy
import json
import os
import sys
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import quote

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

JSON = Dict[str, Any]
Params = Mapping[str, Any]

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
    podapi.KIND_SNAPSHOT: ("podsnapshots", True),
    podapi.KIND_CONTENT: ("podsnapshotcontents", False),
    podapi.KIND_POLICY: ("podsnapshotpolicies", True),
    podapi.KIND_TRIGGER: ("podsnapshotmanualtriggers", True),
    podapi.KIND_STORAGE_CONFIG: ("podsnapshotstorageconfigs", False),
    "Pod": ("pods", True),
    "Secret": ("secrets", True),
    "ConfigMap": ("configmaps", True),  # application profiles a pod's annotation names
}
CORE_KINDS = ("Pod", "Secret", "ConfigMap")  # served under /api/v1
LABEL_SNAPSHOT_NAMESPACE = podapi.GROUP + "/snapshot-namespace"
LABEL_SNAPSHOT_NAME = podapi.GROUP + "/snapshot-name"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
RETRIES = 5
SENDS = 4                 # a request the server did not take is sent at most this often
BACKOFF = 0.5             # seconds before the second send; doubled for each later one
BACKOFF_CAP = 8.0
NOT_TAKEN = (429, 503)    # the server did not process the request (priority and fairness, overload)
READ_AGAIN = (500, 502, 504)


class K8sError(WarmstartError):
    """An API call that failed: ``what`` names the object, ``status``/``reason`` come from the API's Status."""

    def __init__(self, message: str, what: str = "", status: Optional[int] = None, reason: str = "",
                 reasons: Optional[Sequence[str]] = None, **details: Any) -> None:
        super().__init__(message, reasons, **details)
        self.what, self.status, self.reason = what, status, reason
        self.retry_after: Optional[float] = None  # the answer's Retry-After, seconds
        self.not_sent = False                     # no connection: the server never saw the request

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


def _kubernetes() -> Any:
    try:
        import kubernetes  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise K8sError(
            f"the Python library kubernetes is not installed for {sys.executable}, the interpreter this module runs "
            "with: install it there (python3 -m pip install kubernetes) or point ansible_python_interpreter at an "
            "interpreter that has it") from None
    return kubernetes


def _setting(params: Params, key: str) -> Any:
    value = params.get(key)
    if value is None:
        value = os.environ.get(AUTH_ENV[key]) or None
        if value is not None and key == "validate_certs":
            value = str(value).strip().lower() in ("1", "true", "yes", "on")
    return value


def connect(params: Params) -> Any:
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


def now(at: Optional[float] = None) -> str:
    """An API timestamp (RFC 3339, UTC, seconds) of ``at`` (epoch s; default: now)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def ref(kind: str, name: str, namespace: Optional[str] = None) -> str:
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


SERVER_FIELDS = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields", "selfLink")


def object_diff(kind: str, name: str, namespace: Optional[str], before: Optional[JSON], after: Optional[JSON]) -> JSON:
    """One entry of a module's ``diff``: the object before and after (``{}`` where it did not or does not exist),
    without the metadata the API server keeps for itself."""
    def view(obj: Optional[JSON]) -> JSON:
        if not obj:
            return {}
        meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in SERVER_FIELDS}
        return dict(obj, metadata=meta)
    header = ref(kind, name, namespace)
    return {"before_header": header, "after_header": header, "before": view(before), "after": view(after)}


def _status_message(body: Any) -> Tuple[str, str]:
    try:
        doc = json.loads(body) if isinstance(body, (str, bytes)) else body
    except ValueError:
        return str(body or "").strip()[:500], ""
    if isinstance(doc, dict):
        return str(doc.get("message") or ""), str(doc.get("reason") or "")
    return "", ""


def pause(seconds: float) -> None:
    """The backoff between two sends of a request (tests record it instead)."""
    time.sleep(seconds)


def _retry_after(exc: Any) -> Optional[float]:
    """The seconds of a 429/503 answer's ``Retry-After`` header (at most ``BACKOFF_CAP``); None without one."""
    try:
        value = float(str((getattr(exc, "headers", None) or {}).get("Retry-After")))
    except (TypeError, ValueError):
        return None
    return min(BACKOFF_CAP, max(0.0, value))


def _object(doc: Any) -> JSON:
    """A response body as the dict it must be (an empty body is an empty object)."""
    return doc if isinstance(doc, dict) else {}


class Cluster:
    """Plain-JSON requests to one API server through a kubernetes ``ApiClient``."""

    def __init__(self, api_client: Any, request_timeout: Optional[float] = 30) -> None:
        self.client = api_client
        self.host = api_client.configuration.host
        self.timeout = request_timeout

    # transport -----------------------------------------------------------------

    def request(self, method: str, path: str, what: str, body: Any = None, query: Optional[Dict[str, Any]] = None,
                content_type: Optional[str] = None) -> Any:
        """One API call, sent again while the server did not take it (see the module's invariants)."""
        for send in range(1, SENDS + 1):
            try:
                return self._send(method, path, what, body, query, content_type)
            except K8sError as exc:
                wait = self._again(method, exc, send)
                if wait is None:
                    raise
                pause(wait)
        raise AssertionError("unreachable")  # pragma: no cover - the last send raises or returns

    @staticmethod
    def _again(method: str, exc: K8sError, send: int) -> Optional[float]:
        """Seconds to wait before sending again, or None: not again."""
        if send >= SENDS:
            return None
        answer_lost = exc.status is None and not exc.not_sent
        if exc.status in NOT_TAKEN or exc.not_sent or (method == "GET" and (exc.status in READ_AGAIN or answer_lost)):
            return exc.retry_after if exc.retry_after is not None else min(BACKOFF_CAP, BACKOFF * 2 ** (send - 1))
        return None

    def _send(self, method: str, path: str, what: str, body: Any, query: Optional[Dict[str, Any]],
              content_type: Optional[str]) -> Any:
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
            error = K8sError(text, what, code, reason)
            error.retry_after = _retry_after(exc)
            raise error from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            cause = getattr(exc, "reason", None) or exc
            error = K8sError(f"API server {self.host} unreachable: {cause}", what)
            error.not_sent = isinstance(cause, (urllib3.exceptions.NewConnectionError, ConnectionRefusedError))
            raise error from None

    # paths ---------------------------------------------------------------------

    @staticmethod
    def path(kind: str, namespace: Optional[str] = None, name: Optional[str] = None, status: bool = False) -> str:
        """The API path of ``kind`` (in ``namespace``, named ``name``). A namespace must be a DNS label and a name a
        DNS subdomain, as the API server requires: a value from an annotation or an object never becomes '..', a
        '/' or a query in a URL (K8sError naming it); segments are quoted all the same."""
        plural, namespaced = KINDS[kind]
        base = "/api/v1" if kind in CORE_KINDS else f"/apis/{podapi.GROUP}/{podapi.VERSION}"
        if namespaced and namespace and not podapi.is_dns_label(namespace):
            raise K8sError(f"{kind}: namespace {str(namespace)[:80]!r} is not a valid namespace name (a DNS label)",
                           kind)
        if name and not (podapi.is_dns_subdomain(name) and len(name) <= 253):
            raise K8sError(f"{kind}: name {str(name)[:80]!r} is not a valid object name (a DNS subdomain)", kind)
        out = base + (f"/namespaces/{quote(namespace, safe='')}" if namespaced and namespace else "") + f"/{plural}"
        if name:
            out += f"/{quote(name, safe='')}" + ("/status" if status else "")
        return out

    @staticmethod
    def _ns(kind: str, namespace: Optional[str]) -> Optional[str]:
        return namespace if KINDS[kind][1] else None

    # generic verbs over KINDS ----------------------------------------------------------

    def get(self, kind: str, name: str, namespace: Optional[str] = None) -> JSON:
        """The object; one that comes back in another namespace or under another name than asked is refused."""
        ns = self._ns(kind, namespace)
        obj = _object(self.request("GET", self.path(kind, ns, name), ref(kind, name, ns)))
        meta = obj.get("metadata") or {}
        if meta.get("name") != name or (ns is not None and meta.get("namespace") != ns):
            raise K8sError(f"{ref(kind, name, ns)}: the API server answered with "
                           f"{ref(kind, str(meta.get('name')), meta.get('namespace'))}", kind)
        return obj

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
        items = list(_object(doc).get("items") or [])
        strays = [i for i in items if ns is not None and ((i.get("metadata") or {}).get("namespace") != ns)]
        if strays:
            raise K8sError(f"{what}: the API server answered with {len(strays)} object(s) of other namespaces", kind)
        return items

    def create(self, kind: str, body: JSON, namespace: Optional[str] = None, dry_run: bool = False) -> JSON:
        ns = self._ns(kind, namespace)
        meta = body.get("metadata") or {}
        name = meta.get("name") or (str(meta.get("generateName", "")) + "*")
        return _object(self.request("POST", self.path(kind, ns), ref(kind, name, ns), body=body,
                                    query={"dryRun": "All" if dry_run else None}))

    def patch(self, kind: str, name: str, patch: Any, namespace: Optional[str] = None, status: bool = False,
              content_type: str = MERGE_PATCH) -> JSON:
        ns = self._ns(kind, namespace)
        what = ref(kind, name, ns) + (" status" if status else "")
        return _object(self.request("PATCH", self.path(kind, ns, name, status), what, body=patch,
                                    content_type=content_type))

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
                          check_mode: bool = False, also: Sequence[str] = ()) -> Tuple[bool, JSON]:
        """Set one condition in the pod's status.conditions (status subresource); ``(changed, pod)``. The
        condition types ``also`` get the same status, reason and message in the same write.

        The whole list is sent with the resourceVersion it was computed from; a concurrent change (409) is
        read again and retried.
        """
        for _attempt in range(RETRIES):
            pod = self.get_pod(namespace, name)
            conditions = (pod.get("status") or {}).get("conditions") or []
            new = conditions
            for each in [type_, *also]:
                new = podapi.set_condition(new, each, status, reason, message, now())
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
            return _object(self.request("GET", self._crd_path(name), ref("CustomResourceDefinition", name)))
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
                    return "created", None, _object(self.request("POST", self._crd_path(), what, body=definition))
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
                return "updated", before, _object(self.request("PUT", self._crd_path(name), what, body=desired))
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
            if crd is not None and (podapi.get_condition(crd, "Established") or {}).get("status") == "True":
                return crd
            if time.monotonic() >= deadline:
                raise K8sError(f"{ref('CustomResourceDefinition', name)} is not Established after {timeout:g} s",
                               "CustomResourceDefinition")
            time.sleep(0.5)


def subset(want: Any, have: Any) -> bool:
    """Every value of ``want`` is in ``have`` (dicts recursively; lists element-wise, same length)."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(subset(v, have.get(k)) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(subset(w, h) for w, h in zip(want, have))
    return bool(want == have)


def crd_up_to_date(definition: JSON, current: JSON) -> bool:
    meta_want = definition.get("metadata") or {}
    meta_have = current.get("metadata") or {}
    return (subset(definition.get("spec") or {}, current.get("spec") or {})
            and subset(meta_want.get("labels") or {}, meta_have.get("labels") or {})
            and subset(meta_want.get("annotations") or {}, meta_have.get("annotations") or {}))


def cluster_from(params: Params) -> Cluster:
    """The ``Cluster`` for a module's auth options (``request_timeout`` default 30 s)."""
    return Cluster(connect(params), params.get("request_timeout") or 30)
