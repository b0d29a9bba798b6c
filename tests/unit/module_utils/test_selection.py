"""Snapshot selection and binding (plugins/module_utils/k8s/_selection.py): the newest fitting snapshot, pinned pods, contents."""
from __future__ import annotations

import copy

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podbuild as podbuild
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _selection as selection
from tests.support.pod_fixtures import changed_template, content, contents_for, pod, read_back, snapshot, template


# --- selection -------------------------------------------------------------------------

def test_select_the_newest_matching_ready_snapshot() -> None:
    snaps = [snapshot("embed-a", "2026-01-10T10:00:00Z"), snapshot("embed-b", "2026-01-10T12:00:00.5Z"),
             snapshot("embed-c", "2026-01-10T11:00:00Z"), snapshot("embed-d", "2026-01-10T13:00:00Z", ready=False)]
    chosen, reasons = selection.select_snapshot(snaps, read_back(template()))
    assert chosen is not None and chosen["metadata"]["name"] == "embed-b" and reasons == []
    # createdAt wins over creationTimestamp; without it the creationTimestamp counts
    late = snapshot("embed-e", "2026-01-10T09:00:00Z")
    late["status"]["createdAt"] = "2026-01-11T00:00:00Z"
    assert selection.select_snapshot(snaps + [late], template())[0]["metadata"]["name"] == "embed-e"
    for snap in snaps:
        del snap["status"]["createdAt"]
    assert selection.select_snapshot(snaps, template())[0]["metadata"]["name"] == "embed-b"


def test_select_reports_the_fields_of_the_nearest_snapshot() -> None:
    near = changed_template(image="embed:1.3")
    far = changed_template(image="embed:1.2", args=["--port", "1"])
    far["spec"]["volumes"] = far["spec"]["volumes"][:1]
    snaps = [snapshot("embed-near", "2026-01-10T10:00:00Z", near), snapshot("embed-far", "2026-01-10T11:00:00Z", far),
             snapshot("embed-wait", "2026-01-10T12:00:00Z", ready=False)]
    chosen, reasons = selection.select_snapshot(snaps, pod(), contents=contents_for(("embed-near", near), ("embed-far", far)))
    assert chosen is None
    assert "1 PodSnapshot(s) not Ready, ignored: default/embed-wait" in reasons
    assert any("2 Ready PodSnapshot(s) of the pod's group were taken from another pod spec" in r for r in reasons)
    assert "nearest PodSnapshot default/embed-near differs in containers[main].image" in reasons
    far_only = selection.select_snapshot(snaps[1:], pod(), contents=contents_for(("embed-far", far)))[1]
    assert "nearest PodSnapshot default/embed-far differs in containers[main].args, containers[main].image, volumes" in far_only
    unknown = selection.select_snapshot(snaps, pod())[1]
    assert any("newest PodSnapshot default/embed-far has podSpecHash" in r and "podSpecFields" in r for r in unknown)


def test_select_by_grouping_labels() -> None:
    snaps = [snapshot("embed-large", "2026-01-10T12:00:00Z", labels={"model": "large"}),
             snapshot("embed-minilm", "2026-01-10T10:00:00Z", labels={"model": "minilm"})]
    assert selection.select_snapshot(snaps, pod())[0]["metadata"]["name"] == "embed-large"
    assert selection.select_snapshot(snaps, pod(), grouping_labels=["model"])[0]["metadata"]["name"] == "embed-minilm"
    other = pod()
    other["metadata"]["labels"]["model"] = "tiny"
    chosen, reasons = selection.select_snapshot(snaps, other, grouping_labels=["model"])
    assert chosen is None
    assert any("2 Ready PodSnapshot(s) belong to another group" in r and "model='large', pod has 'tiny'" in r for r in reasons)


def test_select_pinned_by_annotation() -> None:
    snaps = [snapshot("embed-old", "2026-01-10T10:00:00Z", changed_template(image="embed:0.1")),
             snapshot("embed-new", "2026-01-10T12:00:00Z"), snapshot("embed-wait", "2026-01-10T13:00:00Z", ready=False)]
    chosen, reasons = selection.select_snapshot(snaps, podbuild.build(pod(), "embed-old"))
    assert chosen is not None and chosen["metadata"]["name"] == "embed-old" and reasons == []
    chosen, reasons = selection.select_snapshot(snaps, podbuild.build(pod(), "embed-wait"))
    assert chosen is None
    assert "pinned to PodSnapshot 'embed-wait'" in reasons[0]
    assert "PodSnapshot default/embed-wait is not Ready (Uploading: copying pages)" in reasons
    chosen, reasons = selection.select_snapshot(snaps, podbuild.build(pod(), "embed-gone"))
    assert chosen is None and "which does not exist in namespace default" in reasons[0]


def test_select_rootfs_only_skips_the_hash() -> None:
    other = changed_template(image="embed:2.0")
    snaps = [snapshot("embed-rootfs", "2026-01-10T10:00:00Z", other, scope="rootfs-only"),
             snapshot("embed-whole", "2026-01-10T12:00:00Z", other)]
    assert selection.select_snapshot(snaps, pod())[0]["metadata"]["name"] == "embed-rootfs"
    assert selection.select_snapshot(snaps, pod(), scope="rootfs-only")[0]["metadata"]["name"] == "embed-whole"
    with pytest.raises(podapi.ContractError, match="scope 'partial'"):
        selection.select_snapshot(snaps, pod(), scope="partial")


def test_select_with_nothing_to_choose_from() -> None:
    assert selection.select_snapshot([], pod()) == (None, ["there is no PodSnapshot in namespace default"])
    elsewhere = snapshot("embed-a", "2026-01-10T10:00:00Z")
    elsewhere["metadata"]["namespace"] = "prod"
    assert selection.select_snapshot([elsewhere], pod())[0] is None
    chosen, reasons = selection.select_snapshot([snapshot("embed-a", "2026-01-10T10:00:00Z", ready=False)], pod())
    assert chosen is None and reasons == ["1 PodSnapshot(s) not Ready, ignored: default/embed-a",
                                          "no Ready PodSnapshot in namespace default"]
    failed = snapshot("embed-f", "2026-01-10T10:00:00Z")
    failed["status"]["conditions"].append({"type": "Failed", "status": "True", "reason": "DumpFailed", "message": "criu"})
    assert selection.select_snapshot([failed], pod())[0] is None


# --- pinned pod vs snapshot spec -----------------------------------------------------------

def test_check_pod_spec_of_a_pinned_restore_pod() -> None:
    snap = snapshot("embed-a", "2026-01-10T10:00:00Z")
    fields = contents_for(("embed-a", template()))["content-embed-a"]
    assert selection.check_pod_spec(snap, podbuild.build(read_back(template()), "embed-a")) == []
    changed = podbuild.build(changed_template(image="embed:9"), "embed-a")
    reasons = selection.check_pod_spec(snap, changed, fields)
    assert reasons == ["pod template does not match the pod spec of PodSnapshot default/embed-a: differs in containers[main].image "
                       "(annotation snapshot.warmstart.io/snapshot-skip-compat-check: \"true\" skips this check)"]
    assert "podSpecHash" in selection.check_pod_spec(snap, changed)[0]
    assert selection.check_pod_spec(snap, podbuild.build(changed_template(image="embed:9"), "embed-a", skip_compat_check=True)) == []
    rootfs = snapshot("embed-r", "2026-01-10T10:00:00Z", scope="rootfs-only")
    assert selection.check_pod_spec(rootfs, changed) == []


def test_check_pod_spec_through_a_container_map() -> None:
    snap = snapshot("embed-a", "2026-01-10T10:00:00Z")
    fields = contents_for(("embed-a", template()))["content-embed-a"]
    replicas = template()
    main = replicas["spec"]["containers"][0]
    replicas["spec"]["containers"] = [dict(copy.deepcopy(main), name="replica-a"), dict(copy.deepcopy(main), name="replica-b")]
    mapped = podbuild.build(replicas, "embed-a", container_map="main=replica-a,main=replica-b")
    assert selection.check_pod_spec(snap, mapped, fields) == []
    assert "needs the PodSnapshotContent's status.podSpecFields" in selection.check_pod_spec(snap, mapped)[0]
    replicas["spec"]["containers"][1]["image"] = "embed:9"
    replicas["spec"]["hostIPC"] = True
    reasons = selection.check_pod_spec(snap, podbuild.build(replicas, "embed-a", container_map="main=replica-a,main=replica-b"), fields)
    assert len(reasons) == 1 and reasons[0].endswith("differs in hostIPC, containers[replica-b].image (from main)")
    unknown = podbuild.build(replicas, "embed-a", container_map="web=replica-a")
    assert selection.check_pod_spec(snap, unknown, fields)[0].endswith("differs in hostIPC, containers[web] (not in the snapshot)")


# --- content binding ---------------------------------------------------------------------


def test_content_binding_accepts_a_matching_pair() -> None:
    snap = snapshot("embed-a", "2026-01-10T10:00:00Z")
    assert selection.check_content_binding(snap, content(snap)) == []


def test_content_binding_refuses_mismatches() -> None:
    snap = snapshot("embed-a", "2026-01-10T10:00:00Z", uid="u-2")
    reasons = selection.check_content_binding(snap, content(snap, uid="u-1"))
    assert reasons == ["PodSnapshotContent content-embed-a points back to uid 'u-1', but PodSnapshot default/embed-a has uid 'u-2' "
                       "(the PodSnapshot was deleted and created again?)"]
    reasons = selection.check_content_binding(snap, content(snap, name="embed-b", namespace="prod"))
    assert len(reasons) == 2 and "namespace 'prod'" in reasons[0] and "name 'embed-b'" in reasons[1]
    unbound = copy.deepcopy(snap)
    unbound["status"]["boundSnapshotContentName"] = "content-other"
    assert selection.check_content_binding(unbound, content(snap)) == [
        "PodSnapshot default/embed-a is bound to PodSnapshotContent 'content-other', not to 'content-embed-a'"]
    del unbound["status"]["boundSnapshotContentName"]
    assert "is not bound to any PodSnapshotContent" in selection.check_content_binding(unbound, content(snap))[0]
    waiting = snapshot("embed-a", "2026-01-10T10:00:00Z", ready=False, uid="u-2")
    assert selection.check_content_binding(waiting, content(waiting)) == ["PodSnapshot default/embed-a is not Ready (Uploading: copying pages)"]
    failed = copy.deepcopy(snap)
    failed["status"]["conditions"].append({"type": "Failed", "status": "True", "reason": "UploadFailed", "message": "disk full"})
    assert selection.check_content_binding(failed, content(failed)) == ["PodSnapshot default/embed-a has failed (UploadFailed: disk full)"]


def test_the_reference_skip_compat_annotation_skips_the_pod_spec_check() -> None:
    snap = snapshot("embed-a", "2026-01-10T10:00:00Z")
    changed = podbuild.build(changed_template(image="embed:9"), "embed-a")
    assert len(selection.check_pod_spec(snap, changed)) == 1
    changed["metadata"]["annotations"][podapi.REF_ANN_SKIP_COMPAT] = "true"
    assert selection.check_pod_spec(snap, changed) == []


@pytest.mark.parametrize("source, node, want", [
    ({"arch": "x86_64"}, {"arch": "aarch64"}, ["architecture: snapshot x86_64, this node aarch64"]),
    ({"arch": "x86_64", "cpuVendor": "AuthenticAMD"}, {"arch": "x86_64", "cpuVendor": "GenuineIntel"},
     ["CPU vendor: snapshot AuthenticAMD, this node GenuineIntel"]),
    ({"gpuModels": ["H100", "H100"]}, {"gpuModels": ["H100"]}, ["GPUs: snapshot H100, H100, this node H100"]),
    ({"gpuModels": ["H100"]}, {"gpuModels": []}, ["GPUs: snapshot H100, this node none"]),
    ({"gpuModels": ["B", "A"]}, {"gpuModels": ["A", "B"]}, []),
    ({}, {"arch": "x86_64", "gpuModels": ["H100"]}, []),  # a CPU snapshot fits a GPU node; unknowns are not compared
    ({"gpuModels": ["H100"]}, {"arch": "x86_64"}, []),
    (None, {"arch": "x86_64"}, []),
])
def test_node_fit(source: object, node: object, want: list) -> None:
    assert selection.node_fit(source, node) == want


def test_select_passes_over_newer_snapshots_taken_on_nodes_unlike_this_one() -> None:
    old = snapshot("old", "2026-01-01T10:00:00Z")
    new = snapshot("new", "2026-01-02T10:00:00Z")
    contents = {"content-old": {"status": {"source": {"arch": "x86_64", "gpuModels": ["A100"]}}},
                "content-new": {"status": {"source": {"arch": "x86_64", "gpuModels": ["H100"]}}}}
    target = read_back(pod())
    assert selection.select_snapshot([old, new], target, contents=contents)[0] is new, "no node: the newest"
    chosen, reasons = selection.select_snapshot([old, new], target, contents=contents,
                                                node={"arch": "x86_64", "gpuModels": ["A100"]})
    assert chosen is old and reasons == []
    chosen, reasons = selection.select_snapshot([old, new], target, contents=contents,
                                                node={"arch": "aarch64", "gpuModels": ["H100"]})
    assert chosen is None
    assert reasons[:2] == ["default/new was taken on a node this one does not match: architecture: snapshot x86_64, "
                           "this node aarch64",
                           "default/old was taken on a node this one does not match: architecture: snapshot x86_64, "
                           "this node aarch64; GPUs: snapshot A100, this node H100"]
