"""Pod summaries, label selectors and PodSnapshotPolicy settings (plugins/module_utils/k8s/_k8s_records.py)."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Dict, Optional

import pytest
import yaml

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_client as _k8s
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_records as kp
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc
from tests.support import fake_apiserver as fake_server_module
from tests.support.fake_apiserver import FakeApiServer

fake_apiserver = fake_server_module.fake_apiserver  # the pytest fixture


def test_label_selectors_become_query_strings() -> None:
    sel = {"matchLabels": {"tier": "gold", "app": "embed"},
           "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]},
                                {"key": "canary", "operator": "NotIn", "values": ["yes"]},
                                {"key": "gpu", "operator": "Exists"}, {"key": "old", "operator": "DoesNotExist"}]}
    assert kp.selector_string(sel) == "app=embed,tier=gold,zone in (a,b),canary notin (yes),gpu,!old"
    assert kp.selector_string(None) == ""
    with pytest.raises(_k8s.K8sError, match="operator 'Gt' is not one of"):
        kp.selector_string({"matchExpressions": [{"key": "x", "operator": "Gt", "values": ["1"]}]})


def test_policy_settings_with_defaults_and_explicit_values() -> None:
    plain = {"metadata": {"name": "p"}, "spec": {"selector": {"matchLabels": {"app": "x"}}, "storeUrl": "/mnt/s"}}
    assert kp.policy_settings(plain) == {
        "name": "p", "selector": "app=x", "store_url": "/mnt/s", "wait_ready": True, "leave_running": True,
        "scope": "whole-pod", "group_by": [], "max_per_group": 0, "last_access_timeout": None}
    manual = kp.policy_settings({"metadata": {"name": "m"}, "spec": {
        "selector": {}, "storeUrl": "s3://b/p", "snapshotScope": "rootfs-only",
        "triggerConfig": {"type": "manual", "postCheckpoint": "stop"},
        "snapshotGroupingRules": {"groupByLabelValue": {"labels": ["model"]},
                                  "groupRetentionPolicy": {"maxSnapshotCountPerGroup": 2}},
        "retentionConfig": {"lastAccessTimeout": "72h"}}})
    assert (manual["wait_ready"], manual["leave_running"], manual["scope"]) == (False, False, "rootfs-only")
    assert (manual["group_by"], manual["max_per_group"], manual["last_access_timeout"]) == (["model"], 2, "72h")


def test_a_pod_summary_carries_what_the_node_needs() -> None:
    pod = {"metadata": {"namespace": "ml", "name": "e-0", "uid": "u1", "labels": {"app": "e"}},
           "spec": {"nodeName": "gpu-01", "containers": [{"name": "main", "image": "i"}, {"name": "side", "image": "j"}]},
           "status": {"phase": "Running", "containerStatuses": [
               {"name": "main", "containerID": "podman://abc", "ready": True, "state": {"running": {}}},
               {"name": "side", "containerID": "podman://def", "state": {"waiting": {}}, "restartCount": 2}]}}
    s = kp.summary(pod)
    assert (s["node"], s["uid"], s["phase"], s["restore_outcome"], s["restore_state"]) == \
        ("gpu-01", "u1", "Running", None, None)
    restoring = copy.deepcopy(pod)
    restoring["metadata"]["annotations"] = {pc.REF_ANN_RESTORE_FROM: "snap-a"}
    restoring["status"]["conditions"] = [{"type": "nvidia.com/Restored", "status": "True", "reason": "RestoreSucceeded"}]
    assert (kp.summary(restoring)["restore_outcome"], kp.summary(restoring)["restore_state"]) == ("Succeeded", "failed")
    assert s["containers"] == [
        {"name": "main", "container_id": "podman://abc", "running": True, "ready": True, "restart_count": 0},
        {"name": "side", "container_id": "podman://def", "running": False, "ready": False, "restart_count": 2}]
    assert kp.waiting_for(s, "scheduled") is None
    assert kp.waiting_for(s, "running") == "containers not running: side"
    assert kp.waiting_for(dict(s, node=None), "scheduled") == "not scheduled"


# --- the restore path against the fake API server (in-process) --------------------------------------------

CRDS = Path(__file__).resolve().parents[3] / "roles" / "k8s_crds" / "files" / "crds.yaml"
SOURCE = [{"name": "main", "image": "registry.local/embed:1.0", "command": ["python", "/app/server.py"]}]


def _cluster(server: FakeApiServer) -> _k8s.Cluster:
    return _k8s.cluster_from({"kubeconfig": str(server.kubeconfig)})


def _recorded(server: FakeApiServer, name: str = "snap-a") -> Dict[str, Any]:
    """A Ready PodSnapshot + content of pod embed-0 (SOURCE), made by the engine the module uses."""
    for crd in yaml.safe_load(CRDS.read_text())["items"]:
        server.store.put("customresourcedefinitions", crd, group="apiextensions.k8s.io")
    server.add_pod("embed-0", containers=copy.deepcopy(SOURCE), labels={"app": "embed"})
    params = {"namespace": "default", "name": name, "source_pod": "embed-0", "containers": ["main"], "scope": "whole-pod",
              "policy_name": None, "labels": None, "content_name": None,
              "store": {"url": "/mnt/snapshots", "snapshot_id": "20261202T120000Z-1a2b3c4d"}, "node": None,
              "source_node": {"hostname": "node-1"}, "size": 1, "created_at": "2026-12-02T12:00:00Z", "ready": True,
              "failed_reason": None, "failed_message": None}
    snapshot: Dict[str, Any] = kp.ensure_pod_snapshot(_cluster(server), params)["snapshot"]
    return snapshot


def _restore_pod(server: FakeApiServer, name: str, image: str = SOURCE[0]["image"],
                 annotations: Optional[Dict[str, str]] = None) -> None:
    """A scheduled restore pod built (inert) from SOURCE with ``image``; ``annotations`` replace build's three."""
    template = {"metadata": {"labels": {"app": "embed"}}, "spec": {"containers": [dict(SOURCE[0], image=image)]}}
    built = pc.build(template, "snap-a")
    if annotations is not None:
        for key in (pc.ANN_RESTORE_FROM, pc.ANN_CONTAINER_MAP, pc.ANN_SKIP_COMPAT):
            built["metadata"]["annotations"].pop(key, None)
        built["metadata"]["annotations"].update(annotations)
    server.add_pod(name, containers=built["spec"]["containers"], spec=dict(built["spec"]), labels={"app": "embed"},
                   annotations=built["metadata"]["annotations"])


def test_begin_marks_the_restore_in_progress_as_the_reference_does(fake_apiserver: FakeApiServer) -> None:
    _recorded(fake_apiserver)
    _restore_pod(fake_apiserver, "r-0")
    out = kp.begin_restore(_cluster(fake_apiserver), "default", "r-0")
    condition = pc.get_condition(out["pod"], pc.RESTORE_CONDITION)
    assert (condition["status"], condition["reason"]) == ("False", pc.REASON_IN_PROGRESS)
    assert (out["outcome"], out["state"], out["losses"], out["snapshot"]) == ("Pending", "pending", [], "snap-a")
    done = kp.finish_restore(_cluster(fake_apiserver), "default", "r-0", "incompatible", "kernel differs")
    assert (done["outcome"], done["state"]) == ("Failed", "failed")
    with pytest.raises(_k8s.K8sError, match="its restore already ran"):
        kp.begin_restore(_cluster(fake_apiserver), "default", "r-0")


def test_begin_reads_the_reference_annotations(fake_apiserver: FakeApiServer) -> None:
    _recorded(fake_apiserver)
    _restore_pod(fake_apiserver, "r-ref", annotations={pc.REF_ANN_RESTORE_FROM: "snap-a",
                                                       pc.REF_ANN_CONTAINER_MAP: "main=main"})
    plan = kp.restore_plan(_cluster(fake_apiserver), _cluster(fake_apiserver).get_pod("default", "r-ref"))
    assert (plan["snapshot"], plan["skip_compat_check"]) == ("snap-a", False)
    assert [(p["source"], p["container"]) for p in plan["pairs"]] == [("main", "main")]
    _restore_pod(fake_apiserver, "r-both", annotations={pc.ANN_RESTORE_FROM: "snap-a", pc.REF_ANN_RESTORE_FROM: "snap-b"})
    with pytest.raises(_k8s.K8sError) as refused:
        kp.begin_restore(_cluster(fake_apiserver), "default", "r-both")
    assert refused.value.reasons == [
        "pod default/r-both has annotation snapshot.warmstart.io/restore-from: 'snap-a' and annotation "
        "nvidia.com/restore-from: 'snap-b', which disagree: remove one or make them equal"]
    held = fake_apiserver.store.get("pods", "r-both", "default")
    assert pc.FINALIZER not in (held["metadata"].get("finalizers") or []), "refused before anything was touched"


def test_a_pinned_snapshot_of_another_pod_spec_is_refused_unless_skipped(fake_apiserver: FakeApiServer) -> None:
    _recorded(fake_apiserver)
    _restore_pod(fake_apiserver, "r-other", image="registry.local/embed:2.0")
    with pytest.raises(_k8s.K8sError) as refused:
        kp.begin_restore(_cluster(fake_apiserver), "default", "r-other")
    assert str(refused.value).startswith("Pod default/r-other: PodSnapshot default/snap-a cannot be restored from")
    (reason,) = refused.value.reasons
    assert "differs in containers[main].image" in reason and pc.ANN_SKIP_COMPAT in reason
    assert pc.restore_condition(fake_apiserver.store.get("pods", "r-other", "default")) is None
    for key in (pc.ANN_SKIP_COMPAT, pc.REF_ANN_SKIP_COMPAT):
        name = "r-skip-" + key.split("/", maxsplit=1)[0].replace(".", "-")
        _restore_pod(fake_apiserver, name, image="registry.local/embed:2.0",
                     annotations={pc.ANN_RESTORE_FROM: "snap-a", key: "true"})
        out = kp.begin_restore(_cluster(fake_apiserver), "default", name)
        assert (out["skip_compat_check"], out["outcome"]) == (True, "Pending")


def test_select_checks_a_pinned_pod_spec(fake_apiserver: FakeApiServer) -> None:
    _recorded(fake_apiserver)
    other = pc.build({"metadata": {"namespace": "default"},
                      "spec": {"containers": [dict(SOURCE[0], image="registry.local/embed:2.0")]}}, "snap-a")
    chosen, _content, reasons = kp.select_for_pod(_cluster(fake_apiserver), other, "default")
    assert chosen is None and len(reasons) == 1 and "differs in containers[main].image" in reasons[0]
    chosen, _content, reasons = kp.select_for_pod(_cluster(fake_apiserver), other, "default",
                                                  scope=pc.SCOPE_ROOTFS_ONLY)
    assert (chosen or {}).get("metadata", {}).get("name") == "snap-a" and reasons == []


# --- PodSnapshot requests, lastAccessTime, snapshots selected at restore (issue 21) ---------------------

def _request(server: FakeApiServer, name: str, **source: Any) -> None:
    """A PodSnapshot request as a user creates it (through the API: the CRD's defaults apply), no status."""
    spec = {"source": dict({"podRef": {"name": "embed-0"}}, **source)}
    _cluster(server).create(pc.KIND_SNAPSHOT, {"apiVersion": pc.API_VERSION, "kind": pc.KIND_SNAPSHOT,
                                               "metadata": {"name": name, "namespace": "default"}, "spec": spec},
                            "default")


def _bind_params(name: str, containers: Optional[list] = None) -> Dict[str, Any]:
    return {"namespace": "default", "name": name, "source_pod": "embed-0", "containers": containers or [],
            "scope": "whole-pod", "policy_name": None, "labels": None, "content_name": None,
            "store": {"url": "/mnt/snapshots", "snapshot_id": "20261203T080000Z-0badcafe"}, "node": None,
            "source_node": {"hostname": "node-1"}, "size": 7, "created_at": None, "ready": True,
            "failed_reason": None, "failed_message": None}


def test_an_existing_request_is_bound_with_the_uid_backlink(fake_apiserver: FakeApiServer) -> None:
    _recorded(fake_apiserver)  # CRDs and the source pod embed-0
    _request(fake_apiserver, "asked", containers=["main"])
    asked = fake_apiserver.store.get("podsnapshots", "asked", "default", group=pc.GROUP)
    out = kp.ensure_pod_snapshot(_cluster(fake_apiserver), _bind_params("asked"))
    snap, content = out["snapshot"], out["content"]
    assert snap["spec"] == asked["spec"], "the request's spec is kept (no uid added: specs are immutable)"
    assert pc.is_ready(snap) and snap["status"]["boundSnapshotContentName"] == content["metadata"]["name"]
    pod_uid = fake_apiserver.store.get("pods", "embed-0", "default")["metadata"]["uid"]
    assert content["spec"]["snapshotRef"] == {"namespace": "default", "name": "asked", "uid": asked["metadata"]["uid"]}
    assert content["spec"]["source"]["podRef"]["uid"] == pod_uid
    assert pc.check_content_binding(snap, content) == []
    assert kp.restore_pairs({"metadata": {"annotations": {pc.ANN_RESTORE_FROM: "asked"}},
                             "spec": {"containers": [{"name": "main"}]}}, snap) == [
        {"source": "main", "container": "main"}]
    assert not kp.ensure_pod_snapshot(_cluster(fake_apiserver), _bind_params("asked"))["changed"]


def test_a_request_for_an_earlier_incarnation_of_the_pod_is_refused(fake_apiserver: FakeApiServer) -> None:
    _recorded(fake_apiserver)
    _request(fake_apiserver, "old-uid", podRef={"name": "embed-0", "uid": "0000-gone"})
    with pytest.raises(_k8s.K8sError, match="that pod now has uid .* \\(it was deleted and created again\\)"):
        kp.ensure_pod_snapshot(_cluster(fake_apiserver), _bind_params("old-uid"))
    _request(fake_apiserver, "two", containers=["main"])
    fake_apiserver.add_pod("embed-0", containers=[SOURCE[0], {"name": "side", "image": "x"}], labels={"app": "embed"})
    with pytest.raises(_k8s.K8sError, match="exists with another spec"):
        kp.ensure_pod_snapshot(_cluster(fake_apiserver), _bind_params("two", ["main", "side"]))


def test_finish_records_last_access_only_for_a_restore_that_happened(fake_apiserver: FakeApiServer) -> None:
    _recorded(fake_apiserver)
    for name in ("r-ok", "r-part", "r-bad", "r-gone"):
        _restore_pod(fake_apiserver, name)
    cluster = _cluster(fake_apiserver)
    assert "lastAccessTime" not in fake_apiserver.store.get("podsnapshots", "snap-a", "default", group=pc.GROUP)["status"]
    failed = kp.finish_restore(cluster, "default", "r-bad", "failed", "CRIU failed")
    assert failed["last_access_time"] is None
    assert "lastAccessTime" not in fake_apiserver.store.get("podsnapshots", "snap-a", "default", group=pc.GROUP)["status"]
    writes = len(fake_apiserver.writes())
    dry = kp.finish_restore(cluster, "default", "r-ok", "succeeded", check_mode=True)
    assert dry["last_access_time"] and len(fake_apiserver.writes()) == writes
    done = kp.finish_restore(cluster, "default", "r-ok", "succeeded")
    stored = fake_apiserver.store.get("podsnapshots", "snap-a", "default", group=pc.GROUP)["status"]
    assert done["last_access_time"] == stored["lastAccessTime"] and done["changed"]
    assert kp.finish_restore(cluster, "default", "r-part", "partially_succeeded")["last_access_time"]
    fake_apiserver.store.remove("podsnapshots", "snap-a", "default", group=pc.GROUP)
    gone = kp.finish_restore(cluster, "default", "r-gone", "succeeded")
    assert gone["outcome"] == "Succeeded" and gone["last_access_time"] is None
    assert gone["warnings"] and "lastAccessTime of PodSnapshot default/snap-a not recorded" in gone["warnings"][0]


def test_the_summary_says_access_attempts_and_failure(fake_apiserver: FakeApiServer) -> None:
    snap = _recorded(fake_apiserver)
    kp.touch_snapshot(_cluster(fake_apiserver), "default", "snap-a", "2026-12-03T08:00:00Z")
    snap = fake_apiserver.store.get("podsnapshots", "snap-a", "default", group=pc.GROUP)
    s = kp.snapshot_summary(snap, None)
    assert (s["last_access_time"], s["attempts"], s["failed"], s["last_error"], s["policy_name"]) == (
        "2026-12-03T08:00:00Z", 0, False, None, None)


def test_a_pod_that_selects_its_snapshot_gets_it_pinned_at_begin(fake_apiserver: FakeApiServer) -> None:
    _recorded(fake_apiserver)
    template = {"metadata": {"labels": {"app": "embed"}}, "spec": {"containers": [dict(SOURCE[0])]}}
    built = pc.build(template, None)
    assert pc.restore_mode(built) == {"restore_from": None, "select": True, "policy": None, "fallback": None}
    fake_apiserver.add_pod("r-sel", containers=built["spec"]["containers"], spec=dict(built["spec"]),
                           labels={"app": "embed"}, annotations=built["metadata"]["annotations"])
    cluster = _cluster(fake_apiserver)
    pod = cluster.get_pod("default", "r-sel")
    writes = len(fake_apiserver.writes())
    dry, name, reasons = kp.pin_selected(cluster, pod, check_mode=True)
    assert (name, reasons, len(fake_apiserver.writes())) == ("snap-a", [], writes)
    assert dry["metadata"]["annotations"][pc.ANN_RESTORE_FROM] == "snap-a"
    out = kp.begin_restore(cluster, "default", "r-sel")
    assert out["snapshot"] == "snap-a" and out["outcome"] == "Pending"
    stored = fake_apiserver.store.get("pods", "r-sel", "default")
    assert stored["metadata"]["annotations"][pc.ANN_RESTORE_FROM] == "snap-a"
    assert pc.restore_mode(stored)["select"] and pc.is_restore_pod(stored)
    # a pinned pod stays pinned
    assert kp.pin_selected(cluster, stored)[1:] == ("snap-a", [])


def test_a_selecting_pod_with_nothing_that_fits_is_refused_with_the_reasons(fake_apiserver: FakeApiServer) -> None:
    _recorded(fake_apiserver)
    fake_apiserver.store.put("podsnapshotpolicies", {"metadata": {"name": "by-model", "namespace": "default"},
                                                     "spec": {"selector": {}, "storeUrl": "/mnt/s",
                                                              "snapshotGroupingRules": {
                                                                  "groupByLabelValue": {"labels": ["model"]}}}},
                             group=pc.GROUP)
    template = {"metadata": {"labels": {"app": "embed", "model": "other"}},
                "spec": {"containers": [dict(SOURCE[0])]}}
    built = pc.build(template, None, restore_policy="by-model")
    fake_apiserver.add_pod("r-none", containers=built["spec"]["containers"], spec=dict(built["spec"]),
                           labels={"app": "embed", "model": "other"}, annotations=built["metadata"]["annotations"])
    with pytest.raises(_k8s.K8sError) as refused:
        kp.begin_restore(_cluster(fake_apiserver), "default", "r-none")
    assert "no PodSnapshot to restore from" in refused.value.message and refused.value.reasons
    pod = fake_apiserver.store.get("pods", "r-none", "default")
    assert pc.ANN_RESTORE_FROM not in pod["metadata"]["annotations"] and pc.restore_condition(pod) is None
    plain = fake_apiserver.add_pod("plain-0")
    assert kp.pin_selected(_cluster(fake_apiserver), plain)[1] is None


# --- names from objects are names, never paths (issue 32, class 3) --------------------------------------------------

@pytest.mark.parametrize("value", ["../../other/podsnapshots/snap-a", "snap-a/status", "snap-a?watch=1", "..",
                                   "Snap-A", "snap-a%2F..", "a" * 254])
def test_a_restore_from_that_is_not_a_name_is_refused_before_any_request(
        fake_apiserver: FakeApiServer, value: str) -> None:
    _recorded(fake_apiserver)
    _restore_pod(fake_apiserver, "r-evil", annotations={pc.ANN_RESTORE_FROM: value})
    before = len(fake_apiserver.requests)
    with pytest.raises(_k8s.K8sError) as refused:
        kp.restore_plan(_cluster(fake_apiserver), _cluster(fake_apiserver).get_pod("default", "r-evil"))
    assert f"its {pc.ANN_RESTORE_FROM} annotation" in str(refused.value) and "is not a PodSnapshot name" in str(refused.value)
    assert not any("podsnapshots" in str(r.get("path", "")) for r in fake_apiserver.requests[before:])


@pytest.mark.parametrize("namespace, name, fragment", [
    ("../kube-system", "x", "namespace '../kube-system' is not a valid namespace name"),
    ("default", "../../x", "name '../../x' is not a valid object name"),
    ("default", "x/status", "name 'x/status' is not a valid object name"),
    ("Default", "x", "is not a valid namespace name"),
])
def test_api_paths_take_names_only(namespace: str, name: str, fragment: str) -> None:
    with pytest.raises(_k8s.K8sError, match=fragment):
        _k8s.Cluster.path(pc.KIND_SNAPSHOT, namespace, name)
    assert _k8s.Cluster.path(pc.KIND_SNAPSHOT, "default", "snap-a.v1").endswith("/namespaces/default/podsnapshots/snap-a.v1")
