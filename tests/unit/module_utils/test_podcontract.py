"""The restore-pod contract: container map, validate, classify, the reference's names (plugins/module_utils/k8s/_podcontract.py)."""
from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Optional

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podbuild as podbuild
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _selection as selection
from ansible_collections.warmstart.snapshot.plugins.module_utils.node._profile import ProfileError
from tests.support.pod_fixtures import append_path, pod, restore_pod, set_path, snapshot


# --- container map ---------------------------------------------------------------------

def test_container_map_fans_out_and_keeps_order() -> None:
    assert pc.parse_container_map("main=a, main=b,side=c") == [("main", "a"), ("main", "b"), ("side", "c")]
    assert pc.parse_container_map(["main=a", ["side", "b"], {"src": "x", "dst": "c"}]) == [
        ("main", "a"), ("side", "b"), ("x", "c")]
    assert pc.parse_container_map({"main": ["a", "b"], "side": "c"}) == [("main", "a"), ("main", "b"), ("side", "c")]
    assert pc.parse_container_map(None) == [] and pc.parse_container_map("  ") == []
    assert pc.format_container_map([("side", "c"), ("main", "b"), ("main", "a")]) == "main=a,main=b,side=c"


@pytest.mark.parametrize("value, message", [
    ("main=a,side=a", "entry 'side=a': destination 'a' already receives 'main'"),
    ("main=", "entry 'main=' has an empty destination"),
    ("=a", "entry '=a' has an empty source"),
    ("main", "entry 'main' is not of the form src=dst"),
    ("main=a,,side=b", "has an empty entry"),
    ("main=Web_1", "destination 'Web_1' is not a valid container name"),
    ([42], "entry 42 is neither"),
])
def test_container_map_rejects(value: Any, message: str) -> None:
    with pytest.raises(podapi.ContractError) as err:
        pc.parse_container_map(value)
    assert any(message in reason for reason in err.value.reasons), err.value.reasons
    assert message in str(err.value)


def test_container_map_lists_every_bad_entry() -> None:
    with pytest.raises(podapi.ContractError) as err:
        pc.parse_container_map("main=a,side=a,x=")
    assert len(err.value.reasons) == 2


# --- validate ------------------------------------------------------------------------

def _drop_mount(index: int) -> Callable[[Dict[str, Any]], None]:
    def change(doc: Dict[str, Any]) -> None:
        mounts = doc["spec"]["containers"][index]["volumeMounts"]
        mounts[:] = [m for m in mounts if m["name"] != "snapshot-control"]
    return change


def _drop_env(doc: Dict[str, Any]) -> None:
    env = doc["spec"]["containers"][1]["env"]
    env[:] = [e for e in env if e["name"] != "SNAPSHOT_CONTROL_DIR"]


def _drop_volume(doc: Dict[str, Any]) -> None:
    doc["spec"]["volumes"] = [v for v in doc["spec"]["volumes"] if v["name"] != "snapshot-control"]


PROBLEMS = [
    ("no annotation", lambda d: d["metadata"]["annotations"].pop(podapi.ANN_RESTORE_FROM),
     "pod default/embed-0 has no annotation snapshot.warmstart.io/restore-from"),
    ("bad annotation", set_path(["metadata", "annotations", podapi.ANN_RESTORE_FROM], "Not/Valid"),
     "is 'Not/Valid', not a valid PodSnapshot name"),
    ("bad map", set_path(["metadata", "annotations", podapi.ANN_CONTAINER_MAP], "main=a,main=a"),
     "annotation snapshot.warmstart.io/restore-container-map of pod default/embed-0 is invalid"),
    ("map destination", set_path(["metadata", "annotations", podapi.ANN_CONTAINER_MAP], "main=web"),
     "container map destination 'web' (from 'main') is not a container of pod default/embed-0"),
    ("bad skip", set_path(["metadata", "annotations", podapi.ANN_SKIP_COMPAT], "maybe"), "is 'maybe', not 'true' or 'false'"),
    ("bad entrypoint annotation", set_path(["metadata", "annotations", podapi.ANN_ORIGINAL_ENTRYPOINT], "[1]"),
     "annotation snapshot.warmstart.io/original-entrypoint of pod default/embed-0 is not a JSON object"),
    ("entrypoint of unknown container", set_path(["metadata", "annotations", podapi.ANN_ORIGINAL_ENTRYPOINT], '{"web": {}}'),
     "names container 'web', which it does not have"),
    ("no volume", _drop_volume, "pod default/embed-0 has no emptyDir volume 'snapshot-control'"),
    ("volume not emptyDir", set_path(["spec", "volumes", 2], {"name": "snapshot-control", "hostPath": {"path": "/x"}}),
     "volume 'snapshot-control' of pod default/embed-0 is hostPath, not an emptyDir"),
    ("no mount", _drop_mount(1), "container 'sidecar' of pod default/embed-0 does not mount volume 'snapshot-control'"),
    ("wrong subPath", set_path(["spec", "containers", 0, "volumeMounts", 2, "subPath"], "other"),
     "container 'main' of pod default/embed-0 mounts volume 'snapshot-control' with subPath 'other', not 'main'"),
    ("read-only mount", set_path(["spec", "containers", 0, "volumeMounts", 2, "readOnly"], True),
     "mounts volume 'snapshot-control' read-only"),
    ("other volume at the mount path", append_path(["spec", "containers", 1, "volumeMounts"], {"name": "data", "mountPath": "/snapshot-control"}),
     "container 'sidecar' of pod default/embed-0 already mounts volume 'data' at /snapshot-control"),
    ("no env", _drop_env, "container 'sidecar' of pod default/embed-0 has no env SNAPSHOT_CONTROL_DIR=/snapshot-control"),
    ("wrong env", set_path(["spec", "containers", 0, "env", 1, "value"], "/ctl"), "sets env SNAPSHOT_CONTROL_DIR='/ctl'"),
    ("not inert", set_path(["spec", "containers", 0, "command"], ["python3"]),
     "container 'main' of pod default/embed-0 does not run the inert command"),
    ("args", set_path(["spec", "containers", 1, "args"], ["-v"]), "container 'sidecar' of pod default/embed-0 has args"),
    ("no seccomp", lambda d: d["spec"].pop("securityContext"), "pod default/embed-0 has no pod-level seccompProfile"),
    ("other seccomp", set_path(["spec", "securityContext", "seccompProfile", "localhostProfile"], "other.json"),
     "already has seccompProfile"),
    ("container seccomp", set_path(["spec", "containers", 0, "securityContext"], {"seccompProfile": {"type": "Unconfined"}}),
     "container 'main' of pod default/embed-0 has its own seccompProfile"),
    ("no containers", set_path(["spec", "containers"], []), "pod default/embed-0 has no containers"),
]


@pytest.mark.parametrize("label, change, message", PROBLEMS, ids=[p[0] for p in PROBLEMS])
def test_validate_finds_each_problem_alone(label: str, change: Callable[[Dict[str, Any]], None], message: str) -> None:
    doc = restore_pod()
    assert pc.validate(doc) == []
    change(doc)
    problems = pc.validate(doc)
    assert len(problems) == 1, problems
    assert message in problems[0]


def test_validate_lists_everything_missing_on_a_plain_pod() -> None:
    problems = pc.validate(pod())
    assert len(problems) == 1 + 1 + 2 * 3 + 1 + 1  # annotation, volume, per container mount/env/command, main's args, seccomp
    assert any("has args" in p for p in problems)
    assert pc.validate({"kind": "Pod", "metadata": {}}) and pc.validate(42)  # type: ignore[arg-type]


# --- classify ----------------------------------------------------------------------

def _restore_pod_with(condition: Optional[Dict[str, Any]] = None, phase: str = "Running",
                      statuses: Optional[List[Dict[str, Any]]] = None,
                      annotations: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    doc = restore_pod()
    if annotations:
        doc["metadata"]["annotations"].update(annotations)
    conditions = [{"type": "Ready", "status": "True"}] + ([condition] if condition else [])
    doc["status"] = {"phase": phase, "conditions": conditions, "containerStatuses": statuses or [
        {"name": "main", "restartCount": 0, "state": {"running": {}}},
        {"name": "sidecar", "restartCount": 0, "state": {"running": {}}}]}
    return doc


def _restored(status: Any, reason: Optional[str], type_: str = "Restored") -> Dict[str, Any]:
    condition = {"type": type_, "reason": reason, "message": "", "lastTransitionTime": "2026-01-10T10:05:00Z"}
    if status is not None:
        condition["status"] = status
    return condition


# The reference's ClassifyRestoreOutcome table (ANCHORS.md section 1), one row each: (status, reason) -> outcome.
REFERENCE_TABLE = [
    ("no condition", None, None, "Pending"),
    ("True", "True", "RestoreSucceeded", "Succeeded"),
    ("True with any reason", "True", "Whatever", "Succeeded"),
    ("True without reason", "True", None, "Succeeded"),
    ("Unknown status", "Unknown", "RestoreSucceeded", "Unknown"),
    ("no status", None, "RestoreSucceeded", "Unknown"),
    ("odd status", "Maybe", "RestoreFailed", "Unknown"),
    ("False RestoreFailed", "False", "RestoreFailed", "Failed"),
    ("False RestoreIncompatible", "False", "RestoreIncompatible", "Failed"),
    ("False RestorePartiallySucceeded", "False", "RestorePartiallySucceeded", "PartiallySucceeded"),
    ("False RestoreInProgress", "False", "RestoreInProgress", "Pending"),
    ("False RestoreSucceeded", "False", "RestoreSucceeded", "Unknown"),
    ("False other reason", "False", "SomethingNew", "Unknown"),
    ("False without reason", "False", None, "Unknown"),
]


@pytest.mark.parametrize("label, status, reason, outcome", REFERENCE_TABLE, ids=[row[0] for row in REFERENCE_TABLE])
@pytest.mark.parametrize("type_", ["Restored", "nvidia.com/Restored"])
def test_classify_follows_the_reference_table(label: str, status: Any, reason: Optional[str], outcome: str,
                                              type_: str) -> None:
    condition = None if label == "no condition" else _restored(status, reason, type_)
    assert pc.classify(_restore_pod_with(condition)) == outcome
    assert outcome in podapi.OUTCOMES


def test_classify_reads_pods_our_earlier_versions_wrote() -> None:
    """They said Unknown + RestoreInProgress while restoring: still Pending during a rolling upgrade."""
    assert pc.classify(_restore_pod_with(_restored("Unknown", "RestoreInProgress"))) == "Pending"
    assert pc.classify(_restore_pod_with(_restored("Unknown", "SomethingElse"))) == "Unknown"


def test_classify_prefers_our_condition_to_the_reference_one() -> None:
    doc = _restore_pod_with(_restored("True", "RestoreSucceeded"))
    doc["status"]["conditions"].insert(0, _restored("False", "RestoreFailed", "nvidia.com/Restored"))
    assert pc.classify(doc) == "Succeeded"
    assert pc.restore_condition(doc)["type"] == "Restored"
    assert pc.classify({"status": {"conditions": [{"type": "nvidia.com/Restored", "status": "False",
                                                   "reason": "RestoreInProgress"}]}}) == "Pending"
    assert pc.classify({}) == "Pending"


def test_classify_does_not_look_at_phase_or_containers() -> None:
    died = [{"name": "main", "restartCount": 0, "state": {"terminated": {"exitCode": 1}}}]
    assert pc.classify(_restore_pod_with(_restored("True", "RestoreSucceeded"), phase="Failed", statuses=died)) == \
        "Succeeded"
    assert pc.classify(_restore_pod_with(None, phase="Failed")) == "Pending"


def test_restore_losses_from_the_phase() -> None:
    assert pc.restore_losses(_restore_pod_with(None, phase="Failed")) == ["the pod's phase is Failed"]
    assert pc.restore_losses(_restore_pod_with(None, phase="Succeeded")) == \
        ["the pod ended (phase Succeeded) without a restore"]
    assert pc.restore_losses(_restore_pod_with(_restored("True", "RestoreSucceeded"), phase="Succeeded")) == []
    assert pc.restore_losses(_restore_pod_with(None, phase="Pending", statuses=[])) == []


def test_restore_losses_of_a_destination_that_died_after_the_restore_began() -> None:
    restarted = [{"name": "main", "restartCount": 1, "state": {"running": {}},
                  "lastState": {"terminated": {"exitCode": 137, "finishedAt": "2026-01-10T10:06:00Z"}}},
                 {"name": "sidecar", "restartCount": 0, "state": {"running": {}}}]
    lost = ["container 'main' restarted (1 times) after its restore began"]
    assert pc.restore_losses(_restore_pod_with(_restored("True", "RestoreSucceeded"), statuses=restarted)) == lost
    assert pc.restore_losses(_restore_pod_with(_restored("False", "RestoreInProgress"), statuses=restarted)) == lost
    assert pc.restore_losses(_restore_pod_with(None, statuses=restarted)) == []  # no restore began yet
    before = copy.deepcopy(restarted)
    before[0]["lastState"]["terminated"]["finishedAt"] = "2026-01-10T09:00:00Z"
    assert pc.restore_losses(_restore_pod_with(_restored("True", "RestoreSucceeded"), statuses=before)) == []
    no_time = copy.deepcopy(restarted)
    del no_time[0]["lastState"]
    assert pc.restore_losses(_restore_pod_with(_restored("True", "RestoreSucceeded"), statuses=no_time)) == lost
    terminated = [{"name": "main", "restartCount": 0, "state": {"terminated": {"exitCode": 1}}}]
    assert pc.restore_losses(_restore_pod_with(_restored("True", "RestoreSucceeded"), statuses=terminated)) == \
        ["container 'main' is terminated"]
    # only destinations count: the sidecar is not one when the map names main alone
    side = [{"name": "main", "restartCount": 0, "state": {"running": {}}},
            {"name": "sidecar", "restartCount": 3, "state": {"running": {}}}]
    only_main = {podapi.ANN_CONTAINER_MAP: "main=main"}
    assert pc.restore_losses(_restore_pod_with(_restored("True", "RestoreSucceeded"), statuses=side,
                                               annotations=only_main)) == []
    assert pc.restore_losses(_restore_pod_with(_restored("True", "RestoreSucceeded"), statuses=side)) == \
        ["container 'sidecar' restarted (3 times) after its restore began"]


# --- the reference contract's names -----------------------------------------------------------

def test_reference_annotations_are_read_as_aliases() -> None:
    raw = {podapi.REF_ANN_RESTORE_FROM: "embed-a", podapi.REF_ANN_CONTAINER_MAP: "main=main",
           podapi.REF_ANN_SKIP_COMPAT: "True", "other": "x"}
    merged, conflicts = pc.contract_annotations(raw, "pod default/p")
    assert conflicts == [] and merged == dict(raw, **{podapi.ANN_RESTORE_FROM: "embed-a", podapi.ANN_CONTAINER_MAP: "main=main",
                                                      podapi.ANN_SKIP_COMPAT: "True"})
    assert pc.skips_compat_check(merged) and "other" in merged and raw[podapi.REF_ANN_SKIP_COMPAT] == "True"
    # ours wins where both are set to the same value (a map in another order, a bool in another case)
    same = {podapi.ANN_CONTAINER_MAP: "a=b,a=c", podapi.REF_ANN_CONTAINER_MAP: "a=c, a=b", podapi.ANN_SKIP_COMPAT: "true",
            podapi.REF_ANN_SKIP_COMPAT: "TRUE", podapi.ANN_RESTORE_FROM: "s", podapi.REF_ANN_RESTORE_FROM: "s"}
    merged, conflicts = pc.contract_annotations(same, "pod default/p")
    assert conflicts == [] and merged[podapi.ANN_CONTAINER_MAP] == "a=b,a=c"


def test_ours_and_an_alias_that_disagree_are_refused_naming_both() -> None:
    both = {podapi.ANN_RESTORE_FROM: "snap-a", podapi.REF_ANN_RESTORE_FROM: "snap-b",
            podapi.ANN_CONTAINER_MAP: "main=main", podapi.REF_ANN_CONTAINER_MAP: "main=sidecar",
            podapi.ANN_SKIP_COMPAT: "false", podapi.REF_ANN_SKIP_COMPAT: "true"}
    _merged, conflicts = pc.contract_annotations(both, "pod default/p")
    assert conflicts == [
        "pod default/p has annotation snapshot.warmstart.io/restore-from: 'snap-a' and annotation "
        "nvidia.com/restore-from: 'snap-b', which disagree: remove one or make them equal",
        "pod default/p has annotation snapshot.warmstart.io/restore-container-map: 'main=main' and annotation "
        "nvidia.com/restore-container-map: 'main=sidecar', which disagree: remove one or make them equal",
        "pod default/p has annotation snapshot.warmstart.io/snapshot-skip-compat-check: 'false' and annotation "
        "nvidia.com/snapshot-skip-compat-check: 'true', which disagree: remove one or make them equal"]
    doc = restore_pod()
    doc["metadata"]["annotations"][podapi.REF_ANN_RESTORE_FROM] = "embed-other"
    assert pc.validate(doc) == [
        "pod default/embed-0 has annotation snapshot.warmstart.io/restore-from: 'embed-abc' and annotation "
        "nvidia.com/restore-from: 'embed-other', which disagree: remove one or make them equal"]
    with pytest.raises(podapi.ContractError) as refused:
        podbuild.build(doc, "embed-abc")
    assert refused.value.reasons[0] == pc.validate(doc)[0]
    assert selection.select_snapshot([snapshot("embed-abc", "2026-01-10T10:00:00Z")], doc) == (None, pc.validate(doc))
    assert selection.check_pod_spec(snapshot("embed-abc", "2026-01-10T10:00:00Z"), doc) == pc.validate(doc)
    assert pc.restore_annotations(doc)[1] == pc.validate(doc)


def test_a_pod_written_with_the_reference_names_is_a_restore_pod() -> None:
    doc = restore_pod(container_map="main=main")
    annotations = doc["metadata"]["annotations"]
    for ours, theirs in podapi.ANNOTATION_ALIASES:
        if ours in annotations:
            annotations[theirs] = annotations.pop(ours)
    assert pc.validate(doc) == [] and pc.restore_destinations(doc) == ["main"]
    assert selection.select_snapshot([snapshot("embed-abc", "2026-01-10T10:00:00Z")], doc)[0] is not None
    annotations[podapi.REF_ANN_CONTAINER_MAP] = "main=web"
    assert pc.validate(doc) == ["container map destination 'web' (from 'main') is not a container of pod default/embed-0"]
    annotations[podapi.REF_ANN_CONTAINER_MAP] = "main"
    assert pc.validate(doc)[0].startswith("annotation nvidia.com/restore-container-map of pod default/embed-0 is invalid")
    missing = selection.select_snapshot([], dict(doc, metadata=dict(doc["metadata"], annotations={podapi.REF_ANN_RESTORE_FROM: "x"})))
    assert missing == (None, ["pod default/embed-0 is pinned to PodSnapshot 'x' (annotation nvidia.com/restore-from), "
                              "which does not exist in namespace default"])
    # build keeps the reference's annotations and writes ours beside them
    theirs = {podapi.REF_ANN_RESTORE_FROM: "embed-abc", podapi.REF_ANN_SKIP_COMPAT: "true"}
    rebuilt = podbuild.build(dict(doc, metadata=dict(doc["metadata"], annotations=theirs)), "embed-abc")
    assert {k: v for k, v in rebuilt["metadata"]["annotations"].items() if k != podapi.ANN_ORIGINAL_ENTRYPOINT} == {
        podapi.REF_ANN_RESTORE_FROM: "embed-abc", podapi.REF_ANN_SKIP_COMPAT: "true", podapi.ANN_RESTORE_FROM: "embed-abc",
        podapi.ANN_SKIP_COMPAT: "true"}
    with pytest.raises(podapi.ContractError, match="annotation nvidia.com/restore-from of pod default/embed-0 is already"):
        podbuild.build(dict(doc, metadata=dict(doc["metadata"], annotations={podapi.REF_ANN_RESTORE_FROM: "embed-abc"})),
                       "embed-new")


def test_result_outcome_is_the_classification_of_the_recorded_condition() -> None:
    assert {result: pc.result_outcome(result) for result in podapi.RESULT_CONDITIONS} == {
        "succeeded": "Succeeded", "failed": "Failed", "partially_succeeded": "PartiallySucceeded",
        "incompatible": "Failed"}


# --- standby-aware entrypoint ----------------------------------------------------------------

@pytest.mark.parametrize("value, form", [("1", "standby"), ("true", "standby"), ("Yes", "standby"), ("0", None),
                                         ("", None), (None, None)])
def test_validate_accepts_a_standby_aware_entrypoint(value: Optional[str], form: Optional[str]) -> None:
    doc = restore_pod(entrypoint="standby")
    main = doc["spec"]["containers"][0]
    if value is None:
        main["env"] = [v for v in main["env"] if v["name"] != "SNAPSHOT_RESTORE_STANDBY"]
    else:
        main["env"][-1]["value"] = value
    assert pc.entrypoint_form(main) == form
    problems = pc.validate(doc)
    if form:
        assert problems == []
    elif value is None:
        assert problems == ["container 'main' of pod default/embed-0 does not run the inert command "
                            "['/bin/sh', '-c', 'exec sleep infinity'] nor sets env SNAPSHOT_RESTORE_STANDBY=1 for a "
                            "standby-aware entrypoint", "container 'main' of pod default/embed-0 has args; the inert "
                            "placeholder takes none"]
    else:
        assert len(problems) == 3 and "which does not ask its entrypoint to stay inert" in problems[0]


def test_validate_refuses_a_standby_env_from_value_from() -> None:
    doc = restore_pod(entrypoint="standby")
    doc["spec"]["containers"][1]["env"][-1] = {"name": "SNAPSHOT_RESTORE_STANDBY",
                                               "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}
    problems = pc.validate(doc)
    assert problems[0] == ("container 'sidecar' of pod default/embed-0 sets env SNAPSHOT_RESTORE_STANDBY from "
                           "valueFrom; a standby entrypoint needs the literal value '1'")
    assert len(problems) == 2 and pc.entrypoint_forms(doc)["sidecar"] is None
    # an inert container's standby env does not matter
    inert = restore_pod()
    inert["spec"]["containers"][0]["env"].append({"name": "SNAPSHOT_RESTORE_STANDBY", "value": "0"})
    assert pc.validate(inert) == []


# --- the application profile annotation ------------------------------------------------

def _annotated(value: Any) -> Dict[str, Any]:
    p = pod()
    p["metadata"].setdefault("annotations", {})[podapi.ANN_APP_PROFILE] = value
    return p


def test_the_app_profile_annotation_names_a_shipped_profile_or_holds_one_as_json() -> None:
    assert pc.app_profile_of(pod()) is None
    shipped = pc.app_profile_of(_annotated("vllm-sleep"))
    assert shipped is not None and shipped.quiesce[0].spec["url"].endswith(":8000/sleep?level=1")
    other_port = pc.app_profile_of(_annotated('{"name": "tgi", "vars": {"port": 8080}}'))
    assert other_port is not None and other_port.ready.spec["url"] == "http://127.0.0.1:8080/health"
    whole = pc.app_profile_of(_annotated('{"name": "mine", "ready": {"tcp": {"port": 9000}}}'))
    assert whole is not None and whole.ready.kind == "tcp"


@pytest.mark.parametrize("value, message", [
    ("/etc/shadow", "neither a shipped profile's name, a JSON object nor configmap:"),
    ("../x", "neither a shipped profile's name, a JSON object nor configmap:"),
    ("{not json", "is not valid JSON"),
    ("vlm", "no shipped profile is called 'vlm'"),
    (5, "is not a string"),
])
def test_a_bad_app_profile_annotation_names_the_pod_and_the_annotation(value: Any, message: str) -> None:
    with pytest.raises(ProfileError) as err:
        pc.app_profile_of(_annotated(value))
    assert message in str(err.value) and podapi.ANN_APP_PROFILE in str(err.value) and "embed-0" in str(err.value)


def test_a_bad_profile_in_the_annotation_lists_every_problem() -> None:
    with pytest.raises(ProfileError) as err:
        pc.app_profile_of(_annotated('{"name": "x", "ready": {"http": {"url": "ftp://a"}}, "quiesce": [{"signal": "KILL"}]}'))
    assert len(err.value.reasons) == 2


def test_a_configmap_profile_is_read_only_through_the_agents_reader() -> None:
    annotated = _annotated("configmap:profiles/llm")
    with pytest.raises(ProfileError, match="only the node agent reads ConfigMaps"):
        pc.app_profile_of(annotated)
    asked: List[Any] = []

    def read(namespace: str, name: str) -> Dict[str, Any]:
        asked.append((namespace, name))
        return {"llm": '{"name": "tgi", "vars": {"port": 8080}}', "other": "x"}
    profile = pc.app_profile_of(annotated, read)
    assert profile is not None and profile.ready.spec["url"] == "http://127.0.0.1:8080/health"
    assert asked == [("default", "profiles")]
    with pytest.raises(ProfileError, match=r"no such key \(keys: llm, other\)"):
        pc.app_profile_of(_annotated("configmap:profiles"), read)  # the default key, profile, is not there
    for bad in ("configmap:", "configmap:Bad_Name", "configmap:a/b/c", "configmap:../x"):
        with pytest.raises(ProfileError, match="not a ConfigMap name and key"):
            pc.app_profile_of(_annotated(bad), read)
