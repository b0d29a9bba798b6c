"""PodSnapshot records against the fake API server, in-process: requests bound by uid, earlier incarnations refused;
API paths take names only (plugins/module_utils/k8s/_k8s_records.py, _k8s_client.py)."""
from __future__ import annotations

from typing import Any, Dict, Optional

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_client as _k8s
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_records as rec
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_restorepods as rpods
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _selection as selection
from tests.support import fake_apiserver as fake_server_module
from tests.support.fake_apiserver import FakeApiServer
from tests.support.record_fixtures import SOURCE, cluster_of, recorded

fake_apiserver = fake_server_module.fake_apiserver  # the pytest fixture


# --- PodSnapshot requests (issue 21) -----------------------------------------------------------------

def _request(server: FakeApiServer, name: str, **source: Any) -> None:
    """A PodSnapshot request as a user creates it (through the API: the CRD's defaults apply), no status."""
    spec = {"source": dict({"podRef": {"name": "embed-0"}}, **source)}
    cluster_of(server).create(podapi.KIND_SNAPSHOT, {"apiVersion": podapi.API_VERSION, "kind": podapi.KIND_SNAPSHOT,
                                                     "metadata": {"name": name, "namespace": "default"}, "spec": spec},
                              "default")


def _bind_params(name: str, containers: Optional[list] = None) -> Dict[str, Any]:
    return {"namespace": "default", "name": name, "source_pod": "embed-0", "containers": containers or [],
            "scope": "whole-pod", "policy_name": None, "labels": None, "content_name": None,
            "store": {"url": "/mnt/snapshots", "snapshot_id": "20261203T080000Z-0badcafe"}, "node": None,
            "source_node": {"hostname": "node-1"}, "size": 7, "created_at": None, "ready": True,
            "failed_reason": None, "failed_message": None}


def test_an_existing_request_is_bound_with_the_uid_backlink(fake_apiserver: FakeApiServer) -> None:
    recorded(fake_apiserver)  # CRDs and the source pod embed-0
    _request(fake_apiserver, "asked", containers=["main"])
    asked = fake_apiserver.store.get("podsnapshots", "asked", "default", group=podapi.GROUP)
    out = rec.ensure_pod_snapshot(cluster_of(fake_apiserver), _bind_params("asked"))
    snap, content = out["snapshot"], out["content"]
    assert snap["spec"] == asked["spec"], "the request's spec is kept (no uid added: specs are immutable)"
    assert podapi.is_ready(snap) and snap["status"]["boundSnapshotContentName"] == content["metadata"]["name"]
    pod_uid = fake_apiserver.store.get("pods", "embed-0", "default")["metadata"]["uid"]
    assert content["spec"]["snapshotRef"] == {"namespace": "default", "name": "asked", "uid": asked["metadata"]["uid"]}
    assert content["spec"]["source"]["podRef"]["uid"] == pod_uid
    assert selection.check_content_binding(snap, content) == []
    assert rpods.restore_pairs({"metadata": {"annotations": {podapi.ANN_RESTORE_FROM: "asked"}},
                                "spec": {"containers": [{"name": "main"}]}}, snap) == [
        {"source": "main", "container": "main"}]
    assert not rec.ensure_pod_snapshot(cluster_of(fake_apiserver), _bind_params("asked"))["changed"]


def test_a_request_for_an_earlier_incarnation_of_the_pod_is_refused(fake_apiserver: FakeApiServer) -> None:
    recorded(fake_apiserver)
    _request(fake_apiserver, "old-uid", podRef={"name": "embed-0", "uid": "0000-gone"})
    with pytest.raises(_k8s.K8sError, match="that pod now has uid .* \\(it was deleted and created again\\)"):
        rec.ensure_pod_snapshot(cluster_of(fake_apiserver), _bind_params("old-uid"))
    _request(fake_apiserver, "two", containers=["main"])
    fake_apiserver.add_pod("embed-0", containers=[SOURCE[0], {"name": "side", "image": "x"}], labels={"app": "embed"})
    with pytest.raises(_k8s.K8sError, match="exists with another spec"):
        rec.ensure_pod_snapshot(cluster_of(fake_apiserver), _bind_params("two", ["main", "side"]))


# --- names from objects are names, never paths (issue 32, class 3) --------------------------------------------------

@pytest.mark.parametrize("namespace, name, fragment", [
    ("../kube-system", "x", "namespace '../kube-system' is not a valid namespace name"),
    ("default", "../../x", "name '../../x' is not a valid object name"),
    ("default", "x/status", "name 'x/status' is not a valid object name"),
    ("Default", "x", "is not a valid namespace name"),
])
def test_api_paths_take_names_only(namespace: str, name: str, fragment: str) -> None:
    with pytest.raises(_k8s.K8sError, match=fragment):
        _k8s.Cluster.path(podapi.KIND_SNAPSHOT, namespace, name)
    assert _k8s.Cluster.path(podapi.KIND_SNAPSHOT, "default", "snap-a.v1").endswith("/namespaces/default/podsnapshots/snap-a.v1")
