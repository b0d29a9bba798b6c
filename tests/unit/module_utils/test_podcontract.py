"""Restore-pod contract, condensed pod-spec hash, snapshot selection, conditions and the CRDs (pure dicts)."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest
import yaml

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc

CRDS = Path(__file__).resolve().parents[3] / "roles" / "k8s_crds" / "files" / "crds.yaml"
PROFILE = {"type": "Localhost", "localhostProfile": pc.SECCOMP_PROFILE}


# --- fixtures ---------------------------------------------------------------------

def template() -> Dict[str, Any]:
    """A Deployment's spec.template with every kind of hashed field in use."""
    return {
        "metadata": {"labels": {"app": "embed", "model": "minilm"}},
        "spec": {
            "initContainers": [{"name": "setup", "image": "busybox:1.36", "command": ["sh", "-c", "cp /w /data"],
                                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "containers": [
                {"name": "main", "image": "embed:1.4", "command": ["python3", "/app/server.py"], "args": ["--port", "8080"],
                 "ports": [{"containerPort": 8080, "name": "http"}],
                 "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "config", "mountPath": "/etc/embed"}],
                 "env": [{"name": "MODEL", "value": "minilm"}],
                 "resources": {"limits": {"cpu": "2", "memory": "2Gi"}},
                 "readinessProbe": {"httpGet": {"path": "/health", "port": 8080}}},
                {"name": "sidecar", "image": "proxy:2", "ports": [{"containerPort": 9090}]},
            ],
            "volumes": [{"name": "data", "emptyDir": {}},
                        {"name": "config", "configMap": {"name": "embed-config"}}],
        },
    }


def deployment() -> Dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "embed", "namespace": "default"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "embed"}}, "template": template()}}


def pod(name: str = "embed-0") -> Dict[str, Any]:
    doc = template()
    doc["apiVersion"] = "v1"
    doc["kind"] = "Pod"
    doc["metadata"].update({"name": name, "namespace": "default"})
    return doc


def read_back(obj: Dict[str, Any]) -> Dict[str, Any]:
    """The pod as the API returns it once created from ``obj``: defaults, injected token volume, status."""
    out = copy.deepcopy(obj)
    out.setdefault("apiVersion", "v1")
    out.setdefault("kind", "Pod")
    meta = out["metadata"]
    meta.update({"name": "embed-7d9c-x2x4q", "namespace": "default", "uid": "0a1b", "resourceVersion": "812",
                 "creationTimestamp": "2026-01-10T10:00:00Z"})
    meta["labels"]["pod-template-hash"] = "7d9c"
    spec = out["spec"]
    spec.update({"dnsPolicy": "ClusterFirst", "restartPolicy": "Always", "schedulerName": "default-scheduler",
                 "securityContext": dict(spec.get("securityContext") or {}), "serviceAccountName": "default",
                 "serviceAccount": "default", "terminationGracePeriodSeconds": 30, "enableServiceLinks": True,
                 "nodeName": "node-a", "priority": 0, "preemptionPolicy": "PreemptLowerPriority",
                 "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                  "effect": "NoExecute", "tolerationSeconds": 300}]})
    token = {"name": "kube-api-access-5x7kq", "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
    ]}}
    for volume in spec.get("volumes", []):
        if "configMap" in volume:
            volume["configMap"]["defaultMode"] = 420
    spec["volumes"] = spec.get("volumes", []) + [token]
    for kind in ("initContainers", "containers"):
        for container in spec.get(kind, []):
            container.update({"terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                              "imagePullPolicy": "IfNotPresent"})
            container.setdefault("resources", {})
            for port in container.get("ports", []):
                port.setdefault("protocol", "TCP")
            container["volumeMounts"] = container.get("volumeMounts", []) + [
                {"name": token["name"], "readOnly": True, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]
    out["status"] = {"phase": "Running", "podIP": "10.0.0.7", "hostIP": "192.168.1.2"}
    return out


def restore_pod(**kwargs: Any) -> Dict[str, Any]:
    return pc.build(pod(), "embed-abc", **kwargs)


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
    with pytest.raises(pc.ContractError) as err:
        pc.parse_container_map(value)
    assert any(message in reason for reason in err.value.reasons), err.value.reasons
    assert message in str(err.value)


def test_container_map_lists_every_bad_entry() -> None:
    with pytest.raises(pc.ContractError) as err:
        pc.parse_container_map("main=a,side=a,x=")
    assert len(err.value.reasons) == 2


# --- build -------------------------------------------------------------------------

def test_build_on_a_pod_adds_the_whole_contract() -> None:
    out = restore_pod()
    ann = out["metadata"]["annotations"]
    assert ann[pc.ANN_RESTORE_FROM] == "embed-abc"
    assert pc.ANN_CONTAINER_MAP not in ann and pc.ANN_SKIP_COMPAT not in ann
    assert json.loads(ann[pc.ANN_ORIGINAL_ENTRYPOINT]) == {
        "main": {"command": ["python3", "/app/server.py"], "args": ["--port", "8080"]}, "sidecar": {}}
    spec = out["spec"]
    assert {"name": "snapshot-control", "emptyDir": {}} in spec["volumes"]
    assert [v["name"] for v in spec["volumes"]] == ["data", "config", "snapshot-control"]
    assert spec["securityContext"]["seccompProfile"] == PROFILE
    for container in spec["containers"]:
        name = container["name"]
        assert container["volumeMounts"][-1] == {"name": "snapshot-control", "mountPath": "/snapshot-control", "subPath": name}
        assert {"name": "SNAPSHOT_CONTROL_DIR", "value": "/snapshot-control"} in container["env"]
        assert container["command"] == ["/bin/sh", "-c", "exec sleep infinity"]
        assert "args" not in container
        assert container["startupProbe"] == {"exec": {"command": ["cat", "/snapshot-control/restore-complete"]},
                                             "periodSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 1800}
    main = spec["containers"][0]
    assert main["env"][0] == {"name": "MODEL", "value": "minilm"} and main["resources"]["limits"]["cpu"] == "2"
    assert spec["initContainers"] == template()["spec"]["initContainers"]


def test_build_on_a_deployment_changes_only_its_template() -> None:
    source = deployment()
    out = pc.build(source, "embed-abc", container_map="main=main", skip_compat_check=True)
    assert out["kind"] == "Deployment" and out["spec"]["replicas"] == 2
    assert out["spec"]["selector"] == source["spec"]["selector"]
    tpl = out["spec"]["template"]
    assert tpl["metadata"]["annotations"][pc.ANN_CONTAINER_MAP] == "main=main"
    assert tpl["metadata"]["annotations"][pc.ANN_SKIP_COMPAT] == "true"
    assert "startupProbe" in tpl["spec"]["containers"][0] and "startupProbe" not in tpl["spec"]["containers"][1]
    assert pc.validate(tpl) == [] and pc.validate(out) == []
    bare = pc.build(template(), "embed-abc")
    assert bare == pc.build(deployment(), "embed-abc")["spec"]["template"]
    assert pc.validate(bare) == []


def test_build_rejects_a_bare_pod_spec() -> None:
    with pytest.raises(pc.ContractError, match="bare PodSpec has no metadata"):
        pc.build(template()["spec"], "embed-abc")


@pytest.mark.parametrize("kwargs", [{}, {"container_map": "main=main,main=sidecar"}, {"skip_compat_check": True},
                                    {"startup_probe": False}, {"seccomp_profile": "warmstart/block-iouring.json"}])
def test_build_is_idempotent_and_validates(kwargs: Dict[str, Any]) -> None:
    once = pc.build(pod(), "embed-abc", **kwargs)
    assert pc.build(once, "embed-abc", **kwargs) == once
    assert pc.build(pc.build(deployment(), "embed-abc", **kwargs), "embed-abc", **kwargs) == pc.build(deployment(), "embed-abc", **kwargs)
    assert pc.validate(once, seccomp_profile=kwargs.get("seccomp_profile", pc.SECCOMP_PROFILE)) == []


def test_build_keeps_a_map_already_on_the_pod_and_rebuild_without_arguments_is_a_no_op() -> None:
    once = pc.build(pod(), "embed-abc", container_map="main=sidecar", skip_compat_check=True)
    assert pc.build(once, "embed-abc") == once
    assert "startupProbe" in once["spec"]["containers"][1] and "startupProbe" not in once["spec"]["containers"][0]


def test_build_does_not_mutate_its_input() -> None:
    for source in (pod(), deployment(), restore_pod()):
        before = copy.deepcopy(source)
        out = pc.build(source, "embed-abc", container_map="main=main", skip_compat_check=True)
        assert source == before
        out["spec"].setdefault("extra", 1)
        assert source == before


def test_build_startup_probe_only_on_destinations_and_optional() -> None:
    out = pc.build(pod(), "embed-abc", container_map={"main": ["sidecar"]})
    assert [("startupProbe" in c) for c in out["spec"]["containers"]] == [False, True]
    out = pc.build(pod(), "embed-abc", startup_probe=False)
    assert not any("startupProbe" in c for c in out["spec"]["containers"])


def test_build_accepts_contract_pieces_already_in_place() -> None:
    source = pod()
    spec = source["spec"]
    spec["volumes"].append({"name": "snapshot-control", "emptyDir": {"medium": "Memory"}})
    spec["containers"][0]["volumeMounts"].append({"name": "snapshot-control", "mountPath": "/snapshot-control/", "subPath": "main"})
    spec["containers"][0]["env"].append({"name": "SNAPSHOT_CONTROL_DIR", "value": "/snapshot-control"})
    spec["containers"][0]["startupProbe"] = dict(pc._startup_probe(), successThreshold=1)
    spec["securityContext"] = {"runAsNonRoot": True, "seccompProfile": dict(PROFILE)}
    out = pc.build(source, "embed-abc")
    main = out["spec"]["containers"][0]
    assert [m["name"] for m in main["volumeMounts"]].count("snapshot-control") == 1
    assert [e["name"] for e in main["env"]].count("SNAPSHOT_CONTROL_DIR") == 1
    assert [v["name"] for v in out["spec"]["volumes"]].count("snapshot-control") == 1
    assert out["spec"]["securityContext"] == {"runAsNonRoot": True, "seccompProfile": PROFILE}
    assert pc.validate(out) == []


def _set(path: List[Any], value: Any) -> Callable[[Dict[str, Any]], None]:
    def change(doc: Dict[str, Any]) -> None:
        node = doc
        for key in path[:-1]:
            node = node.setdefault(key, {}) if isinstance(key, str) else node[key]
        node[path[-1]] = value
    return change


def _append(path: List[Any], value: Any) -> Callable[[Dict[str, Any]], None]:
    def change(doc: Dict[str, Any]) -> None:
        node = doc
        for key in path:
            node = node.setdefault(key, []) if isinstance(key, str) and key in ("env", "volumes", "volumeMounts") else node[key]
        node.append(value)
    return change


CONFLICTS = [
    ("restore-from", _set(["metadata", "annotations", pc.ANN_RESTORE_FROM], "other-snap"), {},
     "annotation snapshot.warmstart.io/restore-from of pod default/embed-0 is already 'other-snap', not 'embed-abc'"),
    ("container map", _set(["metadata", "annotations", pc.ANN_CONTAINER_MAP], "main=sidecar"), {"container_map": "main=main"},
     "annotation snapshot.warmstart.io/restore-container-map of pod default/embed-0 is already 'main=sidecar', not 'main=main'"),
    ("bad map annotation", _set(["metadata", "annotations", pc.ANN_CONTAINER_MAP], "main"), {},
     "annotation snapshot.warmstart.io/restore-container-map of pod default/embed-0 is invalid"),
    ("skip compat false", _set(["metadata", "annotations", pc.ANN_SKIP_COMPAT], "false"), {"skip_compat_check": True},
     "annotation snapshot.warmstart.io/snapshot-skip-compat-check of pod default/embed-0 is already 'false'"),
    ("volume not emptyDir", _append(["spec", "volumes"], {"name": "snapshot-control", "hostPath": {"path": "/srv/ctl"}}), {},
     "volume 'snapshot-control' of pod default/embed-0 is hostPath, not an emptyDir"),
    ("other volume at the mount", _append(["spec", "containers", 0, "volumeMounts"], {"name": "data", "mountPath": "/snapshot-control"}), {},
     "container 'main' of pod default/embed-0 already mounts volume 'data' at /snapshot-control"),
    ("other subPath", _append(["spec", "containers", 1, "volumeMounts"],
                              {"name": "snapshot-control", "mountPath": "/snapshot-control", "subPath": "main"}), {},
     "container 'sidecar' of pod default/embed-0 mounts volume 'snapshot-control' with subPath 'main', not 'sidecar'"),
    ("mounted elsewhere", _append(["spec", "containers", 0, "volumeMounts"], {"name": "snapshot-control", "mountPath": "/ctl"}), {},
     "container 'main' of pod default/embed-0 mounts volume 'snapshot-control' at '/ctl', not at /snapshot-control"),
    ("env value", _append(["spec", "containers", 0, "env"], {"name": "SNAPSHOT_CONTROL_DIR", "value": "/tmp/ctl"}), {},
     "container 'main' of pod default/embed-0 sets env SNAPSHOT_CONTROL_DIR='/tmp/ctl', not /snapshot-control"),
    ("env valueFrom", _append(["spec", "containers", 1, "env"],
                              {"name": "SNAPSHOT_CONTROL_DIR", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}), {},
     "container 'sidecar' of pod default/embed-0 sets env SNAPSHOT_CONTROL_DIR from valueFrom"),
    ("startup probe", _set(["spec", "containers", 0, "startupProbe"], {"httpGet": {"path": "/", "port": 8080}}), {},
     "container 'main' of pod default/embed-0 already has another startupProbe"),
    ("container seccomp", _set(["spec", "containers", 1, "securityContext"], {"seccompProfile": {"type": "RuntimeDefault"}}), {},
     "container 'sidecar' of pod default/embed-0 has its own seccompProfile"),
    ("pod seccomp", _set(["spec", "securityContext"], {"seccompProfile": {"type": "Unconfined"}}), {},
     "pod default/embed-0 already has seccompProfile {'type': 'Unconfined'}"),
    ("unknown destination", lambda doc: None, {"container_map": "main=web"},
     "container map destination 'web' (from 'main') is not a container of pod default/embed-0 (containers: main, sidecar)"),
    ("no containers", _set(["spec", "containers"], []), {}, "pod default/embed-0 has no containers"),
    ("unnamed container", _set(["spec", "containers", 1, "name"], None), {}, "container #1 of pod default/embed-0 has no valid name"),
    ("bad snapshot name", lambda doc: None, {"snapshot_name": "Embed_ABC"},
     "snapshot name 'Embed_ABC' is not a valid PodSnapshot name"),
    ("recorded entrypoint differs", _set(["metadata", "annotations", pc.ANN_ORIGINAL_ENTRYPOINT], '{"main": {"command": ["x"]}}'), {},
     "records another command for container 'main'"),
]


@pytest.mark.parametrize("label, change, kwargs, message", CONFLICTS, ids=[c[0] for c in CONFLICTS])
def test_build_rejects_conflicts_instead_of_overwriting(
        label: str, change: Callable[[Dict[str, Any]], None], kwargs: Dict[str, Any], message: str) -> None:
    source = pod()
    change(source)
    before = copy.deepcopy(source)
    kwargs = dict(kwargs)
    name = kwargs.pop("snapshot_name", "embed-abc")
    with pytest.raises(pc.ContractError) as err:
        pc.build(source, name, **kwargs)
    assert any(message in reason for reason in err.value.reasons), err.value.reasons
    assert str(err.value).startswith("cannot make pod default/embed-0 a restore pod")
    assert source == before


def test_build_reports_every_conflict_at_once() -> None:
    source = pod()
    for _label, change, _kwargs, _message in CONFLICTS[:13]:
        if _label not in ("container map", "skip compat false", "bad map annotation"):
            change(source)
    with pytest.raises(pc.ContractError) as err:
        pc.build(source, "embed-abc")
    assert len(err.value.reasons) >= 10


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
    ("no annotation", lambda d: d["metadata"]["annotations"].pop(pc.ANN_RESTORE_FROM),
     "pod default/embed-0 has no annotation snapshot.warmstart.io/restore-from"),
    ("bad annotation", _set(["metadata", "annotations", pc.ANN_RESTORE_FROM], "Not/Valid"),
     "is 'Not/Valid', not a valid PodSnapshot name"),
    ("bad map", _set(["metadata", "annotations", pc.ANN_CONTAINER_MAP], "main=a,main=a"),
     "annotation snapshot.warmstart.io/restore-container-map of pod default/embed-0 is invalid"),
    ("map destination", _set(["metadata", "annotations", pc.ANN_CONTAINER_MAP], "main=web"),
     "container map destination 'web' (from 'main') is not a container of pod default/embed-0"),
    ("bad skip", _set(["metadata", "annotations", pc.ANN_SKIP_COMPAT], "maybe"), "is 'maybe', not 'true' or 'false'"),
    ("bad entrypoint annotation", _set(["metadata", "annotations", pc.ANN_ORIGINAL_ENTRYPOINT], "[1]"),
     "annotation snapshot.warmstart.io/original-entrypoint of pod default/embed-0 is not a JSON object"),
    ("entrypoint of unknown container", _set(["metadata", "annotations", pc.ANN_ORIGINAL_ENTRYPOINT], '{"web": {}}'),
     "names container 'web', which it does not have"),
    ("no volume", _drop_volume, "pod default/embed-0 has no emptyDir volume 'snapshot-control'"),
    ("volume not emptyDir", _set(["spec", "volumes", 2], {"name": "snapshot-control", "hostPath": {"path": "/x"}}),
     "volume 'snapshot-control' of pod default/embed-0 is hostPath, not an emptyDir"),
    ("no mount", _drop_mount(1), "container 'sidecar' of pod default/embed-0 does not mount volume 'snapshot-control'"),
    ("wrong subPath", _set(["spec", "containers", 0, "volumeMounts", 2, "subPath"], "other"),
     "container 'main' of pod default/embed-0 mounts volume 'snapshot-control' with subPath 'other', not 'main'"),
    ("read-only mount", _set(["spec", "containers", 0, "volumeMounts", 2, "readOnly"], True),
     "mounts volume 'snapshot-control' read-only"),
    ("other volume at the mount path", _append(["spec", "containers", 1, "volumeMounts"], {"name": "data", "mountPath": "/snapshot-control"}),
     "container 'sidecar' of pod default/embed-0 already mounts volume 'data' at /snapshot-control"),
    ("no env", _drop_env, "container 'sidecar' of pod default/embed-0 has no env SNAPSHOT_CONTROL_DIR=/snapshot-control"),
    ("wrong env", _set(["spec", "containers", 0, "env", 1, "value"], "/ctl"), "sets env SNAPSHOT_CONTROL_DIR='/ctl'"),
    ("not inert", _set(["spec", "containers", 0, "command"], ["python3"]),
     "container 'main' of pod default/embed-0 does not run the inert command"),
    ("args", _set(["spec", "containers", 1, "args"], ["-v"]), "container 'sidecar' of pod default/embed-0 has args"),
    ("no seccomp", lambda d: d["spec"].pop("securityContext"), "pod default/embed-0 has no pod-level seccompProfile"),
    ("other seccomp", _set(["spec", "securityContext", "seccompProfile", "localhostProfile"], "other.json"),
     "already has seccompProfile"),
    ("container seccomp", _set(["spec", "containers", 0, "securityContext"], {"seccompProfile": {"type": "Unconfined"}}),
     "container 'main' of pod default/embed-0 has its own seccompProfile"),
    ("no containers", _set(["spec", "containers"], []), "pod default/embed-0 has no containers"),
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
    assert outcome in pc.OUTCOMES


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
    only_main = {pc.ANN_CONTAINER_MAP: "main=main"}
    assert pc.restore_losses(_restore_pod_with(_restored("True", "RestoreSucceeded"), statuses=side,
                                               annotations=only_main)) == []
    assert pc.restore_losses(_restore_pod_with(_restored("True", "RestoreSucceeded"), statuses=side)) == \
        ["container 'sidecar' restarted (3 times) after its restore began"]


def test_legacy_state_keeps_the_earlier_names_and_rules() -> None:
    terminated = [{"name": "main", "restartCount": 0, "state": {"terminated": {"exitCode": 1}}}]
    cases = [
        (None, "Running", None, "pending"),
        (_restored("False", "RestoreInProgress"), "Running", None, "pending"),
        (_restored("Unknown", "RestoreInProgress"), "Running", None, "pending"),
        (_restored("False", "SomethingNew"), "Running", None, "pending"),
        (_restored("True", "RestoreSucceeded"), "Running", None, "succeeded"),
        (_restored("False", "RestoreFailed"), "Running", None, "failed"),
        (_restored("False", "RestoreIncompatible"), "Running", None, "failed"),
        (_restored("False", "RestorePartiallySucceeded"), "Running", None, "partial"),
        (_restored("False", "RestorePartiallySucceeded"), "Failed", None, "partial"),
        (None, "Failed", None, "failed"),
        (_restored("True", "RestoreSucceeded"), "Failed", None, "failed"),
        (None, "Succeeded", None, "failed"),
        (_restored("True", "RestoreSucceeded"), "Succeeded", None, "succeeded"),
        (_restored("True", "RestoreSucceeded"), "Running", terminated, "failed"),
    ]
    for condition, phase, statuses, state in cases:
        doc = _restore_pod_with(condition, phase=phase, statuses=statuses)
        assert (condition, phase, pc.legacy_state(doc)) == (condition, phase, state)
        assert state in pc.LEGACY_STATES


# --- conditions ----------------------------------------------------------------------

def test_set_condition_keeps_transition_time_until_status_changes() -> None:
    first = pc.set_condition([], "Ready", False, "Uploading", "copying", "2026-01-10T10:00:00Z", generation=1)
    assert first == [{"type": "Ready", "status": "False", "reason": "Uploading", "message": "copying",
                      "lastTransitionTime": "2026-01-10T10:00:00Z", "observedGeneration": 1}]
    same = pc.set_condition(first, "Ready", "False", "Verifying", "checksums", "2026-01-10T10:01:00Z")
    assert same[0]["lastTransitionTime"] == "2026-01-10T10:00:00Z" and same[0]["reason"] == "Verifying"
    assert same[0]["observedGeneration"] == 1
    done = pc.set_condition(same + [{"type": "Failed", "status": "False"}], "Ready", True, "Published", "",
                            "2026-01-10T10:02:00Z", generation=2)
    assert done[0]["lastTransitionTime"] == "2026-01-10T10:02:00Z" and done[0]["observedGeneration"] == 2
    assert done[1] == {"type": "Failed", "status": "False"}
    assert first[0]["reason"] == "Uploading"  # input untouched
    assert pc.get_condition({"status": {"conditions": done}}, "Ready")["status"] == "True"
    assert pc.get_condition({"conditions": done}, "Failed") == {"type": "Failed", "status": "False"}
    assert pc.get_condition(done, "Restored") is None and pc.get_condition({}, "Ready") is None


def test_set_condition_rejects_bad_status_and_reason() -> None:
    with pytest.raises(pc.ContractError, match="status 'yes'"):
        pc.set_condition([], "Ready", "yes", "Done", "", "t")
    with pytest.raises(pc.ContractError, match="reason 'not camel case'"):
        pc.set_condition([], "Ready", True, "not camel case", "", "t")


# --- condensed pod-spec hash: field by field ----------------------------------------------

CONTAINER_CHANGES = {
    "image": "embed:1.5",
    "command": ["python3", "/app/other.py"],
    "args": ["--port", "9000"],
    "workingDir": "/srv",
    "ports": [{"containerPort": 9000}],
    "volumeMounts": [{"name": "data", "mountPath": "/other"}],
    "volumeDevices": [{"name": "blk", "devicePath": "/dev/xvdb"}],
    "lifecycle": {"preStop": {"exec": {"command": ["/bin/true"]}}},
    "terminationMessagePath": "/tmp/termination",
    "terminationMessagePolicy": "FallbackToLogsOnError",
    "securityContext": {"runAsUser": 1000},
    "stdin": True,
    "stdinOnce": True,
    "tty": True,
}
POD_CHANGES = {
    "volumes": [{"name": "data", "emptyDir": {"medium": "Memory"}}, {"name": "config", "configMap": {"name": "embed-config"}}],
    "dnsPolicy": "Default",
    "automountServiceAccountToken": False,
    "hostNetwork": True,
    "hostPID": True,
    "hostIPC": True,
    "shareProcessNamespace": True,
    "securityContext": {"runAsNonRoot": True},
    "dnsConfig": {"nameservers": ["10.0.0.10"]},
    "runtimeClassName": "gvisor",
    "os": {"name": "linux"},
    "hostUsers": False,
}


def test_the_hashed_fields_are_exactly_the_anchored_list() -> None:
    assert set(CONTAINER_CHANGES) | {"name"} == set(pc.CONTAINER_FIELDS)
    assert set(POD_CHANGES) == set(pc.POD_FIELDS)
    fields = pc.pod_spec_fields(template())
    expected = {f"{kind}[{name}].{field}" for kind, names in (("containers", ("main", "sidecar")), ("initContainers", ("setup",)))
                for name in names for field in pc.CONTAINER_FIELDS}
    expected |= set(pc.POD_FIELDS) | {"labels[batch.kubernetes.io/job-completion-index]"}
    assert set(fields) == expected
    assert all(re.match(r"^[0-9a-f]{64}$", digest) for digest in fields.values())
    assert re.match(r"^[0-9a-f]{64}$", pc.pod_spec_hash(template()))


@pytest.mark.parametrize("kind, index, name", [("containers", 0, "main"), ("containers", 1, "sidecar"),
                                               ("initContainers", 0, "setup")])
@pytest.mark.parametrize("field", sorted(CONTAINER_CHANGES))
def test_each_container_field_changes_the_hash(kind: str, index: int, name: str, field: str) -> None:
    base = template()
    changed = template()
    changed["spec"][kind][index][field] = copy.deepcopy(CONTAINER_CHANGES[field])
    assert pc.pod_spec_hash(changed) != pc.pod_spec_hash(base)
    assert pc.diff_fields(pc.pod_spec_fields(base), pc.pod_spec_fields(changed)) == [f"{kind}[{name}].{field}"]


@pytest.mark.parametrize("field", sorted(POD_CHANGES))
def test_each_pod_field_changes_the_hash(field: str) -> None:
    base = template()
    changed = template()
    changed["spec"][field] = copy.deepcopy(POD_CHANGES[field])
    assert pc.pod_spec_hash(changed) != pc.pod_spec_hash(base)
    assert pc.diff_fields(pc.pod_spec_fields(base), pc.pod_spec_fields(changed)) == [field]


def test_the_job_completion_index_label_changes_the_hash() -> None:
    base = template()
    changed = template()
    changed["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] = "3"
    other = copy.deepcopy(changed)
    other["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] = "4"
    assert pc.diff_fields(pc.pod_spec_fields(base), pc.pod_spec_fields(changed)) == ["labels[batch.kubernetes.io/job-completion-index]"]
    assert pc.diff_fields(pc.pod_spec_fields(changed), pc.pod_spec_fields(other)) == ["labels[batch.kubernetes.io/job-completion-index]"]
    assert len({pc.pod_spec_hash(base), pc.pod_spec_hash(changed), pc.pod_spec_hash(other)}) == 3


def test_renaming_or_adding_a_container_changes_the_hash() -> None:
    base = template()
    renamed = template()
    renamed["spec"]["containers"][1]["name"] = "proxy"
    diff = pc.diff_fields(pc.pod_spec_fields(base), pc.pod_spec_fields(renamed))
    assert "containers[sidecar].name" in diff and "containers[proxy].name" in diff
    assert all(path.startswith(("containers[sidecar].", "containers[proxy].")) for path in diff)
    assert pc.describe_diff(pc.pod_spec_fields(renamed), pc.pod_spec_fields(base)) == [
        "containers[proxy] (only in the pod)", "containers[sidecar] (only in the snapshot)"]
    renamed_volume = template()
    renamed_volume["spec"]["volumes"][0]["name"] = "cache"
    assert pc.diff_fields(pc.pod_spec_fields(base), pc.pod_spec_fields(renamed_volume)) == ["volumes"]


def _not_hashed() -> Dict[str, Callable[[Dict[str, Any]], None]]:
    def main(doc: Dict[str, Any]) -> Dict[str, Any]:
        return doc["spec"]["containers"][0]
    return {
        "resources": lambda d: main(d).update(resources={"limits": {"cpu": "8"}}),
        "env": lambda d: main(d).update(env=[{"name": "MODEL", "value": "large"}]),
        "envFrom": lambda d: main(d).update(envFrom=[{"configMapRef": {"name": "x"}}]),
        "imagePullPolicy": lambda d: main(d).update(imagePullPolicy="Always"),
        "readinessProbe": lambda d: main(d).update(readinessProbe={"exec": {"command": ["true"]}}),
        "livenessProbe": lambda d: main(d).update(livenessProbe={"tcpSocket": {"port": 8080}}),
        "startupProbe": lambda d: main(d).update(startupProbe={"tcpSocket": {"port": 8080}}),
        "nodeName": lambda d: d["spec"].update(nodeName="node-b"),
        "nodeSelector": lambda d: d["spec"].update(nodeSelector={"gpu": "h100"}),
        "tolerations": lambda d: d["spec"].update(tolerations=[{"key": "gpu", "operator": "Exists"}]),
        "affinity": lambda d: d["spec"].update(affinity={"nodeAffinity": {}}),
        "restartPolicy": lambda d: d["spec"].update(restartPolicy="Never"),
        "serviceAccountName": lambda d: d["spec"].update(serviceAccountName="embedder"),
        "terminationGracePeriodSeconds": lambda d: d["spec"].update(terminationGracePeriodSeconds=5),
        "priorityClassName": lambda d: d["spec"].update(priorityClassName="high"),
        "labels": lambda d: d["metadata"]["labels"].update(model="large", team="ml"),
        "annotations": lambda d: d["metadata"].update(annotations={"note": "x"}),
        "status": lambda d: d.update(status={"phase": "Running", "podIP": "10.1.1.1"}),
        "container order": lambda d: d["spec"]["containers"].reverse(),
        "volume order": lambda d: d["spec"]["volumes"].reverse(),
    }


@pytest.mark.parametrize("label", sorted(_not_hashed()))
def test_other_fields_do_not_change_the_hash(label: str) -> None:
    changed = template()
    _not_hashed()[label](changed)
    assert pc.pod_spec_fields(changed) == pc.pod_spec_fields(template())
    assert pc.pod_spec_hash(changed) == pc.pod_spec_hash(template())


DEFAULTS = [
    ("terminationMessagePath", lambda d: d["spec"]["containers"][0].update(terminationMessagePath="/dev/termination-log")),
    ("terminationMessagePolicy", lambda d: d["spec"]["containers"][0].update(terminationMessagePolicy="File")),
    ("port protocol", lambda d: d["spec"]["containers"][0]["ports"][0].update(protocol="TCP")),
    ("stdin false", lambda d: d["spec"]["containers"][0].update(stdin=False, stdinOnce=False, tty=False)),
    ("mount readOnly false", lambda d: d["spec"]["containers"][0]["volumeMounts"][0].update(readOnly=False)),
    ("null and empty", lambda d: d["spec"]["containers"][1].update(command=None, args=[], workingDir="", securityContext={})),
    ("dnsPolicy", lambda d: d["spec"].update(dnsPolicy="ClusterFirst")),
    ("host flags false", lambda d: d["spec"].update(hostNetwork=False, hostPID=False, hostIPC=False, shareProcessNamespace=False)),
    ("hostUsers true", lambda d: d["spec"].update(hostUsers=True)),
    ("pod securityContext {}", lambda d: d["spec"].update(securityContext={})),
    ("configMap defaultMode", lambda d: d["spec"]["volumes"][1]["configMap"].update(defaultMode=420)),
    ("volume without source", lambda d: d["spec"]["volumes"][0].pop("emptyDir")),
]


@pytest.mark.parametrize("label, change", DEFAULTS, ids=[d[0] for d in DEFAULTS])
def test_apiserver_defaults_hash_like_their_absence(label: str, change: Callable[[Dict[str, Any]], None]) -> None:
    changed = template()
    change(changed)
    assert pc.pod_spec_hash(changed) == pc.pod_spec_hash(template())


def test_lifecycle_http_scheme_default_and_host_port_under_host_network() -> None:
    plain = template()
    plain["spec"]["containers"][0]["lifecycle"] = {"preStop": {"httpGet": {"path": "/quit", "port": 8080}}}
    explicit = copy.deepcopy(plain)
    explicit["spec"]["containers"][0]["lifecycle"]["preStop"]["httpGet"]["scheme"] = "HTTP"
    assert pc.pod_spec_hash(plain) == pc.pod_spec_hash(explicit)
    host = copy.deepcopy(plain)
    host["spec"]["hostNetwork"] = True
    with_port = copy.deepcopy(host)
    with_port["spec"]["containers"][0]["ports"][0]["hostPort"] = 8080
    assert pc.pod_spec_hash(host) == pc.pod_spec_hash(with_port)
    with_port["spec"]["containers"][0]["ports"][0]["hostPort"] = 18080
    assert pc.diff_fields(pc.pod_spec_fields(host), pc.pod_spec_fields(with_port)) == ["containers[main].ports"]


def test_false_is_not_absent_where_the_api_keeps_it() -> None:
    changed = template()
    changed["spec"]["automountServiceAccountToken"] = False
    assert pc.diff_fields(pc.pod_spec_fields(template()), pc.pod_spec_fields(changed)) == ["automountServiceAccountToken"]
    changed = template()
    changed["spec"]["containers"][0]["securityContext"] = {"privileged": False}
    assert pc.diff_fields(pc.pod_spec_fields(template()), pc.pod_spec_fields(changed)) == ["containers[main].securityContext"]


def test_a_pod_read_back_from_the_api_hashes_like_its_template() -> None:
    back = read_back(template())
    assert back["spec"]["volumes"][-1]["name"].startswith("kube-api-access-")
    assert pc.pod_spec_fields(back) == pc.pod_spec_fields(template())
    assert pc.pod_spec_hash(back) == pc.pod_spec_hash(template()) == pc.pod_spec_hash(deployment())
    # a user's own projected volume is hashed
    own = template()
    own["spec"]["volumes"].append({"name": "kube-api-access-mine0", "secret": {"secretName": "s"}})
    assert pc.diff_fields(pc.pod_spec_fields(template()), pc.pod_spec_fields(own)) == ["volumes"]


def test_the_restore_contract_does_not_change_the_hash() -> None:
    for kwargs in ({}, {"container_map": "main=main,main=sidecar", "skip_compat_check": True}, {"startup_probe": False}):
        built = pc.build(template(), "embed-abc", **kwargs)
        assert built != template()
        assert pc.pod_spec_fields(built) == pc.pod_spec_fields(template())
        assert pc.pod_spec_hash(read_back(built)) == pc.pod_spec_hash(template())
    # the source pod had its own control dir (any volume source) and already ran with the seccomp profile
    source = template()
    source["spec"]["volumes"].append({"name": "snapshot-control", "hostPath": {"path": "/srv/ctl/embed-0"}})
    source["spec"]["containers"][0]["volumeMounts"].append({"name": "snapshot-control", "mountPath": "/snapshot-control"})
    source["spec"]["securityContext"] = {"seccompProfile": {"type": "Localhost", "localhostProfile": "warmstart/block-iouring.json"}}
    assert pc.pod_spec_hash(source) == pc.pod_spec_hash(template())
    # but a real change of the template still shows through the restore pod
    changed = template()
    changed["spec"]["containers"][0]["args"] = ["--port", "9999"]
    assert pc.diff_fields(pc.pod_spec_fields(pc.build(changed, "embed-abc")), pc.pod_spec_fields(template())) == [
        "containers[main].args"]


def test_an_inert_pod_without_recorded_entrypoint_hashes_its_inert_command() -> None:
    inert = template()
    for container in inert["spec"]["containers"]:
        container["command"] = list(pc.INERT_COMMAND)
        container.pop("args", None)
    diff = pc.diff_fields(pc.pod_spec_fields(inert), pc.pod_spec_fields(template()))
    assert diff == ["containers[main].args", "containers[main].command", "containers[sidecar].command"]


def test_pod_spec_fields_accepts_pod_template_workload_and_bare_spec() -> None:
    expected = pc.pod_spec_fields(template())
    assert pc.pod_spec_fields(pod()) == expected
    assert pc.pod_spec_fields(deployment()) == expected
    bare = pc.pod_spec_fields(template()["spec"])
    assert bare == expected  # no job index label in the template either
    assert pc.diff_fields({"a": "1", "b": "2"}, {"b": "3", "c": "4"}) == ["a", "b", "c"]
    assert pc.diff_fields(expected, dict(expected)) == []


# --- selection -------------------------------------------------------------------------

def snapshot(name: str, created: str, source: Optional[Dict[str, Any]] = None, ready: bool = True,
             labels: Optional[Dict[str, str]] = None, scope: Optional[str] = None, uid: str = "u-1") -> Dict[str, Any]:
    spec: Dict[str, Any] = {"source": {"podRef": {"name": "embed-0"}}}
    if scope:
        spec["scope"] = scope
    conditions = [{"type": "Ready", "status": "True" if ready else "False", "reason": "Published" if ready else "Uploading",
                   "message": "" if ready else "copying pages", "lastTransitionTime": created}]
    return {"apiVersion": pc.API_VERSION, "kind": "PodSnapshot",
            "metadata": {"name": name, "namespace": "default", "uid": uid, "labels": labels or {"model": "minilm"},
                         "creationTimestamp": created},
            "spec": spec,
            "status": {"boundSnapshotContentName": "content-" + name, "podSpecHash": pc.pod_spec_hash(source or template()),
                       "createdAt": created, "conditions": conditions}}


def contents_for(*pairs: Any) -> Dict[str, Dict[str, Any]]:
    return {"content-" + name: {"metadata": {"name": "content-" + name}, "status": {"podSpecFields": pc.pod_spec_fields(src)}}
            for name, src in pairs}


def changed_template(**container: Any) -> Dict[str, Any]:
    doc = template()
    doc["spec"]["containers"][0].update(container)
    return doc


def test_select_the_newest_matching_ready_snapshot() -> None:
    snaps = [snapshot("embed-a", "2026-01-10T10:00:00Z"), snapshot("embed-b", "2026-01-10T12:00:00.5Z"),
             snapshot("embed-c", "2026-01-10T11:00:00Z"), snapshot("embed-d", "2026-01-10T13:00:00Z", ready=False)]
    chosen, reasons = pc.select_snapshot(snaps, read_back(template()))
    assert chosen is not None and chosen["metadata"]["name"] == "embed-b" and reasons == []
    # createdAt wins over creationTimestamp; without it the creationTimestamp counts
    late = snapshot("embed-e", "2026-01-10T09:00:00Z")
    late["status"]["createdAt"] = "2026-01-11T00:00:00Z"
    assert pc.select_snapshot(snaps + [late], template())[0]["metadata"]["name"] == "embed-e"
    for snap in snaps:
        del snap["status"]["createdAt"]
    assert pc.select_snapshot(snaps, template())[0]["metadata"]["name"] == "embed-b"


def test_select_reports_the_fields_of_the_nearest_snapshot() -> None:
    near = changed_template(image="embed:1.3")
    far = changed_template(image="embed:1.2", args=["--port", "1"])
    far["spec"]["volumes"] = far["spec"]["volumes"][:1]
    snaps = [snapshot("embed-near", "2026-01-10T10:00:00Z", near), snapshot("embed-far", "2026-01-10T11:00:00Z", far),
             snapshot("embed-wait", "2026-01-10T12:00:00Z", ready=False)]
    chosen, reasons = pc.select_snapshot(snaps, pod(), contents=contents_for(("embed-near", near), ("embed-far", far)))
    assert chosen is None
    assert "1 PodSnapshot(s) not Ready, ignored: default/embed-wait" in reasons
    assert any("2 Ready PodSnapshot(s) of the pod's group were taken from another pod spec" in r for r in reasons)
    assert "nearest PodSnapshot default/embed-near differs in containers[main].image" in reasons
    far_only = pc.select_snapshot(snaps[1:], pod(), contents=contents_for(("embed-far", far)))[1]
    assert "nearest PodSnapshot default/embed-far differs in containers[main].args, containers[main].image, volumes" in far_only
    unknown = pc.select_snapshot(snaps, pod())[1]
    assert any("newest PodSnapshot default/embed-far has podSpecHash" in r and "podSpecFields" in r for r in unknown)


def test_select_by_grouping_labels() -> None:
    snaps = [snapshot("embed-large", "2026-01-10T12:00:00Z", labels={"model": "large"}),
             snapshot("embed-minilm", "2026-01-10T10:00:00Z", labels={"model": "minilm"})]
    assert pc.select_snapshot(snaps, pod())[0]["metadata"]["name"] == "embed-large"
    assert pc.select_snapshot(snaps, pod(), grouping_labels=["model"])[0]["metadata"]["name"] == "embed-minilm"
    other = pod()
    other["metadata"]["labels"]["model"] = "tiny"
    chosen, reasons = pc.select_snapshot(snaps, other, grouping_labels=["model"])
    assert chosen is None
    assert any("2 Ready PodSnapshot(s) belong to another group" in r and "model='large', pod has 'tiny'" in r for r in reasons)


def test_select_pinned_by_annotation() -> None:
    snaps = [snapshot("embed-old", "2026-01-10T10:00:00Z", changed_template(image="embed:0.1")),
             snapshot("embed-new", "2026-01-10T12:00:00Z"), snapshot("embed-wait", "2026-01-10T13:00:00Z", ready=False)]
    chosen, reasons = pc.select_snapshot(snaps, pc.build(pod(), "embed-old"))
    assert chosen is not None and chosen["metadata"]["name"] == "embed-old" and reasons == []
    chosen, reasons = pc.select_snapshot(snaps, pc.build(pod(), "embed-wait"))
    assert chosen is None
    assert "pinned to PodSnapshot 'embed-wait'" in reasons[0]
    assert "PodSnapshot default/embed-wait is not Ready (Uploading: copying pages)" in reasons
    chosen, reasons = pc.select_snapshot(snaps, pc.build(pod(), "embed-gone"))
    assert chosen is None and "which does not exist in namespace default" in reasons[0]


def test_select_rootfs_only_skips_the_hash() -> None:
    other = changed_template(image="embed:2.0")
    snaps = [snapshot("embed-rootfs", "2026-01-10T10:00:00Z", other, scope="rootfs-only"),
             snapshot("embed-whole", "2026-01-10T12:00:00Z", other)]
    assert pc.select_snapshot(snaps, pod())[0]["metadata"]["name"] == "embed-rootfs"
    assert pc.select_snapshot(snaps, pod(), scope="rootfs-only")[0]["metadata"]["name"] == "embed-whole"
    with pytest.raises(pc.ContractError, match="scope 'partial'"):
        pc.select_snapshot(snaps, pod(), scope="partial")


def test_select_with_nothing_to_choose_from() -> None:
    assert pc.select_snapshot([], pod()) == (None, ["there is no PodSnapshot in namespace default"])
    elsewhere = snapshot("embed-a", "2026-01-10T10:00:00Z")
    elsewhere["metadata"]["namespace"] = "prod"
    assert pc.select_snapshot([elsewhere], pod())[0] is None
    chosen, reasons = pc.select_snapshot([snapshot("embed-a", "2026-01-10T10:00:00Z", ready=False)], pod())
    assert chosen is None and reasons == ["1 PodSnapshot(s) not Ready, ignored: default/embed-a",
                                          "no Ready PodSnapshot in namespace default"]
    failed = snapshot("embed-f", "2026-01-10T10:00:00Z")
    failed["status"]["conditions"].append({"type": "Failed", "status": "True", "reason": "DumpFailed", "message": "criu"})
    assert pc.select_snapshot([failed], pod())[0] is None


# --- pinned pod vs snapshot spec -----------------------------------------------------------

def test_check_pod_spec_of_a_pinned_restore_pod() -> None:
    snap = snapshot("embed-a", "2026-01-10T10:00:00Z")
    fields = contents_for(("embed-a", template()))["content-embed-a"]
    assert pc.check_pod_spec(snap, pc.build(read_back(template()), "embed-a")) == []
    changed = pc.build(changed_template(image="embed:9"), "embed-a")
    reasons = pc.check_pod_spec(snap, changed, fields)
    assert reasons == ["pod template does not match the pod spec of PodSnapshot default/embed-a: differs in containers[main].image "
                       "(annotation snapshot.warmstart.io/snapshot-skip-compat-check: \"true\" skips this check)"]
    assert "podSpecHash" in pc.check_pod_spec(snap, changed)[0]
    assert pc.check_pod_spec(snap, pc.build(changed_template(image="embed:9"), "embed-a", skip_compat_check=True)) == []
    rootfs = snapshot("embed-r", "2026-01-10T10:00:00Z", scope="rootfs-only")
    assert pc.check_pod_spec(rootfs, changed) == []


def test_check_pod_spec_through_a_container_map() -> None:
    snap = snapshot("embed-a", "2026-01-10T10:00:00Z")
    fields = contents_for(("embed-a", template()))["content-embed-a"]
    replicas = template()
    main = replicas["spec"]["containers"][0]
    replicas["spec"]["containers"] = [dict(copy.deepcopy(main), name="replica-a"), dict(copy.deepcopy(main), name="replica-b")]
    mapped = pc.build(replicas, "embed-a", container_map="main=replica-a,main=replica-b")
    assert pc.check_pod_spec(snap, mapped, fields) == []
    assert "needs the PodSnapshotContent's status.podSpecFields" in pc.check_pod_spec(snap, mapped)[0]
    replicas["spec"]["containers"][1]["image"] = "embed:9"
    replicas["spec"]["hostIPC"] = True
    reasons = pc.check_pod_spec(snap, pc.build(replicas, "embed-a", container_map="main=replica-a,main=replica-b"), fields)
    assert len(reasons) == 1 and reasons[0].endswith("differs in hostIPC, containers[replica-b].image (from main)")
    unknown = pc.build(replicas, "embed-a", container_map="web=replica-a")
    assert pc.check_pod_spec(snap, unknown, fields)[0].endswith("differs in hostIPC, containers[web] (not in the snapshot)")


# --- content binding ---------------------------------------------------------------------

def content(snap: Dict[str, Any], **ref: str) -> Dict[str, Any]:
    backlink = {"namespace": "default", "name": snap["metadata"]["name"], "uid": snap["metadata"]["uid"]}
    backlink.update(ref)
    return {"apiVersion": pc.API_VERSION, "kind": "PodSnapshotContent", "metadata": {"name": "content-" + snap["metadata"]["name"]},
            "spec": {"snapshotRef": backlink, "source": {"podRef": {"namespace": "default", "name": "embed-0"}, "nodeName": "node-a"},
                     "store": {"url": "/mnt/snapshots", "snapshotId": "20260110T100000Z-1a2b3c4d"}}}


def test_content_binding_accepts_a_matching_pair() -> None:
    snap = snapshot("embed-a", "2026-01-10T10:00:00Z")
    assert pc.check_content_binding(snap, content(snap)) == []


def test_content_binding_refuses_mismatches() -> None:
    snap = snapshot("embed-a", "2026-01-10T10:00:00Z", uid="u-2")
    reasons = pc.check_content_binding(snap, content(snap, uid="u-1"))
    assert reasons == ["PodSnapshotContent content-embed-a points back to uid 'u-1', but PodSnapshot default/embed-a has uid 'u-2' "
                       "(the PodSnapshot was deleted and created again?)"]
    reasons = pc.check_content_binding(snap, content(snap, name="embed-b", namespace="prod"))
    assert len(reasons) == 2 and "namespace 'prod'" in reasons[0] and "name 'embed-b'" in reasons[1]
    unbound = copy.deepcopy(snap)
    unbound["status"]["boundSnapshotContentName"] = "content-other"
    assert pc.check_content_binding(unbound, content(snap)) == [
        "PodSnapshot default/embed-a is bound to PodSnapshotContent 'content-other', not to 'content-embed-a'"]
    del unbound["status"]["boundSnapshotContentName"]
    assert "is not bound to any PodSnapshotContent" in pc.check_content_binding(unbound, content(snap))[0]
    waiting = snapshot("embed-a", "2026-01-10T10:00:00Z", ready=False, uid="u-2")
    assert pc.check_content_binding(waiting, content(waiting)) == ["PodSnapshot default/embed-a is not Ready (Uploading: copying pages)"]
    failed = copy.deepcopy(snap)
    failed["status"]["conditions"].append({"type": "Failed", "status": "True", "reason": "UploadFailed", "message": "disk full"})
    assert pc.check_content_binding(failed, content(failed)) == ["PodSnapshot default/embed-a has failed (UploadFailed: disk full)"]


# --- CRDs ------------------------------------------------------------------------------

def crds() -> Dict[str, Dict[str, Any]]:
    """The CRDs by kind. The file is one YAML document (ansible-test's yamllint allows no more): a v1 List."""
    with open(CRDS, encoding="utf-8") as handle:
        docs = [d for d in yaml.safe_load_all(handle) if d]
    assert len(docs) == 1 and docs[0]["apiVersion"] == "v1" and docs[0]["kind"] == "List"
    items = docs[0]["items"]
    assert len(items) == 5
    return {d["spec"]["names"]["kind"]: d for d in items}


def schema_of(kind: str) -> Dict[str, Any]:
    (version,) = crds()[kind]["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


_TYPES = {"object": dict, "array": list, "string": str, "integer": int, "boolean": bool}


def violations(schema: Dict[str, Any], value: Any, path: str = "") -> List[str]:
    """A small structural-schema walk: type, required, enum, pattern, lengths, minimum, items, properties."""
    out: List[str] = []
    kind = schema.get("type")
    if kind and not isinstance(value, _TYPES[kind]) or (kind == "integer" and isinstance(value, bool)):
        return [f"{path or '.'}: expected {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: {value!r} not in {schema['enum']}")
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            out.append(f"{path}: {value!r} does not match {schema['pattern']}")
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", len(value)):
            out.append(f"{path}: length {len(value)} out of range")
    if isinstance(value, int) and value < schema.get("minimum", value):
        out.append(f"{path}: {value} below minimum")
    if isinstance(value, dict):
        out.extend(f"{path}.{key}: required" for key in schema.get("required", []) if key not in value)
        for key, item in value.items():
            if key in schema.get("properties", {}):
                out.extend(violations(schema["properties"][key], item, f"{path}.{key}"))
            elif isinstance(schema.get("additionalProperties"), dict):
                out.extend(violations(schema["additionalProperties"], item, f"{path}.{key}"))
            elif "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields") and path:
                out.append(f"{path}.{key}: unknown field")
    if isinstance(value, list):
        for index, item in enumerate(value):
            out.extend(violations(schema.get("items", {}), item, f"{path}[{index}]"))
    return out


def example_snapshot() -> Dict[str, Any]:
    snap = snapshot("embed-a", "2026-01-10T10:00:00Z")
    snap["spec"]["source"]["containers"] = ["main"]
    snap["spec"]["policyName"] = "embed-policy"
    snap["status"].update(size=345 * 2 ** 20, lastAccessTime="2026-01-10T11:00:00Z")
    return snap


def example_policy() -> Dict[str, Any]:
    return {"apiVersion": pc.API_VERSION, "kind": "PodSnapshotPolicy", "metadata": {"name": "embed", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "embed"},
                                  "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}]},
                     "storeUrl": "s3://snapshots/embed", "triggerConfig": {"type": "workload", "postCheckpoint": "resume"},
                     "snapshotScope": "whole-pod", "retentionConfig": {"lastAccessTimeout": "72h"},
                     "snapshotGroupingRules": {"groupByLabelValue": {"labels": ["model"]},
                                               "groupRetentionPolicy": {"maxSnapshotCountPerGroup": 3}}}}


def example_content() -> Dict[str, Any]:
    doc = content(example_snapshot())
    doc["spec"]["store"]["path"] = "snapshots/20260110T100000Z-1a2b3c4d"
    doc["status"] = {"source": {"nodeName": "node-a", "arch": "x86_64", "kernel": "6.12.0", "cpuHash": "ab12", "cpuVendor": "GenuineIntel",
                                "image": "embed:1.4", "imageId": "sha256:00", "gpuDriver": "580.65", "gpuModels": ["NVIDIA H200"]},
                     "podSpecFields": pc.pod_spec_fields(template()),
                     "conditions": [{"type": "Ready", "status": "True", "reason": "Published", "message": "",
                                     "lastTransitionTime": "2026-01-10T10:00:00Z"}]}
    return doc


def test_crds_structure() -> None:
    docs = crds()
    assert set(docs) == {pc.KIND_SNAPSHOT, pc.KIND_CONTENT, pc.KIND_POLICY, pc.KIND_TRIGGER, pc.KIND_STORAGE_CONFIG}
    scopes = {"PodSnapshot": "Namespaced", "PodSnapshotContent": "Cluster", "PodSnapshotPolicy": "Namespaced",
              "PodSnapshotManualTrigger": "Namespaced", "PodSnapshotStorageConfig": "Cluster"}
    for kind, doc in docs.items():
        assert doc["apiVersion"] == "apiextensions.k8s.io/v1" and doc["kind"] == "CustomResourceDefinition"
        spec = doc["spec"]
        assert spec["group"] == pc.GROUP and spec["scope"] == scopes[kind]
        assert doc["metadata"]["name"] == f"{spec['names']['plural']}.{pc.GROUP}"
        assert spec["names"]["singular"] == kind.lower() and spec["names"]["plural"].startswith(kind.lower()[:-1])
        (version,) = spec["versions"]
        assert version["name"] == pc.VERSION and version["served"] and version["storage"]
        assert version["subresources"] == {"status": {}}
        assert {"Age"} <= {c["name"] for c in version["additionalPrinterColumns"]}
        schema = version["schema"]["openAPIV3Schema"]
        assert schema["type"] == "object" and "spec" in schema["required"] and "status" in schema["properties"]
        rules = schema["properties"]["spec"].get("x-kubernetes-validations", [])
        if kind == "PodSnapshotPolicy":
            assert rules == []
        else:
            assert rules == [{"rule": "self == oldSelf", "message": "spec is immutable"}]
    assert docs["PodSnapshot"]["spec"]["names"]["shortNames"] == ["psnap"]
    columns = {c["name"]: c["jsonPath"] for c in docs["PodSnapshot"]["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns == {"Ready": '.status.conditions[?(@.type=="Ready")].status', "Content": ".status.boundSnapshotContentName",
                       "Size": ".status.size", "Age": ".metadata.creationTimestamp"}
    columns = {c["name"]: c["jsonPath"] for c in docs["PodSnapshotContent"]["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns["PodSnapshot"] == ".spec.snapshotRef.name" and columns["Node"] == ".spec.source.nodeName"
    backlink = schema_of("PodSnapshotContent")["properties"]["spec"]["properties"]["snapshotRef"]
    assert backlink["required"] == ["namespace", "name", "uid"]
    fields = schema_of("PodSnapshotContent")["properties"]["status"]["properties"]["podSpecFields"]
    assert fields["x-kubernetes-preserve-unknown-fields"] is True
    size = schema_of("PodSnapshot")["properties"]["status"]["properties"]["size"]
    assert size["type"] == "integer" and size["format"] == "int64"


def test_crd_schemas_accept_the_examples_and_refuse_bad_objects() -> None:
    assert violations(schema_of("PodSnapshot"), example_snapshot()) == []
    assert violations(schema_of("PodSnapshotContent"), example_content()) == []
    assert violations(schema_of("PodSnapshotPolicy"), example_policy()) == []
    bad = example_snapshot()
    del bad["spec"]["source"]["podRef"]["name"]
    bad["spec"]["scope"] = "half-pod"
    bad["spec"]["source"]["containers"] = ["Main_1"]
    bad["status"]["conditions"][0]["status"] = "Yes"
    found = violations(schema_of("PodSnapshot"), bad)
    assert ".spec.source.podRef.name: required" in found
    assert any(v.startswith(".spec.scope: 'half-pod'") for v in found)
    assert any(v.startswith(".spec.source.containers[0]: 'Main_1' does not match") for v in found)
    assert any(v.startswith(".status.conditions[0].status: 'Yes'") for v in found)
    content_bad = example_content()
    del content_bad["spec"]["snapshotRef"]["uid"]
    assert violations(schema_of("PodSnapshotContent"), content_bad) == [".spec.snapshotRef.uid: required"]
    policy_bad = example_policy()
    policy_bad["spec"]["triggerConfig"]["type"] = "cron"
    policy_bad["spec"]["snapshotGroupingRules"]["groupRetentionPolicy"]["maxSnapshotCountPerGroup"] = -1
    policy_bad["spec"]["retentionConfig"]["lastAccessTimeout"] = "3 days"
    assert len(violations(schema_of("PodSnapshotPolicy"), policy_bad)) == 3
    assert violations(schema_of("PodSnapshotPolicy"), {"spec": {"storeUrl": "/mnt/s"}}) == [".spec.selector: required"]


def test_crd_defaults_and_enums_match_the_code() -> None:
    snap_spec = schema_of("PodSnapshot")["properties"]["spec"]["properties"]
    assert snap_spec["scope"]["enum"] == list(pc.SCOPES) and snap_spec["scope"]["default"] == pc.SCOPE_WHOLE_POD
    policy = schema_of("PodSnapshotPolicy")["properties"]["spec"]["properties"]
    assert policy["triggerConfig"]["properties"]["type"]["default"] == "workload"
    assert policy["triggerConfig"]["properties"]["postCheckpoint"]["enum"] == ["resume", "stop"]
    assert policy["snapshotScope"]["enum"] == list(pc.SCOPES)
    group = policy["snapshotGroupingRules"]["properties"]["groupRetentionPolicy"]["properties"]["maxSnapshotCountPerGroup"]
    assert group["minimum"] == 0 and group["default"] == 0
    hash_pattern = schema_of("PodSnapshot")["properties"]["status"]["properties"]["podSpecHash"]["pattern"]
    assert re.match(hash_pattern, pc.pod_spec_hash(template()))
    conditions = schema_of("PodSnapshot")["properties"]["status"]["properties"]["conditions"]["items"]
    made = pc.set_condition([], pc.RESTORE_CONDITION, True, pc.REASON_PARTIAL, "1 of 2", "2026-01-10T10:00:00Z", 1)
    assert violations(conditions, made[0]) == []


def test_crd_schemas_with_jsonschema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    for kind, example in (("PodSnapshot", example_snapshot()), ("PodSnapshotContent", example_content()),
                          ("PodSnapshotPolicy", example_policy())):
        jsonschema.Draft7Validator(schema_of(kind)).validate(example)
    bad = example_snapshot()
    bad["status"]["size"] = "big"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema_of("PodSnapshot")).validate(bad)


# --- the reference contract's names -----------------------------------------------------------

def test_reference_annotations_are_read_as_aliases() -> None:
    raw = {pc.REF_ANN_RESTORE_FROM: "embed-a", pc.REF_ANN_CONTAINER_MAP: "main=main",
           pc.REF_ANN_SKIP_COMPAT: "True", "other": "x"}
    merged, conflicts = pc.contract_annotations(raw, "pod default/p")
    assert conflicts == [] and merged == dict(raw, **{pc.ANN_RESTORE_FROM: "embed-a", pc.ANN_CONTAINER_MAP: "main=main",
                                                      pc.ANN_SKIP_COMPAT: "True"})
    assert pc.skips_compat_check(merged) and "other" in merged and raw[pc.REF_ANN_SKIP_COMPAT] == "True"
    # ours wins where both are set to the same value (a map in another order, a bool in another case)
    same = {pc.ANN_CONTAINER_MAP: "a=b,a=c", pc.REF_ANN_CONTAINER_MAP: "a=c, a=b", pc.ANN_SKIP_COMPAT: "true",
            pc.REF_ANN_SKIP_COMPAT: "TRUE", pc.ANN_RESTORE_FROM: "s", pc.REF_ANN_RESTORE_FROM: "s"}
    merged, conflicts = pc.contract_annotations(same, "pod default/p")
    assert conflicts == [] and merged[pc.ANN_CONTAINER_MAP] == "a=b,a=c"


def test_ours_and_an_alias_that_disagree_are_refused_naming_both() -> None:
    both = {pc.ANN_RESTORE_FROM: "snap-a", pc.REF_ANN_RESTORE_FROM: "snap-b",
            pc.ANN_CONTAINER_MAP: "main=main", pc.REF_ANN_CONTAINER_MAP: "main=sidecar",
            pc.ANN_SKIP_COMPAT: "false", pc.REF_ANN_SKIP_COMPAT: "true"}
    _merged, conflicts = pc.contract_annotations(both, "pod default/p")
    assert conflicts == [
        "pod default/p has annotation snapshot.warmstart.io/restore-from: 'snap-a' and annotation "
        "nvidia.com/restore-from: 'snap-b', which disagree: remove one or make them equal",
        "pod default/p has annotation snapshot.warmstart.io/restore-container-map: 'main=main' and annotation "
        "nvidia.com/restore-container-map: 'main=sidecar', which disagree: remove one or make them equal",
        "pod default/p has annotation snapshot.warmstart.io/snapshot-skip-compat-check: 'false' and annotation "
        "nvidia.com/snapshot-skip-compat-check: 'true', which disagree: remove one or make them equal"]
    doc = restore_pod()
    doc["metadata"]["annotations"][pc.REF_ANN_RESTORE_FROM] = "embed-other"
    assert pc.validate(doc) == [
        "pod default/embed-0 has annotation snapshot.warmstart.io/restore-from: 'embed-abc' and annotation "
        "nvidia.com/restore-from: 'embed-other', which disagree: remove one or make them equal"]
    with pytest.raises(pc.ContractError) as refused:
        pc.build(doc, "embed-abc")
    assert refused.value.reasons[0] == pc.validate(doc)[0]
    assert pc.select_snapshot([snapshot("embed-abc", "2026-01-10T10:00:00Z")], doc) == (None, pc.validate(doc))
    assert pc.check_pod_spec(snapshot("embed-abc", "2026-01-10T10:00:00Z"), doc) == pc.validate(doc)
    assert pc.restore_annotations(doc)[1] == pc.validate(doc)


def test_a_pod_written_with_the_reference_names_is_a_restore_pod() -> None:
    doc = restore_pod(container_map="main=main")
    annotations = doc["metadata"]["annotations"]
    for ours, theirs in pc.ANNOTATION_ALIASES:
        if ours in annotations:
            annotations[theirs] = annotations.pop(ours)
    assert pc.validate(doc) == [] and pc.restore_destinations(doc) == ["main"]
    assert pc.select_snapshot([snapshot("embed-abc", "2026-01-10T10:00:00Z")], doc)[0] is not None
    annotations[pc.REF_ANN_CONTAINER_MAP] = "main=web"
    assert pc.validate(doc) == ["container map destination 'web' (from 'main') is not a container of pod default/embed-0"]
    annotations[pc.REF_ANN_CONTAINER_MAP] = "main"
    assert pc.validate(doc)[0].startswith("annotation nvidia.com/restore-container-map of pod default/embed-0 is invalid")
    missing = pc.select_snapshot([], dict(doc, metadata=dict(doc["metadata"], annotations={pc.REF_ANN_RESTORE_FROM: "x"})))
    assert missing == (None, ["pod default/embed-0 is pinned to PodSnapshot 'x' (annotation nvidia.com/restore-from), "
                              "which does not exist in namespace default"])
    # build keeps the reference's annotations and writes ours beside them
    theirs = {pc.REF_ANN_RESTORE_FROM: "embed-abc", pc.REF_ANN_SKIP_COMPAT: "true"}
    rebuilt = pc.build(dict(doc, metadata=dict(doc["metadata"], annotations=theirs)), "embed-abc")
    assert {k: v for k, v in rebuilt["metadata"]["annotations"].items() if k != pc.ANN_ORIGINAL_ENTRYPOINT} == {
        pc.REF_ANN_RESTORE_FROM: "embed-abc", pc.REF_ANN_SKIP_COMPAT: "true", pc.ANN_RESTORE_FROM: "embed-abc",
        pc.ANN_SKIP_COMPAT: "true"}
    with pytest.raises(pc.ContractError, match="annotation nvidia.com/restore-from of pod default/embed-0 is already"):
        pc.build(dict(doc, metadata=dict(doc["metadata"], annotations={pc.REF_ANN_RESTORE_FROM: "embed-abc"})),
                 "embed-new")


def test_the_reference_skip_compat_annotation_skips_the_pod_spec_check() -> None:
    snap = snapshot("embed-a", "2026-01-10T10:00:00Z")
    changed = pc.build(changed_template(image="embed:9"), "embed-a")
    assert len(pc.check_pod_spec(snap, changed)) == 1
    changed["metadata"]["annotations"][pc.REF_ANN_SKIP_COMPAT] = "true"
    assert pc.check_pod_spec(snap, changed) == []


def test_result_outcome_is_the_classification_of_the_recorded_condition() -> None:
    assert {result: pc.result_outcome(result) for result in pc.RESULT_CONDITIONS} == {
        "succeeded": "Succeeded", "failed": "Failed", "partially_succeeded": "PartiallySucceeded",
        "incompatible": "Failed"}


# --- standby-aware entrypoint ----------------------------------------------------------------

def test_build_standby_keeps_the_commands_and_sets_the_standby_env() -> None:
    doc = restore_pod(entrypoint="standby")
    main, sidecar = doc["spec"]["containers"]
    assert (main["command"], main["args"]) == (["python3", "/app/server.py"], ["--port", "8080"])
    assert "command" not in sidecar
    for container in (main, sidecar):
        assert container["env"][-1] == {"name": "SNAPSHOT_RESTORE_STANDBY", "value": "1"}
    assert pc.ANN_ORIGINAL_ENTRYPOINT not in doc["metadata"]["annotations"]
    assert pc.validate(doc) == [] and pc.entrypoint_forms(doc) == {"main": "standby", "sidecar": "standby"}
    assert pc.build(doc, "embed-abc", entrypoint="standby") == doc
    assert pc.pod_spec_hash(doc) == pc.pod_spec_hash(pod())
    assert pc.entrypoint_forms(restore_pod()) == {"main": "inert", "sidecar": "inert"}


def test_build_standby_refusals() -> None:
    with pytest.raises(pc.ContractError) as inert_first:
        pc.build(restore_pod(), "embed-abc", entrypoint="standby")
    assert len(inert_first.value.reasons) == 2 and "was made inert by an earlier build" in inert_first.value.reasons[0]
    off = pod()
    off["spec"]["containers"][0]["env"].append({"name": "SNAPSHOT_RESTORE_STANDBY", "value": "0"})
    with pytest.raises(pc.ContractError) as disabled:
        pc.build(off, "embed-abc", entrypoint="standby")
    assert disabled.value.reasons == ["container 'main' of pod default/embed-0 sets env SNAPSHOT_RESTORE_STANDBY='0', "
                                      "which does not ask its entrypoint to stay inert (true values: 1, true, yes, on)"]
    with pytest.raises(pc.ContractError, match="entrypoint 'sleepy' is not one of inert, standby"):
        pc.build(pod(), "embed-abc", entrypoint="sleepy")


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


# --- select at restore and the cold-start fallback (issue 21) -----------------------------------------

def test_build_without_a_snapshot_selects_at_restore() -> None:
    built = pc.build(template(), None, restore_policy="embed")
    annotations = built["metadata"]["annotations"]
    assert pc.ANN_RESTORE_FROM not in annotations
    assert (annotations[pc.ANN_RESTORE_SELECT], annotations[pc.ANN_RESTORE_POLICY]) == ("true", "embed")
    assert pc.validate(built) == [] and pc.build(built, None, restore_policy="embed") == built
    assert pc.restore_mode(built) == {"restore_from": None, "select": True, "policy": "embed", "fallback": None}
    assert pc.is_restore_pod(built) and not pc.is_restore_pod(template())
    assert pc.pod_spec_hash(built) == pc.pod_spec_hash(template())
    # the agent pins the one it selects: the pod then has both, and is still valid
    pinned = copy.deepcopy(built)
    pinned["metadata"]["annotations"][pc.ANN_RESTORE_FROM] = "embed-a"
    assert pc.validate(pinned) == [] and pc.restore_mode(pinned)["restore_from"] == "embed-a"


def test_select_and_pin_do_not_mix() -> None:
    pinned = pc.build(template(), "embed-a")
    with pytest.raises(pc.ContractError) as err:
        pc.build(pinned, None)
    assert err.value.reasons == ["annotation snapshot.warmstart.io/restore-from of pod template already pins 'embed-a'; "
                                 "a snapshot selected at restore needs a template without it"]
    with pytest.raises(pc.ContractError) as err:
        pc.build(pc.build(template(), None), "embed-a")
    assert "selects its snapshot at restore" in err.value.reasons[0]
    with pytest.raises(pc.ContractError) as err:
        pc.build(template(), "embed-a", restore_policy="embed")
    assert err.value.reasons == ["restore_policy 'embed' applies only to a snapshot selected at restore, not to one "
                                 "pinned ('embed-a')"]
    with pytest.raises(pc.ContractError) as err:
        pc.build(pc.build(template(), None, restore_policy="a"), None, restore_policy="b")
    assert "restore-policy of pod template is already 'a', not 'b'" in err.value.reasons[0]
    bad = pc.build(template(), None)
    bad["metadata"]["annotations"][pc.ANN_RESTORE_SELECT] = "maybe"
    assert "annotation snapshot.warmstart.io/restore-select of pod template is 'maybe', not 'true'" in pc.validate(bad)


def test_a_cold_start_fallback_uses_the_standby_entrypoint_and_a_probe_that_accepts_cold_start() -> None:
    built = pc.build(template(), "embed-a", entrypoint=pc.ENTRYPOINT_STANDBY, fallback=pc.FALLBACK_COLD_START)
    assert built["metadata"]["annotations"][pc.ANN_RESTORE_FALLBACK] == "cold-start"
    main = built["spec"]["containers"][0]
    assert main["command"] == ["python3", "/app/server.py"] and main["args"] == ["--port", "8080"]
    assert {"name": pc.STANDBY_ENV, "value": "1"} in main["env"]
    assert main["startupProbe"]["exec"]["command"] == [
        "/bin/sh", "-c", "cat /snapshot-control/restore-complete || cat /snapshot-control/cold-start"]
    assert pc.validate(built) == [] and pc.restore_mode(built)["fallback"] == "cold-start"
    # idempotent, also without repeating the fallback (the annotation says it)
    assert pc.build(built, "embed-a", entrypoint="standby", fallback="cold-start") == built
    assert pc.build(built, "embed-a", entrypoint="standby") == built
    opted_out = pc.build(template(), "embed-a", fallback=pc.FALLBACK_NONE)
    assert opted_out["metadata"]["annotations"][pc.ANN_RESTORE_FALLBACK] == "none"
    assert opted_out["spec"]["containers"][0]["startupProbe"]["exec"]["command"] == pc.STARTUP_PROBE_COMMAND


def test_the_cold_start_fallback_refusals() -> None:
    with pytest.raises(pc.ContractError) as err:
        pc.build(template(), "embed-a", fallback="cold-start")
    assert err.value.reasons == ["fallback cold-start needs entrypoint standby: an inert placeholder cannot start its "
                                 "app cold (it runs no entrypoint of its own)"]
    with pytest.raises(pc.ContractError) as err:
        pc.build(template(), "embed-a", entrypoint="standby", fallback="warm-start")
    assert err.value.reasons == ["fallback 'warm-start' is not one of none, cold-start"]
    plain = pc.build(template(), "embed-a", entrypoint="standby")
    with pytest.raises(pc.ContractError) as err:
        pc.build(plain, "embed-a", entrypoint="standby", fallback="cold-start")
    assert "container 'main' of pod template already has another startupProbe" in err.value.reasons
    with pytest.raises(pc.ContractError) as err:
        pc.build(pc.build(template(), "embed-a", fallback="none"), "embed-a", entrypoint="standby", fallback="cold-start")
    assert "annotation snapshot.warmstart.io/restore-fallback of pod template is already 'none', not 'cold-start'" in \
        err.value.reasons
    inert = pc.build(template(), "embed-a")
    inert["metadata"]["annotations"][pc.ANN_RESTORE_FALLBACK] = "cold-start"
    problems = pc.validate(inert)
    assert any("container 'main' of pod template is inert: annotation snapshot.warmstart.io/restore-fallback "
               "cold-start needs the standby entrypoint" in p for p in problems)
    inert["metadata"]["annotations"][pc.ANN_RESTORE_FALLBACK] = "sometimes"
    assert ("annotation snapshot.warmstart.io/restore-fallback of pod template is 'sometimes', not one of none, "
            "cold-start") in pc.validate(inert)


def test_the_new_crds_accept_their_examples() -> None:
    trigger = {"apiVersion": pc.API_VERSION, "kind": pc.KIND_TRIGGER, "metadata": {"name": "now"},
               "spec": {"targetPod": "embed-0", "policyName": "embed", "containers": ["main"]},
               "status": {"snapshotCreated": {"name": "now-1a2b3c4d"},
                          "conditions": [{"type": "Triggered", "status": "True", "reason": "Complete",
                                          "message": "PodSnapshot default/now-1a2b3c4d is Ready",
                                          "lastTransitionTime": "2026-12-02T12:00:00Z"}]}}
    config = {"apiVersion": pc.API_VERSION, "kind": pc.KIND_STORAGE_CONFIG, "metadata": {"name": "shared-s3"},
              "spec": {"storeUrl": "s3://snapshots/prod", "options": {"endpointUrl": "http://minio:9000",
                                                                      "region": "eu-1", "concurrency": 8},
                       "credentialsSecretRef": {"name": "s3", "namespace": "warmstart",
                                                "keys": {"accessKeyId": "id", "secretAccessKey": "key"}}}}
    assert violations(schema_of(pc.KIND_TRIGGER), trigger) == []
    assert violations(schema_of(pc.KIND_STORAGE_CONFIG), config) == []
    assert violations(schema_of(pc.KIND_TRIGGER), {"spec": {}}) == [".spec.targetPod: required"]
    assert violations(schema_of(pc.KIND_STORAGE_CONFIG), {"spec": {"storeUrl": "relative"}}) != []
    policy = example_policy()
    del policy["spec"]["storeUrl"]
    policy["spec"]["storageConfigName"] = "shared-s3"
    assert violations(schema_of(pc.KIND_POLICY), policy) == []
    root_rules = {k: crds()[k]["spec"]["versions"][0]["schema"]["openAPIV3Schema"].get("x-kubernetes-validations")
                  for k in (pc.KIND_POLICY, pc.KIND_STORAGE_CONFIG)}
    assert "has(self.spec.storeUrl) != has(self.spec.storageConfigName)" in root_rules[pc.KIND_POLICY][0]["rule"]
    assert "credentialsSecretRef" in root_rules[pc.KIND_STORAGE_CONFIG][0]["rule"]
    status = schema_of(pc.KIND_SNAPSHOT)["properties"]["status"]["properties"]
    assert {"lastAccessTime", "attempts", "lastAttemptTime", "lastError"} <= set(status)
