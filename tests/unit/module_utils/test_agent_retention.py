"""The node agent's retention (plugins/module_utils/agent/_agent_retention.py) against the fake API server and a
real directory store: a policy's grouping and lastAccessTimeout, each node removing only its own snapshots."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.agent import _agent_retention as retention
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_client as k8s
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_records as rec
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podbuild as podbuild
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _agent_retention as runner
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
from tests.support import fake_apiserver as fake_server_module
from tests.support.fake_apiserver import FakeApiServer

fake_apiserver = fake_server_module.fake_apiserver  # the pytest fixture

SOURCE = [{"name": "main", "image": "registry.local/embed:1.0", "command": ["python", "/app/server.py"]}]


def _cluster(server: FakeApiServer) -> k8s.Cluster:
    return k8s.cluster_from({"kubeconfig": str(server.kubeconfig)})


def _world(server: FakeApiServer, store: Path, **spec: Any) -> None:
    server.install_crds()
    server.add_pod("embed-0", containers=copy.deepcopy(SOURCE), labels={"app": "embed"})
    server.store.put("podsnapshotpolicies", {"metadata": {"name": "embed", "namespace": "default"},
                                             "spec": dict({"selector": {"matchLabels": {"app": "embed"}},
                                                           "storeUrl": str(store)}, **spec)}, group=podapi.GROUP)


def _snapshot(server: FakeApiServer, store: Path, name: str, node: str, created: str,
              policy: Optional[str] = "embed", last_access: Optional[str] = None) -> str:
    """A Ready PodSnapshot of policy ``policy`` taken on ``node``, its snapshot published in ``store``."""
    sid = f"{created.replace('-', '').replace(':', '')}-{abs(hash(name)) % 16 ** 8:08x}"
    published = store / "snapshots" / sid
    published.mkdir(parents=True)
    (published / "manifest.json").write_text(json.dumps({"id": sid}))
    (published / "pages-1.img").write_bytes(b"\0" * 4096)
    params = {"namespace": "default", "name": name, "source_pod": "embed-0", "containers": ["main"],
              "scope": "whole-pod", "policy_name": policy, "labels": {"app": "embed"}, "content_name": None,
              "store": {"url": str(store), "snapshot_id": sid}, "node": node, "source_node": {"hostname": node},
              "size": 4096, "created_at": created, "ready": True, "failed_reason": None, "failed_message": None}
    rec.ensure_pod_snapshot(_cluster(server), params)
    if last_access:
        snap = server.store.get("podsnapshots", name, "default")
        snap["status"]["lastAccessTime"] = last_access
        server.store.put("podsnapshots", snap, group=podapi.GROUP)
    return sid


def _names(server: FakeApiServer) -> List[str]:
    return sorted(s["metadata"]["name"] for s in server.store.list("podsnapshots", "default"))


def _remover(removed: List[str]) -> retention.Remover:
    def opened(url: str, options: Dict[str, Any]) -> Callable[[str], int]:
        def delete(snapshot_id: str) -> int:
            removed.append(snapshot_id)
            return st.FsStore(url).delete(snapshot_id)
        return delete
    return opened


def test_each_node_removes_its_own_snapshots_beyond_the_group_limit(fake_apiserver: FakeApiServer,
                                                                    tmp_path: Path) -> None:
    store = tmp_path / "store"
    _world(fake_apiserver, store, snapshotGroupingRules={"groupRetentionPolicy": {"maxSnapshotCountPerGroup": 1}})
    old_here = _snapshot(fake_apiserver, store, "s-1", "node-1", "2026-12-01T00:00:00Z")
    old_there = _snapshot(fake_apiserver, store, "s-2", "node-2", "2026-12-02T00:00:00Z")
    newest = _snapshot(fake_apiserver, store, "s-3", "node-1", "2026-12-03T00:00:00Z")
    _snapshot(fake_apiserver, store, "other", "node-1", "2026-11-01T00:00:00Z", policy=None)  # no policy: kept
    cluster = _cluster(fake_apiserver)
    removed: List[str] = []
    dry = retention.sweep(cluster, "node-1", _remover(removed), check_mode=True)
    assert [r["name"] for r in dry["removed"]] == ["s-1"] and not dry["changed"] and removed == []
    assert _names(fake_apiserver) == ["other", "s-1", "s-2", "s-3"]
    out = retention.sweep(cluster, "node-1", _remover(removed))
    assert out["changed"] and [r["name"] for r in out["removed"]] == ["s-1"] and out["errors"] == []
    assert out["removed"][0]["bytes_freed"] > 4096 and removed == [old_here]
    assert _names(fake_apiserver) == ["other", "s-2", "s-3"]  # s-2 is node-2's to remove
    assert not (store / "snapshots" / old_here).exists() and (store / "snapshots" / old_there).exists()
    assert not [c for c in fake_apiserver.store.list("podsnapshotcontents", None)
                if c["spec"]["snapshotRef"]["name"] == "s-1"], "its content went with it"
    there = retention.sweep(cluster, "node-2", _remover(removed))
    assert [r["name"] for r in there["removed"]] == ["s-2"] and _names(fake_apiserver) == ["other", "s-3"]
    assert (store / "snapshots" / newest).exists()
    again = retention.sweep(cluster, "node-1", _remover(removed))
    assert again["removed"] == [] and not again["changed"]


def test_last_access_timeout_keeps_what_a_restore_pod_still_restores_from(fake_apiserver: FakeApiServer,
                                                                          tmp_path: Path) -> None:
    store = tmp_path / "store"
    _world(fake_apiserver, store, retentionConfig={"lastAccessTimeout": "72h"})
    idle = _snapshot(fake_apiserver, store, "idle", "node-1", "2026-01-01T00:00:00Z")
    _snapshot(fake_apiserver, store, "busy", "node-1", "2026-01-01T00:00:00Z")
    _snapshot(fake_apiserver, store, "used", "node-1", "2026-01-01T00:00:00Z",
              last_access="2999-01-01T00:00:00Z")  # restored from "now": not idle
    built = podbuild.build({"metadata": {"labels": {"app": "embed"}}, "spec": {"containers": [dict(SOURCE[0])]}},
                           "busy")
    fake_apiserver.add_pod("r-0", containers=built["spec"]["containers"], spec=dict(built["spec"]), node="node-1",
                           labels={"app": "embed"}, annotations=built["metadata"]["annotations"], phase="Running")
    removed: List[str] = []
    out = retention.sweep(_cluster(fake_apiserver), "node-1", _remover(removed), namespaces=["default"])
    assert [r["name"] for r in out["removed"]] == ["idle"] and removed == [idle]
    assert "never restored from" in out["removed"][0]["reason"] and "last_access_timeout=3d" in out["removed"][0]["reason"]
    assert [k["name"] for k in out["kept"]] == ["busy"] and "restore pod r-0 still restores from it" in \
        out["kept"][0]["reason"]
    assert _names(fake_apiserver) == ["busy", "used"]


def test_the_runner_names_every_problem_after_doing_the_rest(fake_apiserver: FakeApiServer, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    _world(fake_apiserver, store, retentionConfig={"lastAccessTimeout": "1h"})
    _snapshot(fake_apiserver, store, "a", "node-1", "2026-01-01T00:00:00Z")
    gone = _snapshot(fake_apiserver, store, "b", "node-1", "2026-01-02T00:00:00Z")
    (store / "snapshots" / gone / "manifest.json").unlink()
    (store / "snapshots" / gone / "pages-1.img").unlink()
    (store / "snapshots" / gone).rmdir()  # its store snapshot was removed by hand
    _snapshot(fake_apiserver, store, "c", "node-1", "2026-01-03T00:00:00Z")
    cname = fake_apiserver.store.get("podsnapshots", "c", "default")["status"]["boundSnapshotContentName"]
    content = fake_apiserver.store.get("podsnapshotcontents", cname, None)
    content["spec"]["store"]["url"] = "not/absolute"
    fake_apiserver.store.put("podsnapshotcontents", content, group=podapi.GROUP)
    params = {"kubeconfig": str(fake_apiserver.kubeconfig), "namespaces": [], "node_name": "node-1",
              "store_options": {}}
    with pytest.raises(runner.WarmstartError, match=r"retention on node node-1: 1 problem\(s\)") as err:
        runner.run(params, check_mode=False)
    assert err.value.reasons == ["PodSnapshot default/c: store path 'not/absolute' must be an absolute path"]
    done = {r["name"]: r for r in err.value.details["removed"]}
    assert sorted(done) == ["a", "b"] and done["b"]["note"] == "its snapshot was gone from the store already"
    assert _names(fake_apiserver) == ["c"], "a store that cannot be opened leaves the record"
    monkeypatch.delenv("NODE_NAME", raising=False)
    with pytest.raises(runner.WarmstartError, match="node_name is required"):
        runner.run(dict(params, node_name=None), check_mode=True)
