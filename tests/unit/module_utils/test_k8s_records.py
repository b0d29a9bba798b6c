"""Pod summaries, label selectors and PodSnapshotPolicy settings (plugins/module_utils/_k8s_records.py)."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Dict, Optional

import pytest
import yaml

from ansible_collections.warmstart.snapshot.plugins.module_utils import _k8s_client as _k8s
from ansible_collections.warmstart.snapshot.plugins.module_utils import _k8s_records as kp
from ansible_collections.warmstart.snapshot.plugins.module_utils import _podcontract as pc
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
