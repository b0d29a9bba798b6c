"""PodSnapshot requests (capture attempts, bounded retry) and PodSnapshotManualTriggers (plugins/module_utils/k8s/_k8s_requests.py),
against the fake API server with the real kubernetes client."""
from __future__ import annotations

from typing import Any, Dict, Optional

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_client as _k8s
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_records as rec
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_requests as req
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from tests.support import fake_apiserver as fake_server_module
from tests.support.fake_apiserver import FakeApiServer

fake_apiserver = fake_server_module.fake_apiserver  # the pytest fixture

STORE = {"url": "/mnt/snapshots", "snapshot_id": "20261202T120000Z-1a2b3c4d"}


@pytest.fixture(name="server")
def fixture_server(fake_apiserver: FakeApiServer) -> FakeApiServer:
    """The fake API server with the CRDs and a running source pod embed-0 (label app=embed)."""
    fake_apiserver.install_crds()
    fake_apiserver.add_pod("embed-0", labels={"app": "embed"})
    return fake_apiserver


def cluster(server: FakeApiServer) -> _k8s.Cluster:
    return _k8s.cluster_from({"kubeconfig": str(server.kubeconfig)})


def create(server: FakeApiServer, kind: str, name: str, spec: Dict[str, Any]) -> Dict[str, Any]:
    """A ``kind`` object ``name`` in namespace default with ``spec``, created as a user creates it: no status."""
    body = {"apiVersion": podapi.API_VERSION, "kind": kind, "metadata": {"name": name, "namespace": "default"},
            "spec": spec}
    created: Dict[str, Any] = cluster(server).create(kind, body, "default")
    return created


def stored(server: FakeApiServer, plural: str, name: str) -> Dict[str, Any]:
    """The ``plural`` object ``name`` in namespace default, as the fake API server holds it (it must exist)."""
    found = server.store.get(plural, name, "default", group=podapi.GROUP)
    assert found is not None
    return found


def request(server: FakeApiServer, name: str = "req-1", pod: str = "embed-0", **spec: Any) -> Dict[str, Any]:
    """A PodSnapshot request as a user creates it: source podRef (name only) and no status."""
    return create(server, podapi.KIND_SNAPSHOT, name, dict({"source": {"podRef": {"name": pod}}}, **spec))


def snap(server: FakeApiServer, name: str = "req-1") -> Dict[str, Any]:
    return stored(server, "podsnapshots", name)


def cond(obj: Dict[str, Any], type_: str) -> Dict[str, Any]:
    return podapi.get_condition(obj, type_) or {}


def bind(server: FakeApiServer, name: str, ready: bool = True, failed_reason: Optional[str] = None) -> Dict[str, Any]:
    params = {"namespace": "default", "name": name, "source_pod": "embed-0", "containers": [], "scope": "whole-pod",
              "policy_name": None, "labels": None, "content_name": None, "store": STORE if ready else None,
              "node": None, "source_node": {"hostname": "node-1"}, "size": 10, "created_at": None, "ready": ready,
              "failed_reason": failed_reason, "failed_message": "boom" if failed_reason else None}
    out: Dict[str, Any] = rec.ensure_pod_snapshot(cluster(server), params)
    return out


# --- capture attempts ---------------------------------------------------------------------------

def test_a_failed_capture_is_retried_until_max_attempts_then_failed(server: FakeApiServer) -> None:
    request(server)
    c = cluster(server)
    first = req.begin_capture(c, "default", "req-1", max_attempts=3)
    assert (first["claimed"], first["attempt"], first["changed"]) == (True, 1, True)
    status = snap(server)["status"]
    assert status["attempts"] == 1 and status["lastAttemptTime"]
    assert (cond(snap(server), "Ready")["status"], cond(snap(server), "Ready")["reason"]) == ("False", "SnapshotInProgress")
    # a second event while the attempt runs claims nothing
    again = req.begin_capture(c, "default", "req-1", max_attempts=3)
    assert not again["claimed"] and not again["changed"] and "attempt 1 is in progress" in again["reason"]

    failed = req.fail_capture(c, "default", "req-1", "CheckpointFailed", "CRIU: dump failed", max_attempts=3)
    assert (failed["final"], failed["attempts"], failed["changed"]) == (False, 1, True)
    s = snap(server)
    assert s["status"]["lastError"] == "CheckpointFailed: CRIU: dump failed"
    assert (cond(s, "Failed")["status"], cond(s, "Failed")["reason"]) == ("False", "WillRetry")
    assert (cond(s, "Ready")["status"], cond(s, "Ready")["reason"]) == ("False", "CheckpointFailed")
    assert "attempt 1 of 3 failed: CRIU: dump failed" in cond(s, "Ready")["message"]
    # recording the same failure again changes nothing
    assert not req.fail_capture(c, "default", "req-1", "CheckpointFailed", "CRIU: dump failed", max_attempts=3)["changed"]

    for attempt in (2, 3):
        claimed = req.begin_capture(c, "default", "req-1", max_attempts=3)
        assert (claimed["claimed"], claimed["attempt"]) == (True, attempt)
        out = req.fail_capture(c, "default", "req-1", "CheckpointFailed", f"failure {attempt}", max_attempts=3)
    assert out["final"] and out["attempts"] == 3
    s = snap(server)
    assert (cond(s, "Failed")["status"], cond(s, "Failed")["reason"]) == ("True", "CheckpointFailed")
    assert cond(s, "Failed")["message"] == "failure 3 (attempt 3 of 3; no attempt left)"
    assert s["status"]["attempts"] == 3 and s["status"]["lastError"] == "CheckpointFailed: failure 3"
    spent = req.begin_capture(c, "default", "req-1", max_attempts=3)
    assert not spent["claimed"] and spent["reason"].startswith("it has failed (CheckpointFailed")


def test_a_success_after_a_failed_attempt_binds_the_request(server: FakeApiServer) -> None:
    request(server)
    c = cluster(server)
    req.begin_capture(c, "default", "req-1", max_attempts=2)
    req.fail_capture(c, "default", "req-1", "CheckpointFailed", "first", max_attempts=2)
    assert req.begin_capture(c, "default", "req-1", max_attempts=2)["attempt"] == 2
    out = bind(server, "req-1")
    s = out["snapshot"]
    assert cond(s, "Ready")["status"] == "True" and cond(s, "Failed")["status"] == "False"
    assert s["status"]["attempts"] == 2 and s["status"]["boundSnapshotContentName"]
    done = req.begin_capture(c, "default", "req-1", max_attempts=2)
    assert not done["claimed"] and done["reason"] == "it is Ready"
    with pytest.raises(_k8s.K8sError, match="is Ready: a failed capture cannot be recorded"):
        req.fail_capture(c, "default", "req-1", "CheckpointFailed", "late")


def test_one_of_two_agents_claims_an_attempt(server: FakeApiServer) -> None:
    request(server)
    c = cluster(server)
    stale = cluster(server).get(podapi.KIND_SNAPSHOT, "req-1", "default")
    assert req.begin_capture(c, "default", "req-1", max_attempts=2)["claimed"]
    # the other agent read the request before the first one claimed it: its guarded write conflicts
    lost = req._claim(c, stale, 1, 2, _k8s.now(), {"claimed": False, "reason": None}, False)
    assert not lost["claimed"] and "another agent" in lost["reason"]
    assert snap(server)["status"]["attempts"] == 1


def test_an_attempt_that_never_finished_counts_as_failed(server: FakeApiServer) -> None:
    request(server)
    c = cluster(server)
    req.begin_capture(c, "default", "req-1", max_attempts=2)
    old = snap(server)
    old["status"]["lastAttemptTime"] = "2020-01-01T00:00:00Z"
    server.store.put("podsnapshots", old, group=podapi.GROUP)
    second = req.begin_capture(c, "default", "req-1", max_attempts=2, attempt_timeout=60)
    assert (second["claimed"], second["attempt"]) == (True, 2)
    assert snap(server)["status"]["lastError"].startswith("CaptureTimedOut: attempt 1 did not finish within 60 s")
    old = snap(server)
    old["status"]["lastAttemptTime"] = "2020-01-01T00:00:00Z"
    server.store.put("podsnapshots", old, group=podapi.GROUP)
    last = req.begin_capture(c, "default", "req-1", max_attempts=2, attempt_timeout=60)
    assert not last["claimed"] and last["changed"]
    s = snap(server)
    assert (cond(s, "Failed")["status"], cond(s, "Failed")["reason"]) == ("True", "CaptureTimedOut")


def test_a_request_whose_pod_is_gone_fails_at_once_and_check_mode_writes_nothing(server: FakeApiServer) -> None:
    request(server, pod="gone-0")
    c = cluster(server)
    writes = len(server.writes())
    dry = req.fail_capture(c, "default", "req-1", "SourcePodGone", "Pod default/gone-0 not found", check_mode=True)
    assert dry["changed"] and dry["final"] and len(server.writes()) == writes
    assert req.begin_capture(c, "default", "req-1", check_mode=True)["claimed"] and len(server.writes()) == writes
    out = req.fail_capture(c, "default", "req-1", "SourcePodGone", "Pod default/gone-0 not found")
    assert out["final"] and out["attempts"] == 1
    assert cond(snap(server), "Failed")["message"].startswith("Pod default/gone-0 not found")
    with pytest.raises(_k8s.K8sError, match="max_attempts must be at least 1"):
        req.begin_capture(c, "default", "req-1", max_attempts=0)
    with pytest.raises(_k8s.K8sError, match="not found"):
        req.fail_capture(c, "default", "nope", "X", "y")


# --- manual triggers -------------------------------------------------------------------------------------

def trigger(server: FakeApiServer, name: str = "now", **spec: Any) -> Dict[str, Any]:
    return create(server, podapi.KIND_TRIGGER, name, dict({"targetPod": "embed-0"}, **spec))


def stored_trigger(server: FakeApiServer, name: str = "now") -> Dict[str, Any]:
    return stored(server, "podsnapshotmanualtriggers", name)


def test_a_trigger_creates_its_request_then_completes_when_it_is_ready(server: FakeApiServer) -> None:
    t = trigger(server, containers=["main"])
    c = cluster(server)
    writes = len(server.writes())
    dry = req.reconcile_trigger(c, "default", "now", check_mode=True)
    assert dry["changed"] and dry["phase"] == "pending" and len(server.writes()) == writes
    out = req.reconcile_trigger(c, "default", "now")
    name = req.trigger_snapshot_name(t)
    assert name == "now-" + t["metadata"]["uid"].replace("-", "")[:8]
    assert (out["phase"], out["snapshot_name"]) == ("pending", name) and out["changed"]
    assert stored_trigger(server)["status"]["snapshotCreated"] == {"name": name}
    s = snap(server, name)
    assert s["spec"]["source"] == {"podRef": {"name": "embed-0", "uid": server.store.get("pods", "embed-0", "default")
                                              ["metadata"]["uid"]}, "containers": ["main"]}
    assert s["metadata"]["annotations"] == {req.ANN_TRIGGER: "now", req.ANN_TRIGGER_UID: t["metadata"]["uid"]}
    assert s["metadata"]["labels"] == {"app": "embed"} and "status" not in s
    # idempotent while the capture has not happened
    assert not req.reconcile_trigger(c, "default", "now")["changed"]
    assert podapi.get_condition(stored_trigger(server), "Triggered") is None
    bind(server, name)
    done = req.reconcile_trigger(c, "default", "now")
    assert done["phase"] == "complete"
    t_cond = cond(stored_trigger(server), "Triggered")
    assert (t_cond["status"], t_cond["reason"], t_cond["message"]) == ("True", "Complete", f"PodSnapshot default/{name} is Ready")
    again = req.reconcile_trigger(c, "default", "now")
    assert not again["changed"] and again["phase"] == "complete" and again["snapshot"]["metadata"]["name"] == name


def test_a_trigger_fails_with_its_snapshot_or_at_once(server: FakeApiServer) -> None:
    c = cluster(server)
    trigger(server, "bad-pod", targetPod="nope-0")
    out = req.reconcile_trigger(c, "default", "bad-pod")
    assert out["phase"] == "failed" and out["snapshot_name"] is None
    t_cond = cond(stored_trigger(server, "bad-pod"), "Triggered")
    assert (t_cond["status"], t_cond["reason"], t_cond["message"]) == ("False", "Failed", "Pod default/nope-0 not found")
    assert "snapshotCreated" not in stored_trigger(server, "bad-pod").get("status", {})

    trigger(server, "bad-policy", policyName="missing")
    assert req.reconcile_trigger(c, "default", "bad-policy")["phase"] == "failed"
    assert cond(stored_trigger(server, "bad-policy"), "Triggered")["message"] == "PodSnapshotPolicy default/missing not found"

    t = trigger(server, "fails")
    req.reconcile_trigger(c, "default", "fails")
    name = req.trigger_snapshot_name(t)
    req.fail_capture(c, "default", name, "CheckpointFailed", "CRIU said no")
    out = req.reconcile_trigger(c, "default", "fails")
    assert out["phase"] == "failed"
    assert "CheckpointFailed: CRIU said no" in cond(stored_trigger(server, "fails"), "Triggered")["message"]

    t = trigger(server, "deleted")
    req.reconcile_trigger(c, "default", "deleted")
    server.store.remove("podsnapshots", req.trigger_snapshot_name(t), "default", group=podapi.GROUP)
    assert req.reconcile_trigger(c, "default", "deleted")["phase"] == "failed"
    assert "was deleted before it became Ready" in cond(stored_trigger(server, "deleted"), "Triggered")["message"]


def test_a_snapshot_of_the_same_name_that_is_not_the_triggers_fails_it(server: FakeApiServer) -> None:
    t = trigger(server, "clash")
    request(server, name=req.trigger_snapshot_name(t))
    out = req.reconcile_trigger(cluster(server), "default", "clash")
    assert out["phase"] == "failed"
    assert "exists and was not created by this trigger" in cond(stored_trigger(server, "clash"), "Triggered")["message"]
    with pytest.raises(_k8s.K8sError, match="not found"):
        req.reconcile_trigger(cluster(server), "default", "no-such-trigger")


def test_the_trigger_snapshot_name_stays_a_valid_name() -> None:
    long = {"metadata": {"name": "a" * 253, "uid": "0123abcd-0000"}}
    name = req.trigger_snapshot_name(long)
    assert len(name) <= 253 and podapi.is_dns_subdomain(name) and name.endswith("-0123abcd")
    assert req.trigger_snapshot_name({"metadata": {"name": "x"}}) == "x"
