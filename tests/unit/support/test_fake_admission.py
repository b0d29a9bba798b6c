"""The fake API server's mutating admission webhooks, called over HTTPS on a tiny webhook run by the test."""
from __future__ import annotations

import base64
import json
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

kubernetes = pytest.importorskip("kubernetes")

from kubernetes import client, config  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

from tests.support import fake_apiserver as fake_server_module  # noqa: E402
from tests.support.fake_apiserver import FakeApiServer  # noqa: E402
from tests.support.tls_certs import Pki  # noqa: E402

fake_apiserver = fake_server_module.fake_apiserver  # the pytest fixture

HOOK = "inject.warmstart.io"
CONFIGS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
PODS = "/api/v1/namespaces/default/pods"
Answer = Callable[[Dict[str, Any]], Dict[str, Any]]


class Webhook:
    """A tiny HTTPS admission webhook on 127.0.0.1: keeps each AdmissionReview (and its path) and answers it with
    ``answer(request)`` (the ``response`` without its uid, which is the request's unless the answer gives one)."""

    def __init__(self, pki: Pki, name: str, ips: Optional[List[str]], dns: Optional[List[str]]) -> None:
        cert, key = pki.issue(name, "ca", ips=ips, dns=dns, server=True)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(cert, key)
        self.reviews: List[Dict[str, Any]] = []
        self.paths: List[str] = []
        self.answer: Answer = lambda request: {"allowed": True}
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
                pass

            def do_POST(self) -> None:  # noqa: N802 - BaseHTTPRequestHandler's naming
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                hook.reviews.append(review)
                hook.paths.append(self.path)
                response = dict({"uid": review["request"]["uid"]}, **hook.answer(review["request"]))
                data = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                   "response": response}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.url = f"https://127.0.0.1:{self.port}/mutate"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    pki = Pki(tmp_path / "pki")
    pki.ca("ca")
    return pki


def _bundle(pki: Pki, ca: str = "ca") -> str:
    return base64.b64encode((pki.root / f"{ca}.pem").read_bytes()).decode()


@pytest.fixture
def webhook(pki: Pki) -> Iterator[Webhook]:
    hook = Webhook(pki, "hook", ips=["127.0.0.1"], dns=["localhost"])
    try:
        yield hook
    finally:
        hook.stop()


def _patch(*ops: Dict[str, Any], **extra: Any) -> Dict[str, Any]:
    return dict({"allowed": True, "patchType": "JSONPatch", "patch": base64.b64encode(json.dumps(list(ops)).encode())
                 .decode()}, **extra)


def _config(name: str, *hooks: Dict[str, Any]) -> Dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name}, "webhooks": list(hooks)}


def _hook(name: str = HOOK, url: Optional[str] = None, ca: Optional[str] = None, **extra: Any) -> Dict[str, Any]:
    """A webhook on CREATE of v1 pods (``url``, ``caBundle``; ``extra`` sets or replaces any field)."""
    client_config: Dict[str, Any] = {"url": url} if url else {}
    if ca:
        client_config["caBundle"] = ca
    return dict({"name": name, "clientConfig": client_config, "sideEffects": "None",
                 "admissionReviewVersions": ["v1"], "timeoutSeconds": 2,
                 "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                            "resources": ["pods"]}]}, **extra)


def _install(server: FakeApiServer, config_doc: Dict[str, Any]) -> None:
    code, _headers, answer = server.request("POST", CONFIGS, config_doc, "?fieldValidation=Strict")
    assert code == 201, answer


def _pod(name: str = "web", labels: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    meta: Dict[str, Any] = {"generateName": name} if name.endswith("-") else {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "main", "image": "busybox:1"}]}}


@pytest.fixture
def core(fake_apiserver: FakeApiServer) -> Any:
    return client.CoreV1Api(config.new_client_from_config(config_file=str(fake_apiserver.kubeconfig),
                                                          context="fake", persist_config=False))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _outcomes(server: FakeApiServer) -> List[Tuple[str, str]]:
    return [(c["webhook"], c["outcome"]) for c in server.admission_calls]


# --- the configuration resource --------------------------------------------------------

def test_configurations_are_served_discovered_and_checked_like_builtin_objects(fake_apiserver: FakeApiServer,
                                                                               webhook: Webhook, pki: Pki) -> None:
    code, _headers, found = fake_apiserver.request("GET", "/apis/admissionregistration.k8s.io/v1", None)
    assert code == 200 and {r["name"]: r["namespaced"] for r in found["resources"]} == {
        "mutatingwebhookconfigurations": False}
    bogus = _config("bogus", _hook(url=webhook.url, bogus=1))
    code, _headers, answer = fake_apiserver.request("POST", CONFIGS, bogus, "?fieldValidation=Strict")
    assert code == 400 and 'unknown field "webhooks[0].bogus"' in answer["message"], answer
    bad = _config("bad", _hook(url="http://127.0.0.1:1/mutate", sideEffects="Some"), _hook(name="short.name"))
    code, _headers, answer = fake_apiserver.request("POST", CONFIGS, bad)
    assert code == 422 and answer["reason"] == "Invalid", answer
    assert sorted(c["field"] for c in answer["details"]["causes"]) == [
        "webhooks[0].clientConfig.url", "webhooks[0].sideEffects", "webhooks[1].clientConfig", "webhooks[1].name"]
    assert fake_apiserver.store.list("mutatingwebhookconfigurations") == []
    _install(fake_apiserver, _config("good", _hook(url=webhook.url, ca=_bundle(pki))))
    code, _headers, listed = fake_apiserver.request("GET", CONFIGS, None)
    assert code == 200 and [c["metadata"]["name"] for c in listed["items"]] == ["good"]


# --- calls --------------------------------------------------------------------------------

def test_a_matching_webhook_patch_lands_in_the_pod_named_after_admission(fake_apiserver: FakeApiServer, core: Any,
                                                                         webhook: Webhook, pki: Pki) -> None:
    webhook.answer = lambda request: _patch({"op": "add", "path": "/metadata/annotations",
                                             "value": {"warmstart.io/restore": "latest"}})
    _install(fake_apiserver, _config("warmstart", _hook(url=webhook.url, ca=_bundle(pki))))
    created = core.create_namespaced_pod("default", _pod("restore-"))
    stored = fake_apiserver.store.get("pods", created.metadata.name, "default")
    assert stored["metadata"]["annotations"] == {"warmstart.io/restore": "latest"}
    assert created.metadata.name.startswith("restore-") and len(created.metadata.name) == len("restore-") + 5
    [review] = webhook.reviews
    request = review["request"]
    assert review["apiVersion"] == "admission.k8s.io/v1" and review["kind"] == "AdmissionReview"
    assert request.get("name", "") == "" and request["object"]["metadata"]["generateName"] == "restore-"
    assert request["namespace"] == "default" and request["operation"] == "CREATE"
    assert request["kind"] == request["requestKind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert request["resource"] == request["requestResource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert request["oldObject"] is None and request["dryRun"] is False and request["userInfo"]["username"]
    assert request["options"] == {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
    assert webhook.paths == ["/mutate?timeout=2s"]
    assert fake_apiserver.admission_calls == [{"configuration": "warmstart", "webhook": HOOK, "outcome": "patched"}]


def test_dry_run_calls_the_webhook_with_dry_run_and_stores_nothing(fake_apiserver: FakeApiServer, core: Any,
                                                                   webhook: Webhook, pki: Pki) -> None:
    _install(fake_apiserver, _config("warmstart", _hook(url=webhook.url, ca=_bundle(pki))))
    core.create_namespaced_pod("default", _pod("p"), dry_run="All")
    assert webhook.reviews[0]["request"]["dryRun"] is True
    assert webhook.reviews[0]["request"]["options"]["dryRun"] == ["All"]
    assert fake_apiserver.store.get("pods", "p", "default") is None


def test_webhooks_whose_rules_or_selectors_do_not_match_are_not_called(fake_apiserver: FakeApiServer, core: Any,
                                                                       webhook: Webhook, pki: Pki) -> None:
    ca = _bundle(pki)
    cm_rule = [{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["configmaps"]}]
    _install(fake_apiserver, _config(
        "a", _hook("object.warmstart.io", webhook.url, ca, objectSelector={"matchLabels": {"inject": "yes"}}),
        _hook("gpu-ns.warmstart.io", webhook.url, ca, namespaceSelector={"matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["gpu"]}]}),
        _hook("by-name.warmstart.io", webhook.url, ca, namespaceSelector={"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["default"]}]}),
        _hook("no-tier.warmstart.io", webhook.url, ca, namespaceSelector={"matchExpressions": [
            {"key": "tier", "operator": "DoesNotExist"}]}),
        _hook("configmaps.warmstart.io", webhook.url, ca, rules=cm_rule),
        _hook("cluster.warmstart.io", webhook.url, ca, rules=[dict(cm_rule[0], resources=["*"], scope="Cluster")],
              namespaceSelector={"matchLabels": {"tier": "gpu"}})))  # a Namespace: matched on its own labels
    core.create_namespaced_pod("default", _pod("plain"))
    assert _outcomes(fake_apiserver) == [("by-name.warmstart.io", "allowed"), ("no-tier.warmstart.io", "allowed")]
    fake_apiserver.admission_calls.clear()
    core.create_namespace({"metadata": {"name": "gpus", "labels": {"tier": "gpu"}}})
    assert _outcomes(fake_apiserver) == [("cluster.warmstart.io", "allowed")]
    fake_apiserver.admission_calls.clear()
    core.create_namespaced_pod("gpus", _pod("labelled", labels={"inject": "yes"}))
    assert _outcomes(fake_apiserver) == [("object.warmstart.io", "allowed"), ("gpu-ns.warmstart.io", "allowed")]
    assert len(webhook.reviews) == 5


def test_a_denial_refuses_the_create_with_the_webhooks_status(fake_apiserver: FakeApiServer, core: Any,
                                                              webhook: Webhook, pki: Pki) -> None:
    webhook.answer = lambda request: {"allowed": False, "status": {"code": 403, "reason": "Forbidden",
                                                                   "message": "no GPU left on this node"}}
    _install(fake_apiserver, _config("warmstart", _hook(url=webhook.url, ca=_bundle(pki))))
    with pytest.raises(ApiException) as denied:
        core.create_namespaced_pod("default", _pod("p"))
    status = json.loads(denied.value.body)
    assert denied.value.status == 403 and status["reason"] == "Forbidden"
    assert status["message"] == f'admission webhook "{HOOK}" denied the request: no GPU left on this node'
    webhook.answer = lambda request: {"allowed": False, "status": {"message": "not today"}}
    with pytest.raises(ApiException) as no_code:
        core.create_namespaced_pod("default", _pod("p"))
    assert no_code.value.status == 400
    assert json.loads(no_code.value.body)["message"] == f'admission webhook "{HOOK}" denied the request: not today'
    assert fake_apiserver.store.get("pods", "p", "default") is None
    assert _outcomes(fake_apiserver) == [(HOOK, "denied"), (HOOK, "denied")]


def test_a_webhook_that_is_down_fails_the_create_or_is_ignored_by_its_policy(fake_apiserver: FakeApiServer,
                                                                             core: Any) -> None:
    url = f"https://127.0.0.1:{_free_port()}/mutate"
    _install(fake_apiserver, _config("warmstart", _hook(url=url)))
    with pytest.raises(ApiException) as failed:
        core.create_namespaced_pod("default", _pod("p"))
    status = json.loads(failed.value.body)
    assert failed.value.status == 500 and status["reason"] == "InternalError"
    assert status["message"].startswith(f'Internal error occurred: failed calling webhook "{HOOK}": failed to call '
                                        f'webhook: Post "{url}?timeout=2s": '), status
    assert fake_apiserver.store.get("pods", "p", "default") is None
    fake_apiserver.request("DELETE", f"{CONFIGS}/warmstart", None)
    _install(fake_apiserver, _config("warmstart", _hook(url=url, failurePolicy="Ignore")))
    body = _pod("p", labels={"app": "embed"})
    core.create_namespaced_pod("default", body)
    stored = fake_apiserver.store.get("pods", "p", "default")
    assert stored["metadata"]["labels"] == {"app": "embed"} and "annotations" not in stored["metadata"]
    assert [o.split(":")[0] for _w, o in _outcomes(fake_apiserver)] == ["failed", "ignored"]


def test_a_certificate_the_ca_bundle_does_not_trust_is_a_failed_call(fake_apiserver: FakeApiServer, core: Any,
                                                                     webhook: Webhook, pki: Pki) -> None:
    pki.ca("other")
    _install(fake_apiserver, _config("warmstart", _hook(url=webhook.url, ca=_bundle(pki, "other"))))
    with pytest.raises(ApiException) as failed:
        core.create_namespaced_pod("default", _pod("p"))
    assert failed.value.status == 500 and "CERTIFICATE_VERIFY_FAILED" in json.loads(failed.value.body)["message"]
    assert webhook.reviews == [] and fake_apiserver.store.get("pods", "p", "default") is None


def test_an_answer_for_another_uid_is_a_failed_call(fake_apiserver: FakeApiServer, core: Any, webhook: Webhook,
                                                    pki: Pki) -> None:
    webhook.answer = lambda request: {"uid": "not-" + request["uid"], "allowed": True}
    _install(fake_apiserver, _config("warmstart", _hook(url=webhook.url, ca=_bundle(pki))))
    with pytest.raises(ApiException) as failed:
        core.create_namespaced_pod("default", _pod("p"))
    uid = webhook.reviews[0]["request"]["uid"]
    assert failed.value.status == 500
    assert json.loads(failed.value.body)["message"] == (
        f'Internal error occurred: failed calling webhook "{HOOK}": received invalid webhook response: '
        f'expected response.uid="{uid}", got "not-{uid}"')
    assert fake_apiserver.store.get("pods", "p", "default") is None


def test_a_patch_that_does_not_apply_is_a_500_even_when_ignored(fake_apiserver: FakeApiServer, core: Any,
                                                                webhook: Webhook, pki: Pki) -> None:
    webhook.answer = lambda request: _patch({"op": "replace", "path": "/metadata/nope", "value": 1})
    _install(fake_apiserver, _config("warmstart", _hook(url=webhook.url, ca=_bundle(pki), failurePolicy="Ignore")))
    with pytest.raises(ApiException) as failed:
        core.create_namespaced_pod("default", _pod("p"))
    assert failed.value.status == 500 and json.loads(failed.value.body)["reason"] == "InternalError"
    assert fake_apiserver.store.get("pods", "p", "default") is None


def test_webhook_warnings_reach_the_client_as_warning_headers(fake_apiserver: FakeApiServer, webhook: Webhook,
                                                              pki: Pki) -> None:
    webhook.answer = lambda request: _patch({"op": "add", "path": "/metadata/labels", "value": {"seen": "yes"}},
                                            warnings=["pods should say please"])
    _install(fake_apiserver, _config("warmstart", _hook(url=webhook.url, ca=_bundle(pki))))
    code, headers, answer = fake_apiserver.request("POST", PODS, _pod("p"))
    assert code == 201 and answer["metadata"]["labels"] == {"seen": "yes"}
    assert headers.get_all("Warning") == ['299 - "pods should say please"']
    assert fake_apiserver.warnings == [f"POST {PODS}: pods should say please"]


def test_a_service_is_called_through_service_urls_and_verified_for_its_dns_name(fake_apiserver: FakeApiServer,
                                                                                core: Any, pki: Pki) -> None:
    hook = Webhook(pki, "svc", ips=None, dns=["hook.webhooks.svc"])  # no 127.0.0.1: the svc name is verified
    try:
        hook.answer = lambda request: _patch({"op": "add", "path": "/metadata/labels", "value": {"via": "svc"}})
        service = {"namespace": "webhooks", "name": "hook", "path": "/inject", "port": 8443}
        _install(fake_apiserver, _config("warmstart", _hook(
            clientConfig={"service": service, "caBundle": _bundle(pki)})))
        with pytest.raises(ApiException) as unrouted:
            core.create_namespaced_pod("default", _pod("p"))
        assert unrouted.value.status == 500 and json.loads(unrouted.value.body)["message"].endswith(
            'failed to call webhook: Post "https://hook.webhooks.svc:8443/inject?timeout=2s": service "hook" not found')
        fake_apiserver.service_urls[("webhooks", "hook")] = f"https://127.0.0.1:{hook.port}"
        core.create_namespaced_pod("default", _pod("p"))
        assert fake_apiserver.store.get("pods", "p", "default")["metadata"]["labels"] == {"via": "svc"}
        assert hook.paths == ["/inject?timeout=2s"]
    finally:
        hook.stop()
