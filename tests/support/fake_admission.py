"""Mutating admission webhooks for the fake API server (``fake_apiserver``), called as a real kube-apiserver does.

On every create, after the object is placed in the request's namespace and before it is named from
``generateName``, validated and stored (so a webhook sees no name, as on a real server), each
``admissionregistration.k8s.io/v1`` MutatingWebhookConfiguration (sorted by name) and each of its ``webhooks``
in order is matched against the request:

* ``rules``: ``operations`` (``CREATE`` or ``*``), ``apiGroups``, ``apiVersions``, ``resources`` (``*``,
  ``*/*``) and ``scope`` (``*``, ``Namespaced``, ``Cluster``); versions match exactly (``matchPolicy:
  Equivalent`` converts nothing here);
* ``namespaceSelector`` against the namespace's labels plus ``kubernetes.io/metadata.name: <namespace>`` (a
  Namespace: its own labels; other cluster-scoped objects always match) and ``objectSelector`` against the
  object's labels: ``matchLabels`` and ``matchExpressions`` (In, NotIn, Exists, DoesNotExist);
* ``matchConditions`` (CEL) are not evaluated: a webhook that has them is a failed call.

A matching webhook gets an ``admission.k8s.io/v1`` AdmissionReview POSTed over HTTPS within ``timeoutSeconds``
(default 10; sent as ``?timeout=<n>s``), the server's certificate checked against ``clientConfig.caBundle``
(system trust without one). ``clientConfig.url`` is called as given; ``clientConfig.service`` is routed through
``server.service_urls[(namespace, name)]``, a base URL (``https://127.0.0.1:8443``) to which the service's
``path`` is added, its port ignored, and the certificate verified for ``<name>.<namespace>.svc`` as a real
server does. Like the real request, the review leaves out an empty ``name`` (``generateName``). The answer:

* ``allowed: false``: the create is refused with the response's ``status`` (code 400 when missing or below 400),
  message ``admission webhook "<name>" denied the request: <message>``;
* a ``JSONPatch`` ``patch`` is applied to the object; one that does not apply answers 500 InternalError whatever
  the failurePolicy, as on a real server;
* ``warnings`` reach the client as ``Warning`` headers (and ``server.warnings``), denied or not;
* a failed call (refused, TLS, timeout, non-2xx, not JSON, not an AdmissionReview, ``response.uid`` not the
  request's, a patch without a ``patchType``, an unknown service): with ``failurePolicy: Fail`` (the default)
  500 InternalError ``Internal error occurred: failed calling webhook "<name>": <cause>``; with ``Ignore`` the
  create goes on without that webhook.

A dry-run create calls webhooks with ``dryRun: true``; one whose ``sideEffects`` is not None / NoneOnDryRun
refuses it (400, ``admission webhook "<name>" does not support dry run``), as a real server does (v1 validation
lets no such configuration in). Webhooks are never called for webhook configurations. Not done: updates,
deletes, reinvocation (``reinvocationPolicy``), validating webhooks, AdmissionReview v1beta1.

Every webhook considered after matching is recorded in ``server.admission_calls``: ``{"configuration",
"webhook", "outcome"}`` with outcome ``patched``, ``allowed``, ``denied``, ``failed: <cause>`` or
``ignored: <cause>``.
"""
from __future__ import annotations

import base64
import binascii
import copy
import http.client
import json
import socket
import ssl
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Set
from urllib.parse import urlsplit

from tests.support.fake_apiserver import (ADMISSION_GROUP, DNS1123_SUBDOMAIN, JSON, ApiError, FakeApiServer,
                                          Resource, json_patch, label_match)

REVIEW_VERSION = "admission.k8s.io/v1"
USER_INFO: JSON = {"username": "system:serviceaccount:warmstart:agent",
                   "groups": ["system:serviceaccounts", "system:serviceaccounts:warmstart", "system:authenticated"]}
NAME_LABEL = "kubernetes.io/metadata.name"
SELECTOR_OPS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
SIDE_EFFECTS = ("None", "NoneOnDryRun")


class CallFailed(Exception):
    """A webhook that could not be called or answered no valid review: its ``failurePolicy`` decides."""


def admit(fake: FakeApiServer, res: Resource, namespace: str, obj: JSON, dry_run: bool,
          warnings: List[str]) -> JSON:
    """``obj`` after every matching mutating webhook of ``fake``; an ApiError when one refuses it."""
    if res.group == ADMISSION_GROUP:
        return obj
    ns_labels = _namespace_labels(fake, res, namespace, obj)
    for config in fake.store.list("mutatingwebhookconfigurations", group=ADMISSION_GROUP):  # sorted by name
        for hook in config.get("webhooks") or []:
            if _matches(hook, res, ns_labels, obj):
                obj = _invoke(fake, config["metadata"]["name"], hook, res, namespace, obj, dry_run, warnings)
    return obj


def check_configuration(obj: JSON) -> List[str]:
    """What a real server's validation refuses in a MutatingWebhookConfiguration beyond its schema."""
    errors: List[str] = []
    seen: Set[str] = set()
    for i, hook in enumerate(obj.get("webhooks") or []):
        if not isinstance(hook, dict):
            continue
        at, name = f"webhooks[{i}]", hook.get("name")
        if isinstance(name, str):
            if len(name.split(".")) < 3 or not DNS1123_SUBDOMAIN.match(name):
                errors.append(f'{at}.name: Invalid value: "{name}": should be a domain with at least three segments '
                              "separated by dots")
            if name in seen:
                errors.append(f'{at}.name: Duplicate value: "{name}"')
            seen.add(name)
        side = hook.get("sideEffects")
        if side is None:
            errors.append(f"{at}.sideEffects: Required value: must specify one of None, NoneOnDryRun")
        elif side not in SIDE_EFFECTS:
            errors.append(f'{at}.sideEffects: Unsupported value: "{side}": supported values: "None", "NoneOnDryRun"')
        if hook.get("failurePolicy") not in (None, "Fail", "Ignore"):
            errors.append(f'{at}.failurePolicy: Unsupported value: "{hook["failurePolicy"]}": supported values: '
                          '"Fail", "Ignore"')
        timeout = hook.get("timeoutSeconds")
        if isinstance(timeout, int) and not 1 <= timeout <= 30:
            errors.append(f"{at}.timeoutSeconds: Invalid value: {timeout}: the timeout value must be between 1 and "
                          "30 seconds")
        client = _client_config(hook)
        if bool(client.get("url")) == bool(client.get("service")):
            errors.append(f"{at}.clientConfig: Required value: exactly one of url or service is required")
        elif client.get("url") and urlsplit(str(client["url"])).scheme != "https":
            errors.append(f'{at}.clientConfig.url: Invalid value: "{urlsplit(str(client["url"])).scheme}": '
                          "'https' is the only allowed URL scheme")
    return errors


# --- matching ---------------------------------------------------------------------

def selector_matches(selector: Optional[JSON], labels: Dict[str, str]) -> bool:
    """A LabelSelector (``matchLabels``, ``matchExpressions``) against ``labels``; empty or null matches all."""
    selector = selector or {}
    reqs = [(str(k), "=", [str(v)]) for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        op = SELECTOR_OPS.get(str(expr.get("operator")))
        if op is None:
            return False
        reqs.append((str(expr.get("key", "")), op, [str(v) for v in expr.get("values") or []]))
    return label_match(labels, reqs)


def _rule_matches(rule: JSON, res: Resource) -> bool:
    def has(key: str, value: str) -> bool:
        return any(v in ("*", value) for v in rule.get(key) or [])

    def resource(entry: str) -> bool:
        name, _sep, sub = entry.partition("/")
        return name in ("*", res.plural) and sub in ("*", "")  # a create of the resource itself: no subresource

    return (has("operations", "CREATE") and has("apiGroups", res.group) and has("apiVersions", res.version)
            and any(resource(str(r)) for r in rule.get("resources") or [])
            and (rule.get("scope") or "*") in ("*", "Namespaced" if res.namespaced else "Cluster"))


def _namespace_labels(fake: FakeApiServer, res: Resource, namespace: str, obj: JSON) -> Optional[Dict[str, str]]:
    """The labels a namespaceSelector sees; None for a cluster-scoped object, which every selector matches."""
    if res.group == "" and res.plural == "namespaces":
        meta = obj.get("metadata") or {}
        return dict(meta.get("labels") or {}, **{NAME_LABEL: str(meta.get("name", ""))})
    if not res.namespaced:
        return None
    ns = fake.store.get("namespaces", namespace, group="") or {}
    return dict((ns.get("metadata") or {}).get("labels") or {}, **{NAME_LABEL: namespace})


def _matches(hook: JSON, res: Resource, ns_labels: Optional[Dict[str, str]], obj: JSON) -> bool:
    return (any(_rule_matches(rule, res) for rule in hook.get("rules") or [])
            and (ns_labels is None or selector_matches(hook.get("namespaceSelector"), ns_labels))
            and selector_matches(hook.get("objectSelector"), (obj.get("metadata") or {}).get("labels") or {}))


# --- calling ----------------------------------------------------------------------

def _invoke(fake: FakeApiServer, configuration: str, hook: JSON, res: Resource, namespace: str, obj: JSON,
            dry_run: bool, warnings: List[str]) -> JSON:
    """Call one matching webhook and apply its answer: the object after it."""
    name = str(hook.get("name", ""))

    def record(outcome: str) -> None:
        with fake.store.lock:
            fake.admission_calls.append({"configuration": configuration, "webhook": name, "outcome": outcome})

    try:
        if dry_run and hook.get("sideEffects") is None:
            raise CallFailed("Webhook SideEffects is nil")
        if dry_run and hook.get("sideEffects") not in SIDE_EFFECTS:
            record(f'failed: admission webhook "{name}" does not support dry run')
            raise ApiError(400, "BadRequest", f'admission webhook "{name}" does not support dry run')
        if hook.get("matchConditions"):
            raise CallFailed("the fake API server does not evaluate matchConditions")
        if "v1" not in (hook.get("admissionReviewVersions") or []):
            raise CallFailed("could not create admission objects: the fake API server sends only "
                             f"{REVIEW_VERSION} reviews")
        uid = str(uuid.uuid4())
        response = _call(fake, hook, _review(uid, res, namespace, obj, dry_run), uid)
        warnings.extend(str(w) for w in response.get("warnings") or [])
        if not response.get("allowed"):
            record("denied")
            raise _denied(name, response.get("status"))
        ops = _patch(response)
    except CallFailed as exc:
        if hook.get("failurePolicy") == "Ignore":
            record(f"ignored: {exc}")
            return obj
        record(f"failed: {exc}")
        cause = f'failed calling webhook "{name}": {exc}'
        raise ApiError(500, "InternalError", f"Internal error occurred: {cause}", {"causes": [{"message": cause}]}) \
            from None
    if not ops:
        record("allowed")
        return obj
    try:
        patched = json_patch(obj, ops)
        if not isinstance(patched, dict):
            raise ApiError(500, "InternalError", "the patch does not produce an object")
    except ApiError as exc:
        record(f"failed: {exc.message}")
        raise ApiError(500, "InternalError", f"Internal error occurred: {exc.message}",
                       {"causes": [{"message": exc.message}]}) from None
    record("patched")
    return patched


def _review(uid: str, res: Resource, namespace: str, obj: JSON, dry_run: bool) -> JSON:
    """The AdmissionReview a real server sends for a create (empty name and namespace left out, as Go does)."""
    kind = {"group": res.group, "version": res.version, "kind": res.kind}
    resource = {"group": res.group, "version": res.version, "resource": res.plural}
    options: JSON = {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
    if dry_run:
        options["dryRun"] = ["All"]
    request: JSON = {"uid": uid, "kind": kind, "resource": resource, "requestKind": dict(kind),
                     "requestResource": dict(resource), "operation": "CREATE", "userInfo": copy.deepcopy(USER_INFO),
                     "object": copy.deepcopy(obj), "oldObject": None, "dryRun": dry_run, "options": options}
    name = (obj.get("metadata") or {}).get("name")
    if name:
        request["name"] = name
    if res.namespaced and namespace:
        request["namespace"] = namespace
    return {"apiVersion": REVIEW_VERSION, "kind": "AdmissionReview", "request": request}


@dataclass
class _Target:
    """Where a webhook is called: ``shown`` (the URL a real server names), the address and the TLS name."""

    shown: str
    host: str
    port: int
    path: str
    tls_name: str
    host_header: Optional[str] = None


def _target(fake: FakeApiServer, client: JSON, timeout: int) -> _Target:
    service = client.get("service")
    if client.get("url"):
        parts = urlsplit(str(client["url"]))
        shown, tls_name, host_header = f"{client['url']}?timeout={timeout}s", parts.hostname or "", None
    elif isinstance(service, dict):
        ns, svc, path = str(service.get("namespace", "")), str(service.get("name", "")), service.get("path") or "/"
        shown = f"https://{svc}.{ns}.svc:{service.get('port', 443)}{path}?timeout={timeout}s"
        base = fake.service_urls.get((ns, svc))
        if base is None:
            raise CallFailed(f'failed to call webhook: Post "{shown}": service "{svc}" not found')
        parts = urlsplit(base.rstrip("/") + str(path))
        tls_name, host_header = f"{svc}.{ns}.svc", f"{svc}.{ns}.svc:{service.get('port', 443)}"
    else:
        raise CallFailed("could not get REST client: exactly one of url or service is required")
    if parts.scheme != "https" or not parts.hostname:
        raise CallFailed(f"could not get REST client: 'https' is the only allowed URL scheme: {shown}")
    return _Target(shown, parts.hostname, parts.port or 443, f"{parts.path or '/'}?timeout={timeout}s", tls_name,
                   host_header)


class _Https(http.client.HTTPSConnection):
    """An HTTPS connection to ``host:port`` whose certificate is verified for ``tls_name``."""

    def __init__(self, target: _Target, tls: ssl.SSLContext, timeout: float) -> None:
        super().__init__(target.host, target.port, timeout=timeout, context=tls)
        self.tls, self.tls_name = tls, target.tls_name

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        try:
            self.sock = self.tls.wrap_socket(sock, server_hostname=self.tls_name)
        except OSError:
            sock.close()
            raise


def _client_config(hook: JSON) -> JSON:
    client = hook.get("clientConfig")
    return client if isinstance(client, dict) else {}


def _tls(client: JSON) -> ssl.SSLContext:
    bundle = client.get("caBundle")
    if not bundle:
        return ssl.create_default_context()
    try:
        return ssl.create_default_context(cadata=base64.b64decode(str(bundle), validate=True).decode())
    except (binascii.Error, UnicodeDecodeError, ValueError, ssl.SSLError) as exc:
        raise CallFailed(f"could not get REST client: unable to load root certificates: {exc}") from None


def _call(fake: FakeApiServer, hook: JSON, review: JSON, uid: str) -> JSON:
    """POST ``review`` to the webhook: the ``response`` of its answer, checked as a real server checks it."""
    client = _client_config(hook)
    timeout = int(hook.get("timeoutSeconds") or 10)
    target = _target(fake, client, timeout)
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if target.host_header:
        headers["Host"] = target.host_header
    conn = _Https(target, _tls(client), timeout)
    try:
        conn.request("POST", target.path, json.dumps(review).encode(), headers)
        answer = conn.getresponse()
        data = answer.read()
    except (OSError, http.client.HTTPException) as exc:  # refused, TLS, timeout, a cut connection
        raise CallFailed(f'failed to call webhook: Post "{target.shown}": {exc}') from None
    finally:
        conn.close()
    if not 200 <= answer.status < 300:
        raise CallFailed(f"failed to call webhook: the server responded with HTTP {answer.status}: "
                         f"{data[:200].decode(errors='replace')}")
    try:
        doc = json.loads(data)
        response = doc.get("response") if isinstance(doc, dict) else None
        if isinstance(response, dict) and response.get("patch") is not None:
            response["patch"] = base64.b64decode(str(response["patch"]), validate=True)
    except (ValueError, binascii.Error) as exc:
        raise CallFailed(f"failed to call webhook: {exc}") from None
    return _verify(doc, response, uid)


def _verify(doc: Any, response: Any, uid: str) -> JSON:
    """The checks of a real server's ``VerifyAdmissionResponse`` (a mutating webhook's, v1)."""
    def invalid(why: str) -> CallFailed:
        return CallFailed(f"received invalid webhook response: {why}")

    if not isinstance(response, dict):
        raise invalid("webhook response was absent")
    if response.get("uid") != uid:
        raise invalid(f'expected response.uid="{uid}", got "{response.get("uid", "")}"')
    if (doc.get("apiVersion"), doc.get("kind")) != (REVIEW_VERSION, "AdmissionReview"):
        raise invalid(f"expected webhook response of {REVIEW_VERSION}, Kind=AdmissionReview, got "
                      f"{doc.get('apiVersion', '')}, Kind={doc.get('kind', '')}")
    if response.get("patch") and response.get("patchType") is None:
        raise invalid("webhook returned response.patch but not response.patchType")
    if not response.get("patch") and response.get("patchType") is not None:
        raise invalid("webhook returned response.patchType but not response.patch")
    if response.get("patchType") == "":
        raise invalid('webhook returned invalid response.patchType of ""')
    return response


def _patch(response: JSON) -> Optional[List[JSON]]:
    """The JSON patch of an allowing answer (None: no change)."""
    if not response.get("patch"):
        return None
    try:
        ops = json.loads(response["patch"])
    except ValueError as exc:
        raise CallFailed(f"received undecodable patch in webhook response: {exc}") from None
    if not isinstance(ops, list) or not all(isinstance(op, dict) for op in ops):
        raise CallFailed("received undecodable patch in webhook response: json: cannot unmarshal into Go value "
                         "of type jsonpatch.Patch")
    if not ops:
        return None
    if response.get("patchType") != "JSONPatch":
        raise CallFailed(f'unsupported patch type "{response.get("patchType")}"')
    return ops


def _denied(name: str, status: Any) -> ApiError:
    """The refusal a real server answers for ``allowed: false`` (its ``ToStatusErr``)."""
    status = status if isinstance(status, dict) else {}
    denied = f'admission webhook "{name}" denied the request'
    message, reason = str(status.get("message") or ""), str(status.get("reason") or "")
    text = f"{denied}: {message}" if message else f"{denied}: {reason}" if reason else f"{denied} without explanation"
    code = status.get("code")
    code = code if isinstance(code, int) and code >= 400 else 400
    return ApiError(code, reason, text, status.get("details") if isinstance(status.get("details"), dict) else {})
