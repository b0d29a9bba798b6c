"""Restore pods against the fake API server, in-process: begin, plan, finish, pinning a selected snapshot
(plugins/module_utils/k8s/_k8s_restorepods.py)."""
from __future__ import annotations

from typing import Dict, Optional

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_client as _k8s
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_restorepods as rpods
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podbuild as podbuild
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc
from tests.support import fake_apiserver as fake_server_module
from tests.support.fake_apiserver import FakeApiServer
from tests.support.record_fixtures import SOURCE, cluster_of, recorded

fake_apiserver = fake_server_module.fake_apiserver  # the pytest fixture


# --- the restore path against the fake API server (in-process) --------------------------------------------

def _restore_pod(server: FakeApiServer, name: str, image: str = SOURCE[0]["image"],
                 annotations: Optional[Dict[str, str]] = None) -> None:
    """A scheduled restore pod built (inert) from SOURCE with ``image``; ``annotations`` replace build's three."""
    template = {"metadata": {"labels": {"app": "embed"}}, "spec": {"containers": [dict(SOURCE[0], image=image)]}}
    built = podbuild.build(template, "snap-a")
    if annotations is not None:
        for key in (podapi.ANN_RESTORE_FROM, podapi.ANN_CONTAINER_MAP, podapi.ANN_SKIP_COMPAT):
            built["metadata"]["annotations"].pop(key, None)
        built["metadata"]["annotations"].update(annotations)
    server.add_pod(name, containers=built["spec"]["containers"], spec=dict(built["spec"]), labels={"app": "embed"},
                   annotations=built["metadata"]["annotations"])


def test_begin_marks_the_restore_in_progress_as_the_reference_does(fake_apiserver: FakeApiServer) -> None:
    recorded(fake_apiserver)
    _restore_pod(fake_apiserver, "r-0")
    out = rpods.begin_restore(cluster_of(fake_apiserver), "default", "r-0")
    condition = podapi.get_condition(out["pod"], podapi.RESTORE_CONDITION)
    assert (condition["status"], condition["reason"]) == ("False", podapi.REASON_IN_PROGRESS)
    assert (out["pod_outcome"], out["losses"], out["pod_snapshot_name"]) == ("Pending", [], "snap-a") and "state" not in out
    done = rpods.finish_restore(cluster_of(fake_apiserver), "default", "r-0", "incompatible", "kernel differs")
    assert done["pod_outcome"] == "Failed"
    with pytest.raises(_k8s.K8sError, match="its restore already ran"):
        rpods.begin_restore(cluster_of(fake_apiserver), "default", "r-0")


def test_begin_reads_the_reference_annotations(fake_apiserver: FakeApiServer) -> None:
    recorded(fake_apiserver)
    _restore_pod(fake_apiserver, "r-ref", annotations={podapi.REF_ANN_RESTORE_FROM: "snap-a",
                                                       podapi.REF_ANN_CONTAINER_MAP: "main=main"})
    plan = rpods.restore_plan(cluster_of(fake_apiserver), cluster_of(fake_apiserver).get_pod("default", "r-ref"))
    assert (plan["pod_snapshot_name"], plan["skip_compat_check"]) == ("snap-a", False)
    assert [(p["source"], p["container"]) for p in plan["pairs"]] == [("main", "main")]
    _restore_pod(fake_apiserver, "r-both", annotations={podapi.ANN_RESTORE_FROM: "snap-a", podapi.REF_ANN_RESTORE_FROM: "snap-b"})
    with pytest.raises(_k8s.K8sError) as refused:
        rpods.begin_restore(cluster_of(fake_apiserver), "default", "r-both")
    assert refused.value.reasons == [
        "pod default/r-both has annotation snapshot.warmstart.io/restore-from: 'snap-a' and annotation "
        "nvidia.com/restore-from: 'snap-b', which disagree: remove one or make them equal"]
    held = fake_apiserver.store.get("pods", "r-both", "default")
    assert podapi.FINALIZER not in (held["metadata"].get("finalizers") or []), "refused before anything was touched"


def test_a_pinned_snapshot_of_another_pod_spec_is_refused_unless_skipped(fake_apiserver: FakeApiServer) -> None:
    recorded(fake_apiserver)
    _restore_pod(fake_apiserver, "r-other", image="registry.local/embed:2.0")
    with pytest.raises(_k8s.K8sError) as refused:
        rpods.begin_restore(cluster_of(fake_apiserver), "default", "r-other")
    assert str(refused.value).startswith("Pod default/r-other: PodSnapshot default/snap-a cannot be restored from")
    (reason,) = refused.value.reasons
    assert "differs in containers[main].image" in reason and podapi.ANN_SKIP_COMPAT in reason
    assert pc.restore_condition(fake_apiserver.store.get("pods", "r-other", "default")) is None
    for key in (podapi.ANN_SKIP_COMPAT, podapi.REF_ANN_SKIP_COMPAT):
        name = "r-skip-" + key.split("/", maxsplit=1)[0].replace(".", "-")
        _restore_pod(fake_apiserver, name, image="registry.local/embed:2.0",
                     annotations={podapi.ANN_RESTORE_FROM: "snap-a", key: "true"})
        out = rpods.begin_restore(cluster_of(fake_apiserver), "default", name)
        assert (out["skip_compat_check"], out["pod_outcome"]) == (True, "Pending")


def test_select_checks_a_pinned_pod_spec(fake_apiserver: FakeApiServer) -> None:
    recorded(fake_apiserver)
    other = podbuild.build({"metadata": {"namespace": "default"},
                            "spec": {"containers": [dict(SOURCE[0], image="registry.local/embed:2.0")]}}, "snap-a")
    chosen, _content, reasons = rpods.select_for_pod(cluster_of(fake_apiserver), other, "default")
    assert chosen is None and len(reasons) == 1 and "differs in containers[main].image" in reasons[0]
    chosen, _content, reasons = rpods.select_for_pod(cluster_of(fake_apiserver), other, "default",
                                                     scope=podapi.SCOPE_ROOTFS_ONLY)
    assert (chosen or {}).get("metadata", {}).get("name") == "snap-a" and reasons == []


# --- lastAccessTime, snapshots selected at restore (issue 21) ---------------------

def test_finish_records_last_access_only_for_a_restore_that_happened(fake_apiserver: FakeApiServer) -> None:
    recorded(fake_apiserver)
    for name in ("r-ok", "r-part", "r-bad", "r-gone"):
        _restore_pod(fake_apiserver, name)
    cluster = cluster_of(fake_apiserver)
    assert "lastAccessTime" not in fake_apiserver.store.get("podsnapshots", "snap-a", "default", group=podapi.GROUP)["status"]
    failed = rpods.finish_restore(cluster, "default", "r-bad", "failed", "CRIU failed")
    assert failed["last_access_time"] is None
    assert "lastAccessTime" not in fake_apiserver.store.get("podsnapshots", "snap-a", "default", group=podapi.GROUP)["status"]
    writes = len(fake_apiserver.writes())
    dry = rpods.finish_restore(cluster, "default", "r-ok", "succeeded", check_mode=True)
    assert dry["last_access_time"] and len(fake_apiserver.writes()) == writes
    done = rpods.finish_restore(cluster, "default", "r-ok", "succeeded")
    stored = fake_apiserver.store.get("podsnapshots", "snap-a", "default", group=podapi.GROUP)["status"]
    assert done["last_access_time"] == stored["lastAccessTime"] and done["changed"]
    assert rpods.finish_restore(cluster, "default", "r-part", "partially_succeeded")["last_access_time"]
    fake_apiserver.store.remove("podsnapshots", "snap-a", "default", group=podapi.GROUP)
    gone = rpods.finish_restore(cluster, "default", "r-gone", "succeeded")
    assert gone["pod_outcome"] == "Succeeded" and gone["last_access_time"] is None
    assert gone["warnings"] and "lastAccessTime of PodSnapshot default/snap-a not recorded" in gone["warnings"][0]


def test_a_pod_that_selects_its_snapshot_gets_it_pinned_at_begin(fake_apiserver: FakeApiServer) -> None:
    recorded(fake_apiserver)
    template = {"metadata": {"labels": {"app": "embed"}}, "spec": {"containers": [dict(SOURCE[0])]}}
    built = podbuild.build(template, None)
    assert pc.restore_mode(built) == {"restore_from": None, "select": True, "policy": None, "fallback": None}
    fake_apiserver.add_pod("r-sel", containers=built["spec"]["containers"], spec=dict(built["spec"]),
                           labels={"app": "embed"}, annotations=built["metadata"]["annotations"])
    cluster = cluster_of(fake_apiserver)
    pod = cluster.get_pod("default", "r-sel")
    writes = len(fake_apiserver.writes())
    dry, name, reasons = rpods.pin_selected(cluster, pod, check_mode=True)
    assert (name, reasons, len(fake_apiserver.writes())) == ("snap-a", [], writes)
    assert dry["metadata"]["annotations"][podapi.ANN_RESTORE_FROM] == "snap-a"
    out = rpods.begin_restore(cluster, "default", "r-sel")
    assert out["pod_snapshot_name"] == "snap-a" and out["pod_outcome"] == "Pending"
    stored = fake_apiserver.store.get("pods", "r-sel", "default")
    assert stored["metadata"]["annotations"][podapi.ANN_RESTORE_FROM] == "snap-a"
    assert pc.restore_mode(stored)["select"] and pc.is_restore_pod(stored)
    # a pinned pod stays pinned
    assert rpods.pin_selected(cluster, stored)[1:] == ("snap-a", [])


def test_a_selecting_pod_with_nothing_that_fits_is_refused_with_the_reasons(fake_apiserver: FakeApiServer) -> None:
    recorded(fake_apiserver)
    fake_apiserver.store.put("podsnapshotpolicies", {"metadata": {"name": "by-model", "namespace": "default"},
                                                     "spec": {"selector": {}, "storeUrl": "/mnt/s",
                                                              "snapshotGroupingRules": {
                                                                  "groupByLabelValue": {"labels": ["model"]}}}},
                             group=podapi.GROUP)
    template = {"metadata": {"labels": {"app": "embed", "model": "other"}},
                "spec": {"containers": [dict(SOURCE[0])]}}
    built = podbuild.build(template, None, restore_policy="by-model")
    fake_apiserver.add_pod("r-none", containers=built["spec"]["containers"], spec=dict(built["spec"]),
                           labels={"app": "embed", "model": "other"}, annotations=built["metadata"]["annotations"])
    with pytest.raises(_k8s.K8sError) as refused:
        rpods.begin_restore(cluster_of(fake_apiserver), "default", "r-none")
    assert "no PodSnapshot to restore from" in refused.value.message and refused.value.reasons
    pod = fake_apiserver.store.get("pods", "r-none", "default")
    assert podapi.ANN_RESTORE_FROM not in pod["metadata"]["annotations"] and pc.restore_condition(pod) is None
    plain = fake_apiserver.add_pod("plain-0")
    assert rpods.pin_selected(cluster_of(fake_apiserver), plain)[1] is None


# --- names from objects are names, never paths (issue 32, class 3) --------------------------------------------------

@pytest.mark.parametrize("value", ["../../other/podsnapshots/snap-a", "snap-a/status", "snap-a?watch=1", "..",
                                   "Snap-A", "snap-a%2F..", "a" * 254])
def test_a_restore_from_that_is_not_a_name_is_refused_before_any_request(
        fake_apiserver: FakeApiServer, value: str) -> None:
    recorded(fake_apiserver)
    _restore_pod(fake_apiserver, "r-evil", annotations={podapi.ANN_RESTORE_FROM: value})
    before = len(fake_apiserver.requests)
    with pytest.raises(_k8s.K8sError) as refused:
        rpods.restore_plan(cluster_of(fake_apiserver), cluster_of(fake_apiserver).get_pod("default", "r-evil"))
    assert f"its {podapi.ANN_RESTORE_FROM} annotation" in str(refused.value) and "is not a PodSnapshot name" in str(refused.value)
    assert not any("podsnapshots" in str(r.get("path", "")) for r in fake_apiserver.requests[before:])
