"""pod_snapshot_trigger, pod_snapshot (state capturing / failed), pod_snapshot_info (storage config, last access)
and the restore_template filter in real ansible-playbook runs against the fake API server (issue 21)."""
from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

pytest.importorskip("kubernetes")

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi  # noqa: E402
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc  # noqa: E402
from tests.integration.ansible_run import REPO, Run, k8s_tasks, task_results  # noqa: E402
from tests.support import fake_apiserver as fake_server_module  # noqa: E402
from tests.support.fake_apiserver import FakeApiServer  # noqa: E402

fake_apiserver = fake_server_module.fake_apiserver  # the pytest fixture

CRDS = yaml.safe_load((REPO / "roles/k8s_crds/files/crds.yaml").read_text())["items"]
SECRET_VALUE = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"


@pytest.fixture(name="server")
def fixture_server(fake_apiserver: FakeApiServer) -> FakeApiServer:
    """The fake API server with the CRDs, a source pod embed-0, a storage config with its Secret and a policy."""
    for crd in CRDS:
        fake_apiserver.store.put("customresourcedefinitions", copy.deepcopy(crd), group="apiextensions.k8s.io")
    fake_apiserver.add_pod("embed-0", labels={"app": "embed"})
    fake_apiserver.store.put("secrets", {"metadata": {"name": "s3", "namespace": "warmstart"}, "data": {
        "AWS_ACCESS_KEY_ID": base64.b64encode(b"AKIAEXAMPLE").decode(),
        "AWS_SECRET_ACCESS_KEY": base64.b64encode(SECRET_VALUE.encode()).decode()}}, group="")
    fake_apiserver.store.put("podsnapshotstorageconfigs", {
        "metadata": {"name": "shared"}, "spec": {"storeUrl": "s3://snapshots/prod",
                                                 "options": {"endpointUrl": "http://minio:9000"},
                                                 "credentialsSecretRef": {"name": "s3", "namespace": "warmstart"}}},
        group=podapi.GROUP)
    fake_apiserver.store.put("podsnapshotpolicies", {
        "metadata": {"name": "embed", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "embed"}}, "storageConfigName": "shared",
                 "retentionConfig": {"lastAccessTimeout": "72h"}}}, group=podapi.GROUP)
    return fake_apiserver


def run_tasks(server: FakeApiServer, tmp_path: Path, tasks: List[Dict[str, Any]], *args: str) -> Run:
    return k8s_tasks(server.kubeconfig, tmp_path, tasks, *args)


results = task_results


def test_a_manual_trigger_request_attempts_and_the_policys_store(server: FakeApiServer, tmp_path: Path) -> None:
    server.store.put("podsnapshotmanualtriggers", {"metadata": {"name": "now", "namespace": "default"},
                                                   "spec": {"targetPod": "embed-0", "policyName": "embed"}},
                     group=podapi.GROUP)
    trigger = {"namespace": "default", "name": "now"}
    tasks = [
        {"name": "trigger (check)", "warmstart.snapshot.pod_snapshot_trigger": trigger, "check_mode": True},
        {"name": "trigger", "warmstart.snapshot.pod_snapshot_trigger": trigger},
        {"name": "claim", "warmstart.snapshot.pod_snapshot": {
            "namespace": "default", "name": "{{ trig.pod_snapshot_name }}",
            "state": "capturing", "max_attempts": 2}},
        {"name": "fail", "warmstart.snapshot.pod_snapshot": {
            "namespace": "default", "name": "{{ trig.pod_snapshot_name }}",
            "state": "failed", "failed_reason": "CheckpointFailed", "failed_message": "CRIU: boom", "max_attempts": 2}},
        {"name": "fail without a reason", "warmstart.snapshot.pod_snapshot": {
            "namespace": "default", "name": "x", "state": "failed"}, "ignore_errors": True},
        {"name": "where", "warmstart.snapshot.pod_snapshot_info": {"namespace": "default", "policy": "embed"}},
        {"name": "where with credentials", "no_log": True,
         "warmstart.snapshot.pod_snapshot_info": {"namespace": "default", "policy": "embed",
                                                  "include_credentials": True}},
        {"name": "keep the secret's length", "ansible.builtin.set_fact": {
            "secret_length": "{{ creds.store_options.secret_access_key | length }}"}},
    ]
    tasks[1]["register"] = "trig"
    tasks[6]["register"] = "creds"
    run = run_tasks(server, tmp_path, tasks)
    r = results(run)
    assert run.rc == 0, run.stderr[-3000:]
    assert r["trigger (check)"]["changed"] and r["trigger (check)"]["phase"] == "pending"
    name = r["trigger"]["pod_snapshot_name"]
    assert r["trigger"]["phase"] == "pending" and name.startswith("now-")
    request = server.store.get("podsnapshots", name, "default", group=podapi.GROUP)
    assert request["spec"]["policyName"] == "embed"
    assert (r["claim"]["claimed"], r["claim"]["attempt"], r["claim"]["max_attempts"]) == (True, 1, 2)
    assert (r["fail"]["final"], r["fail"]["attempt"]) == (False, 1)
    assert r["fail"]["status"]["lastError"] == "CheckpointFailed: CRIU: boom"
    assert "state=failed needs failed_reason" in r["fail without a reason"]["msg"]
    where = r["where"]
    assert (where["store_url"], where["storage_config"], where["credentials_secret"]) == (
        "s3://snapshots/prod", "shared", "warmstart/s3")
    assert where["store_options"] == {"endpoint_url": "http://minio:9000"}
    assert where["policy"]["store_url"] == "s3://snapshots/prod" and where["policy"]["storage_config"] == "shared"
    assert r["where with credentials"].get("censored")
    assert SECRET_VALUE not in run.stdout + run.stderr
    assert int(r["keep the secret's length"]["ansible_facts"]["secret_length"]) == len(SECRET_VALUE)


def test_last_access_retention_and_the_restore_template_filter(server: FakeApiServer, tmp_path: Path) -> None:
    for name, accessed in (("old", "2020-01-01T00:00:00Z"), ("fresh", None)):
        snap = {"metadata": {"name": name, "namespace": "default", "labels": {"app": "embed"}},
                "spec": {"source": {"podRef": {"name": "embed-0"}}},
                "status": {"createdAt": "2020-01-01T00:00:00Z" if accessed else "2999-01-01T00:00:00Z",
                           "conditions": [{"type": "Ready", "status": "True", "reason": "SnapshotReady",
                                           "message": "", "lastTransitionTime": "2020-01-01T00:00:00Z"}]}}
        if accessed:
            snap["status"]["lastAccessTime"] = accessed
        server.store.put("podsnapshots", snap, group=podapi.GROUP)
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "embed", "namespace": "default"},
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "embed"}},
                           "template": {"metadata": {"labels": {"app": "embed"}},
                                        "spec": {"containers": [{"name": "main", "image": "i", "command": ["run"]}]}}}}
    tasks = [
        {"name": "retention",
         "warmstart.snapshot.pod_snapshot_info": {"namespace": "default", "last_access_timeout": "72h"}},
        {"name": "template", "ansible.builtin.set_fact": {
            "built": "{{ deployment | warmstart.snapshot.restore_template(policy='embed', fallback='cold-start') }}"},
         "vars": {"deployment": deployment}},
        {"name": "refused", "ansible.builtin.set_fact": {
            "bad": "{{ deployment | warmstart.snapshot.restore_template('x', fallback='cold-start', entrypoint='inert') }}"},
         "vars": {"deployment": deployment}, "ignore_errors": True},
    ]
    run = run_tasks(server, tmp_path, tasks)
    r = results(run)
    expired = r["retention"]["expired"]
    assert [e["name"] for e in expired] == ["old"]
    assert expired[0]["reason"].startswith("not restored from for ") and "last_access_timeout=3d" in expired[0]["reason"]
    tpl = r["template"]["ansible_facts"]["built"]["spec"]["template"]
    assert pc.validate(tpl) == [] and pc.restore_mode(tpl)["fallback"] == "cold-start"
    assert "Deployment default/embed cannot restore its pods from 'x'" in r["refused"]["msg"]
