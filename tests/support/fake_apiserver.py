"""A small, in-memory Kubernetes API server for tests: the real ``kubernetes`` client talks to it over HTTP.

It speaks the REST protocol for what warmstart uses, with the semantics that matter for correctness:

* core ``v1`` pods (namespaced, ``/status`` subresource), secrets, configmaps and serviceaccounts (namespaced) and
  namespaces (cluster-scoped); ``apps/v1`` daemonsets and deployments (stored only: no controller acts on them);
  ``rbac.authorization.k8s.io/v1`` roles, rolebindings, clusterroles and clusterrolebindings (stored, not enforced);
* ``admissionregistration.k8s.io/v1`` MutatingWebhookConfigurations (cluster-scoped): their webhooks are called
  over HTTPS on every create, before the object is validated and named from ``generateName``, and their JSON
  patches applied, denials and failures (``failurePolicy``) answered as a real server does; ``clientConfig.service``
  is routed through ``server.service_urls`` and every call is recorded in ``server.admission_calls`` (see
  ``fake_admission``);
* ``apiextensions.k8s.io/v1`` CustomResourceDefinitions; creating one serves its custom objects
  (namespaced or cluster-scoped per ``spec.scope``; ``/status`` when the version declares it), pruned and
  type-checked against the version's ``openAPIV3Schema`` (``type``, ``enum``, ``required``, unknown fields
  dropped unless ``x-kubernetes-preserve-unknown-fields``; ``default``, ``pattern``, ``minLength``, ``maxLength``,
  ``minimum``, ``maximum``, ``maxItems`` applied), with transition rules of exactly the form
  ``self == oldSelf`` (``x-kubernetes-validations``) enforced on update (422 Invalid with the rule's message);
  other CEL rules are ignored;
* verbs: GET, LIST (``labelSelector``: ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k``,
  ``!k``; ``fieldSelector``: ``metadata.name``, ``metadata.namespace``, ``spec.nodeName``, ``status.phase``),
  POST (``generateName``; 409 AlreadyExists; 422 Invalid), PUT (409 Conflict on a stale
  ``metadata.resourceVersion``; custom objects must carry one), PATCH, DELETE (finalizers: ``deletionTimestamp``
  is set and the object goes when its finalizers list becomes empty; ``preconditions`` uid/resourceVersion);
  ``dryRun=All`` on writes;
* PATCH content types: ``application/merge-patch+json`` (RFC 7386), ``application/json-patch+json`` (RFC 6902)
  and, for core objects only (custom objects answer 415 like the real server),
  ``application/strategic-merge-patch+json`` - a documented subset: a merge patch in which the lists
  ``conditions`` (key ``type``), ``containers`` / ``initContainers`` / ``volumes`` / ``env`` /
  ``containerStatuses`` (key ``name``) merge by key and ``finalizers`` merges as a set; every other list is
  replaced; ``$patch`` directives are not supported;
* status subresource: writes to the main resource keep the stored ``.status``; writes to ``/status`` change only
  ``.status``; ``metadata.generation`` bumps when anything outside ``metadata`` and ``status`` changes;
* a global ``resourceVersion``; ``uid`` and ``creationTimestamp`` assigned on create;
* errors are ``Status`` objects with the real reasons and messages (``pods "x" not found``);
* discovery: ``/version``, ``/api``, ``/api/v1``, ``/apis``, ``/apis/<group>``, ``/apis/<group>/<version>``;
* optional bearer token (``FakeApiServer(token=...)`` answers 401 without it);
* watch: ``?watch=true`` (or ``watch=1``) on a collection path streams chunked JSON lines ``{"type": "ADDED" |
  "MODIFIED" | "DELETED" | "BOOKMARK" | "ERROR", "object": {...}}``. Without ``resourceVersion`` (or with ``0``)
  it starts with an ADDED event for every object that matches, else with the events after that resourceVersion,
  kept in a bounded in-memory history (``FakeApiServer(history=...)`` events): one older than the history answers
  HTTP 410 Gone (reason ``Expired``) at the start, and a watcher that falls behind the history gets an ERROR event
  carrying that Status in the middle of its stream, which then ends. Every write makes an event: create, update,
  patch (status too), delete, the ``deletionTimestamp`` of a delete held by finalizers and the final delete when
  the last finalizer goes (a DELETED event carries a new resourceVersion), ``store.put``/``store.remove`` and the
  objects of a deleted CRD. ``labelSelector`` and ``fieldSelector`` apply as on the real server's watch cache: an
  object that starts matching (a pod bound to the node: ``spec.nodeName``) arrives as ADDED, one that stops
  matching as DELETED. ``allowWatchBookmarks=true`` adds a BOOKMARK (an object with only
  ``metadata.resourceVersion``) every ``server.bookmark_interval`` seconds; ``timeoutSeconds`` ends the stream
  cleanly (default ``server.watch_timeout``).

Test hooks for faults: ``server.drop_watches()`` cuts every open watch connection (no terminating chunk, as a
load balancer or a restarted API server does); ``server.compact()`` forgets the history, so that a resume from
any earlier resourceVersion gets 410, and sends every open watch an ERROR 410 in the middle of its stream;
``server.answer_errors(403)`` (or a 5xx) answers every resource request with that Status for ``seconds`` or until
``server.heal()``; ``server.go_offline(seconds)`` closes the listening socket and every connection (refused until
``server.go_online()``, same port); ``server.open_watches()`` lists the streams open now.

Built-in objects (pods, secrets, configmaps, namespaces, services, service accounts, DaemonSets, Deployments, RBAC, CRDs,
webhook configurations) are checked on every write against Kubernetes' own schemas (``k8s_schemas``: the
``kubernetes-validate`` package's, for ``k8s_schemas.VERSION``), every violation at once (422 Invalid); webhook
configurations also get a real server's checks (``fake_admission.check_configuration``); a field the schema does not
know is refused with ``?fieldValidation=Strict`` (400, strict decoding error, as kubectl asks by default),
dropped with a ``Warning`` header with ``Warn`` (the default, as the Python client gets; ``server.warnings``
keeps them for a test to check) and dropped silently with ``Ignore``.

No server-side apply, no pagination. Every request is recorded in ``server.requests`` (method, path, query,
content type) so a test can assert that check mode wrote nothing.
"""
from __future__ import annotations

import collections
import copy
import json
import random
import re
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence, Set, Tuple
from urllib.parse import parse_qs, unquote, urlsplit

from tests.support import k8s_schemas

CRDS = Path(__file__).resolve().parents[2] / "roles" / "k8s_crds" / "files" / "crds.yaml"

JSON = Dict[str, Any]

CORE_GROUP = ""
CRD_GROUP = "apiextensions.k8s.io"
RBAC_GROUP = "rbac.authorization.k8s.io"
ADMISSION_GROUP = "admissionregistration.k8s.io"
BUILTIN_GROUPS = (CORE_GROUP, CRD_GROUP, "apps", RBAC_GROUP, ADMISSION_GROUP)
WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
SMP_LIST_KEYS = {"conditions": "type", "containers": "name", "initContainers": "name", "volumes": "name",
                 "env": "name", "containerStatuses": "name"}
SMP_SET_LISTS = ("finalizers",)


class ApiError(Exception):
    """An error answer: becomes a ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str, details: Optional[JSON] = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> JSON:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": self.message,
                "reason": self.reason, "details": self.details, "code": self.code}


@dataclass
class Resource:
    """One served resource type."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    status: bool
    singular: str = ""
    short_names: List[str] = field(default_factory=list)
    schema: Optional[JSON] = None  # openAPIV3Schema of custom resources
    rules: List[Tuple[Tuple[str, ...], str]] = field(default_factory=list)  # (path, message) of self == oldSelf

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``pods`` or ``podsnapshots.snapshot.warmstart.io``, as the real messages name a resource."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def custom(self) -> bool:
        return self.group not in BUILTIN_GROUPS


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# --- label and field selectors --------------------------------------------------

_REQ_SET = re.compile(r"^\s*([A-Za-z0-9._/-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_REQ_CMP = re.compile(r"^\s*([A-Za-z0-9._/-]+)\s*(==|!=|=)\s*([A-Za-z0-9._-]*)\s*$")
_REQ_EXISTS = re.compile(r"^\s*(!?)\s*([A-Za-z0-9._/-]+)\s*$")


def _split_requirements(selector: str) -> List[str]:
    """Split on commas outside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p for p in parts if p.strip()]


def parse_label_selector(selector: str) -> List[Tuple[str, str, List[str]]]:
    """``[(key, op, values)]`` with op one of ``=``, ``!=``, ``in``, ``notin``, ``exists``, ``!``."""
    reqs = []
    for part in _split_requirements(selector or ""):
        m = _REQ_SET.match(part)
        if m:
            values = [v.strip() for v in m.group(3).split(",") if v.strip()]
            reqs.append((m.group(1), m.group(2), values))
            continue
        m = _REQ_CMP.match(part)
        if m:
            reqs.append((m.group(1), "=" if m.group(2) in ("=", "==") else "!=", [m.group(3)]))
            continue
        m = _REQ_EXISTS.match(part)
        if m:
            reqs.append((m.group(2), "!" if m.group(1) else "exists", []))
            continue
        raise ApiError(400, "BadRequest", f"unable to parse requirement: {part.strip()!r}")
    return reqs


def label_match(labels: Dict[str, str], reqs: List[Tuple[str, str, List[str]]]) -> bool:
    for key, op, values in reqs:
        present = key in labels
        value = labels.get(key)
        if op == "=" and value != values[0]:
            return False
        if op == "!=" and value == values[0]:
            return False
        if op == "in" and value not in values:
            return False
        if op == "notin" and present and value in values:
            return False
        if op == "exists" and not present:
            return False
        if op == "!" and present:
            return False
    return True


FIELD_PATHS = {"metadata.name": ("metadata", "name"), "metadata.namespace": ("metadata", "namespace"),
               "spec.nodeName": ("spec", "nodeName"), "status.phase": ("status", "phase")}


def field_match(obj: JSON, selector: str, res: Resource) -> bool:
    for part in _split_requirements(selector or ""):
        m = re.match(r"^\s*([A-Za-z.]+)\s*(==|!=|=)\s*(.*?)\s*$", part)
        if not m:
            raise ApiError(400, "BadRequest", f"invalid field selector: {part.strip()!r}")
        key, op, want = m.groups()
        if res.plural == "pods":
            allowed = FIELD_PATHS
        else:
            allowed = {k: v for k, v in FIELD_PATHS.items() if k.startswith("metadata.")}
        if key not in allowed:
            raise ApiError(400, "BadRequest", f'"{key}" is not a known field selector: only "'
                           + '", "'.join(sorted(allowed)) + '"')
        have: Any = obj
        for step in allowed[key]:
            have = (have or {}).get(step) if isinstance(have, dict) else None
        have = "" if have is None else str(have)
        if (op == "!=") == (have == want):
            return False
    return True


# --- patches --------------------------------------------------------------------

def merge_patch(target: Any, patch: Any, strategic: bool = False) -> Any:
    """RFC 7386 JSON merge patch; ``strategic``: a strategic merge patch, where the lists in SMP_LIST_KEYS merge
    by key and SMP_SET_LISTS as sets (see module doc)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif strategic and key in SMP_LIST_KEYS and isinstance(value, list) and isinstance(result.get(key), list):
            merge_key = SMP_LIST_KEYS[key]
            merged = [copy.deepcopy(x) for x in result[key]]
            for item in value:
                idx = next((i for i, old in enumerate(merged) if isinstance(old, dict) and isinstance(item, dict)
                            and old.get(merge_key) == item.get(merge_key)), None)
                if idx is None:
                    merged.append(copy.deepcopy(item))
                else:
                    merged[idx] = merge_patch(merged[idx], item, strategic=True)
            result[key] = merged
        elif strategic and key in SMP_SET_LISTS and isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = result[key] + [v for v in value if v not in result[key]]
        else:
            result[key] = merge_patch(result.get(key), value, strategic)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Merge patch, but the lists in SMP_LIST_KEYS merge by key and SMP_SET_LISTS as sets (see module doc)."""
    return merge_patch(target, patch, strategic=True)


def _pointer(path: str) -> List[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _resolve(doc: Any, tokens: List[str]) -> Any:
    for tok in tokens:
        if isinstance(doc, list):
            doc = doc[int(tok)]
        else:
            doc = doc[tok]
    return doc


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch: add, remove, replace, move, copy, test."""
    if not isinstance(ops, list):
        raise ApiError(400, "BadRequest", "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(doc)
    for op in ops:
        kind, path = op.get("op"), op.get("path", "")
        try:
            tokens = _pointer(path)
            if kind == "test":
                if _resolve(doc, tokens) != op.get("value"):
                    raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our "
                                   f"request: testing value {path} failed")
                continue
            if kind in ("move", "copy"):
                value = copy.deepcopy(_resolve(doc, _pointer(op["from"])))
                if kind == "move":
                    doc = json_patch(doc, [{"op": "remove", "path": op["from"]}])
                kind, op = "add", {"op": "add", "path": path, "value": value}
            if not tokens:
                if kind in ("add", "replace"):
                    doc = copy.deepcopy(op["value"])
                    continue
                raise ApiError(422, "Invalid", "cannot remove the whole document")
            parent = _resolve(doc, tokens[:-1])
            last = tokens[-1]
            if kind == "add":
                if isinstance(parent, list):
                    parent.insert(len(parent) if last == "-" else int(last), copy.deepcopy(op["value"]))
                else:
                    parent[last] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[int(last) if isinstance(parent, list) else last]
            elif kind == "replace":
                if isinstance(parent, list):
                    parent[int(last)] = copy.deepcopy(op["value"])
                else:
                    if last not in parent:
                        raise KeyError(last)
                    parent[last] = copy.deepcopy(op["value"])
            else:
                raise ApiError(422, "Invalid", f"unexpected kind of JSON patch operation: {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: "
                           f"{kind} operation does not apply: doc is missing path: {path!r} ({exc})") from None
    return doc


# --- schemas of custom resources --------------------------------------------------

def collect_rules(schema: JSON, path: Tuple[str, ...] = ()) -> List[Tuple[Tuple[str, ...], str]]:
    """Transition rules of the form ``self == oldSelf`` in an openAPIV3Schema: ``[(path, message)]``."""
    out: List[Tuple[Tuple[str, ...], str]] = []
    for rule in schema.get("x-kubernetes-validations") or []:
        if re.sub(r"\s+", "", str(rule.get("rule", ""))) == "self==oldSelf":
            out.append((path, str(rule.get("message") or "Invalid value: failed rule: self == oldSelf")))
    for name, sub in (schema.get("properties") or {}).items():
        if isinstance(sub, dict):
            out.extend(collect_rules(sub, path + (name,)))
    return out


_TYPES = {"string": (str,), "boolean": (bool,), "object": (dict,), "array": (list,)}


def _type_ok(value: Any, want: str) -> bool:
    if want == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if want == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES.get(want, (object,)))


def _type_name(value: Any) -> str:
    for name in ("boolean", "integer", "number", "string", "object", "array"):
        if _type_ok(value, name):
            return name
    return "null"


def prune_and_check(value: Any, schema: JSON, path: str, errors: List[str]) -> Any:
    """Drop unknown fields (structural pruning) and collect type / enum / required errors."""
    if value is None:
        return None
    want = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(value, (int, str)) or isinstance(value, bool):
            errors.append(f"{path}: Invalid value: \"{_type_name(value)}\": {path} in body must be of type "
                          "int-or-string")
        return value
    if want and not _type_ok(value, want):
        errors.append(f"{path}: Invalid value: \"{_type_name(value)}\": {path} in body must be of type {want}: "
                      f"\"{_type_name(value)}\"")
        return value
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(json.dumps(v) for v in schema["enum"])
        errors.append(f"{path}: Unsupported value: {json.dumps(value)}: supported values: {supported}")
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{path}: Invalid value: {json.dumps(value)}: {path} in body should match "
                          f"'{schema['pattern']}'")
        if len(value) < schema.get("minLength", 0):
            errors.append(f"{path}: Invalid value: {json.dumps(value)}: {path} in body should be at least "
                          f"{schema['minLength']} chars long")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{path}: Too long: may not be more than {schema['maxLength']} bytes")
    if _type_ok(value, "number"):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: Invalid value: {value}: {path} in body should be greater than or equal to "
                          f"{schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: Invalid value: {value}: {path} in body should be less than or equal to "
                          f"{schema['maximum']}")
    if isinstance(value, list) and "maxItems" in schema and len(value) > schema["maxItems"]:
        errors.append(f"{path}: Too many: {len(value)}: must have at most {schema['maxItems']} items")
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        preserve = schema.get("x-kubernetes-preserve-unknown-fields")
        value = dict(value)
        for key, sub_schema in props.items():
            if key not in value and isinstance(sub_schema, dict) and "default" in sub_schema:
                value[key] = copy.deepcopy(sub_schema["default"])  # structural defaulting
        out = {}
        for key, sub in value.items():
            sub_path = f"{path}.{key}" if path else key
            sub_schema = props.get(key) if key in props else extra if isinstance(extra, dict) else None
            if sub_schema is not None:
                if sub is None and not sub_schema.get("nullable"):
                    continue  # null in a non-nullable field is pruned
                out[key] = prune_and_check(sub, sub_schema, sub_path, errors)
            elif extra is True or preserve:
                out[key] = sub
            # anything else is an unknown field: pruned, as the real server does
        for req in schema.get("required") or []:
            if req not in out:
                errors.append(f"{path + '.' if path else ''}{req}: Required value")
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune_and_check(item, schema["items"], f"{path}[{i}]", errors) for i, item in enumerate(value)]
    return value


def _at(obj: Any, path: Tuple[str, ...]) -> Tuple[bool, Any]:
    for step in path:
        if not isinstance(obj, dict) or step not in obj:
            return False, None
        obj = obj[step]
    return True, obj


# --- the store ------------------------------------------------------------------

@dataclass
class WatchEvent:
    """One change in the history: the object after it (``prev``: before it, None when created)."""

    rv: int
    group: str
    plural: str
    type: str
    obj: JSON
    prev: Optional[JSON]


class Store:
    """Objects by (group, plural) and (namespace, name); one lock for all of it.

    Every change is also appended to ``history`` (at most ``history_limit`` events; ``compacted_rv`` is the
    resourceVersion of the newest event forgotten, so a watch may resume from any resourceVersion >= it) and
    wakes the watchers waiting on ``changed``."""

    def __init__(self, history: int = 1000) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.history: Deque[WatchEvent] = collections.deque()
        self.history_limit = history
        self.compacted_rv = 0
        self.resources: Dict[Tuple[str, str, str], Resource] = {}
        self.objects: Dict[Tuple[str, str], Dict[Tuple[str, str], JSON]] = {}
        self.rv = 0
        for res in (Resource(CORE_GROUP, "v1", "pods", "Pod", True, True, "pod", ["po"]),
                    Resource(CORE_GROUP, "v1", "namespaces", "Namespace", False, True, "namespace", ["ns"]),
                    Resource(CORE_GROUP, "v1", "secrets", "Secret", True, False, "secret", []),
                    Resource(CORE_GROUP, "v1", "configmaps", "ConfigMap", True, False, "configmap", ["cm"]),
                    Resource(CORE_GROUP, "v1", "services", "Service", True, True, "service", ["svc"]),
                    Resource(CORE_GROUP, "v1", "serviceaccounts", "ServiceAccount", True, False, "serviceaccount",
                             ["sa"]),
                    Resource("apps", "v1", "daemonsets", "DaemonSet", True, True, "daemonset", ["ds"]),
                    Resource("apps", "v1", "deployments", "Deployment", True, True, "deployment", ["deploy"]),
                    Resource(RBAC_GROUP, "v1", "clusterroles", "ClusterRole", False, False, "clusterrole", []),
                    Resource(RBAC_GROUP, "v1", "clusterrolebindings", "ClusterRoleBinding", False, False,
                             "clusterrolebinding", []),
                    Resource(RBAC_GROUP, "v1", "roles", "Role", True, False, "role", []),
                    Resource(RBAC_GROUP, "v1", "rolebindings", "RoleBinding", True, False, "rolebinding", []),
                    Resource(ADMISSION_GROUP, "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration",
                             False, False, "mutatingwebhookconfiguration", []),
                    Resource(CRD_GROUP, "v1", "customresourcedefinitions", "CustomResourceDefinition", False, True,
                             "customresourcedefinition", ["crd", "crds"])):
            self.resources[(res.group, res.version, res.plural)] = res
        for ns in ("default", "kube-system"):
            self._insert(self.resource("", "v1", "namespaces"), {"metadata": {"name": ns},
                                                                 "spec": {"finalizers": ["kubernetes"]},
                                                                 "status": {"phase": "Active"}})

    # assertions helpers --------------------------------------------------------

    def resource(self, group: str, version: str, plural: str) -> Resource:
        res = self.resources.get((group, version, plural))
        if res is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource",
                           {"group": group, "kind": plural})
        return res

    def find_resource(self, plural: str, group: Optional[str] = None) -> Resource:
        for res in self.resources.values():
            if res.plural == plural and (group is None or res.group == group):
                return res
        raise KeyError(plural)

    def get(self, plural: str, name: str, namespace: str = "", group: Optional[str] = None) -> Optional[JSON]:
        """A deep copy of one stored object, or None."""
        res = self.find_resource(plural, group)
        with self.lock:
            obj = self.objects.get((res.group, plural), {}).get((namespace if res.namespaced else "", name))
            return copy.deepcopy(obj)

    def list(self, plural: str, namespace: Optional[str] = None, group: Optional[str] = None) -> List[JSON]:
        res = self.find_resource(plural, group)
        with self.lock:
            objs = self.objects.get((res.group, plural), {})
            return [copy.deepcopy(o) for (ns, _name), o in sorted(objs.items())
                    if namespace is None or ns == namespace]

    def put(self, plural: str, obj: JSON, group: Optional[str] = None) -> JSON:
        """Store ``obj`` as given (status included), creating or overwriting it: for test set-up."""
        res = self.find_resource(plural, group)
        with self.lock:
            meta = obj.setdefault("metadata", {})
            if res.namespaced:
                meta.setdefault("namespace", "default")
            key = (meta.get("namespace", "") if res.namespaced else "", meta["name"])
            old = self.objects.get((res.group, plural), {}).get(key)
            if old is not None:
                for keep in ("uid", "creationTimestamp"):
                    meta.setdefault(keep, old["metadata"][keep])
            return copy.deepcopy(self._insert(res, obj))

    def remove(self, plural: str, name: str, namespace: str = "", group: Optional[str] = None) -> None:
        """Drop an object at once, finalizers or not."""
        res = self.find_resource(plural, group)
        with self.lock:
            self._drop(res, (namespace if res.namespaced else "", name))

    # internals -------------------------------------------------------------------

    def next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def record(self, group: str, plural: str, type_: str, obj: JSON, prev: Optional[JSON]) -> None:
        """Append one change to the history (copies) and wake the watchers."""
        with self.lock:
            self.history.append(WatchEvent(int(obj["metadata"]["resourceVersion"]), group, plural, type_,
                                           copy.deepcopy(obj), copy.deepcopy(prev) if prev is not None else None))
            while len(self.history) > self.history_limit:
                self.compacted_rv = self.history.popleft().rv
            self.changed.notify_all()

    def _insert(self, res: Resource, obj: JSON) -> JSON:
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        meta.setdefault("generation", 1)
        meta["resourceVersion"] = self.next_rv()
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        key = (meta.get("namespace", "") if res.namespaced else "", meta["name"])
        bucket = self.objects.setdefault((res.group, res.plural), {})
        prev = bucket.get(key)
        bucket[key] = obj
        self.record(res.group, res.plural, "ADDED" if prev is None else "MODIFIED", obj, prev)
        if res.plural == "customresourcedefinitions":
            self._serve_crd(obj)
        return obj

    def _drop(self, res: Resource, key: Tuple[str, str], final: Optional[JSON] = None) -> None:
        """Remove one object; its DELETED event carries ``final`` (default: the stored object) at a new rv."""
        obj = self.objects.get((res.group, res.plural), {}).pop(key, None)
        if obj is None:
            return
        self._deleted(res.group, res.plural, final if final is not None else obj, obj)
        if res.plural == "customresourcedefinitions":
            spec = obj.get("spec") or {}
            group, plural = spec.get("group", ""), (spec.get("names") or {}).get("plural", "")
            for k in [k for k in self.resources if k[0] == group and k[2] == plural]:
                del self.resources[k]
            for _key, gone in sorted((self.objects.pop((group, plural), None) or {}).items()):
                self._deleted(group, plural, gone, gone)

    def _deleted(self, group: str, plural: str, final: JSON, prev: JSON) -> None:
        gone = copy.deepcopy(final)
        gone.setdefault("metadata", {})["resourceVersion"] = self.next_rv()
        self.record(group, plural, "DELETED", gone, prev)

    def _serve_crd(self, crd: JSON) -> None:
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        group, plural = spec["group"], names["plural"]
        for k in [k for k in self.resources if k[0] == group and k[2] == plural]:
            del self.resources[k]
        for ver in spec.get("versions") or []:
            if not ver.get("served", True):
                continue
            schema = ((ver.get("schema") or {}).get("openAPIV3Schema")) or None
            self.resources[(group, ver["name"], plural)] = Resource(
                group, ver["name"], plural, names.get("kind", ""), spec.get("scope") == "Namespaced",
                "status" in (ver.get("subresources") or {}), names.get("singular", ""),
                list(names.get("shortNames") or []), schema, collect_rules(schema or {}))
        storage = [v["name"] for v in spec.get("versions") or [] if v.get("storage")]
        crd["status"] = {"acceptedNames": copy.deepcopy(names), "storedVersions": storage,
                         "conditions": [{"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                                         "message": "no conflicts found", "lastTransitionTime": _now()},
                                        {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                                         "message": "the initial names have been accepted",
                                         "lastTransitionTime": _now()}]}


# --- request handling -------------------------------------------------------------

JSON_TYPES = ("application/json", "application/json-patch+json", "application/merge-patch+json",
              "application/strategic-merge-patch+json")


@dataclass
class FieldValidation:
    """A write's ``fieldValidation`` (``Strict``: unknown fields refused; ``Warn``, the default: dropped with a
    Warning header; ``Ignore``: dropped) and the warnings it collected."""

    mode: str = "Warn"
    warnings: List[str] = field(default_factory=list)


def _builtin_schema(res: Resource, name: str, obj: JSON, fields: FieldValidation, errors: List[str]) -> JSON:
    """A built-in object checked against Kubernetes' own schema (``k8s_schemas``): invalid fields are errors,
    unknown ones refused (Strict, 400 like the real server's strict decoding) or dropped."""
    problems = k8s_schemas.check(obj)
    errors.extend(problems.invalid)
    if not problems.unknown:
        return obj
    paths = problems.unknown_paths()
    if fields.mode == "Strict":
        raise ApiError(400, "BadRequest", f'{res.kind} in version "{res.version}" cannot be handled as a '
                       f'{res.kind}: strict decoding error: ' + ", ".join(f'unknown field "{p}"' for p in paths))
    if fields.mode == "Warn":
        fields.warnings.extend(f'unknown field "{p}"' for p in paths)
    return k8s_schemas.prune(obj, problems.unknown)


def _not_found(res: Resource, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{res.qualified} "{name}" not found',
                    {"name": name, "group": res.group, "kind": res.plural})


def _invalid(res: Resource, name: str, causes: List[str]) -> ApiError:
    """422 Invalid, each cause as the real server gives it: ``field``, ``message`` and ``reason`` apart."""
    return ApiError(422, "Invalid", f'{res.kind}{"." + res.group if res.group else ""} "{name}" is invalid: '
                    + ("[" + ", ".join(causes) + "]" if len(causes) > 1 else causes[0]),
                    {"name": name, "group": res.group, "kind": res.kind, "causes": [_cause(c) for c in causes]})


def _cause(text: str) -> JSON:
    field_path, _sep, message = text.partition(": ")
    reason = ("FieldValueRequired" if message.startswith("Required value") else
              "FieldValueNotSupported" if message.startswith("Unsupported value") else
              "FieldValueForbidden" if message.startswith("Forbidden") else "FieldValueInvalid")
    return {"reason": reason, "message": message or text, "field": field_path}


def _conflict(res: Resource, name: str, why: str = "the object has been modified; please apply your changes "
              "to the latest version and try again") -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {res.qualified} "{name}": {why}',
                    {"name": name, "group": res.group, "kind": res.plural})


def _without_rv(obj: JSON) -> JSON:
    out = dict(obj, metadata=dict(obj.get("metadata") or {}))
    out["metadata"].pop("resourceVersion", None)
    return out


def _place(res: Resource, namespace: str, obj: JSON) -> JSON:
    """Put a new object in the request's namespace (none when cluster-scoped); its metadata."""
    meta: JSON = obj.setdefault("metadata", {})
    if res.namespaced:
        if meta.get("namespace") and meta["namespace"] != namespace:
            raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the "
                           "namespace sent on the request")
        meta["namespace"] = namespace
    else:
        meta.pop("namespace", None)
    return meta


def _spec_part(obj: JSON) -> JSON:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


Admit = Callable[[Resource, str, JSON, bool, List[str]], JSON]


class Api:
    """The verbs, over a Store; ``admit`` (res, namespace, object, dry_run, warnings) -> object: the mutating
    admission a create goes through (``FakeApiServer`` sets it; None: none)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.admit: Optional[Admit] = None

    def _key(self, res: Resource, namespace: str, name: str) -> Tuple[str, str]:
        return (namespace if res.namespaced else "", name)

    def _bucket(self, res: Resource) -> Dict[Tuple[str, str], JSON]:
        return self.store.objects.setdefault((res.group, res.plural), {})

    def _validate(self, res: Resource, obj: JSON, old: Optional[JSON], fields: Optional["FieldValidation"] = None) -> JSON:
        """Schema pruning/type checks, immutability rules, built-in checks; returns the object to store."""
        name = obj["metadata"].get("name", "")
        errors: List[str] = []
        if not res.custom:
            obj = _builtin_schema(res, name, obj, fields or FieldValidation(), errors)
        if res.plural == "mutatingwebhookconfigurations":
            from tests.support import fake_admission  # pylint: disable=import-outside-toplevel  # it imports us

            errors.extend(fake_admission.check_configuration(obj))
        if not DNS1123_SUBDOMAIN.match(name) or len(name) > 253:
            errors.append(f'metadata.name: Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of '
                          "lower case alphanumeric characters, '-' or '.', and must start and end with an "
                          "alphanumeric character (e.g. 'example.com', regex used for validation is "
                          "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
        for key in ("labels", "annotations"):
            for k, v in ((obj["metadata"].get(key) or {}).items()):
                if not isinstance(v, str):
                    errors.append(f"metadata.{key}: Invalid value: {json.dumps(v)}: {key} values must be strings")
        if res.custom and res.schema:
            meta = obj.get("metadata")
            body = {k: v for k, v in obj.items() if k not in ("metadata", "apiVersion", "kind")}
            pruned = prune_and_check(body, res.schema, "", errors)
            obj = dict(pruned or {}, metadata=meta, apiVersion=obj.get("apiVersion"), kind=obj.get("kind"))
        if res.plural == "pods":
            spec = obj.get("spec") or {}
            if not spec.get("containers"):
                errors.append("spec.containers: Required value")
            for i, ctr in enumerate(spec.get("containers") or []):
                if not (ctr or {}).get("name"):
                    errors.append(f"spec.containers[{i}].name: Required value")
                if not (ctr or {}).get("image"):
                    errors.append(f"spec.containers[{i}].image: Required value")
        if res.plural == "customresourcedefinitions":
            spec = obj.get("spec") or {}
            plural, group = (spec.get("names") or {}).get("plural", ""), spec.get("group", "")
            if name != f"{plural}.{group}":
                errors.append(f'metadata.name: Invalid value: "{name}": must be spec.names.plural+"."+spec.group')
            if spec.get("scope") not in ("Namespaced", "Cluster"):
                errors.append(f'spec.scope: Unsupported value: "{spec.get("scope")}": supported values: '
                              '"Cluster", "Namespaced"')
            if not (spec.get("names") or {}).get("kind"):
                errors.append("spec.names.kind: Required value")
            if not spec.get("versions"):
                errors.append("spec.versions: Invalid value: null: must have exactly one version marked as "
                              "storage version")
        if old is not None:
            for path, message in res.rules:
                had, before = _at(old, path)
                has, after = _at(obj, path)
                if had and has and before != after:
                    errors.append(f'{".".join(path) or "<nil>"}: Invalid value: "{_type_name(after)}": {message}')
            new_fin = set(obj["metadata"].get("finalizers") or [])
            if old["metadata"].get("deletionTimestamp") and new_fin - set(old["metadata"].get("finalizers") or []):
                errors.append("metadata.finalizers: Forbidden: no new finalizers can be added if the object is "
                              "being deleted, found new finalizers " + json.dumps(sorted(new_fin - set(
                                  old["metadata"].get("finalizers") or []))))
        if errors:
            raise _invalid(res, name, errors)
        return obj

    # verbs -------------------------------------------------------------------------

    def get(self, res: Resource, namespace: str, name: str) -> JSON:
        with self.store.lock:
            obj = self._bucket(res).get(self._key(res, namespace, name))
            if obj is None:
                raise _not_found(res, name)
            return copy.deepcopy(obj)

    def list(self, res: Resource, namespace: Optional[str], query: Dict[str, str]) -> JSON:
        reqs = parse_label_selector(query.get("labelSelector", ""))
        with self.store.lock:
            items = []
            for (ns, _name), obj in sorted(self._bucket(res).items()):
                if namespace is not None and res.namespaced and ns != namespace:
                    continue
                if not label_match(obj["metadata"].get("labels") or {}, reqs):
                    continue
                if not field_match(obj, query.get("fieldSelector", ""), res):
                    continue
                items.append(copy.deepcopy(obj))
            return {"kind": res.kind + "List", "apiVersion": res.api_version,
                    "metadata": {"resourceVersion": str(self.store.rv)}, "items": items}

    def create(self, res: Resource, namespace: str, body: Any, dry_run: bool,
               fields: Optional["FieldValidation"] = None) -> JSON:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of the request was in an unknown format")
        obj = copy.deepcopy(body)
        meta = _place(res, namespace, obj)
        want_kind = obj.get("kind")
        if want_kind and want_kind != res.kind:
            raise ApiError(400, "BadRequest", f"the kind of the object ({want_kind}) does not match the resource "
                           f"({res.kind})")
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        if self.admit is not None:  # before the name is made and the object validated, as on a real server
            obj = self.admit(res, namespace, obj, dry_run, (fields or FieldValidation()).warnings)
            meta = _place(res, namespace, obj)
        with self.store.lock:
            if not meta.get("name"):
                if meta.get("generateName"):
                    chars = "bcdfghjklmnpqrstvwxz2456789"
                    meta["name"] = meta["generateName"] + "".join(random.choice(chars) for _i in range(5))
                else:
                    raise _invalid(res, "", ["metadata.name: Required value: name or generateName is required"])
            for drop in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "generation"):
                meta.pop(drop, None)
            if res.status:
                obj.pop("status", None)
                if res.plural == "pods":
                    obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
            obj["apiVersion"], obj["kind"] = res.api_version, res.kind
            obj = self._validate(res, obj, None, fields)
            if self._key(res, namespace, meta["name"]) in self._bucket(res):
                raise ApiError(409, "AlreadyExists", f'{res.qualified} "{meta["name"]}" already exists',
                               {"name": meta["name"], "group": res.group, "kind": res.plural})
            if dry_run:
                obj["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
                return obj
            return copy.deepcopy(self.store._insert(res, obj))

    def _write(self, res: Resource, namespace: str, name: str, new: JSON, old: JSON, status_only: bool,
               dry_run: bool, require_rv: bool, fields: Optional["FieldValidation"] = None) -> JSON:
        """Store ``new`` as the next version of ``old`` (the common tail of update and patch)."""
        new = copy.deepcopy(new)
        meta = new.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise ApiError(400, "BadRequest", f'the name of the object ({meta.get("name")}) does not match the '
                           f"name on the URL ({name})")
        rv = meta.get("resourceVersion")
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise _conflict(res, name)
        if require_rv and not rv:
            raise _invalid(res, name, ['metadata.resourceVersion: Invalid value: 0x0: must be specified for an '
                                       "update"])
        if status_only:
            merged = copy.deepcopy(old)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
            new = merged
        else:
            meta["name"] = name
            if res.namespaced:
                meta["namespace"] = namespace
            for keep in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                         "generation"):
                if keep in old["metadata"]:
                    meta[keep] = old["metadata"][keep]
                else:
                    meta.pop(keep, None)
            if res.status:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
        new["apiVersion"], new["kind"] = res.api_version, res.kind
        new = self._validate(res, new, old, fields)
        if _spec_part(new) != _spec_part(old):
            new["metadata"]["generation"] = int(old["metadata"].get("generation", 1)) + 1
        if _without_rv(new) == _without_rv(old):
            return copy.deepcopy(old)  # a no-op write: the real server keeps the resourceVersion
        if dry_run:
            return new
        key = self._key(res, namespace, name)
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            self.store._drop(res, key, final=new)
            return new
        new["metadata"]["resourceVersion"] = self.store.next_rv()
        self._bucket(res)[key] = new
        self.store.record(res.group, res.plural, "MODIFIED", new, old)
        if res.plural == "customresourcedefinitions":
            self.store._serve_crd(new)
        return copy.deepcopy(new)

    def replace(self, res: Resource, namespace: str, name: str, body: Any, status_only: bool,
                dry_run: bool, fields: Optional["FieldValidation"] = None) -> JSON:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of the request was in an unknown format")
        with self.store.lock:
            old = self.get(res, namespace, name)
            return self._write(res, namespace, name, body, old, status_only, dry_run, require_rv=res.custom,
                               fields=fields)

    def patch(self, res: Resource, namespace: str, name: str, body: Any, content_type: str, status_only: bool,
              dry_run: bool, fields: Optional["FieldValidation"] = None) -> JSON:
        with self.store.lock:
            old = self.get(res, namespace, name)
            if content_type == "application/json-patch+json":
                new = json_patch(old, body)
            elif content_type == "application/merge-patch+json":
                new = merge_patch(old, body)
            elif content_type == "application/strategic-merge-patch+json" and not res.custom:
                new = strategic_merge_patch(old, body)
            else:
                accepted = "application/json-patch+json, application/merge-patch+json" + (
                    "" if res.custom else ", application/strategic-merge-patch+json")
                raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                               f"accepted media types include: {accepted}")
            if not isinstance(new, dict):
                raise ApiError(400, "BadRequest", "the patch does not produce an object")
            return self._write(res, namespace, name, new, old, status_only, dry_run, require_rv=False, fields=fields)

    def delete(self, res: Resource, namespace: str, name: str, body: Any, dry_run: bool) -> JSON:
        with self.store.lock:
            old = self.get(res, namespace, name)
            pre = (body or {}).get("preconditions") or {} if isinstance(body, dict) else {}
            if pre.get("uid") and pre["uid"] != old["metadata"]["uid"]:
                raise _conflict(res, name, f"Precondition failed: UID in precondition: {pre['uid']}, UID in "
                                f"object meta: {old['metadata']['uid']}")
            if pre.get("resourceVersion") and pre["resourceVersion"] != old["metadata"]["resourceVersion"]:
                raise _conflict(res, name, f"Precondition failed: ResourceVersion in precondition: "
                                f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                                f"{old['metadata']['resourceVersion']}")
            if dry_run:
                return old
            key = self._key(res, namespace, name)
            if old["metadata"].get("finalizers"):
                obj = self._bucket(res)[key]
                if not obj["metadata"].get("deletionTimestamp"):
                    obj["metadata"]["deletionTimestamp"] = _now()
                    obj["metadata"]["deletionGracePeriodSeconds"] = 0
                    obj["metadata"]["resourceVersion"] = self.store.next_rv()
                    self.store.record(res.group, res.plural, "MODIFIED", obj, old)
                return copy.deepcopy(obj)
            self.store._drop(res, key)
            if res.custom:
                return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                        "details": {"name": name, "group": res.group, "kind": res.plural, "uid": old["metadata"]["uid"]}}
            return old


# --- watch ------------------------------------------------------------------------

@dataclass
class WatchRequest:
    """A watch asked of a collection: what ``route`` answers instead of a document."""

    res: Resource
    namespace: Optional[str]
    query: Dict[str, str]


def _expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


class WatchStream:
    """One open watch: its filters, its position in the history and its fate (dropped, expired)."""

    def __init__(self, fake: "FakeApiServer", handler: "_Handler", req: WatchRequest) -> None:
        self.fake, self.handler, self.res, self.namespace = fake, handler, req.res, req.namespace
        self.query = req.query
        self.labels = parse_label_selector(req.query.get("labelSelector", ""))
        self.fields = req.query.get("fieldSelector", "")
        field_match({}, self.fields, self.res)  # a bad field selector is a 400 before the stream starts
        self.bookmarks = req.query.get("allowWatchBookmarks") in ("true", "1")
        try:
            timeout = float(req.query["timeoutSeconds"]) if req.query.get("timeoutSeconds") else fake.watch_timeout
        except ValueError:
            raise ApiError(400, "BadRequest", f"invalid timeoutSeconds {req.query['timeoutSeconds']!r}") from None
        self.deadline = time.monotonic() + timeout
        self.position = 0
        self.dropped = self.expired = False

    @property
    def path(self) -> str:
        return self.handler.path

    def matches(self, obj: JSON) -> bool:
        meta = obj.get("metadata") or {}
        if self.namespace is not None and self.res.namespaced and meta.get("namespace") != self.namespace:
            return False
        return label_match(meta.get("labels") or {}, self.labels) and field_match(obj, self.fields, self.res)

    def start(self) -> List[JSON]:
        """Under the store's lock: the first events (the current state when no resourceVersion is given)."""
        store = self.fake.store
        rv = self.query.get("resourceVersion") or ""
        if rv in ("", "0"):
            self.position = store.rv
            return [{"type": "ADDED", "object": copy.deepcopy(obj)}
                    for _key, obj in sorted(store.objects.get((self.res.group, self.res.plural), {}).items())
                    if self.matches(obj)]
        try:
            self.position = int(rv)
        except ValueError:
            raise ApiError(400, "BadRequest", f"invalid resourceVersion {rv!r}") from None
        if self.position < store.compacted_rv:
            raise _expired(f"too old resource version: {self.position} ({store.compacted_rv})")
        return []

    def convert(self, ev: WatchEvent) -> Optional[JSON]:
        """What this watcher sees of one change (selectors as the watch cache applies them), or None."""
        if (ev.group, ev.plural) != (self.res.group, self.res.plural):
            return None
        was_in = ev.prev is not None and self.matches(ev.prev)
        if ev.type == "DELETED":
            return {"type": "DELETED", "object": ev.obj} if was_in or self.matches(ev.obj) else None
        now_in = self.matches(ev.obj)
        if now_in:
            return {"type": "MODIFIED" if was_in else "ADDED", "object": ev.obj}
        if was_in and ev.prev is not None:
            gone = copy.deepcopy(ev.prev)
            gone["metadata"]["resourceVersion"] = str(ev.rv)
            return {"type": "DELETED", "object": gone}
        return None

    def _next(self, next_bookmark: float) -> Optional[List[JSON]]:
        """Wait for changes (or a bookmark or the deadline); the events to send, or None when the stream ends."""
        store = self.fake.store
        with store.lock:
            while not (self.dropped or self.expired or self.fake.closing or store.rv > self.position):
                now = time.monotonic()
                wake = min(self.deadline, next_bookmark)
                if now >= wake:
                    break
                store.changed.wait(min(wake - now, 0.5))
            if self.dropped or self.fake.closing:
                return None
            if self.expired or self.position < store.compacted_rv:
                self.expired = True
                return [{"type": "ERROR", "object": _expired(
                    f"too old resource version: {self.position} ({store.compacted_rv})").status()}]
            events = [out for ev in store.history if ev.rv > self.position
                      for out in [self.convert(ev)] if out is not None]
            self.position = store.rv
            return events

    def run(self, first: List[JSON]) -> None:
        """Send the events until the deadline, an expiry (ERROR then a clean end) or a drop (cut, no end)."""
        interval = self.fake.bookmark_interval
        next_bookmark = time.monotonic() + interval if self.bookmarks else float("inf")
        self._send(first)
        while True:
            events = self._next(next_bookmark)
            if events is None:
                self.cut()
                return
            self._send(events)
            if self.expired:
                break
            now = time.monotonic()
            if now >= next_bookmark:
                self._send([{"type": "BOOKMARK", "object": {"kind": self.res.kind, "apiVersion": self.res.api_version,
                                                            "metadata": {"resourceVersion": str(self.position)}}}])
                next_bookmark = now + interval
            if now >= self.deadline:
                break
        with self.fake.store.lock:
            self.fake.watches.discard(self)  # closed before the client can see the end
        self.handler.wfile.write(b"0\r\n\r\n")

    def _send(self, events: List[JSON]) -> None:
        for event in events:
            data = json.dumps(event).encode() + b"\n"
            self.handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def cut(self) -> None:
        """Close the connection at once, mid-stream (the client sees it end without the last chunk)."""
        self.dropped = True
        try:
            self.handler.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_HttpServer"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's signature
        pass

    def _send(self, code: int, doc: Any, warnings: Sequence[str] = ()) -> None:
        data = json.dumps(doc).encode()
        self.send_response(code)
        for warning in warnings:
            self.send_header("Warning", '299 - ' + json.dumps(warning))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(400, "BadRequest", "the body of the request could not be decoded as JSON") from None

    def _handle(self) -> None:
        fake: FakeApiServer = self.server.fake
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        warnings: List[str] = []
        try:
            if ctype and ctype not in JSON_TYPES:  # protobuf (kubectl's typed commands), CBOR, YAML: not spoken here
                raise ApiError(415, "UnsupportedMediaType", f'the body of the request was in an unknown format - '
                               f'accepted media types include: {", ".join(JSON_TYPES)}')
            body = self._body()
            with fake.store.lock:
                fake.requests.append({"method": self.command, "path": parts.path, "query": query,
                                      "content_type": ctype})
            if fake.token is not None and self.headers.get("Authorization") != f"Bearer {fake.token}":
                raise ApiError(401, "Unauthorized", "Unauthorized")
            code, doc = fake.route(self.command, parts.path, query, body, ctype, warnings)
            if warnings:
                with fake.store.lock:
                    fake.warnings.extend(f"{self.command} {parts.path}: {w}" for w in warnings)
            if isinstance(doc, WatchRequest):
                self._watch(WatchStream(fake, self, doc))
                return
        except ApiError as exc:
            code, doc = exc.code, exc.status()
        except Exception as exc:  # noqa: BLE001 - a bug in the fake must show as 500, not hang the client
            code, doc = 500, ApiError(500, "InternalError", f"fake apiserver: {type(exc).__name__}: {exc}").status()
        self._send(code, doc, warnings)

    def _watch(self, stream: WatchStream) -> None:
        """Answer a watch: its first events, then the changes, as a chunked stream of JSON lines."""
        fake: FakeApiServer = self.server.fake
        with fake.store.lock:
            first = stream.start()  # an ApiError (410, 400) is answered as a plain Status by _handle
            fake.watches.add(stream)
        self.close_connection = True
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            stream.run(first)
        except OSError:
            pass  # the client went away
        finally:
            with fake.store.lock:
                fake.watches.discard(stream)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    fake: "FakeApiServer"

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (reset, broken pipe; common with cut watches) is no error of the server."""
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class FakeApiServer:
    """``with FakeApiServer() as api: ...``; ``api.url``, ``api.write_kubeconfig(path)``, ``api.store``."""

    VERSION = {"major": "1", "minor": "34", "gitVersion": "v1.34.0-warmstart-fake", "gitCommit": "0" * 40,
               "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24.0",
               "compiler": "gc", "platform": "linux/amd64"}

    def __init__(self, token: Optional[str] = None, history: int = 1000, bookmark_interval: float = 1.0,
                 watch_timeout: float = 1800.0) -> None:
        self.token = token
        self.store = Store(history)
        self.api = Api(self.store)
        self.requests: List[JSON] = []
        self.warnings: List[str] = []  # every Warning header answered (unknown fields dropped), for tests to check
        # clientConfig.service (namespace, name) of a webhook -> the base URL that serves it, "https://127.0.0.1:8443"
        self.service_urls: Dict[Tuple[str, str], str] = {}
        self.admission_calls: List[JSON] = []  # every webhook call: {"configuration", "webhook", "outcome"}
        self.api.admit = self._admit
        self.kubeconfig: Optional[Path] = None
        self.bookmark_interval = bookmark_interval
        self.watch_timeout = watch_timeout
        self.watches: Set[WatchStream] = set()
        self.closing = False
        self._errors: Optional[Tuple[int, float]] = None  # (code, until) of answer_errors
        self._port = 0
        self._offline_timer: Optional[threading.Timer] = None
        self._httpd: Optional[_HttpServer] = None
        self._thread: Optional[threading.Thread] = None

    # lifecycle ---------------------------------------------------------------------

    def start(self) -> "FakeApiServer":
        self.closing = False
        self._httpd = _HttpServer(("127.0.0.1", self._port), _Handler)
        self._httpd.fake = self
        self._port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-apiserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._offline_timer is not None:
            self._offline_timer.cancel()
        with self.store.lock:
            self.closing = True
            self.store.changed.notify_all()
        self.drop_watches()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> "FakeApiServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._port, "server not started"
        return f"http://127.0.0.1:{self._port}"

    def request(self, method: str, path: str, body: Any = None, query: str = "",
                timeout: float = 20) -> Tuple[int, Any, Any]:
        """(status, headers, JSON answer) of one raw request, as any client would send it (no proxy)."""
        import urllib.error  # pylint: disable=import-outside-toplevel  # only raw-request tests pay for it
        import urllib.request  # pylint: disable=import-outside-toplevel

        request = urllib.request.Request(f"{self.url}{path}{query}", data=json.dumps(body).encode(), method=method,
                                         headers={"Content-Type": "application/json"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=timeout) as answer:
                return answer.status, answer.headers, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers, json.loads(exc.read())

    def install_crds(self, path: Optional[Path] = None) -> "FakeApiServer":
        """Store the collection's CRDs (roles/k8s_crds/files/crds.yaml, or ``path``), as the k8s_crds role would;
        each is first checked against Kubernetes' own CustomResourceDefinition schema (a problem raises)."""
        import yaml  # pylint: disable=import-outside-toplevel  # only the tests that need CRDs pay for it

        for crd in yaml.safe_load((path or CRDS).read_text())["items"]:
            found = k8s_schemas.check(crd)  # as the real server would check them on apply
            if found.unknown or found.invalid:
                raise ValueError(f"CustomResourceDefinition {crd.get('metadata', {}).get('name')}: "
                                 + "; ".join(found.invalid + [f"unknown field {u}" for u in found.unknown_paths()]))
            self.store.put("customresourcedefinitions", crd, group="apiextensions.k8s.io")
        return self

    def write_kubeconfig(self, path: Path, context: str = "fake", namespace: str = "default",
                         token: Optional[str] = None) -> Path:
        """Write a kubeconfig whose context ``context`` points here (with the server's token unless given).

        The first one written becomes ``.kubeconfig``."""
        token = self.token if token is None else token
        user: JSON = {"token": token} if token else {}
        doc = {"apiVersion": "v1", "kind": "Config", "preferences": {},
               "clusters": [{"name": context, "cluster": {"server": self.url}}],
               "users": [{"name": f"{context}-user", "user": user}],
               "contexts": [{"name": context, "context": {"cluster": context, "user": f"{context}-user",
                                                          "namespace": namespace}}],
               "current-context": context}
        path.write_text(json.dumps(doc, indent=2))
        if self.kubeconfig is None:
            self.kubeconfig = path
        return path

    def _admit(self, res: Resource, namespace: str, obj: JSON, dry_run: bool, warnings: List[str]) -> JSON:
        """The mutating admission webhooks of this server, on a new object (``fake_admission.admit``)."""
        from tests.support import fake_admission  # pylint: disable=import-outside-toplevel  # it imports us

        return fake_admission.admit(self, res, namespace, obj, dry_run, warnings)

    # test helpers ------------------------------------------------------------------

    def add_pod(self, name: str, namespace: str = "default", containers: Optional[List[JSON]] = None,
                labels: Optional[Dict[str, str]] = None, node: str = "node-1", phase: str = "Running",
                spec: Optional[JSON] = None, status: Optional[JSON] = None,
                annotations: Optional[Dict[str, str]] = None) -> JSON:
        """Store a scheduled pod with a status (as if the scheduler and kubelet had run); returns it."""
        containers = containers or [{"name": "main", "image": "registry.local/embed:1.0",
                                     "command": ["python", "/app/server.py"]}]
        pod_spec = dict(spec or {}, containers=containers) if "containers" not in (spec or {}) else dict(spec or {})
        pod_spec.setdefault("nodeName", node)
        pod_status = status if status is not None else {
            "phase": phase, "podIP": "10.0.0.7", "hostIP": "192.168.0.10",
            "conditions": [{"type": "PodScheduled", "status": "True"},
                           {"type": "Ready", "status": "True" if phase == "Running" else "False"}],
            "containerStatuses": [{"name": c["name"], "image": c.get("image", ""),
                                   "imageID": f"{c.get('image', '')}@sha256:{'ab' * 32}",
                                   "containerID": f"containerd://{uuid.uuid4().hex}{uuid.uuid4().hex}",
                                   "ready": phase == "Running", "restartCount": 0,
                                   "state": {"running": {"startedAt": _now()}} if phase == "Running" else
                                   {"waiting": {"reason": "ContainerCreating"}}} for c in pod_spec["containers"]]}
        meta: JSON = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
        if annotations:
            meta["annotations"] = dict(annotations)
        return self.store.put("pods", {"metadata": meta, "spec": pod_spec, "status": pod_status}, group="")

    def writes(self) -> List[JSON]:
        """The requests that could change something (POST, PUT, PATCH, DELETE), in order."""
        with self.store.lock:
            return [r for r in self.requests if r["method"] in WRITE_VERBS]

    # faults --------------------------------------------------------------------------

    def open_watches(self) -> List[JSON]:
        """The watch streams open now: ``[{"path", "query", "resource_version"}]`` (their position)."""
        with self.store.lock:
            return [{"path": urlsplit(w.path).path, "query": dict(w.query), "resource_version": str(w.position)}
                    for w in self.watches if not w.dropped]

    def wait_watches(self, count: int, timeout: float = 10.0, path: Optional[str] = None) -> List[JSON]:
        """Wait until at least ``count`` watches (on ``path`` when given) are open; returns them."""
        deadline = time.monotonic() + timeout
        while True:
            open_now = [w for w in self.open_watches() if path is None or w["path"] == path]
            if len(open_now) >= count:
                return open_now
            if time.monotonic() >= deadline:
                raise AssertionError(f"{len(open_now)} watch(es) open{' on ' + path if path else ''} after "
                                     f"{timeout:g} s, wanted {count}: {self.open_watches()}")
            time.sleep(0.02)

    def drop_watches(self) -> int:
        """Cut every open watch connection mid-stream; returns how many."""
        with self.store.lock:
            streams = [w for w in self.watches if not w.dropped]
            for stream in streams:
                stream.cut()
            self.store.changed.notify_all()
        return len(streams)

    def compact(self, interrupt: bool = True) -> None:
        """Forget the history: resuming from any resourceVersion seen so far answers 410 Gone; with
        ``interrupt``, every open watch gets an ERROR 410 event now, in the middle of its stream, and ends."""
        with self.store.lock:
            self.store.history.clear()
            self.store.compacted_rv = self.store.rv
            if interrupt:
                for stream in self.watches:
                    stream.expired = True
            self.store.changed.notify_all()

    def answer_errors(self, code: int = 403, seconds: Optional[float] = None) -> None:
        """Answer every resource request (not discovery) with ``code`` for ``seconds`` (None: until ``heal``)."""
        with self.store.lock:
            self._errors = (code, time.monotonic() + seconds if seconds is not None else float("inf"))

    def heal(self) -> None:
        with self.store.lock:
            self._errors = None

    def go_offline(self, seconds: Optional[float] = None) -> None:
        """Stop listening and cut every connection (clients get 'connection refused'); back after ``seconds``
        (None: when ``go_online`` is called), on the same port."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        self.drop_watches()
        if seconds is not None:
            self._offline_timer = threading.Timer(seconds, self.go_online)
            self._offline_timer.daemon = True
            self._offline_timer.start()

    def go_online(self) -> None:
        if self._httpd is None:
            self.start()

    def _injected_error(self, method: str, res: Resource, namespace: Optional[str], name: Optional[str],
                        watch: bool) -> None:
        with self.store.lock:
            if self._errors is None:
                return
            code, until = self._errors
            if time.monotonic() >= until:
                self._errors = None
                return
        if code == 403:
            verb = {"GET": "watch" if watch else ("get" if name else "list"), "POST": "create", "PUT": "update",
                    "PATCH": "patch", "DELETE": "delete"}.get(method, method.lower())
            scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
            raise ApiError(403, "Forbidden", f'{res.qualified} {(name + " ") if name else ""}is forbidden: User '
                           f'"system:serviceaccount:warmstart:agent" cannot {verb} resource "{res.plural}" in API '
                           f'group "{res.group}" {scope}',
                           {"name": name or "", "group": res.group, "kind": res.plural})
        reason = {500: "InternalError", 503: "ServiceUnavailable", 429: "TooManyRequests"}.get(code, "Unknown")
        raise ApiError(code, reason, f"fake apiserver: injected {code} {reason}")

    # routing -----------------------------------------------------------------------

    def _discovery(self, path: str) -> Optional[JSON]:
        store = self.store
        if path in ("/version", "/version/"):
            return self.VERSION
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": self.url[7:]}]}
        if path == "/apis":
            groups: Dict[str, List[str]] = {}
            for (group, version, _plural) in store.resources:
                if group and version not in groups.setdefault(group, []):
                    groups[group].append(version)
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                 "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}}
                for g, vs in sorted(groups.items())]}
        m = re.match(r"^/apis/([^/]+)/?$", path)
        if m:
            versions = sorted({v for (g, v, _plural) in store.resources if g == m.group(1)})
            if not versions:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return {"kind": "APIGroup", "apiVersion": "v1", "name": m.group(1),
                    "versions": [{"groupVersion": f"{m.group(1)}/{v}", "version": v} for v in versions],
                    "preferredVersion": {"groupVersion": f"{m.group(1)}/{versions[0]}", "version": versions[0]}}
        m = re.match(r"^/api/(v1)/?$", path) or re.match(r"^/apis/([^/]+/[^/]+)/?$", path)
        if m:
            gv = m.group(1)
            group, version = gv.split("/") if "/" in gv else ("", gv)
            resources = []
            for (g, v, _plural), res in sorted(store.resources.items()):
                if g != group or v != version:
                    continue
                verbs = ["create", "delete", "get", "list", "patch", "update"]
                resources.append({"name": res.plural, "singularName": res.singular, "namespaced": res.namespaced,
                                  "kind": res.kind, "verbs": verbs, "shortNames": res.short_names})
                if res.status:
                    resources.append({"name": f"{res.plural}/status", "singularName": "", "namespaced":
                                      res.namespaced, "kind": res.kind, "verbs": ["get", "patch", "update"]})
            if not resources:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}
        return None

    def route(self, method: str, path: str, query: Dict[str, str], body: Any, ctype: str,
              warnings: Optional[List[str]] = None) -> Tuple[int, Any]:
        """The answer to one request; ``warnings`` collects the Warning headers it carries (unknown fields)."""
        warnings = warnings if warnings is not None else []
        if method == "GET":
            doc = self._discovery(path.rstrip("/") or "/")
            if doc is not None:
                return 200, doc
        watch = query.get("watch") in ("true", "1")
        m = re.match(r"^/api/v1/(.*)$", path) or re.match(r"^/apis/([^/]+)/([^/]+)/(.*)$", path)
        if not m:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if path.startswith("/api/v1/"):
            group, version, rest = "", "v1", m.group(1)
        else:
            group, version, rest = m.group(1), m.group(2), m.group(3)
        segs = [unquote(s) for s in rest.strip("/").split("/")]
        namespace: Optional[str] = None
        if len(segs) >= 3 and segs[0] == "namespaces" and (group, version, segs[2]) in self.store.resources \
                and self.store.resources[(group, version, segs[2])].namespaced:
            namespace, segs = segs[1], segs[2:]
        res = self.store.resource(group, version, segs[0])
        name = segs[1] if len(segs) > 1 else None
        sub = segs[2] if len(segs) > 2 else None
        if len(segs) > 3 or (sub is not None and (sub != "status" or not res.status)):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if res.namespaced and namespace is None and (name is not None or method != "GET"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        ns = namespace or ""
        dry_run = query.get("dryRun") == "All"
        fields = FieldValidation(query.get("fieldValidation") or "Warn", warnings)
        if fields.mode not in ("Ignore", "Warn", "Strict"):
            raise ApiError(400, "BadRequest", f"fieldValidation must be one of Ignore, Warn or Strict, not "
                           f"{fields.mode!r}")
        self._injected_error(method, res, namespace, name, watch and name is None)
        if name is None:
            if method == "GET" and watch:
                return 200, WatchRequest(res, namespace, query)
            if method == "GET":
                return 200, self.api.list(res, namespace, query)
            if method == "POST":
                return 201, self.api.create(res, ns, body, dry_run, fields)
            raise ApiError(405, "MethodNotAllowed", f"the server does not allow this method on the requested "
                           f"resource ({method} on a collection)")
        if method == "GET":
            return 200, self.api.get(res, ns, name)
        if method == "PUT":
            return 200, self.api.replace(res, ns, name, body, sub == "status", dry_run, fields)
        if method == "PATCH":
            return 200, self.api.patch(res, ns, name, body, ctype, sub == "status", dry_run, fields)
        if method == "DELETE" and sub is None:
            return 200, self.api.delete(res, ns, name, body, dry_run)
        raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")


try:
    import pytest
except ImportError:  # pragma: no cover - the server itself needs no pytest
    pytest = None  # type: ignore[assignment]

if pytest is not None:
    @pytest.fixture
    def fake_apiserver(tmp_path: Path) -> Iterator[FakeApiServer]:
        """A started fake API server with ``.kubeconfig`` (a file; context ``fake``, namespace default)."""
        server = FakeApiServer().start()
        server.write_kubeconfig(tmp_path / "kubeconfig")
        try:
            yield server
        finally:
            server.stop()
