"""The admission webhook: which new pods an auto-restore policy makes restore pods, and its HTTPS server."""
from __future__ import annotations

import base64
import copy
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.agent import _admission as admission
from ansible_collections.warmstart.snapshot.plugins.module_utils.agent import _admission_server as server
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _spechash as spechash
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import K8sError

from tests.support.fake_apiserver import json_patch
from tests.support.pod_fixtures import pod, read_back, snapshot, template
from tests.support.tls_certs import Pki


def policy(name: str = "embed", mode: Optional[str] = "auto", selector: Optional[Dict[str, Any]] = None,
           **conf: Any) -> Dict[str, Any]:
    spec: Dict[str, Any] = {"selector": selector if selector is not None else {"matchLabels": {"app": "embed"}},
                            "storeUrl": "/var/lib/warmstart/store"}
    if mode is not None:
        spec["restoreConfig"] = dict(conf, mode=mode)
    return {"apiVersion": podapi.API_VERSION, "kind": podapi.KIND_POLICY,
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def new_pod() -> Dict[str, Any]:
    """A replica as a ReplicaSet creates it: generateName, defaults and the token volume, no name yet."""
    doc = read_back(pod())
    doc["metadata"].pop("name", None)
    doc["metadata"]["generateName"] = "embed-7d9f-"
    doc.pop("status", None)
    return doc


WARM = snapshot("embed-warm", "2026-12-01T10:00:00Z")


def test_a_selected_pod_becomes_a_restore_pod_that_selects_its_snapshot_when_it_runs() -> None:
    original = new_pod()
    decision = admission.decide(original, "default", [policy(), policy("other", selector={"matchLabels": {"app": "x"}})],
                                [WARM])
    assert decision.restore and decision.policy == "embed" and decision.warnings == []
    mode = pc.restore_mode(decision.pod)
    assert mode["select"] and mode["policy"] == "embed" and not mode["restore_from"]
    assert decision.pod["spec"]["containers"][0]["command"] == list(podapi.INERT_COMMAND)
    assert "now embed-warm" in decision.pod["metadata"]["annotations"][admission.ANN_AUTO_RESTORE]
    assert spechash.pod_spec_hash(decision.pod) == spechash.pod_spec_hash(original), "it hashes like its template"
    assert original == new_pod(), "the input is not changed"
    # the patch the API server applies makes exactly that pod
    assert json_patch(copy.deepcopy(original), admission.json_patch(original, decision.pod)) == decision.pod


def test_the_policy_s_fallback_and_entrypoint_go_into_the_pod() -> None:
    decision = admission.decide(new_pod(), "default", [policy(fallback="cold-start")], [WARM])
    container = decision.pod["spec"]["containers"][0]
    assert container["command"] == template()["spec"]["containers"][0]["command"], "standby keeps the entrypoint"
    assert {"name": "SNAPSHOT_RESTORE_STANDBY", "value": "1"} in container["env"]
    assert pc.restore_mode(decision.pod)["fallback"] == podapi.FALLBACK_COLD_START
    inert = admission.decide(new_pod(), "default", [policy(entrypoint="inert", fallback="none")], [WARM])
    assert inert.pod["spec"]["containers"][0]["command"] == list(podapi.INERT_COMMAND)


@pytest.mark.parametrize("policies, snapshots, want", [
    ([], [WARM], None),
    ([policy(mode=None)], [WARM], None),
    ([policy(mode="manual")], [WARM], None),
    ([policy(selector={"matchLabels": {"app": "other"}})], [WARM], None),
    ([policy(selector={})], [WARM], "restore pod (policy embed)"),
    ([policy()], [], "no Ready PodSnapshot fits it yet: there is no PodSnapshot in namespace default"),
    ([policy()], [snapshot("embed-warm", "2026-12-01T10:00:00Z", ready=False)], "no Ready PodSnapshot in namespace"),
    ([policy()], [snapshot("old-spec", "2026-12-01T10:00:00Z", source=pod("x") | {"spec": {"containers": [
        {"name": "main", "image": "embed:1.3"}]}})], "taken from another pod spec"),
    ([policy(), policy("b")], [WARM], "2 auto-restore policies select it (b, embed)"),
])
def test_what_each_pod_gets(policies: List[Dict[str, Any]], snapshots: List[Dict[str, Any]], want: Optional[str]) -> None:
    original = new_pod()
    decision = admission.decide(original, "default", policies, snapshots)
    if want is None:
        assert decision.pod == original and not decision.verdict, "a pod no auto policy selects is left alone"
        return
    assert want in decision.pod["metadata"]["annotations"][admission.ANN_AUTO_RESTORE], decision.verdict
    assert decision.restore == want.startswith("restore pod")
    if not decision.restore:
        assert not pc.restore_mode(decision.pod)["select"]
        assert decision.pod["spec"] == original["spec"], "a pod that is not restored starts as it is"


def test_restore_pods_and_opted_out_pods_are_left_as_they_are() -> None:
    opted = new_pod()
    opted["metadata"]["annotations"] = {admission.ANN_AUTO_RESTORE: "False"}
    assert admission.decide(opted, "default", [policy()], [WARM]).pod == opted
    pinned = new_pod()
    pinned["metadata"]["annotations"] = {"nvidia.com/restore-from": "embed-warm"}
    decision = admission.decide(pinned, "default", [policy()], [WARM])
    assert decision.pod == pinned and decision.verdict == "a restore pod already"


def test_a_pod_the_contract_refuses_starts_as_it_is_with_a_warning() -> None:
    bad = new_pod()
    bad["spec"]["volumes"].append({"name": podapi.CONTROL_VOLUME, "configMap": {"name": "x"}})
    decision = admission.decide(bad, "default", [policy()], [WARM])
    assert not decision.restore and decision.warnings and "cannot be a restore pod" in decision.warnings[0]
    assert decision.pod["spec"] == bad["spec"]


def review(obj: Any, uid: str = "r-1", operation: str = "CREATE", kind: str = "Pod") -> Dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": kind}, "operation": operation,
                        "namespace": "default", "name": "", "object": obj}}


def test_review_requests_other_than_a_pod_create_are_refused_with_every_reason() -> None:
    assert admission.review_request(review(new_pod()))[0] is not None
    _none, problems = admission.review_request(dict(review(None, operation="DELETE"), apiVersion="admission.k8s.io/v1beta1"))
    assert len(problems) == 3 and "v1beta1" in problems[0] and "DELETE" in problems[1] and "no object" in problems[2]
    assert admission.review_request([])[1] == ["an AdmissionReview is a JSON object, not list"]


@pytest.fixture()
def webhook(tmp_path: Path) -> Any:
    pki = Pki(tmp_path)
    ca = pki.ca("ca")
    cert, key = pki.issue("webhook", "ca", ips=["127.0.0.1"], server=True)
    state: Dict[str, Any] = {"objects": ([policy()], [WARM]), "log": []}

    def lister(namespace: str) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
        state["asked"] = namespace
        if state.get("error") is not None:
            raise state["error"]
        policies, snapshots = state["objects"]
        return policies, snapshots

    srv = server.AdmissionServer("127.0.0.1", 0, str(cert), str(key), lister, state["log"].append).start()
    state["url"] = f"https://127.0.0.1:{srv.port}"
    state["context"] = ssl.create_default_context(cafile=str(ca))
    yield state
    srv.shutdown()
    srv.server_close()


def post(state: Dict[str, Any], body: bytes, path: str = server.PATH_MUTATE) -> Tuple[int, Any]:
    req = urllib.request.Request(state["url"] + path, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, context=state["context"], timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_server_answers_a_review_with_the_patch_over_tls(webhook: Dict[str, Any]) -> None:
    original = new_pod()
    code, doc = post(webhook, json.dumps(review(original, uid="abc")).encode())
    assert code == 200 and doc["kind"] == "AdmissionReview" and webhook["asked"] == "default"
    answer = doc["response"]
    assert answer["uid"] == "abc" and answer["allowed"] is True and answer["patchType"] == "JSONPatch"
    patched = json_patch(copy.deepcopy(original), json.loads(base64.b64decode(answer["patch"])))
    assert pc.restore_mode(patched)["select"]
    assert webhook["log"] and "restore pod (policy embed)" in webhook["log"][-1]
    with urllib.request.urlopen(webhook["url"] + server.PATH_HEALTH, context=webhook["context"], timeout=10) as resp:
        assert resp.read() == b"ok"


def test_the_server_never_blocks_a_pod_when_the_api_cannot_be_read(webhook: Dict[str, Any]) -> None:
    webhook["error"] = K8sError("list PodSnapshotPolicies in default: 503 Service Unavailable")
    code, doc = post(webhook, json.dumps(review(new_pod())).encode())
    assert code == 200 and doc["response"]["allowed"] is True and "patch" not in doc["response"]
    assert "503" in doc["response"]["warnings"][0] and "admitted unchanged" in webhook["log"][-1]


def test_the_server_refuses_what_is_no_review(webhook: Dict[str, Any]) -> None:
    assert post(webhook, b"{not json")[0] == 400
    code, doc = post(webhook, json.dumps(review(new_pod(), operation="UPDATE")).encode())
    assert code == 400 and "UPDATE" in doc["error"]
    assert post(webhook, b"{}", path="/other")[0] == 404
