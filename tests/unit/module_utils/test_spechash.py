"""The condensed pod-spec hash (plugins/module_utils/k8s/_spechash.py): field by field, defaults, the contract stripped."""
from __future__ import annotations

import copy
import re
from typing import Any, Callable, Dict

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podbuild as podbuild
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _spechash as spechash
from tests.support.pod_fixtures import deployment, pod, read_back, template

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
    assert set(CONTAINER_CHANGES) | {"name"} == set(spechash.CONTAINER_FIELDS)
    assert set(POD_CHANGES) == set(spechash.POD_FIELDS)
    fields = spechash.pod_spec_fields(template())
    expected = {f"{kind}[{name}].{field}" for kind, names in (("containers", ("main", "sidecar")), ("initContainers", ("setup",)))
                for name in names for field in spechash.CONTAINER_FIELDS}
    expected |= set(spechash.POD_FIELDS) | {"labels[batch.kubernetes.io/job-completion-index]"}
    assert set(fields) == expected
    assert all(re.match(r"^[0-9a-f]{64}$", digest) for digest in fields.values())
    assert re.match(r"^[0-9a-f]{64}$", spechash.pod_spec_hash(template()))


@pytest.mark.parametrize("kind, index, name", [("containers", 0, "main"), ("containers", 1, "sidecar"),
                                               ("initContainers", 0, "setup")])
@pytest.mark.parametrize("field", sorted(CONTAINER_CHANGES))
def test_each_container_field_changes_the_hash(kind: str, index: int, name: str, field: str) -> None:
    base = template()
    changed = template()
    changed["spec"][kind][index][field] = copy.deepcopy(CONTAINER_CHANGES[field])
    assert spechash.pod_spec_hash(changed) != spechash.pod_spec_hash(base)
    assert spechash.diff_fields(spechash.pod_spec_fields(base), spechash.pod_spec_fields(changed)) == [f"{kind}[{name}].{field}"]


@pytest.mark.parametrize("field", sorted(POD_CHANGES))
def test_each_pod_field_changes_the_hash(field: str) -> None:
    base = template()
    changed = template()
    changed["spec"][field] = copy.deepcopy(POD_CHANGES[field])
    assert spechash.pod_spec_hash(changed) != spechash.pod_spec_hash(base)
    assert spechash.diff_fields(spechash.pod_spec_fields(base), spechash.pod_spec_fields(changed)) == [field]


def test_the_job_completion_index_label_changes_the_hash() -> None:
    base = template()
    changed = template()
    changed["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] = "3"
    other = copy.deepcopy(changed)
    other["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] = "4"
    assert spechash.diff_fields(spechash.pod_spec_fields(base), spechash.pod_spec_fields(changed)) == ["labels[batch.kubernetes.io/job-completion-index]"]
    assert spechash.diff_fields(spechash.pod_spec_fields(changed), spechash.pod_spec_fields(other)) == ["labels[batch.kubernetes.io/job-completion-index]"]
    assert len({spechash.pod_spec_hash(base), spechash.pod_spec_hash(changed), spechash.pod_spec_hash(other)}) == 3


def test_renaming_or_adding_a_container_changes_the_hash() -> None:
    base = template()
    renamed = template()
    renamed["spec"]["containers"][1]["name"] = "proxy"
    diff = spechash.diff_fields(spechash.pod_spec_fields(base), spechash.pod_spec_fields(renamed))
    assert "containers[sidecar].name" in diff and "containers[proxy].name" in diff
    assert all(path.startswith(("containers[sidecar].", "containers[proxy].")) for path in diff)
    assert spechash.describe_diff(spechash.pod_spec_fields(renamed), spechash.pod_spec_fields(base)) == [
        "containers[proxy] (only in the pod)", "containers[sidecar] (only in the snapshot)"]
    renamed_volume = template()
    renamed_volume["spec"]["volumes"][0]["name"] = "cache"
    assert spechash.diff_fields(spechash.pod_spec_fields(base), spechash.pod_spec_fields(renamed_volume)) == ["volumes"]


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
    assert spechash.pod_spec_fields(changed) == spechash.pod_spec_fields(template())
    assert spechash.pod_spec_hash(changed) == spechash.pod_spec_hash(template())


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
    assert spechash.pod_spec_hash(changed) == spechash.pod_spec_hash(template())


def test_lifecycle_http_scheme_default_and_host_port_under_host_network() -> None:
    plain = template()
    plain["spec"]["containers"][0]["lifecycle"] = {"preStop": {"httpGet": {"path": "/quit", "port": 8080}}}
    explicit = copy.deepcopy(plain)
    explicit["spec"]["containers"][0]["lifecycle"]["preStop"]["httpGet"]["scheme"] = "HTTP"
    assert spechash.pod_spec_hash(plain) == spechash.pod_spec_hash(explicit)
    host = copy.deepcopy(plain)
    host["spec"]["hostNetwork"] = True
    with_port = copy.deepcopy(host)
    with_port["spec"]["containers"][0]["ports"][0]["hostPort"] = 8080
    assert spechash.pod_spec_hash(host) == spechash.pod_spec_hash(with_port)
    with_port["spec"]["containers"][0]["ports"][0]["hostPort"] = 18080
    assert spechash.diff_fields(spechash.pod_spec_fields(host), spechash.pod_spec_fields(with_port)) == ["containers[main].ports"]


def test_false_is_not_absent_where_the_api_keeps_it() -> None:
    changed = template()
    changed["spec"]["automountServiceAccountToken"] = False
    assert spechash.diff_fields(spechash.pod_spec_fields(template()), spechash.pod_spec_fields(changed)) == ["automountServiceAccountToken"]
    changed = template()
    changed["spec"]["containers"][0]["securityContext"] = {"privileged": False}
    assert spechash.diff_fields(spechash.pod_spec_fields(template()), spechash.pod_spec_fields(changed)) == ["containers[main].securityContext"]


def test_a_pod_read_back_from_the_api_hashes_like_its_template() -> None:
    back = read_back(template())
    assert back["spec"]["volumes"][-1]["name"].startswith("kube-api-access-")
    assert spechash.pod_spec_fields(back) == spechash.pod_spec_fields(template())
    assert spechash.pod_spec_hash(back) == spechash.pod_spec_hash(template()) == spechash.pod_spec_hash(deployment())
    # a user's own projected volume is hashed
    own = template()
    own["spec"]["volumes"].append({"name": "kube-api-access-mine0", "secret": {"secretName": "s"}})
    assert spechash.diff_fields(spechash.pod_spec_fields(template()), spechash.pod_spec_fields(own)) == ["volumes"]


def test_the_restore_contract_does_not_change_the_hash() -> None:
    for kwargs in ({}, {"container_map": "main=main,main=sidecar", "skip_compat_check": True}, {"startup_probe": False}):
        built = podbuild.build(template(), "embed-abc", **kwargs)
        assert built != template()
        assert spechash.pod_spec_fields(built) == spechash.pod_spec_fields(template())
        assert spechash.pod_spec_hash(read_back(built)) == spechash.pod_spec_hash(template())
    # the source pod had its own control dir (any volume source) and already ran with the seccomp profile
    source = template()
    source["spec"]["volumes"].append({"name": "snapshot-control", "hostPath": {"path": "/srv/ctl/embed-0"}})
    source["spec"]["containers"][0]["volumeMounts"].append({"name": "snapshot-control", "mountPath": "/snapshot-control"})
    source["spec"]["securityContext"] = {"seccompProfile": {"type": "Localhost", "localhostProfile": "warmstart/block-iouring.json"}}
    assert spechash.pod_spec_hash(source) == spechash.pod_spec_hash(template())
    # but a real change of the template still shows through the restore pod
    changed = template()
    changed["spec"]["containers"][0]["args"] = ["--port", "9999"]
    assert spechash.diff_fields(spechash.pod_spec_fields(podbuild.build(changed, "embed-abc")), spechash.pod_spec_fields(template())) == [
        "containers[main].args"]


def test_an_inert_pod_without_recorded_entrypoint_hashes_its_inert_command() -> None:
    inert = template()
    for container in inert["spec"]["containers"]:
        container["command"] = list(podapi.INERT_COMMAND)
        container.pop("args", None)
    diff = spechash.diff_fields(spechash.pod_spec_fields(inert), spechash.pod_spec_fields(template()))
    assert diff == ["containers[main].args", "containers[main].command", "containers[sidecar].command"]


def test_pod_spec_fields_accepts_pod_template_workload_and_bare_spec() -> None:
    expected = spechash.pod_spec_fields(template())
    assert spechash.pod_spec_fields(pod()) == expected
    assert spechash.pod_spec_fields(deployment()) == expected
    bare = spechash.pod_spec_fields(template()["spec"])
    assert bare == expected  # no job index label in the template either
    assert spechash.diff_fields({"a": "1", "b": "2"}, {"b": "3", "c": "4"}) == ["a", "b", "c"]
    assert spechash.diff_fields(expected, dict(expected)) == []
