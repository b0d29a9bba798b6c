"""runners/_pod_snapshot and _pod_snapshot_trigger: options that only make sense together are refused before a
connection is made; in diff mode each record they write comes back before and after (fake API server)."""
from __future__ import annotations

from typing import Any, Dict

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_client as _k8s
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _pod_snapshot
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _pod_snapshot_trigger
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import failure
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from tests.support import fake_apiserver as fake_server_module
from tests.support.fake_apiserver import FakeApiServer

fake_apiserver = fake_server_module.fake_apiserver  # the pytest fixture

NO_SERVER = {"host": "http://127.0.0.1:9", "request_timeout": 1}  # a connection attempt would fail differently


def test_failed_reason_needs_ready_false() -> None:
    params = dict(NO_SERVER, namespace="default", name="s", state="present", source_pod="p", ready=True,
                  failed_reason="CheckpointFailed")
    with pytest.raises(WarmstartError) as refused:
        _pod_snapshot.run(params, False)
    assert failure(refused.value) == {"msg": "failed_reason needs ready=false", "reasons": []}


# --- diff mode, against the fake API server -------------------------------------------------------

@pytest.fixture(name="server")
def fixture_server(fake_apiserver: FakeApiServer) -> FakeApiServer:
    fake_apiserver.install_crds()
    fake_apiserver.add_pod("embed-0", labels={"app": "embed"})
    return fake_apiserver


def present(server: FakeApiServer) -> Dict[str, Any]:
    return {"kubeconfig": str(server.kubeconfig), "namespace": "default", "name": "snap-1", "state": "present",
            "source_pod": "embed-0", "containers": [], "scope": "whole-pod", "policy_name": None, "labels": None,
            "content_name": None, "store": {"url": "/mnt/snapshots", "snapshot_id": "20261202T120000Z-1a2b3c4d"},
            "node": None, "source_node": {"hostname": "node-1"}, "size": 10, "created_at": None, "ready": True,
            "failed_reason": None, "failed_message": None}


def test_pod_snapshot_diff_shows_both_records_before_and_after(server: FakeApiServer) -> None:
    dry = _pod_snapshot.run(present(server), True, diff=True)
    assert [d["before"] for d in dry["diff"]] == [{}] and dry["diff"][0]["after"]["spec"]["source"]["podRef"]["name"] == "embed-0"
    made = _pod_snapshot.run(present(server), False, diff=True)
    snap_diff, content_diff = made["diff"]
    assert snap_diff["before_header"] == "PodSnapshot default/snap-1" and snap_diff["before"] == {}
    assert content_diff["before_header"] == f"PodSnapshotContent {made['pod_snapshot_content']['metadata']['name']}"
    assert content_diff["before"] == {} and content_diff["after"]["spec"] == made["pod_snapshot_content"]["spec"]
    assert snap_diff["after"]["status"] == made["status"] and made["status"]["boundSnapshotContentName"]
    for d in made["diff"]:  # what the API server keeps for itself is left out
        assert not set(d["after"]["metadata"]) & {"uid", "resourceVersion", "managedFields", "creationTimestamp"}
    again = _pod_snapshot.run(present(server), False, diff=True)
    assert again["changed"] is False and all(d["before"] == d["after"] for d in again["diff"])
    gone = _pod_snapshot.run(dict(present(server), state="absent"), False, diff=True)
    assert gone["changed"] and [d["after"] for d in gone["diff"]] == [{}, {}]
    assert [d["before"]["kind"] for d in gone["diff"]] == ["PodSnapshot", "PodSnapshotContent"]


def test_trigger_diff_shows_the_trigger_and_the_request_it_makes(server: FakeApiServer) -> None:
    c = _k8s.cluster_from({"kubeconfig": str(server.kubeconfig)})
    c.create(podapi.KIND_TRIGGER, {"apiVersion": podapi.API_VERSION, "kind": podapi.KIND_TRIGGER,
                                   "metadata": {"name": "now", "namespace": "default"},
                                   "spec": {"targetPod": "embed-0"}}, "default")
    params = {"kubeconfig": str(server.kubeconfig), "namespace": "default", "name": "now"}
    out = _pod_snapshot_trigger.run(params, False, diff=True)
    trigger_diff, snap_diff = out["diff"]
    assert "status" not in trigger_diff["before"]
    assert trigger_diff["after"]["status"]["snapshotCreated"] == {"name": out["pod_snapshot_name"]}
    assert snap_diff["before_header"] == f"PodSnapshot default/{out['pod_snapshot_name']}" and snap_diff["before"] == {}
    assert snap_diff["after"]["spec"]["source"]["podRef"]["name"] == "embed-0"
    again = _pod_snapshot_trigger.run(params, False, diff=True)
    assert again["changed"] is False and all(d["before"] == d["after"] for d in again["diff"])
    assert "diff" not in _pod_snapshot_trigger.run(params, False)
