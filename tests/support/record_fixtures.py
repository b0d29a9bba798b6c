"""A Ready PodSnapshot and its content in the fake API server, made by the engine the modules use: for the unit tests
of the k8s records and restore pods."""
from __future__ import annotations

import copy
from typing import Any, Dict


from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_client as _k8s
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_records as rec
from tests.support.fake_apiserver import FakeApiServer

SOURCE = [{"name": "main", "image": "registry.local/embed:1.0", "command": ["python", "/app/server.py"]}]


def cluster_of(server: FakeApiServer) -> _k8s.Cluster:
    return _k8s.cluster_from({"kubeconfig": str(server.kubeconfig)})


def recorded(server: FakeApiServer, name: str = "snap-a") -> Dict[str, Any]:
    """A Ready PodSnapshot + content of pod embed-0 (SOURCE), made by the engine the module uses."""
    server.install_crds()
    server.add_pod("embed-0", containers=copy.deepcopy(SOURCE), labels={"app": "embed"})
    params = {"namespace": "default", "name": name, "source_pod": "embed-0", "containers": ["main"], "scope": "whole-pod",
              "policy_name": None, "labels": None, "content_name": None,
              "store": {"url": "/mnt/snapshots", "snapshot_id": "20261202T120000Z-1a2b3c4d"}, "node": None,
              "source_node": {"hostname": "node-1"}, "size": 1, "created_at": "2026-12-02T12:00:00Z", "ready": True,
              "failed_reason": None, "failed_message": None}
    snapshot: Dict[str, Any] = rec.ensure_pod_snapshot(cluster_of(server), params)["snapshot"]
    return snapshot
