"""Building a restore pod (plugins/module_utils/k8s/_podbuild.py): what build adds, what it refuses, its forms."""
from __future__ import annotations

import copy
import json
from typing import Any, Callable, Dict

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podbuild as podbuild
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _spechash as spechash
from tests.support import k8s_schemas
from tests.support.pod_fixtures import append_path, deployment, pod, restore_pod, set_path, template

PROFILE = {"type": "Localhost", "localhostProfile": podapi.SECCOMP_PROFILE}


# --- build -------------------------------------------------------------------------

def test_build_on_a_pod_adds_the_whole_contract() -> None:
    out = restore_pod()
    ann = out["metadata"]["annotations"]
    assert ann[podapi.ANN_RESTORE_FROM] == "embed-abc"
    assert podapi.ANN_CONTAINER_MAP not in ann and podapi.ANN_SKIP_COMPAT not in ann
    assert json.loads(ann[podapi.ANN_ORIGINAL_ENTRYPOINT]) == {
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
    out = podbuild.build(source, "embed-abc", container_map="main=main", skip_compat_check=True)
    assert out["kind"] == "Deployment" and out["spec"]["replicas"] == 2
    assert out["spec"]["selector"] == source["spec"]["selector"]
    tpl = out["spec"]["template"]
    assert tpl["metadata"]["annotations"][podapi.ANN_CONTAINER_MAP] == "main=main"
    assert tpl["metadata"]["annotations"][podapi.ANN_SKIP_COMPAT] == "true"
    assert "startupProbe" in tpl["spec"]["containers"][0] and "startupProbe" not in tpl["spec"]["containers"][1]
    assert pc.validate(tpl) == [] and pc.validate(out) == []
    bare = podbuild.build(template(), "embed-abc")
    assert bare == podbuild.build(deployment(), "embed-abc")["spec"]["template"]
    assert pc.validate(bare) == []


def test_build_rejects_a_bare_pod_spec() -> None:
    with pytest.raises(podapi.ContractError, match="bare PodSpec has no metadata"):
        podbuild.build(template()["spec"], "embed-abc")


@pytest.mark.parametrize("kwargs", [{}, {"container_map": "main=main,main=sidecar"}, {"skip_compat_check": True},
                                    {"startup_probe": False}, {"seccomp_profile": "warmstart/block-iouring.json"}])
def test_build_is_idempotent_and_validates(kwargs: Dict[str, Any]) -> None:
    once = podbuild.build(pod(), "embed-abc", **kwargs)
    assert podbuild.build(once, "embed-abc", **kwargs) == once
    assert podbuild.build(podbuild.build(deployment(), "embed-abc", **kwargs), "embed-abc", **kwargs) == podbuild.build(deployment(), "embed-abc", **kwargs)
    assert pc.validate(once, seccomp_profile=kwargs.get("seccomp_profile", podapi.SECCOMP_PROFILE)) == []


def test_build_keeps_a_map_already_on_the_pod_and_rebuild_without_arguments_is_a_no_op() -> None:
    once = podbuild.build(pod(), "embed-abc", container_map="main=sidecar", skip_compat_check=True)
    assert podbuild.build(once, "embed-abc") == once
    assert "startupProbe" in once["spec"]["containers"][1] and "startupProbe" not in once["spec"]["containers"][0]


def test_build_does_not_mutate_its_input() -> None:
    for source in (pod(), deployment(), restore_pod()):
        before = copy.deepcopy(source)
        out = podbuild.build(source, "embed-abc", container_map="main=main", skip_compat_check=True)
        assert source == before
        out["spec"].setdefault("extra", 1)
        assert source == before


def test_build_startup_probe_only_on_destinations_and_optional() -> None:
    out = podbuild.build(pod(), "embed-abc", container_map={"main": ["sidecar"]})
    assert [("startupProbe" in c) for c in out["spec"]["containers"]] == [False, True]
    out = podbuild.build(pod(), "embed-abc", startup_probe=False)
    assert not any("startupProbe" in c for c in out["spec"]["containers"])


def test_build_accepts_contract_pieces_already_in_place() -> None:
    source = pod()
    spec = source["spec"]
    spec["volumes"].append({"name": "snapshot-control", "emptyDir": {"medium": "Memory"}})
    spec["containers"][0]["volumeMounts"].append({"name": "snapshot-control", "mountPath": "/snapshot-control/", "subPath": "main"})
    spec["containers"][0]["env"].append({"name": "SNAPSHOT_CONTROL_DIR", "value": "/snapshot-control"})
    spec["containers"][0]["startupProbe"] = dict(podbuild._startup_probe(), successThreshold=1)
    spec["securityContext"] = {"runAsNonRoot": True, "seccompProfile": dict(PROFILE)}
    out = podbuild.build(source, "embed-abc")
    main = out["spec"]["containers"][0]
    assert [m["name"] for m in main["volumeMounts"]].count("snapshot-control") == 1
    assert [e["name"] for e in main["env"]].count("SNAPSHOT_CONTROL_DIR") == 1
    assert [v["name"] for v in out["spec"]["volumes"]].count("snapshot-control") == 1
    assert out["spec"]["securityContext"] == {"runAsNonRoot": True, "seccompProfile": PROFILE}
    assert pc.validate(out) == []


CONFLICTS = [
    ("restore-from", set_path(["metadata", "annotations", podapi.ANN_RESTORE_FROM], "other-snap"), {},
     "annotation snapshot.warmstart.io/restore-from of pod default/embed-0 is already 'other-snap', not 'embed-abc'"),
    ("container map", set_path(["metadata", "annotations", podapi.ANN_CONTAINER_MAP], "main=sidecar"), {"container_map": "main=main"},
     "annotation snapshot.warmstart.io/restore-container-map of pod default/embed-0 is already 'main=sidecar', not 'main=main'"),
    ("bad map annotation", set_path(["metadata", "annotations", podapi.ANN_CONTAINER_MAP], "main"), {},
     "annotation snapshot.warmstart.io/restore-container-map of pod default/embed-0 is invalid"),
    ("skip compat false", set_path(["metadata", "annotations", podapi.ANN_SKIP_COMPAT], "false"), {"skip_compat_check": True},
     "annotation snapshot.warmstart.io/snapshot-skip-compat-check of pod default/embed-0 is already 'false'"),
    ("volume not emptyDir", append_path(["spec", "volumes"], {"name": "snapshot-control", "hostPath": {"path": "/srv/ctl"}}), {},
     "volume 'snapshot-control' of pod default/embed-0 is hostPath, not an emptyDir"),
    ("other volume at the mount", append_path(["spec", "containers", 0, "volumeMounts"], {"name": "data", "mountPath": "/snapshot-control"}), {},
     "container 'main' of pod default/embed-0 already mounts volume 'data' at /snapshot-control"),
    ("other subPath", append_path(["spec", "containers", 1, "volumeMounts"],
                                  {"name": "snapshot-control", "mountPath": "/snapshot-control", "subPath": "main"}), {},
     "container 'sidecar' of pod default/embed-0 mounts volume 'snapshot-control' with subPath 'main', not 'sidecar'"),
    ("mounted elsewhere", append_path(["spec", "containers", 0, "volumeMounts"], {"name": "snapshot-control", "mountPath": "/ctl"}), {},
     "container 'main' of pod default/embed-0 mounts volume 'snapshot-control' at '/ctl', not at /snapshot-control"),
    ("env value", append_path(["spec", "containers", 0, "env"], {"name": "SNAPSHOT_CONTROL_DIR", "value": "/tmp/ctl"}), {},
     "container 'main' of pod default/embed-0 sets env SNAPSHOT_CONTROL_DIR='/tmp/ctl', not /snapshot-control"),
    ("env valueFrom", append_path(["spec", "containers", 1, "env"],
                                  {"name": "SNAPSHOT_CONTROL_DIR", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}), {},
     "container 'sidecar' of pod default/embed-0 sets env SNAPSHOT_CONTROL_DIR from valueFrom"),
    ("startup probe", set_path(["spec", "containers", 0, "startupProbe"], {"httpGet": {"path": "/", "port": 8080}}), {},
     "container 'main' of pod default/embed-0 already has another startupProbe"),
    ("container seccomp", set_path(["spec", "containers", 1, "securityContext"], {"seccompProfile": {"type": "RuntimeDefault"}}), {},
     "container 'sidecar' of pod default/embed-0 has its own seccompProfile"),
    ("pod seccomp", set_path(["spec", "securityContext"], {"seccompProfile": {"type": "Unconfined"}}), {},
     "pod default/embed-0 already has seccompProfile {'type': 'Unconfined'}"),
    ("unknown destination", lambda doc: None, {"container_map": "main=web"},
     "container map destination 'web' (from 'main') is not a container of pod default/embed-0 (containers: main, sidecar)"),
    ("no containers", set_path(["spec", "containers"], []), {}, "pod default/embed-0 has no containers"),
    ("unnamed container", set_path(["spec", "containers", 1, "name"], None), {}, "container #1 of pod default/embed-0 has no valid name"),
    ("bad snapshot name", lambda doc: None, {"snapshot_name": "Embed_ABC"},
     "snapshot name 'Embed_ABC' is not a valid PodSnapshot name"),
    ("recorded entrypoint differs", set_path(["metadata", "annotations", podapi.ANN_ORIGINAL_ENTRYPOINT], '{"main": {"command": ["x"]}}'), {},
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
    with pytest.raises(podapi.ContractError) as err:
        podbuild.build(source, name, **kwargs)
    assert any(message in reason for reason in err.value.reasons), err.value.reasons
    assert str(err.value).startswith("cannot make pod default/embed-0 a restore pod")
    assert source == before


def test_build_reports_every_conflict_at_once() -> None:
    source = pod()
    for _label, change, _kwargs, _message in CONFLICTS[:13]:
        if _label not in ("container map", "skip compat false", "bad map annotation"):
            change(source)
    with pytest.raises(podapi.ContractError) as err:
        podbuild.build(source, "embed-abc")
    assert len(err.value.reasons) >= 10


# --- standby-aware entrypoint ----------------------------------------------------------------

def test_build_standby_keeps_the_commands_and_sets_the_standby_env() -> None:
    doc = restore_pod(entrypoint="standby")
    main, sidecar = doc["spec"]["containers"]
    assert (main["command"], main["args"]) == (["python3", "/app/server.py"], ["--port", "8080"])
    assert "command" not in sidecar
    for container in (main, sidecar):
        assert container["env"][-1] == {"name": "SNAPSHOT_RESTORE_STANDBY", "value": "1"}
    assert podapi.ANN_ORIGINAL_ENTRYPOINT not in doc["metadata"]["annotations"]
    assert pc.validate(doc) == [] and pc.entrypoint_forms(doc) == {"main": "standby", "sidecar": "standby"}
    assert podbuild.build(doc, "embed-abc", entrypoint="standby") == doc
    assert spechash.pod_spec_hash(doc) == spechash.pod_spec_hash(pod())
    assert pc.entrypoint_forms(restore_pod()) == {"main": "inert", "sidecar": "inert"}


def test_build_standby_refusals() -> None:
    with pytest.raises(podapi.ContractError) as inert_first:
        podbuild.build(restore_pod(), "embed-abc", entrypoint="standby")
    assert len(inert_first.value.reasons) == 2 and "was made inert by an earlier build" in inert_first.value.reasons[0]
    off = pod()
    off["spec"]["containers"][0]["env"].append({"name": "SNAPSHOT_RESTORE_STANDBY", "value": "0"})
    with pytest.raises(podapi.ContractError) as disabled:
        podbuild.build(off, "embed-abc", entrypoint="standby")
    assert disabled.value.reasons == ["container 'main' of pod default/embed-0 sets env SNAPSHOT_RESTORE_STANDBY='0', "
                                      "which does not ask its entrypoint to stay inert (true values: 1, true, yes, on)"]
    with pytest.raises(podapi.ContractError, match="entrypoint 'sleepy' is not one of inert, standby"):
        podbuild.build(pod(), "embed-abc", entrypoint="sleepy")


# --- select at restore and the cold-start fallback (issue 21) -----------------------------------------

def test_build_without_a_snapshot_selects_at_restore() -> None:
    built = podbuild.build(template(), None, restore_policy="embed")
    annotations = built["metadata"]["annotations"]
    assert podapi.ANN_RESTORE_FROM not in annotations
    assert (annotations[podapi.ANN_RESTORE_SELECT], annotations[podapi.ANN_RESTORE_POLICY]) == ("true", "embed")
    assert pc.validate(built) == [] and podbuild.build(built, None, restore_policy="embed") == built
    assert pc.restore_mode(built) == {"restore_from": None, "select": True, "policy": "embed", "fallback": None}
    assert pc.is_restore_pod(built) and not pc.is_restore_pod(template())
    assert spechash.pod_spec_hash(built) == spechash.pod_spec_hash(template())
    # the agent pins the one it selects: the pod then has both, and is still valid
    pinned = copy.deepcopy(built)
    pinned["metadata"]["annotations"][podapi.ANN_RESTORE_FROM] = "embed-a"
    assert pc.validate(pinned) == [] and pc.restore_mode(pinned)["restore_from"] == "embed-a"


def test_select_and_pin_do_not_mix() -> None:
    pinned = podbuild.build(template(), "embed-a")
    with pytest.raises(podapi.ContractError) as err:
        podbuild.build(pinned, None)
    assert err.value.reasons == ["annotation snapshot.warmstart.io/restore-from of pod template already pins 'embed-a'; "
                                 "a snapshot selected at restore needs a template without it"]
    with pytest.raises(podapi.ContractError) as err:
        podbuild.build(podbuild.build(template(), None), "embed-a")
    assert "selects its snapshot at restore" in err.value.reasons[0]
    with pytest.raises(podapi.ContractError) as err:
        podbuild.build(template(), "embed-a", restore_policy="embed")
    assert err.value.reasons == ["restore_policy 'embed' applies only to a snapshot selected at restore, not to one "
                                 "pinned ('embed-a')"]
    with pytest.raises(podapi.ContractError) as err:
        podbuild.build(podbuild.build(template(), None, restore_policy="a"), None, restore_policy="b")
    assert "restore-policy of pod template is already 'a', not 'b'" in err.value.reasons[0]
    bad = podbuild.build(template(), None)
    bad["metadata"]["annotations"][podapi.ANN_RESTORE_SELECT] = "maybe"
    assert "annotation snapshot.warmstart.io/restore-select of pod template is 'maybe', not 'true'" in pc.validate(bad)


def test_a_cold_start_fallback_uses_the_standby_entrypoint_and_a_probe_that_accepts_cold_start() -> None:
    built = podbuild.build(template(), "embed-a", entrypoint=podapi.ENTRYPOINT_STANDBY, fallback=podapi.FALLBACK_COLD_START)
    assert built["metadata"]["annotations"][podapi.ANN_RESTORE_FALLBACK] == "cold-start"
    main = built["spec"]["containers"][0]
    assert main["command"] == ["python3", "/app/server.py"] and main["args"] == ["--port", "8080"]
    assert {"name": podapi.STANDBY_ENV, "value": "1"} in main["env"]
    assert main["startupProbe"]["exec"]["command"] == [
        "/bin/sh", "-c", "cat /snapshot-control/restore-complete || cat /snapshot-control/cold-start"]
    assert pc.validate(built) == [] and pc.restore_mode(built)["fallback"] == "cold-start"
    # idempotent, also without repeating the fallback (the annotation says it)
    assert podbuild.build(built, "embed-a", entrypoint="standby", fallback="cold-start") == built
    assert podbuild.build(built, "embed-a", entrypoint="standby") == built
    opted_out = podbuild.build(template(), "embed-a", fallback=podapi.FALLBACK_NONE)
    assert opted_out["metadata"]["annotations"][podapi.ANN_RESTORE_FALLBACK] == "none"
    assert opted_out["spec"]["containers"][0]["startupProbe"]["exec"]["command"] == podapi.STARTUP_PROBE_COMMAND


def test_the_cold_start_fallback_refusals() -> None:
    with pytest.raises(podapi.ContractError) as err:
        podbuild.build(template(), "embed-a", fallback="cold-start")
    assert err.value.reasons == ["fallback cold-start needs entrypoint standby: an inert placeholder cannot start its "
                                 "app cold (it runs no entrypoint of its own)"]
    with pytest.raises(podapi.ContractError) as err:
        podbuild.build(template(), "embed-a", entrypoint="standby", fallback="warm-start")
    assert err.value.reasons == ["fallback 'warm-start' is not one of none, cold-start"]
    plain = podbuild.build(template(), "embed-a", entrypoint="standby")
    with pytest.raises(podapi.ContractError) as err:
        podbuild.build(plain, "embed-a", entrypoint="standby", fallback="cold-start")
    assert "container 'main' of pod template already has another startupProbe" in err.value.reasons
    with pytest.raises(podapi.ContractError) as err:
        podbuild.build(podbuild.build(template(), "embed-a", fallback="none"), "embed-a", entrypoint="standby", fallback="cold-start")
    assert "annotation snapshot.warmstart.io/restore-fallback of pod template is already 'none', not 'cold-start'" in \
        err.value.reasons
    inert = podbuild.build(template(), "embed-a")
    inert["metadata"]["annotations"][podapi.ANN_RESTORE_FALLBACK] = "cold-start"
    problems = pc.validate(inert)
    assert any("container 'main' of pod template is inert: annotation snapshot.warmstart.io/restore-fallback "
               "cold-start needs the standby entrypoint" in p for p in problems)
    inert["metadata"]["annotations"][podapi.ANN_RESTORE_FALLBACK] = "sometimes"
    assert ("annotation snapshot.warmstart.io/restore-fallback of pod template is 'sometimes', not one of none, "
            "cold-start") in pc.validate(inert)


# --- what build renders is a valid Kubernetes object ------------------------------------------------

def _controller(kind: str, api_version: str, **spec: Any) -> Dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": "embed", "namespace": "default"},
            "spec": dict(spec, template=template())}


@pytest.mark.parametrize("source", [
    pod(),
    deployment(),
    _controller("StatefulSet", "apps/v1", serviceName="embed", selector={"matchLabels": {"app": "embed"}}),
    _controller("ReplicaSet", "apps/v1", selector={"matchLabels": {"app": "embed"}}),
    _controller("DaemonSet", "apps/v1", selector={"matchLabels": {"app": "embed"}}),
    _controller("Job", "batch/v1"),
    {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "embed", "namespace": "default"},
     "spec": {"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": template()}}}},
], ids=lambda s: s["kind"])
@pytest.mark.parametrize("fallback", [None, "cold-start"])
def test_every_restore_object_build_renders_passes_the_kubernetes_schema(source: Dict[str, Any], fallback: Any) -> None:
    """The source and what build makes of it, against Kubernetes' own schema (unknown fields are errors)."""
    if source["kind"] == "Job":
        source["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    if source["kind"] == "CronJob":
        source["spec"]["jobTemplate"]["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    assert k8s_schemas.known(source["kind"], source["apiVersion"])
    before = k8s_schemas.check(source)
    assert before.unknown == [] and before.invalid == [], "the fixture itself is not a valid object"
    kwargs: Dict[str, Any] = {"fallback": fallback} if fallback else {}
    if fallback:
        kwargs["entrypoint"] = "standby"
    out = podbuild.build(source, "embed-abc", container_map="main=main", **kwargs)
    problems = k8s_schemas.check(out)
    assert problems.unknown_paths() == [] and problems.invalid == [], problems
