"""Kubernetes end to end: the k8s playbooks against a fake API server, with real containers as pods - once on
podman and once on containerd (a private daemon, as the kubelet's runtime on GKE, EKS, AKS, kubeadm and k3s).

The fake API server (tests/support/fake_apiserver.py) holds the pods and our custom objects; the real
``kubernetes`` client of the modules talks to it over HTTP. A fake kubelet thread plays the node: each restore
pod the playbook creates gets a real placeholder container - the pod's inert command, its snapshot-control
volume, the CRI labels - and the pod's status says where it runs (``podman://<id>`` or ``containerd://<id>``;
the playbooks use ``runtime: auto``, which follows that scheme). So the checkpoint of the source pod and the
restores into the placeholders behind the playbooks are real CRIU work on real containers. On podman the source
runs its app under an init; on containerd the app is PID 1 of its container, as in an ordinary pod.
"""
from __future__ import annotations

import json
import subprocess
import time
from typing import Any, Dict, Iterator, List

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _selection as selection
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _spechash as spechash

from tests.support.fake_apiserver import FakeApiServer

from .ansible_run import REPO, VENV_BIN
from .k8s_lab import CACHE, NS, POD_LABELS, ContainerdNode, Kubelet, Node, PodmanNode, emptydir, source_pod, template

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=["podman", "containerd"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Any]]:
    tmp = tmp_path_factory.mktemp(f"k8s-{request.param}")
    lab: Node = PodmanNode(tmp) if request.param == "podman" else ContainerdNode(tmp)
    api = FakeApiServer(token="k8s-e2e-token").start()
    api.store.put("namespaces", {"metadata": {"name": NS}, "status": {"phase": "Active"}}, group="")
    kubeconfig = api.write_kubeconfig(tmp / "kubeconfig")
    kubelet = Kubelet(api, lab)
    kubelet.start()
    try:
        yield {"tmp": tmp, "lab": lab, "api": api, "kubeconfig": kubeconfig, "kubelet": kubelet,
               "auth": {"kubeconfig": str(kubeconfig)}}
    finally:
        kubelet.stop.set()
        kubelet.join(5)
        api.stop()
        lab.cleanup()


def run_playbook(c: Dict[str, Any], name: str, extra: Dict[str, Any], ok: bool = True,
                 store: bool = True) -> Dict[str, Any]:
    summary = c["tmp"] / f"{name}-{time.monotonic_ns()}.json"
    args = dict(extra, warmstart_k8s_auth=c["auth"], warmstart_summary_file=str(summary))
    if store:
        args["warmstart_store"] = str(c["lab"].store)
    env = dict(c["lab"].env, ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default")
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), f"warmstart.snapshot.{name}", "-i", "localhost,",
                           "-c", "local", "-e", json.dumps(args)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=1200, check=False)
    if ok:
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    rows = json.loads(summary.read_text())["rows"] if summary.exists() else []
    return {"rc": proc.returncode, "out": proc.stdout + proc.stderr, "rows": {r.get("pod"): r for r in rows}}


def snapshots(c: Dict[str, Any]) -> List[Dict[str, Any]]:
    return c["api"].store.list("podsnapshots", NS, group=podapi.GROUP)


@pytest.fixture(scope="module")
def captured(cluster: Dict[str, Any]) -> Dict[str, Any]:
    run_playbook(cluster, "k8s_crds", {})
    src = source_pod(cluster, "embed-0")
    (emptydir(cluster["lab"], "embed-0", CACHE[0]) / "compiled.bin").write_bytes(b"kernels compiled at start-up\n")
    # a pod of the same app on a node outside the inventory: reported, left alone
    cluster["api"].add_pod("embed-9", NS, labels=POD_LABELS, node="gpu-far-away")
    before = cluster["lab"].ask(src)
    res = run_playbook(cluster, "k8s_snapshot", {"warmstart_k8s_namespace": NS, "warmstart_k8s_selector": "app=embed"})
    # What the run recorded, read now: later tests take newer snapshots and retention removes this one.
    recorded = snapshots(cluster)
    contents = [cluster["api"].store.get("podsnapshotcontents", s["status"]["boundSnapshotContentName"],
                                         group=podapi.GROUP) for s in recorded]
    sid = res["rows"].get(f"{NS}/embed-0", {}).get("snapshot")
    manifest_path = cluster["lab"].store / "snapshots" / str(sid) / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else None
    return {"src": src, "before": before, "res": res, "recorded": recorded, "contents": contents,
            "pod": cluster["api"].store.get("pods", "embed-0", NS, group=""), "manifest": manifest}


@pytest.fixture(scope="module")
def restored(cluster: Dict[str, Any], captured: Dict[str, Any]) -> Dict[str, Any]:
    """Two pods restored through the contract (the restore playbook's run), for every test that needs them."""
    return run_playbook(cluster, "k8s_restore", {"warmstart_k8s_namespace": NS, "warmstart_k8s_count": 2,
                                                 "warmstart_k8s_name_prefix": "embed-r",
                                                 "warmstart_k8s_template": template(cluster["lab"].image)})


def test_snapshot_playbook_records_a_bound_ready_podsnapshot(cluster: Dict[str, Any], captured: Dict[str, Any]) -> None:
    rows = captured["res"]["rows"]
    assert rows[f"{NS}/embed-0"]["result"] == "snapshotted", rows
    assert rows[f"{NS}/embed-9"]["result"] == "skipped" and "gpu-far-away is not in the inventory" in \
        rows[f"{NS}/embed-9"]["detail"]
    (snap,) = captured["recorded"]
    assert podapi.is_ready(snap), snap["status"]
    (content,) = captured["contents"]
    assert content["spec"]["snapshotRef"]["uid"] == snap["metadata"]["uid"]
    assert selection.check_content_binding(snap, content) == []
    pod = captured["pod"]
    assert snap["status"]["podSpecHash"] == spechash.pod_spec_hash(pod)
    sid = content["spec"]["store"]["snapshotId"]
    assert rows[f"{NS}/embed-0"]["snapshot"] == sid
    manifest = captured["manifest"]
    assert manifest is not None, "the snapshot's manifest was in the store right after the run"
    assert manifest["pod"]["name"] == "embed-0" and manifest["pod"]["uid"] == pod["metadata"]["uid"]
    assert manifest["targets"][0]["name"] == "main", "the snapshot names the container by its pod name"
    (volume,) = manifest["targets"][0]["volumes"]  # the pod's emptyDir went along (pod_info's containers[].volumes)
    assert volume["mountpoint"] == CACHE[1] and volume["entries"] == 1, volume
    # the source pod keeps serving
    after = cluster["lab"].ask(captured["src"])
    assert after["token"] == captured["before"]["token"] and after["counter"] > captured["before"]["counter"]


def test_restore_playbook_starts_restored_pods_through_the_contract(
        cluster: Dict[str, Any], captured: Dict[str, Any], restored: Dict[str, Any]) -> None:
    lab: Node = cluster["lab"]
    res = restored
    token = captured["before"]["token"]
    for name in ("embed-r-0", "embed-r-1"):
        assert res["rows"][f"{NS}/{name}"]["result"] == "restored", res["rows"]
        pod = cluster["api"].store.get("pods", name, NS, group="")
        assert pc.validate(pod) == [], "the created pod follows the contract"
        cond = podapi.get_condition(pod, podapi.RESTORE_CONDITION)
        assert (cond["status"], cond["reason"]) == ("True", podapi.REASON_SUCCEEDED), cond
        assert podapi.FINALIZER not in (pod["metadata"].get("finalizers") or []), "the finalizer is released"
        assert pc.classify(pod) == "Succeeded"
        full = cluster["kubelet"].started[name]
        answer = lab.ask(full)
        assert answer["token"] == token and answer["sha256"] == answer["digest"], answer
        assert answer["workers"]["alive"] == 2, answer["workers"]  # the whole tree came back
        assert answer["loop"]["broken"] == 0 and answer["loop"]["rounds"] >= 2, answer["loop"]  # its loopback links
        time.sleep(0.3)
        later = lab.ask(full)["workers"]["ticks"]
        assert all(b > a >= captured["before"]["workers"]["ticks"][i] for i, (a, b) in
                   enumerate(zip(answer["workers"]["ticks"], later))), (captured["before"]["workers"], later)
        assert (lab.control(f"k8s-{name}") / "restore-complete").read_text().startswith("pid=")
        assert (emptydir(lab, name, CACHE[0]) / "compiled.bin").read_bytes() == b"kernels compiled at start-up\n"
    assert cluster["kubelet"].errors == []


def test_no_snapshot_fits_a_template_of_another_image(cluster: Dict[str, Any], captured: Dict[str, Any]) -> None:
    other = template("localhost/other-image:2")
    res = run_playbook(cluster, "k8s_restore", {"warmstart_k8s_namespace": NS, "warmstart_k8s_template": other,
                                                "warmstart_k8s_name_prefix": "embed-x"}, ok=False)
    assert res["rc"] != 0
    assert "no PodSnapshot in namespace ml fits" in res["out"] and "containers[main].image" in res["out"], \
        res["out"][-4000:]
    assert cluster["api"].store.get("pods", "embed-x-0", NS, group="") is None, "no pod created"


def test_grouping_retention_keeps_the_newest_per_group(cluster: Dict[str, Any], captured: Dict[str, Any]) -> None:
    older = snapshots(cluster)  # the captured one, and whatever other tests of this module recorded
    assert older, "the captured snapshot's record is missing"
    older_contents = [cluster["api"].store.get("podsnapshotcontents", s["status"]["boundSnapshotContentName"],
                                               group=podapi.GROUP) for s in older]
    older_ids = [c["spec"]["store"]["snapshotId"] for c in older_contents]
    time.sleep(1.1)  # snapshot ids and createdAt are to the second
    # the restored replicas carry the template's labels too: a JMESPath filter keeps the original only
    res = run_playbook(cluster, "k8s_snapshot", {"warmstart_k8s_namespace": NS, "warmstart_k8s_selector": "app=embed",
                                                 "warmstart_k8s_filter": "metadata.name == 'embed-0'",
                                                 "warmstart_k8s_group_by": ["model"],
                                                 "warmstart_k8s_max_per_group": 1})
    assert set(res["rows"]) == {f"{NS}/embed-0"}, res["rows"]
    assert res["rows"][f"{NS}/embed-0"]["result"] == "snapshotted"
    left = snapshots(cluster)
    assert len(left) == 1 and left[0]["metadata"]["name"] not in {s["metadata"]["name"] for s in older}, left
    for content, sid in zip(older_contents, older_ids):
        assert cluster["api"].store.get("podsnapshotcontents", content["metadata"]["name"], group=podapi.GROUP) is None
        assert not (cluster["lab"].store / "snapshots" / sid).exists(), "its store snapshot went too"


def test_a_restored_pod_is_found_and_snapshotted_like_any_pod(cluster: Dict[str, Any], captured: Dict[str, Any],
                                                              restored: Dict[str, Any]) -> None:
    """Its workload runs beside the placeholder's PID 1 and is found there; it leads its own session (the
    checkpoint made the tree do so, _pstree), so CRIU dumps it like the original: snapshotted, left serving."""
    res = run_playbook(cluster, "k8s_snapshot", {"warmstart_k8s_namespace": NS, "warmstart_k8s_selector": "app=embed",
                                                 "warmstart_k8s_filter": "metadata.name == 'embed-r-1'"})
    row = res["rows"][f"{NS}/embed-r-1"]
    assert row["result"] == "snapshotted", row
    answer = cluster["lab"].ask(cluster["kubelet"].started["embed-r-1"])
    assert answer["token"] == captured["before"]["token"], "the restored replica keeps serving"


def test_a_podsnapshotpolicy_drives_the_snapshot_run(cluster: Dict[str, Any], captured: Dict[str, Any]) -> None:
    """Selector, store, manual trigger and grouping retention come from the policy; no variables for them."""
    cluster["api"].store.put("podsnapshotpolicies", {
        "apiVersion": podapi.API_VERSION, "kind": podapi.KIND_POLICY, "metadata": {"name": "embed-policy", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "embed"},
                              "matchExpressions": [{"key": "role", "operator": "In", "values": ["source"]}]},
                 "storeUrl": str(cluster["lab"].store),
                 "triggerConfig": {"type": "manual", "postCheckpoint": "resume"},
                 "snapshotGroupingRules": {"groupByLabelValue": {"labels": ["model"]},
                                           "groupRetentionPolicy": {"maxSnapshotCountPerGroup": 1}}}}, group=podapi.GROUP)
    before = {s["metadata"]["name"] for s in snapshots(cluster)}
    time.sleep(1.1)
    res = run_playbook(cluster, "k8s_snapshot", {"warmstart_k8s_namespace": NS, "warmstart_k8s_policy": "embed-policy"},
                       store=False)
    assert set(res["rows"]) == {f"{NS}/embed-0"}, "the policy's selector keeps the restored replicas out"
    assert res["rows"][f"{NS}/embed-0"]["result"] == "snapshotted"
    (snap,) = snapshots(cluster)
    assert snap["metadata"]["name"] not in before, "grouping retention (1 per model) removed the older one"
    assert snap["spec"]["policyName"] == "embed-policy"
    sid = res["rows"][f"{NS}/embed-0"]["snapshot"]
    assert (cluster["lab"].store / "snapshots" / sid / "manifest.json").is_file(), "into the policy's store"
