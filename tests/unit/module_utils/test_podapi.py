"""The API's names, conditions and the CRDs (plugins/module_utils/k8s/_podapi.py, roles/k8s_crds)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _spechash as spechash
from tests.support.pod_fixtures import content, snapshot, template

CRDS = Path(__file__).resolve().parents[3] / "roles" / "k8s_crds" / "files" / "crds.yaml"


# --- conditions ----------------------------------------------------------------------

def test_set_condition_keeps_transition_time_until_status_changes() -> None:
    first = podapi.set_condition([], "Ready", False, "Uploading", "copying", "2026-01-10T10:00:00Z", generation=1)
    assert first == [{"type": "Ready", "status": "False", "reason": "Uploading", "message": "copying",
                      "lastTransitionTime": "2026-01-10T10:00:00Z", "observedGeneration": 1}]
    same = podapi.set_condition(first, "Ready", "False", "Verifying", "checksums", "2026-01-10T10:01:00Z")
    assert same[0]["lastTransitionTime"] == "2026-01-10T10:00:00Z" and same[0]["reason"] == "Verifying"
    assert same[0]["observedGeneration"] == 1
    done = podapi.set_condition(same + [{"type": "Failed", "status": "False"}], "Ready", True, "Published", "",
                                "2026-01-10T10:02:00Z", generation=2)
    assert done[0]["lastTransitionTime"] == "2026-01-10T10:02:00Z" and done[0]["observedGeneration"] == 2
    assert done[1] == {"type": "Failed", "status": "False"}
    assert first[0]["reason"] == "Uploading"  # input untouched
    assert podapi.get_condition({"status": {"conditions": done}}, "Ready")["status"] == "True"
    assert podapi.get_condition({"conditions": done}, "Failed") == {"type": "Failed", "status": "False"}
    assert podapi.get_condition(done, "Restored") is None and podapi.get_condition({}, "Ready") is None


def test_set_condition_rejects_bad_status_and_reason() -> None:
    with pytest.raises(podapi.ContractError, match="status 'yes'"):
        podapi.set_condition([], "Ready", "yes", "Done", "", "t")
    with pytest.raises(podapi.ContractError, match="reason 'not camel case'"):
        podapi.set_condition([], "Ready", True, "not camel case", "", "t")


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
    return {"apiVersion": podapi.API_VERSION, "kind": "PodSnapshotPolicy", "metadata": {"name": "embed", "namespace": "default"},
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
                     "podSpecFields": spechash.pod_spec_fields(template()),
                     "conditions": [{"type": "Ready", "status": "True", "reason": "Published", "message": "",
                                     "lastTransitionTime": "2026-01-10T10:00:00Z"}]}
    return doc


def test_crds_structure() -> None:
    docs = crds()
    assert set(docs) == {podapi.KIND_SNAPSHOT, podapi.KIND_CONTENT, podapi.KIND_POLICY, podapi.KIND_TRIGGER, podapi.KIND_STORAGE_CONFIG}
    scopes = {"PodSnapshot": "Namespaced", "PodSnapshotContent": "Cluster", "PodSnapshotPolicy": "Namespaced",
              "PodSnapshotManualTrigger": "Namespaced", "PodSnapshotStorageConfig": "Cluster"}
    for kind, doc in docs.items():
        assert doc["apiVersion"] == "apiextensions.k8s.io/v1" and doc["kind"] == "CustomResourceDefinition"
        spec = doc["spec"]
        assert spec["group"] == podapi.GROUP and spec["scope"] == scopes[kind]
        assert doc["metadata"]["name"] == f"{spec['names']['plural']}.{podapi.GROUP}"
        assert spec["names"]["singular"] == kind.lower() and spec["names"]["plural"].startswith(kind.lower()[:-1])
        (version,) = spec["versions"]
        assert version["name"] == podapi.VERSION and version["served"] and version["storage"]
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
    assert snap_spec["scope"]["enum"] == list(podapi.SCOPES) and snap_spec["scope"]["default"] == podapi.SCOPE_WHOLE_POD
    policy = schema_of("PodSnapshotPolicy")["properties"]["spec"]["properties"]
    assert policy["triggerConfig"]["properties"]["type"]["default"] == "workload"
    assert policy["triggerConfig"]["properties"]["postCheckpoint"]["enum"] == ["resume", "stop"]
    assert policy["snapshotScope"]["enum"] == list(podapi.SCOPES)
    group = policy["snapshotGroupingRules"]["properties"]["groupRetentionPolicy"]["properties"]["maxSnapshotCountPerGroup"]
    assert group["minimum"] == 0 and group["default"] == 0
    hash_pattern = schema_of("PodSnapshot")["properties"]["status"]["properties"]["podSpecHash"]["pattern"]
    assert re.match(hash_pattern, spechash.pod_spec_hash(template()))
    conditions = schema_of("PodSnapshot")["properties"]["status"]["properties"]["conditions"]["items"]
    made = podapi.set_condition([], podapi.RESTORE_CONDITION, True, podapi.REASON_PARTIAL, "1 of 2", "2026-01-10T10:00:00Z", 1)
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


def test_the_new_crds_accept_their_examples() -> None:
    trigger = {"apiVersion": podapi.API_VERSION, "kind": podapi.KIND_TRIGGER, "metadata": {"name": "now"},
               "spec": {"targetPod": "embed-0", "policyName": "embed", "containers": ["main"]},
               "status": {"snapshotCreated": {"name": "now-1a2b3c4d"},
                          "conditions": [{"type": "Triggered", "status": "True", "reason": "Complete",
                                          "message": "PodSnapshot default/now-1a2b3c4d is Ready",
                                          "lastTransitionTime": "2026-12-02T12:00:00Z"}]}}
    config = {"apiVersion": podapi.API_VERSION, "kind": podapi.KIND_STORAGE_CONFIG, "metadata": {"name": "shared-s3"},
              "spec": {"storeUrl": "s3://snapshots/prod", "options": {"endpointUrl": "http://minio:9000",
                                                                      "region": "eu-1", "concurrency": 8},
                       "credentialsSecretRef": {"name": "s3", "namespace": "warmstart",
                                                "keys": {"accessKeyId": "id", "secretAccessKey": "key"}}}}
    assert violations(schema_of(podapi.KIND_TRIGGER), trigger) == []
    assert violations(schema_of(podapi.KIND_STORAGE_CONFIG), config) == []
    assert violations(schema_of(podapi.KIND_TRIGGER), {"spec": {}}) == [".spec.targetPod: required"]
    assert violations(schema_of(podapi.KIND_STORAGE_CONFIG), {"spec": {"storeUrl": "relative"}}) != []
    policy = example_policy()
    del policy["spec"]["storeUrl"]
    policy["spec"]["storageConfigName"] = "shared-s3"
    assert violations(schema_of(podapi.KIND_POLICY), policy) == []
    root_rules = {k: crds()[k]["spec"]["versions"][0]["schema"]["openAPIV3Schema"].get("x-kubernetes-validations")
                  for k in (podapi.KIND_POLICY, podapi.KIND_STORAGE_CONFIG)}
    assert "has(self.spec.storeUrl) != has(self.spec.storageConfigName)" in root_rules[podapi.KIND_POLICY][0]["rule"]
    assert "credentialsSecretRef" in root_rules[podapi.KIND_STORAGE_CONFIG][0]["rule"]
    status = schema_of(podapi.KIND_SNAPSHOT)["properties"]["status"]["properties"]
    assert {"lastAccessTime", "attempts", "lastAttemptTime", "lastError"} <= set(status)


def test_emptydir_mounts_are_where_the_container_mounts_the_pod_s_emptydir_volumes() -> None:
    spec = {"volumes": [{"name": "cache", "emptyDir": {}}, {"name": "shm", "emptyDir": {"medium": "Memory"}},
                        {"name": podapi.CONTROL_VOLUME, "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "c"}},
                        "not a volume"],
            "containers": [{"name": "main", "volumeMounts": [
                {"name": "cfg", "mountPath": "/etc/app"}, {"name": "shm", "mountPath": "/dev/shm"},
                {"name": podapi.CONTROL_VOLUME, "mountPath": "/snapshot-control"},
                {"name": "cache", "mountPath": "/root/.cache"},
                {"name": "cache", "mountPath": "/tmp/part", "subPath": "part"}, {"name": "cache"}]},
                {"name": "side", "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}]}
    assert podapi.emptydir_mounts(spec, "main") == ["/dev/shm", "/root/.cache"]
    assert podapi.emptydir_mounts(spec, "side") == ["/cache"]
    assert podapi.emptydir_mounts(spec, "absent") == [] and podapi.emptydir_mounts(None, "main") == []
    skip = {"annotations": {podapi.ANN_SKIP_VOLUMES: "shm, other"}}  # weights an init container fetches again
    assert podapi.emptydir_mounts(spec, "main", skip) == ["/root/.cache"]
    assert podapi.emptydir_mounts(spec, "main", {"annotations": "not a mapping"}) == ["/dev/shm", "/root/.cache"]
