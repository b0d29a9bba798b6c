"""k8s_crds, pod_snapshot and restore_pod end to end: real ansible-playbook runs, the real kubernetes client, and the
fake API server over HTTP on 127.0.0.1 (there is no cluster here). A few checks call the engine (_k8s_client, _k8s_records) in-process.

Each playbook runs on localhost with this venv's Python as the module interpreter (the kubernetes library lives
there). The tests read what the modules stored straight from the fake server's store.
"""
from __future__ import annotations

import copy
import json
import sys
import zlib
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import yaml

pytest.importorskip("kubernetes")

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_client as _k8s  # noqa: E402
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_records  # noqa: E402
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi  # noqa: E402
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podbuild as podbuild  # noqa: E402
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc  # noqa: E402
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _selection as selection  # noqa: E402
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _spechash as spechash  # noqa: E402
from tests.integration.ansible_run import REPO, Run, k8s_tasks, playbook, task_results  # noqa: E402
from tests.support import fake_apiserver as fake_server_module  # noqa: E402
from tests.support.fake_apiserver import FakeApiServer  # noqa: E402

fake_apiserver = fake_server_module.fake_apiserver  # the pytest fixture

CRDS = yaml.safe_load((REPO / "roles/k8s_crds/files/crds.yaml").read_text())["items"]
STORE = {"url": "/mnt/snapshots", "snapshot_id": "20261202T120000Z-1a2b3c4d",
         "path": "/mnt/snapshots/snapshots/20261202T120000Z-1a2b3c4d"}
SOURCE_NODE = {"hostname": "gpu-01", "arch": "x86_64", "kernel": "6.12.48", "cpu_vendor": "GenuineIntel",
               "cpu_flags_hash": "9f2c", "gpu": {"driver": "580.65", "models": ["NVIDIA H200"]}}
TEMPLATE = {"metadata": {"labels": {"app": "embed", "model": "minilm"}},
            "spec": {"containers": [{"name": "main", "image": "registry.local/embed:1.0",
                                     "command": ["python", "/app/server.py"]}]}}


# --- helpers ----------------------------------------------------------------------

def run_tasks(server: FakeApiServer, tmp_path: Path, tasks: List[Dict[str, Any]], *args: str) -> Run:
    return k8s_tasks(server.kubeconfig, tmp_path, tasks, *args)


results = task_results


def snapshot_task(task: str, **args: Any) -> Dict[str, Any]:
    """A pod_snapshot task named ``task`` (errors ignored: the test reads its result)."""
    base = {"namespace": "default", "name": "embed-1", "source_pod": "embed-0", "store": STORE,
            "source_node": SOURCE_NODE, "size": 4096}
    base.update(args)
    return {"name": task, "warmstart.snapshot.pod_snapshot": {k: v for k, v in base.items() if v is not None},
            "ignore_errors": True}


def stored(server: FakeApiServer, plural: str) -> List[Dict[str, Any]]:
    """Every stored object of one of our kinds, all namespaces."""
    return server.store.list(plural, group=podapi.GROUP)


def install_crds(server: FakeApiServer) -> None:
    for crd in CRDS:
        server.store.put("customresourcedefinitions", copy.deepcopy(crd), group="apiextensions.k8s.io")


def cluster(server: FakeApiServer) -> _k8s.Cluster:
    return _k8s.cluster_from({"kubeconfig": str(server.kubeconfig)})


def record(server: FakeApiServer, name: str, pod: str, created_at: str, ready: bool = True,
           labels: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """A PodSnapshot + content made in-process by the engine the module uses."""
    params = {"namespace": "default", "name": name, "source_pod": pod, "containers": [], "scope": "whole-pod",
              "policy_name": None, "labels": labels, "content_name": None,
              "store": dict(STORE, snapshot_id=f"20261202T120000Z-{zlib.crc32(name.encode()):08x}"),
              "node": None, "source_node": SOURCE_NODE, "size": 1, "created_at": created_at, "ready": ready,
              "failed_reason": None if ready else "CheckpointFailed", "failed_message": None}
    return _k8s_records.ensure_pod_snapshot(cluster(server), params)["snapshot"]


# --- k8s_crds -------------------------------------------------------------------------

def test_crds_role_installs_once_then_unchanged_and_check_mode_absent_keeps_them(
        fake_apiserver: FakeApiServer, tmp_path: Path) -> None:
    extra = ["-e", json.dumps({"k8s_crds_kubeconfig": str(fake_apiserver.kubeconfig),
                               "ansible_python_interpreter": sys.executable})]
    first = playbook("warmstart.snapshot.k8s_crds", *extra, timeout=300)
    assert first.rc == 0, first.messages() or first.stderr[-3000:]
    names = sorted(c["metadata"]["name"] for c in fake_apiserver.store.list("customresourcedefinitions"))
    assert names == sorted(c["metadata"]["name"] for c in CRDS) and len(names) == 5
    applied = results(first)["Apply the warmstart CRDs"]
    assert applied["changed"] and {c["action"] for c in applied["crds"]} == {"created"}
    # the CRDs now serve their kinds
    assert (podapi.GROUP, "v1alpha1", "podsnapshotcontents") in fake_apiserver.store.resources

    second = playbook("warmstart.snapshot.k8s_crds", *extra, timeout=300)
    assert second.rc == 0 and second.stats()["changed"] == 0
    assert {c["action"] for c in results(second)["Apply the warmstart CRDs"]["crds"]} == {"unchanged"}

    # someone edits one CRD: the role puts it back, and says so for that one only
    policy = fake_apiserver.store.get("customresourcedefinitions", "podsnapshotpolicies.snapshot.warmstart.io")
    policy["spec"]["versions"][0]["additionalPrinterColumns"] = []
    fake_apiserver.store.put("customresourcedefinitions", policy)
    writes_before = len(fake_apiserver.writes())
    dry = playbook("warmstart.snapshot.k8s_crds", *extra, "--check", "-e", "k8s_crds_state=absent", timeout=300)
    assert dry.rc == 0 and dry.stats()["changed"] == 1
    assert {c["action"] for c in results(dry)["Apply the warmstart CRDs"]["crds"]} == {"deleted"}
    assert len(fake_apiserver.writes()) == writes_before  # check mode wrote nothing
    fix = playbook("warmstart.snapshot.k8s_crds", *extra, timeout=300)
    actions = {c["name"]: c["action"] for c in results(fix)["Apply the warmstart CRDs"]["crds"]}
    assert actions == {"podsnapshots.snapshot.warmstart.io": "unchanged",
                       "podsnapshotcontents.snapshot.warmstart.io": "unchanged",
                       "podsnapshotpolicies.snapshot.warmstart.io": "updated",
                       "podsnapshotmanualtriggers.snapshot.warmstart.io": "unchanged",
                       "podsnapshotstorageconfigs.snapshot.warmstart.io": "unchanged"}
    fixed = fake_apiserver.store.get("customresourcedefinitions", "podsnapshotpolicies.snapshot.warmstart.io")
    assert len(fixed["spec"]["versions"][0]["additionalPrinterColumns"]) == 4


# --- pod_snapshot ---------------------------------------------------------------------------

def test_pod_snapshot_check_mode_creates_nothing(fake_apiserver: FakeApiServer, tmp_path: Path) -> None:
    install_crds(fake_apiserver)
    fake_apiserver.add_pod("embed-0", labels={"app": "embed"})
    run = run_tasks(fake_apiserver, tmp_path, [snapshot_task("would record")], "--check")
    res = results(run)["would record"]
    assert not res.get("failed"), res.get("msg")
    assert res["changed"] is True and res["actions"][0] == "created PodSnapshot default/embed-1"
    assert stored(fake_apiserver, "podsnapshots") == [] and stored(fake_apiserver, "podsnapshotcontents") == []
    assert fake_apiserver.writes() == []


def test_pod_snapshot_present_binds_records_then_is_idempotent_and_absent_deletes_both(
        fake_apiserver: FakeApiServer, tmp_path: Path) -> None:
    install_crds(fake_apiserver)
    pod = fake_apiserver.add_pod("embed-0", labels={"app": "embed", "model": "minilm"}, node="gpu-01")
    run = run_tasks(fake_apiserver, tmp_path, [
        snapshot_task("record"), snapshot_task("record again"),
        snapshot_task("forget", state="absent"), snapshot_task("forget again", state="absent")])
    res = results(run)
    first, again = res["record"], res["record again"]
    assert not first.get("failed"), first.get("msg")
    assert first["changed"] is True and again["changed"] is False and again["actions"] == []

    snap, content = first["pod_snapshot"], first["pod_snapshot_content"]
    cname = f"default-embed-1-{snap['metadata']['uid'].replace('-', '')[:8]}"
    assert content["metadata"]["name"] == cname
    assert snap["spec"]["source"]["podRef"] == {"name": "embed-0", "uid": pod["metadata"]["uid"]}
    assert snap["metadata"]["labels"] == {"app": "embed", "model": "minilm"}  # the pod's, for grouping
    assert first["status"]["boundSnapshotContentName"] == cname
    assert first["status"]["podSpecHash"] == spechash.pod_spec_hash(pod)
    assert first["status"]["size"] == 4096
    assert podapi.get_condition(snap, "Ready")["status"] == "True"
    assert podapi.get_condition(snap, "Failed")["status"] == "False"
    assert content["spec"]["snapshotRef"] == {"namespace": "default", "name": "embed-1",
                                              "uid": snap["metadata"]["uid"]}
    assert content["spec"]["source"] == {"podRef": {"namespace": "default", "name": "embed-0",
                                                    "uid": pod["metadata"]["uid"]}, "nodeName": "gpu-01"}
    assert content["spec"]["store"] == {"url": STORE["url"], "snapshotId": STORE["snapshot_id"],
                                        "path": STORE["path"]}
    assert content["status"]["source"] == {
        "nodeName": "gpu-01", "arch": "x86_64", "kernel": "6.12.48", "cpuHash": "9f2c", "cpuVendor": "GenuineIntel",
        "image": "registry.local/embed:1.0", "imageId": pod["status"]["containerStatuses"][0]["imageID"],
        "gpuDriver": "580.65", "gpuModels": ["NVIDIA H200"]}
    assert content["status"]["podSpecFields"] == spechash.pod_spec_fields(pod)
    assert selection.check_content_binding(snap, content) == []
    # the second run returned the same records, unchanged on the server
    assert again["pod_snapshot"]["metadata"]["resourceVersion"] == snap["metadata"]["resourceVersion"]

    forget, forget_again = res["forget"], res["forget again"]
    assert forget["changed"] is True and forget["actions"] == ["deleted PodSnapshot default/embed-1",
                                                               f"deleted PodSnapshotContent {cname}"]
    assert forget_again["changed"] is False
    assert stored(fake_apiserver, "podsnapshots") == [] and stored(fake_apiserver, "podsnapshotcontents") == []
    assert fake_apiserver.store.get("pods", "embed-0", "default") is not None  # the pod is not ours to delete


def test_pod_snapshot_refusals(fake_apiserver: FakeApiServer, tmp_path: Path) -> None:
    install_crds(fake_apiserver)
    fake_apiserver.add_pod("embed-0")
    # a PodSnapshot already bound to another content
    bound = record(fake_apiserver, "bound-1", "embed-0", "2026-12-02T10:00:00Z")
    # a content left by a PodSnapshot "named-1" that was deleted (its uid is gone)
    fake_apiserver.store.put("podsnapshotcontents", {
        "apiVersion": f"{podapi.GROUP}/v1alpha1", "kind": "PodSnapshotContent", "metadata": {"name": "named-content"},
        "spec": {"snapshotRef": {"namespace": "default", "name": "named-1", "uid": "0ld-uid"},
                 "source": {"podRef": {"namespace": "default", "name": "embed-0"}},
                 "store": {"url": "/mnt/snapshots", "snapshotId": "x"}}}, group=podapi.GROUP)
    run = run_tasks(fake_apiserver, tmp_path, [
        snapshot_task("no pod", source_pod="ghost"),
        snapshot_task("bad container", containers=["sidecar"]),
        snapshot_task("rebind", name="bound-1", content_name="other-content"),
        snapshot_task("stale backlink", name="named-1", content_name="named-content"),
        snapshot_task("other spec", name="bound-1", scope="rootfs-only"),
        snapshot_task("ready without store", name="nostore", store=None),
    ])
    res = results(run)
    assert res["no pod"]["failed"] and res["no pod"]["msg"] == "Pod default/ghost not found"
    assert res["bad container"]["failed"] and "no container 'sidecar' (it has main)" in res["bad container"]["msg"]
    assert res["rebind"]["failed"]
    assert res["rebind"]["msg"] == (f"PodSnapshot default/bound-1 is bound to PodSnapshotContent "
                                    f"{bound['status']['boundSnapshotContentName']!r}, not to 'other-content': "
                                    "refusing to rebind it")
    stale = res["stale backlink"]
    assert stale["failed"] and "belongs to another PodSnapshot" in stale["msg"]
    assert any("points back to uid '0ld-uid'" in r for r in stale["reasons"])
    assert fake_apiserver.store.get("podsnapshots", "named-1", "default") is None  # refused before creating it
    assert res["other spec"]["failed"] and "spec.scope" in res["other spec"]["msg"]
    assert "immutable" in res["other spec"]["msg"]
    assert res["ready without store"]["failed"] and "needs store" in res["ready without store"]["msg"]
    # nothing was changed by the refusals
    assert [s["metadata"]["name"] for s in stored(fake_apiserver, "podsnapshots")] == ["bound-1"]
    assert fake_apiserver.store.get("podsnapshots", "bound-1", "default")["status"] == bound["status"]


def test_pod_snapshot_uid_mismatch_after_delete_and_recreate(fake_apiserver: FakeApiServer, tmp_path: Path) -> None:
    """The content of a deleted PodSnapshot must not be bound to a new one of the same name."""
    install_crds(fake_apiserver)
    fake_apiserver.add_pod("embed-0")
    old = record(fake_apiserver, "embed-1", "embed-0", "2026-12-02T10:00:00Z")
    content_name = old["status"]["boundSnapshotContentName"]
    fake_apiserver.store.remove("podsnapshots", "embed-1", "default")  # deleted behind our back ...
    fresh = cluster(fake_apiserver).create(podapi.KIND_SNAPSHOT, {  # ... and created again by someone
        "apiVersion": podapi.API_VERSION, "kind": podapi.KIND_SNAPSHOT, "metadata": {"name": "embed-1"},
        "spec": {"source": {"podRef": {"name": "embed-0", "uid": old["spec"]["source"]["podRef"]["uid"]}}}},
        "default")
    assert fresh["metadata"]["uid"] != old["metadata"]["uid"]
    run = run_tasks(fake_apiserver, tmp_path, [snapshot_task("rebind old content", content_name=content_name)])
    res = results(run)["rebind old content"]
    assert res["failed"]
    assert any(f"points back to uid {old['metadata']['uid']!r}, but PodSnapshot default/embed-1 has uid "
               f"{fresh['metadata']['uid']!r} (the PodSnapshot was deleted and created again)" in r
               for r in res["reasons"])
    assert "boundSnapshotContentName" not in (fake_apiserver.store.get("podsnapshots", "embed-1", "default")
                                              .get("status") or {})


def test_pod_snapshot_failed_records_conditions_without_content(fake_apiserver: FakeApiServer,
                                                                tmp_path: Path) -> None:
    install_crds(fake_apiserver)
    fake_apiserver.add_pod("embed-0")
    run = run_tasks(fake_apiserver, tmp_path, [snapshot_task(
        "failed", store=None, ready=False, failed_reason="CheckpointFailed", failed_message="criu dump: exit 1")])
    res = results(run)["failed"]
    assert not res.get("failed"), res.get("msg")
    assert res["pod_snapshot_content"] is None and stored(fake_apiserver, "podsnapshotcontents") == []
    failed = podapi.get_condition(res["pod_snapshot"], "Failed")
    assert failed["status"] == "True" and failed["reason"] == "CheckpointFailed"
    assert failed["message"] == "criu dump: exit 1"
    assert podapi.get_condition(res["pod_snapshot"], "Ready")["status"] == "False"
    assert podapi.readiness_problems(res["pod_snapshot"])  # never selected for a restore


# --- restore_pod ---------------------------------------------------------------------------

def test_restore_pod_build_and_check_are_filters(fake_apiserver: FakeApiServer, tmp_path: Path) -> None:
    """The contract's pure steps run as the collection's filters in a play: build (restore_template), check
    (restore_pod_problems) and classify (restore_pod_outcome), without a word to the API server; the module no
    longer offers them as actions."""
    conflicting = copy.deepcopy(TEMPLATE)
    conflicting["metadata"]["annotations"] = {podapi.ANN_RESTORE_FROM: "another"}
    run = run_tasks(fake_apiserver, tmp_path, [
        {"name": "build", "ansible.builtin.set_fact": {
            "built": "{{ template | warmstart.snapshot.restore_template('embed-1') }}",
            "standby": "{{ template | warmstart.snapshot.restore_template('embed-1', entrypoint='standby') }}"},
         "vars": {"template": TEMPLATE}},
        {"name": "check", "ansible.builtin.set_fact": {
            "built_problems": "{{ built | warmstart.snapshot.restore_pod_problems }}",
            "plain_problems": "{{ template | warmstart.snapshot.restore_pod_problems }}",
            "built_outcome": "{{ built | warmstart.snapshot.restore_pod_outcome }}",
            "standby_outcome": "{{ standby | warmstart.snapshot.restore_pod_outcome }}"},
         "vars": {"template": TEMPLATE}},
        {"name": "build conflicting", "ansible.builtin.set_fact": {
            "bad": "{{ conflicting | warmstart.snapshot.restore_template('embed-1') }}"},
         "vars": {"conflicting": conflicting}, "ignore_errors": True},
        {"name": "no such action", "ignore_errors": True,
         "warmstart.snapshot.restore_pod": {"action": "build", "template": TEMPLATE, "snapshot": "embed-1"}},
    ])
    res = results(run)
    facts = {**res["build"]["ansible_facts"], **res["check"]["ansible_facts"]}
    built = facts["built"]
    assert built == podbuild.build(TEMPLATE, "embed-1")
    assert built["metadata"]["annotations"][podapi.ANN_RESTORE_FROM] == "embed-1"
    assert built["spec"]["containers"][0]["command"] == podapi.INERT_COMMAND
    assert facts["built_problems"] == [] and facts["built_outcome"]["entrypoints"] == {"main": "inert"}
    assert facts["built_outcome"]["pod_outcome"] == "Pending"
    standby = facts["standby"]["spec"]["containers"][0]
    assert standby["command"] == TEMPLATE["spec"]["containers"][0]["command"]
    assert {"name": "SNAPSHOT_RESTORE_STANDBY", "value": "1"} in standby["env"]
    assert facts["standby_outcome"]["entrypoints"] == {"main": "standby"}
    assert facts["plain_problems"] == pc.validate(TEMPLATE) and facts["plain_problems"]
    assert any(podapi.ANN_RESTORE_FROM in p for p in facts["plain_problems"])
    assert res["build conflicting"]["failed"] and "'another'" in res["build conflicting"]["msg"]
    assert res["no such action"]["failed"] and "value of action must be one of: select, create, begin, finish" in \
        res["no such action"]["msg"]
    assert fake_apiserver.requests == []  # building and checking never talk to the API server


def test_restore_pod_select_newest_match_or_name_the_differing_fields(fake_apiserver: FakeApiServer,
                                                                      tmp_path: Path) -> None:
    install_crds(fake_apiserver)
    labels = TEMPLATE["metadata"]["labels"]
    fake_apiserver.add_pod("embed-0", labels=labels, containers=copy.deepcopy(TEMPLATE["spec"]["containers"]))
    old_image = copy.deepcopy(TEMPLATE["spec"]["containers"])
    old_image[0]["image"] = "registry.local/embed:0.9"
    fake_apiserver.add_pod("embed-old", labels=labels, containers=old_image)
    record(fake_apiserver, "snap-a", "embed-0", "2026-12-02T10:00:00Z")
    record(fake_apiserver, "snap-b", "embed-0", "2026-12-02T11:00:00Z")  # newest match
    record(fake_apiserver, "snap-c", "embed-old", "2026-12-02T12:00:00Z")  # newer, but another image
    record(fake_apiserver, "snap-d", "embed-0", "2026-12-02T13:00:00Z", ready=False)  # newest, not Ready
    other_group = copy.deepcopy(TEMPLATE)
    other_group["metadata"]["labels"]["model"] = "mpnet"
    new_image = copy.deepcopy(TEMPLATE)
    new_image["spec"]["containers"][0]["image"] = "registry.local/embed:2.0"
    new_image["spec"]["containers"][0]["workingDir"] = "/srv"
    select = {"action": "select", "namespace": "default", "grouping_labels": ["model"]}
    writes_before = len(fake_apiserver.writes())
    run = run_tasks(fake_apiserver, tmp_path, [
        {"name": "select", "warmstart.snapshot.restore_pod": dict(select, template=TEMPLATE)},
        {"name": "other group", "warmstart.snapshot.restore_pod": dict(select, template=other_group),
         "ignore_errors": True},
        {"name": "no match", "warmstart.snapshot.restore_pod": dict(select, template=new_image),
         "ignore_errors": True},
    ])
    res = results(run)
    chosen = res["select"]
    assert not chosen.get("failed"), chosen.get("msg")
    assert chosen["pod_snapshot"]["metadata"]["name"] == "snap-b"
    assert chosen["pod_snapshot_content"]["metadata"]["name"] == chosen["pod_snapshot"]["status"]["boundSnapshotContentName"]
    assert res["other group"]["failed"]
    assert any("belong to another group" in r and "model='minilm', pod has 'mpnet'" in r
               for r in res["other group"]["reasons"])
    nomatch = res["no match"]
    assert nomatch["failed"] and "no PodSnapshot in namespace default fits" in nomatch["msg"]
    nearest = [r for r in nomatch["reasons"] if r.startswith("nearest PodSnapshot")]
    assert nearest and "containers[main].image" in nearest[0] and "containers[main].workingDir" in nearest[0]
    assert any("1 PodSnapshot(s) not Ready" in r for r in nomatch["reasons"])
    assert len(fake_apiserver.writes()) == writes_before  # select only reads


def test_restore_pod_create_n_pods_idempotent_check_mode_and_classify(
        fake_apiserver: FakeApiServer, tmp_path: Path) -> None:
    install_crds(fake_apiserver)
    fake_apiserver.add_pod("embed-0", labels=TEMPLATE["metadata"]["labels"],
                           containers=copy.deepcopy(TEMPLATE["spec"]["containers"]))
    record(fake_apiserver, "snap-a", "embed-0", "2026-12-02T10:00:00Z")
    restored = podbuild.build(TEMPLATE, "snap-a")
    restored["metadata"].update(name="done-0", namespace="default")
    fake_apiserver.store.put("pods", dict(restored, status={
        "phase": "Running", "conditions": [{"type": "Restored", "status": "True", "reason": "RestoreSucceeded",
                                            "message": "pid=1", "lastTransitionTime": "2026-12-02T12:00:00Z"}],
        "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0, "image": "x", "imageID": "y",
                               "state": {"running": {"startedAt": "2026-12-02T11:59:00Z"}}}]}), group="")
    create = {"action": "create", "namespace": "default", "template": TEMPLATE, "grouping_labels": ["model"],
              "count": 3, "name_prefix": "embed-restore"}
    other_image = copy.deepcopy(TEMPLATE)
    other_image["spec"]["containers"][0]["image"] = "registry.local/embed:2.0"
    writes_before = len(fake_apiserver.writes())
    dry = run_tasks(fake_apiserver, tmp_path, [
        {"name": "would create", "warmstart.snapshot.restore_pod": create}], "--check")
    assert results(dry)["would create"]["changed"] is True
    assert len(results(dry)["would create"]["pods"]) == 3
    assert len(fake_apiserver.writes()) == writes_before
    run = run_tasks(fake_apiserver, tmp_path, [
        {"name": "create", "warmstart.snapshot.restore_pod": create},
        {"name": "create again", "warmstart.snapshot.restore_pod": create},
        {"name": "pinned to a missing snapshot", "ignore_errors": True,
         "warmstart.snapshot.restore_pod": dict(create, snapshot="nope", name_prefix="x")},
        {"name": "classify by name", "warmstart.snapshot.pod_info": {"namespace": "default", "name": "done-0"}},
        {"name": "classify new", "warmstart.snapshot.pod_info": {"namespace": "default", "name": "embed-restore-0"}},
        {"name": "create generated", "warmstart.snapshot.restore_pod": dict(create, count=2, name_prefix=None,
                                                                            snapshot="snap-a")},
        {"name": "pinned to another spec", "ignore_errors": True,
         "warmstart.snapshot.restore_pod": dict(create, template=other_image, snapshot="snap-a", name_prefix="o")},
        {"name": "pinned, compat skipped", "warmstart.snapshot.restore_pod": dict(
            create, template=other_image, snapshot="snap-a", name_prefix="s", count=1, skip_compat_check=True)},
    ])
    res = results(run)
    assert res["create"]["changed"] is True and res["create"]["pod_snapshot"]["metadata"]["name"] == "snap-a"
    assert res["create again"]["changed"] is False
    pods = {p["metadata"]["name"]: p for p in fake_apiserver.store.list("pods", "default")}
    assert {"embed-restore-0", "embed-restore-1", "embed-restore-2"} <= set(pods)
    for i in range(3):
        pod = pods[f"embed-restore-{i}"]
        assert pod["metadata"]["annotations"][podapi.ANN_RESTORE_FROM] == "snap-a"
        assert pc.validate(pod) == []
        assert pod["metadata"]["uid"] in {p["metadata"]["uid"] for p in res["create again"]["pods"]}
    assert res["pinned to a missing snapshot"]["failed"] is True
    assert res["pinned to a missing snapshot"]["msg"] == "PodSnapshot default/nope not found"
    assert "x-0" not in pods
    assert res["classify by name"]["targets"][0]["pod_outcome"] == "Succeeded"
    assert res["classify new"]["targets"][0]["pod_outcome"] == "Pending"
    assert res["classify by name"]["targets"][0]["pod_outcome"] == pc.classify(res["classify by name"]["pods"][0])
    generated = [n for n in (p["metadata"]["name"] for p in fake_apiserver.store.list("pods", "default"))
                 if n.startswith("snap-a-restore-")]
    assert res["create generated"]["changed"] is True and len(generated) == 2
    other = res["pinned to another spec"]
    assert other["failed"] and other["msg"].startswith("PodSnapshot default/snap-a cannot be restored into Pod ")
    assert len(other["reasons"]) == 1 and "differs in containers[main].image" in other["reasons"][0]
    assert fake_apiserver.store.get("pods", "o-0", "default") is None, "refused before any pod was created"
    assert res["pinned, compat skipped"]["changed"] is True
    assert fake_apiserver.store.get("pods", "s-0", "default") is not None


# --- the client wrapper in-process ------------------------------------------------------------

def test_connect_errors_name_the_cause(tmp_path: Path) -> None:
    with pytest.raises(_k8s.K8sError) as missing:
        _k8s.connect({"kubeconfig": str(tmp_path / "nope")})
    assert str(missing.value) == f"kubeconfig {tmp_path / 'nope'} does not exist"
    dead = _k8s.Cluster(_k8s.connect({"host": "http://127.0.0.1:9"}), request_timeout=5)
    with pytest.raises(_k8s.K8sError) as down:
        dead.get(podapi.KIND_SNAPSHOT, "embed-1", "default")
    assert str(down.value).startswith("API server http://127.0.0.1:9 unreachable: ")


def test_env_fallback_token_and_wrong_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with FakeApiServer(token="s3cret") as server:
        monkeypatch.setenv("K8S_AUTH_HOST", server.url)
        monkeypatch.setenv("K8S_AUTH_API_KEY", "s3cret")
        monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
        server.add_pod("p")
        assert _k8s.cluster_from({}).get_pod("default", "p")["metadata"]["name"] == "p"
        monkeypatch.setenv("K8S_AUTH_API_KEY", "wrong")
        with pytest.raises(_k8s.K8sError) as denied:
            _k8s.cluster_from({}).get_pod("default", "p")
        assert denied.value.status == 401 and "wrong" not in str(denied.value)
        assert "refused the credentials" in str(denied.value)


def test_pod_conditions_and_finalizers(fake_apiserver: FakeApiServer) -> None:
    fake_apiserver.add_pod("p")
    api = cluster(fake_apiserver)
    changed, pod = api.set_pod_condition("default", "p", podapi.RESTORE_CONDITION, True, podapi.REASON_IN_PROGRESS, "go")
    assert changed and podapi.get_condition(pod, "Restored")["reason"] == podapi.REASON_IN_PROGRESS
    assert podapi.get_condition(pod, "PodScheduled")["status"] == "True"  # the kubelet's conditions stay
    assert api.set_pod_condition("default", "p", podapi.RESTORE_CONDITION, True, podapi.REASON_IN_PROGRESS, "go")[0] is False
    assert api.add_finalizer("Pod", "p", podapi.FINALIZER, "default") is True
    assert api.add_finalizer("Pod", "p", "other.io/x", "default") is True
    assert api.add_finalizer("Pod", "p", podapi.FINALIZER, "default") is False
    assert api.get_pod("default", "p")["metadata"]["finalizers"] == [podapi.FINALIZER, "other.io/x"]
    api.delete_pod("default", "p")
    assert api.remove_finalizer("Pod", "p", podapi.FINALIZER, "default") is True
    assert api.get_pod("default", "p")["metadata"]["finalizers"] == ["other.io/x"]  # still held by the other
    assert api.remove_finalizer("Pod", "p", "other.io/x", "default") is True
    assert fake_apiserver.store.get("pods", "p", "default") is None  # gone with its last finalizer
    assert api.remove_finalizer("Pod", "p", "other.io/x", "default") is False
