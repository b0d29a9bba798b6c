"""Pod summaries, label selectors and PodSnapshotPolicy settings (plugins/module_utils/_k8s_records.py)."""
from __future__ import annotations

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils import _k8s_client as _k8s
from ansible_collections.warmstart.snapshot.plugins.module_utils import _k8s_records as kp


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
    assert (s["node"], s["uid"], s["phase"], s["restore_state"]) == ("gpu-01", "u1", "Running", None)
    assert s["containers"] == [
        {"name": "main", "container_id": "podman://abc", "running": True, "ready": True, "restart_count": 0},
        {"name": "side", "container_id": "podman://def", "running": False, "ready": False, "restart_count": 2}]
    assert kp.waiting_for(s, "scheduled") is None
    assert kp.waiting_for(s, "running") == "containers not running: side"
    assert kp.waiting_for(dict(s, node=None), "scheduled") == "not scheduled"
