"""Pod and snapshot summaries, label selectors and PodSnapshotPolicy settings (plugins/module_utils/k8s/_k8s_summaries.py)."""
from __future__ import annotations

import copy

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_client as _k8s
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_restorepods as rpods
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_summaries as summ
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from tests.support import fake_apiserver as fake_server_module
from tests.support.fake_apiserver import FakeApiServer
from tests.support.record_fixtures import cluster_of, recorded

fake_apiserver = fake_server_module.fake_apiserver  # the pytest fixture


def test_label_selectors_become_query_strings() -> None:
    sel = {"matchLabels": {"tier": "gold", "app": "embed"},
           "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]},
                                {"key": "canary", "operator": "NotIn", "values": ["yes"]},
                                {"key": "gpu", "operator": "Exists"}, {"key": "old", "operator": "DoesNotExist"}]}
    assert summ.selector_string(sel) == "app=embed,tier=gold,zone in (a,b),canary notin (yes),gpu,!old"
    assert summ.selector_string(None) == ""
    with pytest.raises(_k8s.K8sError, match="operator 'Gt' is not one of"):
        summ.selector_string({"matchExpressions": [{"key": "x", "operator": "Gt", "values": ["1"]}]})


def test_policy_settings_with_defaults_and_explicit_values() -> None:
    plain = {"metadata": {"name": "p"}, "spec": {"selector": {"matchLabels": {"app": "x"}}, "storeUrl": "/mnt/s"}}
    assert summ.policy_settings(plain) == {
        "name": "p", "selector": "app=x", "store_url": "/mnt/s", "wait_ready": True, "leave_running": True,
        "scope": "whole-pod", "group_by": [], "max_per_group": 0, "last_access_timeout": None}
    manual = summ.policy_settings({"metadata": {"name": "m"}, "spec": {
        "selector": {}, "storeUrl": "s3://b/p", "snapshotScope": "rootfs-only",
        "triggerConfig": {"type": "manual", "postCheckpoint": "stop"},
        "snapshotGroupingRules": {"groupByLabelValue": {"labels": ["model"]},
                                  "groupRetentionPolicy": {"maxSnapshotCountPerGroup": 2}},
        "retentionConfig": {"lastAccessTimeout": "72h"}}})
    assert (manual["wait_ready"], manual["leave_running"], manual["scope"]) == (False, False, "rootfs-only")
    assert (manual["group_by"], manual["max_per_group"], manual["last_access_timeout"]) == (["model"], 2, "72h")


def test_a_pod_summary_carries_what_the_node_needs() -> None:
    pod = {"metadata": {"namespace": "ml", "name": "e-0", "uid": "u1", "labels": {"app": "e"}},
           "spec": {"nodeName": "gpu-01", "containers": [
               {"name": "main", "image": "i", "volumeMounts": [{"name": "cache", "mountPath": "/root/.cache"},
                                                               {"name": "snapshot-control", "mountPath": "/sc"},
                                                               {"name": "weights", "mountPath": "/models"}]},
               {"name": "side", "image": "j"}],
               "volumes": [{"name": "cache", "emptyDir": {}}, {"name": "snapshot-control", "emptyDir": {}},
                           {"name": "weights", "persistentVolumeClaim": {"claimName": "w"}}]},
           "status": {"phase": "Running", "containerStatuses": [
               {"name": "main", "containerID": "podman://abc", "ready": True, "state": {"running": {}}},
               {"name": "side", "containerID": "podman://def", "state": {"waiting": {}}, "restartCount": 2}]}}
    s = summ.summary(pod)
    assert (s["node_name"], s["uid"], s["phase"], s["pod_outcome"]) == ("gpu-01", "u1", "Running", None)
    assert "restore_state" not in s
    restoring = copy.deepcopy(pod)
    restoring["metadata"]["annotations"] = {podapi.REF_ANN_RESTORE_FROM: "snap-a"}
    restoring["status"]["conditions"] = [{"type": "nvidia.com/Restored", "status": "True", "reason": "RestoreSucceeded"}]
    assert summ.summary(restoring)["pod_outcome"] == "Succeeded"
    assert s["containers"] == [
        {"name": "main", "container_id": "podman://abc", "running": True, "ready": True, "restart_count": 0,
         "volumes": ["/root/.cache"]},  # its emptyDir volumes, the snapshot-control one left out
        {"name": "side", "container_id": "podman://def", "running": False, "ready": False, "restart_count": 2,
         "volumes": []}]
    assert summ.waiting_for(s, "scheduled") is None
    assert summ.waiting_for(s, "running") == "containers not running: side"
    assert summ.waiting_for(dict(s, node_name=None), "scheduled") == "not scheduled"


def test_the_summary_says_access_attempts_and_failure(fake_apiserver: FakeApiServer) -> None:
    snap = recorded(fake_apiserver)
    rpods.touch_snapshot(cluster_of(fake_apiserver), "default", "snap-a", "2026-12-03T08:00:00Z")
    snap = fake_apiserver.store.get("podsnapshots", "snap-a", "default", group=podapi.GROUP)
    s = summ.snapshot_summary(snap, None)
    assert (s["last_access_time"], s["attempts"], s["failed"], s["last_error"], s["policy_name"]) == (
        "2026-12-03T08:00:00Z", 0, False, None, None)


def test_the_summary_names_its_content_and_node_and_locates_its_store(fake_apiserver: FakeApiServer) -> None:
    snap = recorded(fake_apiserver)
    content = fake_apiserver.store.get("podsnapshotcontents", snap["status"]["boundSnapshotContentName"],
                                       group=podapi.GROUP)
    s = summ.snapshot_summary(snap, content)
    spec_store = content["spec"]["store"]
    assert s["content_name"] == content["metadata"]["name"]
    assert s["node_name"] == content["spec"]["source"]["nodeName"]
    assert s["store"] == {"url": spec_store["url"], "snapshot_id": spec_store["snapshotId"],
                          "path": spec_store.get("path")}
    assert summ.snapshot_summary(snap, None)["store"] is None  # no content: no store
