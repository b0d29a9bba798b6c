"""The restore_template filter: workload manifests whose pod templates become restore templates
(plugins/filter/restore_template.py)."""
from __future__ import annotations

import copy
from typing import Any, Dict

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.warmstart.snapshot.plugins.filter.restore_template import FilterModule, restore_template
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _spechash as spechash

OWNER = [{"apiVersion": "example.com/v1", "kind": "InferenceService", "name": "embed", "uid": "1234",
          "controller": True, "blockOwnerDeletion": True}]


def template(name: str = "main", **extra: Any) -> Dict[str, Any]:
    return {"metadata": {"labels": {"app": "embed"}},
            "spec": {"containers": [dict({"name": name, "image": "registry.local/embed:1.0",
                                          "command": ["python", "/app/server.py"]}, **extra)]}}


def workload(kind: str, api: str = "apps/v1") -> Dict[str, Any]:
    return {"apiVersion": api, "kind": kind,
            "metadata": {"name": "embed", "namespace": "ml", "labels": {"team": "a"}, "ownerReferences": OWNER},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "embed"}}, "template": template()}}


def lws(leader: bool = True) -> Dict[str, Any]:
    doc: Dict[str, Any] = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                           "metadata": {"name": "vllm", "namespace": "ml", "ownerReferences": OWNER},
                           "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 4, "workerTemplate": template("worker")}}}
    if leader:
        doc["spec"]["leaderWorkerTemplate"]["leaderTemplate"] = template("leader")
    return doc


def same_except_template(before: Dict[str, Any], after: Dict[str, Any], *path: str) -> None:
    """``after`` equals ``before`` everywhere but at the template ``path``."""
    a, b = copy.deepcopy(before), copy.deepcopy(after)
    for doc in (a, b):
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        parent.pop(path[-1])
    assert a == b


@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet", "ReplicaSet", "DaemonSet"])
def test_a_controllers_template_becomes_a_restore_template_and_nothing_else_changes(kind: str) -> None:
    before = workload(kind)
    kept = copy.deepcopy(before)
    out = restore_template(before, "embed-a")
    assert before == kept, "the input is not changed"
    same_except_template(before, out, "spec", "template")
    assert out["metadata"]["ownerReferences"] == OWNER
    tpl = out["spec"]["template"]
    assert pc.validate(tpl) == [] and tpl["metadata"]["annotations"][podapi.ANN_RESTORE_FROM] == "embed-a"
    assert tpl["metadata"]["labels"] == {"app": "embed"}
    assert tpl["spec"]["containers"][0]["command"] == podapi.INERT_COMMAND
    assert spechash.pod_spec_hash(tpl) == spechash.pod_spec_hash(template()), "pods restore from snapshots of the original"
    assert restore_template(out, "embed-a") == out


def test_a_leaderworkerset_gets_both_templates_and_workers_alone_without_a_leader() -> None:
    out = restore_template(lws(), None, entrypoint="standby", fallback="cold_start", policy="vllm")
    group = out["spec"]["leaderWorkerTemplate"]
    assert out["spec"]["replicas"] == 2 and group["size"] == 4 and out["metadata"]["ownerReferences"] == OWNER
    for key, container in (("leaderTemplate", "leader"), ("workerTemplate", "worker")):
        tpl = group[key]
        assert pc.validate(tpl) == []
        assert pc.restore_mode(tpl) == {"restore_from": None, "select": True, "policy": "vllm", "fallback": "cold-start"}
        (c,) = tpl["spec"]["containers"]
        assert c["name"] == container and c["command"] == ["python", "/app/server.py"]
        assert c["startupProbe"]["exec"]["command"] == podapi.COLD_START_PROBE_COMMAND
    assert restore_template(out, None, entrypoint="standby", fallback="cold-start", policy="vllm") == out
    assert restore_template(out, None, policy="vllm") == out, "standby and the fallback are read back"
    workers = restore_template(lws(leader=False), "vllm-a")
    assert "leaderTemplate" not in workers["spec"]["leaderWorkerTemplate"]
    assert pc.validate(workers["spec"]["leaderWorkerTemplate"]["workerTemplate"]) == []


def test_other_shapes_pod_template_cronjob_pod_and_bare_template() -> None:
    cron = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "c", "namespace": "ml"},
            "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template()}}}}
    assert pc.validate(restore_template(cron, "s")["spec"]["jobTemplate"]["spec"]["template"]) == []
    podtemplate = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t", "namespace": "ml"},
                   "template": template()}
    assert pc.validate(restore_template(podtemplate, "s")["template"]) == []
    bare = restore_template(template(), "s", container_map="main=main", skip_compat_check=True)
    assert pc.validate(bare) == [] and bare["metadata"]["annotations"][podapi.ANN_SKIP_COMPAT] == "true"
    pod = dict(template(), apiVersion="v1", kind="Pod", metadata={"name": "p", "namespace": "ml"})
    assert pc.validate(restore_template(pod, "s", startup_probe=False)) == []
    assert "startupProbe" not in restore_template(pod, "s", startup_probe=False)["spec"]["containers"][0]
    assert FilterModule().filters() == {"restore_template": restore_template}


def test_refusals_name_the_controller_the_template_and_every_reason() -> None:
    taken = workload("Deployment")
    taken["spec"]["template"]["metadata"]["annotations"] = {podapi.ANN_RESTORE_FROM: "other"}
    taken["spec"]["template"]["spec"]["volumes"] = [{"name": "snapshot-control", "hostPath": {"path": "/x"}}]
    with pytest.raises(AnsibleFilterError) as err:
        restore_template(taken, "embed-a")
    text = str(err.value)
    assert text.startswith("restore_template: Deployment ml/embed cannot restore its pods from 'embed-a': ")
    assert "spec.template: annotation snapshot.warmstart.io/restore-from of pod template is already 'other'" in text
    assert "volume 'snapshot-control' of pod template is hostPath, not an emptyDir" in text
    bad = lws()
    bad["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["startupProbe"] = {
        "httpGet": {"path": "/", "port": 80}}
    with pytest.raises(AnsibleFilterError, match="LeaderWorkerSet ml/vllm .*spec.leaderWorkerTemplate.workerTemplate: "
                                                 "container 'worker' of pod template already has another startupProbe"):
        restore_template(bad, "vllm-a")
    with pytest.raises(AnsibleFilterError, match="fallback cold-start needs entrypoint standby"):
        restore_template(workload("StatefulSet"), "s", fallback="cold-start", entrypoint="inert")
    with pytest.raises(AnsibleFilterError, match="Service ml/embed is not a kind whose pod template it knows"):
        restore_template(dict(workload("Service", "v1"), spec={"ports": []}), "s")
    with pytest.raises(AnsibleFilterError, match="Deployment ml/embed has no pod template at spec.template"):
        restore_template(dict(workload("Deployment"), spec={"replicas": 1}), "s")
    with pytest.raises(AnsibleFilterError, match="expected a manifest"):
        restore_template(["not", "a", "manifest"], "s")
