"""The node agent's capture of one PodSnapshot request (plugins/module_utils/agent/_agent_capture.py), fake API server.

The node's checkpoint is a double (``FakeCapturer``); the real one runs in tests/integration/test_agent_e2e.py.
"""
from __future__ import annotations

from typing import Any, Dict, List


from ansible_collections.warmstart.snapshot.plugins.module_utils.agent import _agent_capture as cap
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_client as k8s
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from tests.support import fake_apiserver as fake_server_module
from tests.support.fake_apiserver import FakeApiServer

fake_apiserver = fake_server_module.fake_apiserver  # the pytest fixture


class FakeCapturer:
    """Checkpoints nothing; fails the first ``failures`` calls (as a real checkpoint refusing would)."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.calls: List[cap.Capture] = []

    def checkpoint(self, c: cap.Capture) -> Dict[str, Any]:
        self.calls.append(c)
        if len(self.calls) <= self.failures:
            raise WarmstartError(f"container {c.container}: CRIU dump failed (try {len(self.calls)})")
        return {"id": f"20261204T120000Z-0000000{len(self.calls)}", "size": 4096, "path": "snapshots/x",
                "created_at": "2026-12-04T12:00:00Z", "source_node": {"hostname": "node-1"},
                "timings": {"dump": 0.5}}


def _cluster(server: FakeApiServer) -> k8s.Cluster:
    return k8s.cluster_from({"kubeconfig": str(server.kubeconfig)})


def _setup(server: FakeApiServer, name: str = "warm", uid: str = "") -> None:
    server.install_crds()
    if server.store.get("pods", "embed-0", "default") is None:
        server.add_pod("embed-0", labels={"app": "embed"})
    ref: Dict[str, Any] = {"name": "embed-0"}
    if uid:
        ref["uid"] = uid
    _cluster(server).create(podapi.KIND_SNAPSHOT, {"apiVersion": podapi.API_VERSION, "kind": podapi.KIND_SNAPSHOT,
                                                   "metadata": {"name": name, "namespace": "default"},
                                                   "spec": {"source": {"podRef": ref}}}, "default")


def _settings(name: str = "warm", **kw: Any) -> cap.CaptureSettings:
    return cap.CaptureSettings(namespace="default", name=name, agent=kw.pop("agent", "node-1"),
                               node_name=kw.pop("node_name", "node-1"), store=kw.pop("store", "/mnt/snapshots"), **kw)


def _snap(server: FakeApiServer, name: str = "warm") -> Dict[str, Any]:
    return server.store.get("podsnapshots", name, "default", group=podapi.GROUP)


def test_a_request_is_captured_bound_and_ready(fake_apiserver: FakeApiServer) -> None:
    _setup(fake_apiserver)
    node = FakeCapturer()
    out = cap.capture(_cluster(fake_apiserver), _settings(), node)
    assert (out["action"], out["attempts"], out["container"]) == ("captured", 1, "main")
    snap = _snap(fake_apiserver)
    assert podapi.is_ready(snap)
    content = fake_apiserver.store.get("podsnapshotcontents", snap["status"]["boundSnapshotContentName"],
                                       group=podapi.GROUP)
    assert content["spec"]["store"] == {"url": "/mnt/snapshots", "snapshotId": out["snapshot_id"], "path": "snapshots/x"}
    assert content["spec"]["snapshotRef"]["uid"] == snap["metadata"]["uid"]
    again = cap.capture(_cluster(fake_apiserver), _settings(), node)
    assert again["action"] == "skipped" and again["reason"].startswith("it is bound to")
    assert len(node.calls) == 1


def test_a_failed_capture_is_retried_then_failed_after_the_last_attempt(fake_apiserver: FakeApiServer) -> None:
    _setup(fake_apiserver)
    node = FakeCapturer(failures=5)
    first = cap.capture(_cluster(fake_apiserver), _settings(max_attempts=2), node)
    assert (first["action"], first["attempts"]) == ("will retry", 1)
    snap = _snap(fake_apiserver)
    ready, failed = podapi.get_condition(snap, podapi.READY_CONDITION), podapi.get_condition(snap, podapi.FAILED_CONDITION)
    assert (ready["status"], ready["reason"]) == ("False", cap.REASON_FAILED)
    assert "attempt 1 of 2 failed: container main: CRIU dump failed (try 1)" in ready["message"]
    assert (failed["status"], failed["reason"]) == ("False", "WillRetry")
    assert snap["status"]["attempts"] == 1
    second = cap.capture(_cluster(fake_apiserver), _settings(max_attempts=2), node)
    assert (second["action"], second["attempts"]) == ("failed", 2)
    failed = podapi.get_condition(_snap(fake_apiserver), podapi.FAILED_CONDITION)
    assert (failed["status"], failed["reason"]) == ("True", cap.REASON_FAILED)
    assert "(try 2)" in failed["message"] and "attempt 2 of 2; no attempt left" in failed["message"]
    third = cap.capture(_cluster(fake_apiserver), _settings(max_attempts=2), node)
    assert third["action"] == "skipped" and len(node.calls) == 2


def test_a_missing_storage_secret_fails_the_attempt_naming_it(fake_apiserver: FakeApiServer) -> None:
    _setup(fake_apiserver)
    k8s_cluster = _cluster(fake_apiserver)
    k8s_cluster.create(podapi.KIND_STORAGE_CONFIG, {
        "apiVersion": podapi.API_VERSION, "kind": podapi.KIND_STORAGE_CONFIG, "metadata": {"name": "s3-store"},
        "spec": {"storeUrl": "s3://snapshots/ml", "credentialsSecretRef": {"name": "s3-creds"}}})
    k8s_cluster.create(podapi.KIND_POLICY, {
        "apiVersion": podapi.API_VERSION, "kind": podapi.KIND_POLICY, "metadata": {"name": "p", "namespace": "default"},
        "spec": {"selector": {}, "storageConfigName": "s3-store"}}, "default")
    k8s_cluster.create(podapi.KIND_SNAPSHOT, {"apiVersion": podapi.API_VERSION, "kind": podapi.KIND_SNAPSHOT,
                                              "metadata": {"name": "via-policy", "namespace": "default"},
                                              "spec": {"source": {"podRef": {"name": "embed-0"}}, "policyName": "p"}},
                       "default")
    node = FakeCapturer()
    out = cap.capture(k8s_cluster, _settings("via-policy", store=None, max_attempts=1), node)
    assert out["action"] == "failed" and "Secret default/s3-creds not found" in out["reasons"][0], out
    assert not node.calls


def test_a_request_whose_source_is_gone_or_replaced_fails_at_once(fake_apiserver: FakeApiServer) -> None:
    _setup(fake_apiserver, "old", uid="uid-of-an-earlier-pod")
    node = FakeCapturer()
    out = cap.capture(_cluster(fake_apiserver), _settings("old"), node)
    assert out["action"] == "failed" and "was deleted and created again" in out["reasons"][0]
    assert podapi.get_condition(_snap(fake_apiserver, "old"), podapi.FAILED_CONDITION)["reason"] == cap.REASON_SOURCE_GONE
    assert not node.calls


def test_requests_of_other_nodes_are_skipped_and_check_mode_writes_nothing(fake_apiserver: FakeApiServer) -> None:
    _setup(fake_apiserver)
    node = FakeCapturer()
    far = cap.capture(_cluster(fake_apiserver), _settings(node_name="node-2"), node)
    assert far["reason"] == "its source pod runs on node node-1, not on this agent's node node-2"
    before = len(fake_apiserver.writes())
    dry = cap.capture(_cluster(fake_apiserver), _settings(), node, check_mode=True)
    assert dry["action"] == "would capture" and len(fake_apiserver.writes()) == before and not node.calls


def test_a_policy_asks_once_per_pod_incarnation(fake_apiserver: FakeApiServer) -> None:
    _setup(fake_apiserver)
    pod = fake_apiserver.store.get("pods", "embed-0", "default")
    policy = {"metadata": {"name": "embed-policy"}, "spec": {"snapshotScope": "rootfs-only"}}
    name, created = cap.ask_for(_cluster(fake_apiserver), "default", pod, policy)
    assert created and name == cap.request_name("embed-0", "embed-policy", pod["metadata"]["uid"])
    again, created = cap.ask_for(_cluster(fake_apiserver), "default", pod, policy)
    assert (again, created) == (name, False)
    snap = _snap(fake_apiserver, name)
    assert snap["spec"]["policyName"] == "embed-policy" and snap["spec"]["scope"] == "rootfs-only"
    assert snap["spec"]["source"]["podRef"] == {"name": "embed-0", "uid": pod["metadata"]["uid"]}


def test_a_pods_profile_from_a_configmap_reaches_the_nodes_checkpoint(fake_apiserver: FakeApiServer) -> None:
    fake_apiserver.add_pod("embed-0", labels={"app": "embed"},
                           annotations={podapi.ANN_APP_PROFILE: "configmap:profiles/llm"})
    fake_apiserver.store.put("configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                            "metadata": {"name": "profiles", "namespace": "default"},
                                            "data": {"llm": "name: llm\nvars: {port: 9000}\nready:\n"
                                                            "  http: {url: 'http://127.0.0.1:{port}/health'}\n"}})
    _setup(fake_apiserver)
    node = FakeCapturer()
    out = cap.capture(_cluster(fake_apiserver), _settings(), node)
    assert out["action"] == "captured"
    profile = node.calls[0].app_profile
    assert profile is not None and profile.name == "llm"
    assert profile.ready.spec["url"] == "http://127.0.0.1:9000/health"


def test_a_profile_configmap_the_agent_cannot_read_fails_the_attempt_saying_why(fake_apiserver: FakeApiServer) -> None:
    fake_apiserver.add_pod("embed-0", labels={"app": "embed"},
                           annotations={podapi.ANN_APP_PROFILE: "configmap:missing"})
    _setup(fake_apiserver)
    node = FakeCapturer()
    out = cap.capture(_cluster(fake_apiserver), _settings(), node)
    assert out["action"] == "will retry" and node.calls == []
    reason = out["reasons"][0]
    assert "ConfigMap default/missing" in reason and "k8s_agent_profile_configmaps" in reason
    assert f"annotation {podapi.ANN_APP_PROFILE} of pod default/embed-0" in reason
