"""The k8s_agent role through ansible-playbook (warmstart.snapshot.k8s_agent) against the fake API server.

The real ``kubernetes`` client behind kubernetes.core.k8s and the collection's k8s_crds module writes the CRDs,
the ServiceAccount, the RBAC objects, the ConfigMap and the DaemonSet; the test reads them back from the
server's store: the rules are exactly the ones written out in docs/agent.md, the DaemonSet has the shape the
node agent needs, check mode writes nothing, a second run changes nothing, a changed setting changes only the
ConfigMap and the DaemonSet (whose pods roll), and state absent removes the agent but keeps the CRDs. With
k8s_agent_admission the mutating admission webhook's objects come last (the webhook configuration the very
last) and go first, its rights only read, and it is refused without a CA for its certificate.
"""
from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
import yaml

from tests.support.fake_apiserver import FakeApiServer

from .ansible_run import Run, playbook

pytestmark = pytest.mark.integration

NS = "warmstart-system"
NAME = "warmstart-node-agent"
GROUP = "snapshot.warmstart.io"
IMAGE = "registry.example/warmstart-agent:0.1.0"
RBAC = "rbac.authorization.k8s.io"

NAMESPACED_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
    {"apiGroups": [GROUP], "resources": ["podsnapshots"],
     "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
    {"apiGroups": [GROUP], "resources": ["podsnapshots/status"], "verbs": ["patch"]},
    {"apiGroups": [GROUP], "resources": ["podsnapshotpolicies"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [GROUP], "resources": ["podsnapshotmanualtriggers"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [GROUP], "resources": ["podsnapshotmanualtriggers/status"], "verbs": ["patch"]},
]
CLUSTER_RULES = [
    {"apiGroups": [GROUP], "resources": ["podsnapshotcontents"], "verbs": ["get", "list", "create", "delete"]},
    {"apiGroups": [GROUP], "resources": ["podsnapshotcontents/status"], "verbs": ["patch"]},
    {"apiGroups": [GROUP], "resources": ["podsnapshotstorageconfigs"], "verbs": ["get"]},
]
SUBJECTS = [{"kind": "ServiceAccount", "name": NAME, "namespace": NS}]
ADMISSION = f"{NAME}-admission"
ADMISSION_RULES = [
    {"apiGroups": [GROUP], "resources": ["podsnapshotpolicies"], "verbs": ["get", "list"]},
    {"apiGroups": [GROUP], "resources": ["podsnapshots"], "verbs": ["list"]},
]
CA_BUNDLE = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()
ADMISSION_PATHS = {  # the webhook's objects: their paths on the API server
    "ServiceAccount": f"/api/v1/namespaces/{NS}/serviceaccounts/{ADMISSION}",
    "ClusterRole": f"/apis/{RBAC}/v1/clusterroles/{ADMISSION}",
    "RoleBinding ml": f"/apis/{RBAC}/v1/namespaces/ml/rolebindings/{ADMISSION}",
    "RoleBinding ops": f"/apis/{RBAC}/v1/namespaces/ops/rolebindings/{ADMISSION}",
    "Deployment": f"/apis/apps/v1/namespaces/{NS}/deployments/{ADMISSION}",
    "Service": f"/api/v1/namespaces/{NS}/services/{ADMISSION}",
    "MutatingWebhookConfiguration": f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{NAME}",
}


@pytest.fixture(name="api")
def fixture_api(tmp_path: Path) -> Iterator[FakeApiServer]:
    """An empty fake API server with a kubeconfig (its token required)."""
    server = FakeApiServer(token="agent-role-token").start()
    server.write_kubeconfig(tmp_path / "kubeconfig")
    try:
        yield server
    finally:
        server.stop()


def deploy(api: FakeApiServer, *args: str, **role_vars: Any) -> Run:
    extra = dict({"warmstart_k8s_auth": {"kubeconfig": str(api.kubeconfig)}, "k8s_agent_image": IMAGE,
                  "k8s_agent_watch_namespaces": ["ml", "ops"],
                  "k8s_agent_storage_secrets": [{"namespace": "ml", "name": "s3-creds"},
                                                {"namespace": "ml", "name": "s3-other"},
                                                {"namespace": "ops", "name": "s3-ops"}],
                  "k8s_agent_profile_configmaps": [{"namespace": "ml", "name": "llm-profiles"}],
                  "k8s_agent_store_host_path": "/mnt/snapshots"}, **role_vars)
    return playbook("warmstart.snapshot.k8s_agent", *args, extra=extra, timeout=600)


def ok(run: Run) -> Dict[str, Any]:
    assert run.rc == 0, run.messages() or run.stdout[-4000:] + run.stderr[-3000:]
    return run.stats()


def changed_items(run: Run) -> List[str]:
    """'Kind ns/name' of every object the role's apply task changed."""
    out = []
    for task in run.result["plays"][0]["tasks"]:
        if task["task"]["name"].endswith("Say what changed, naming each object that could not be applied"):
            for res in task["hosts"]["localhost"].get("results", []):
                obj, applied = res["item"]
                if applied.get("changed"):
                    meta = obj["metadata"]
                    out.append(f"{obj['kind']} {'/'.join(filter(None, [meta.get('namespace'), meta['name']]))}")
    return out


def get(api: FakeApiServer, plural: str, name: str, namespace: str = "", group: str = "") -> Dict[str, Any]:
    obj = api.store.get(plural, name, namespace, group=group)
    assert obj is not None, f"{plural} {namespace}/{name} is missing"
    return obj


def test_check_mode_first_writes_nothing(api: FakeApiServer) -> None:
    stats = ok(deploy(api, "--check", "--diff"))
    assert stats["changed"] > 0
    real_writes = [w for w in api.writes() if w["query"].get("dryRun") != "All"]
    assert real_writes == []
    assert api.store.get("daemonsets", NAME, NS, group="apps") is None
    assert api.store.list("customresourcedefinitions", group="apiextensions.k8s.io") == []


def test_deploys_least_privilege_rbac_and_the_daemonset_then_changes_nothing(api: FakeApiServer) -> None:
    first = deploy(api)
    assert ok(first)["changed"] > 0
    assert api.warnings == [], "the role renders fields Kubernetes does not know"
    crds = {c["metadata"]["name"] for c in api.store.list("customresourcedefinitions", group="apiextensions.k8s.io")}
    assert {f"{p}.{GROUP}" for p in ("podsnapshots", "podsnapshotcontents", "podsnapshotpolicies")} <= crds
    assert get(api, "namespaces", NS)["metadata"]["name"] == NS
    assert get(api, "serviceaccounts", NAME, NS)["metadata"]["labels"]["app.kubernetes.io/part-of"] == "warmstart"

    # RBAC: exactly these rules; namespaced ones bound in the watched namespaces only
    assert get(api, "clusterroles", NAME, group=RBAC)["rules"] == NAMESPACED_RULES
    assert get(api, "clusterroles", f"{NAME}-cluster", group=RBAC)["rules"] == CLUSTER_RULES
    binding = get(api, "clusterrolebindings", f"{NAME}-cluster", group=RBAC)
    assert binding["roleRef"]["name"] == f"{NAME}-cluster" and binding["subjects"] == SUBJECTS
    assert api.store.get("clusterrolebindings", NAME, group=RBAC) is None  # not all namespaces
    for watched in ("ml", "ops"):
        rb = get(api, "rolebindings", NAME, watched, group=RBAC)
        assert rb["roleRef"] == {"apiGroup": RBAC, "kind": "ClusterRole", "name": NAME} and rb["subjects"] == SUBJECTS
    ml_secrets = get(api, "roles", f"{NAME}-storage-secrets", "ml", group=RBAC)
    assert ml_secrets["rules"] == [{"apiGroups": [""], "resources": ["secrets"],
                                    "resourceNames": ["s3-creds", "s3-other"], "verbs": ["get"]}]
    assert get(api, "roles", f"{NAME}-storage-secrets", "ops", group=RBAC)["rules"][0]["resourceNames"] == ["s3-ops"]
    assert get(api, "rolebindings", f"{NAME}-storage-secrets", "ml", group=RBAC)["roleRef"]["kind"] == "Role"
    profiles = get(api, "roles", f"{NAME}-app-profiles", "ml", group=RBAC)
    assert profiles["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["llm-profiles"],
                                  "verbs": ["get"]}]
    assert get(api, "rolebindings", f"{NAME}-app-profiles", "ml", group=RBAC)["subjects"] == SUBJECTS
    assert api.store.get("roles", f"{NAME}-app-profiles", "ops", group=RBAC) is None
    every_rule = [r for role in api.store.list("clusterroles", group=RBAC) + api.store.list("roles", group=RBAC)
                  for r in role["rules"]]
    assert not [r for r in every_rule if {"secrets", "configmaps"} & set(r["resources"]) and not r.get("resourceNames")]
    assert not [r for r in every_rule if "*" in r["verbs"] or "*" in r["resources"]]
    assert [r["resources"] for r in every_rule if "delete" in r["verbs"]] == [["podsnapshots"], ["podsnapshotcontents"]]

    # configuration
    config = get(api, "configmaps", f"{NAME}-config", NS)["data"]
    rulebook_vars = yaml.safe_load(config["agent-vars.yml"])
    assert rulebook_vars == {"warmstart_k8s_auth": {}, "warmstart_namespaces": ["ml", "ops"],
                             "warmstart_agent_fallback": "none", "warmstart_resync_seconds": 30,
                             "warmstart_retention_seconds": 300,
                             "warmstart_capture_attempts": 3, "warmstart_metrics_dir": "/var/lib/warmstart/metrics",
                             "warmstart_metrics_port": 9479}
    localhost = yaml.safe_load(config["inventory.yml"])["all"]["hosts"]["localhost"]
    assert localhost["ansible_connection"] == "local" and localhost["warmstart_become"] is False
    assert localhost["warmstart_agent_lazy"] is False  # reaches the agent_restore playbook (k8s_agent_lazy)

    # the DaemonSet
    ds = get(api, "daemonsets", NAME, NS, group="apps")
    assert ds["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": NAME}
    pod = ds["spec"]["template"]
    assert pod["metadata"]["labels"]["app.kubernetes.io/name"] == NAME
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9479"
    spec = pod["spec"]
    assert spec["hostPID"] is True and spec["hostNetwork"] is False and spec["serviceAccountName"] == NAME
    assert spec["tolerations"] == [{"operator": "Exists"}]
    (agent,) = spec["containers"]
    assert agent["image"] == IMAGE and agent["securityContext"]["privileged"] is True
    assert agent["command"][:3] == ["ansible-rulebook", "--rulebook", "warmstart.snapshot.node_agent"]
    assert agent["command"][3:] == ["--inventory", "/etc/warmstart/agent/inventory.yml",
                                    "--vars", "/etc/warmstart/agent/agent-vars.yml", "--env-vars", "NODE_NAME"]
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["WARMSTART_METRICS_DIR"]["value"] == "/var/lib/warmstart/metrics"
    assert agent["ports"] == [{"name": "metrics", "containerPort": 9479, "protocol": "TCP"}]
    host_paths = {v["hostPath"]["path"]: v["name"] for v in spec["volumes"] if "hostPath" in v}
    assert set(host_paths) == {"/var/lib/warmstart", "/opt/warmstart", "/var/lib/kubelet/seccomp",
                               "/var/lib/kubelet/pods", "/mnt/snapshots", "/run/containerd", "/run/podman"}
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    for path, volume in host_paths.items():
        assert mounts[volume]["mountPath"] == path  # the same path inside: the node's paths mean the same there
    assert mounts["criu-bundle"]["readOnly"] is True and mounts["warmstart-state"]["readOnly"] is False
    assert mounts["config"]["mountPath"] == "/etc/warmstart/agent"

    # a second run changes nothing
    again = deploy(api)
    assert ok(again)["changed"] == 0, changed_items(again)


def test_a_new_setting_rolls_the_agent_and_absent_removes_it(api: FakeApiServer) -> None:
    ok(deploy(api))
    before = get(api, "daemonsets", NAME, NS, group="apps")["spec"]["template"]["metadata"]["annotations"]
    run = deploy(api, "--diff", k8s_agent_fallback="cold-start")
    ok(run)
    assert changed_items(run) == [f"ConfigMap {NS}/{NAME}-config", f"DaemonSet {NS}/{NAME}"]
    after = get(api, "daemonsets", NAME, NS, group="apps")["spec"]["template"]["metadata"]["annotations"]
    key = "snapshot.warmstart.io/agent-config-sha256"
    assert before[key] != after[key]  # the pods roll to read the new configuration
    assert yaml.safe_load(get(api, "configmaps", f"{NAME}-config", NS)["data"]["agent-vars.yml"])[
        "warmstart_agent_fallback"] == "cold-start"

    gone = deploy(api, k8s_agent_state="absent", k8s_agent_image="")
    ok(gone)
    assert api.store.get("daemonsets", NAME, NS, group="apps") is None
    assert api.store.get("clusterroles", NAME, group=RBAC) is None
    assert api.store.get("roles", f"{NAME}-storage-secrets", "ml", group=RBAC) is None
    assert api.store.get("roles", f"{NAME}-app-profiles", "ml", group=RBAC) is None
    assert api.store.get("namespaces", NS) is not None  # kept: it may hold more than the agent
    assert api.store.list("customresourcedefinitions", group="apiextensions.k8s.io")  # kept: they hold the records
    assert ok(deploy(api, k8s_agent_state="absent", k8s_agent_image=""))["changed"] == 0


def test_all_namespaces_bind_cluster_wide_and_an_image_is_required(api: FakeApiServer) -> None:
    ok(deploy(api, k8s_agent_watch_namespaces=[], k8s_agent_storage_secrets=[], k8s_agent_profile_configmaps=[],
              k8s_agent_metrics_port=0, k8s_agent_retention_seconds=0,
              k8s_agent_install_crds=False))
    every_rule = [r for role in api.store.list("clusterroles", group=RBAC) for r in role["rules"]]
    assert not [r for r in every_rule if "delete" in r["verbs"]], "no retention: nothing to delete"
    binding = get(api, "clusterrolebindings", NAME, group=RBAC)
    assert binding["roleRef"]["name"] == NAME and binding["subjects"] == SUBJECTS
    assert api.store.list("roles", group=RBAC) == [] and api.store.list("rolebindings", group=RBAC) == []
    assert api.store.list("customresourcedefinitions", group="apiextensions.k8s.io") == []
    (agent,) = get(api, "daemonsets", NAME, NS, group="apps")["spec"]["template"]["spec"]["containers"]
    assert "ports" not in agent and "livenessProbe" not in agent

    refused = deploy(api, k8s_agent_image="")
    assert refused.rc != 0 and "set k8s_agent_image" in refused.messages()
    assert json.dumps(refused.result["stats"]["localhost"]["failures"]) == "1"


def test_admission_webhook_comes_last_reads_only_changes_nothing_again_and_goes_first(api: FakeApiServer) -> None:
    refused = deploy(api, k8s_agent_admission=True, k8s_agent_install_crds=False)
    assert refused.rc != 0 and api.writes() == []
    assert "k8s_agent_admission_ca_bundle" in refused.messages()
    assert "k8s_agent_admission_cert_manager_certificate" in refused.messages()

    admission = dict(k8s_agent_admission=True, k8s_agent_admission_ca_bundle=CA_BUNDLE, k8s_agent_install_crds=False)
    first = deploy(api, **admission)
    ok(first)
    assert api.warnings == [], "the role renders fields Kubernetes does not know"
    applied = changed_items(first)
    assert applied[-2:] == [f"Service {NS}/{ADMISSION}", f"MutatingWebhookConfiguration {NAME}"], applied

    (webhook,) = get(api, "mutatingwebhookconfigurations", NAME, group="admissionregistration.k8s.io")["webhooks"]
    assert webhook["name"] == "pods.admission.snapshot.warmstart.io"
    assert webhook["clientConfig"] == {"service": {"namespace": NS, "name": ADMISSION, "path": "/mutate-pods",
                                                   "port": 443}, "caBundle": CA_BUNDLE}
    assert webhook["rules"] == [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                 "resources": ["pods"], "scope": "Namespaced"}]
    assert (webhook["failurePolicy"], webhook["sideEffects"], webhook["admissionReviewVersions"]) == (
        "Ignore", "None", ["v1"])
    assert (webhook["timeoutSeconds"], webhook["reinvocationPolicy"], webhook["matchPolicy"]) == (
        5, "Never", "Equivalent")
    key = "kubernetes.io/metadata.name"
    assert webhook["namespaceSelector"] == {"matchExpressions": [  # the watched ones, never the agent's own
        {"key": key, "operator": "In", "values": ["ml", "ops"]}, {"key": key, "operator": "NotIn", "values": [NS]}]}

    # it reads, nothing else, where the agent watches
    assert get(api, "clusterroles", ADMISSION, group=RBAC)["rules"] == ADMISSION_RULES
    subjects = [{"kind": "ServiceAccount", "name": ADMISSION, "namespace": NS}]
    assert get(api, "serviceaccounts", ADMISSION, NS)["metadata"]["name"] == ADMISSION
    for watched in ("ml", "ops"):
        rb = get(api, "rolebindings", ADMISSION, watched, group=RBAC)
        assert rb["roleRef"] == {"apiGroup": RBAC, "kind": "ClusterRole", "name": ADMISSION}
        assert rb["subjects"] == subjects
    assert api.store.get("clusterrolebindings", ADMISSION, group=RBAC) is None

    deployment = get(api, "deployments", ADMISSION, NS, group="apps")
    selector = {"app.kubernetes.io/name": ADMISSION}  # not the DaemonSet's: neither takes the other's pods
    assert deployment["spec"]["replicas"] == 2 and deployment["spec"]["selector"]["matchLabels"] == selector
    spec = deployment["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == ADMISSION and spec["automountServiceAccountToken"] is True
    assert "hostPID" not in spec and spec["volumes"] == [{"name": "tls",
                                                          "secret": {"secretName": "warmstart-admission-tls"}}]
    (server,) = spec["containers"]
    assert server["image"] == IMAGE and server["command"] == [
        "python3", "-m", "ansible_collections.warmstart.snapshot.plugins.module_utils.agent._admission_server",
        "--port", "8443", "--cert", "/etc/warmstart/admission/tls.crt", "--key", "/etc/warmstart/admission/tls.key"]
    assert server["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"}]
    assert server["volumeMounts"] == [{"name": "tls", "mountPath": "/etc/warmstart/admission", "readOnly": True}]
    for probe in ("readinessProbe", "livenessProbe"):
        assert server[probe]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    assert server["securityContext"] == {"runAsNonRoot": True, "runAsUser": 65532, "allowPrivilegeEscalation": False,
                                         "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
                                         "seccompProfile": {"type": "RuntimeDefault"}}
    service = get(api, "services", ADMISSION, NS)["spec"]
    assert service["selector"] == selector
    assert service["ports"] == [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}]

    again = deploy(api, **admission)
    assert ok(again)["changed"] == 0, changed_items(again)

    # absent (k8s_agent_admission left at its default) removes the webhook, its configuration first
    before = len(api.writes())
    ok(deploy(api, k8s_agent_state="absent", k8s_agent_image=""))
    deletes = [w["path"] for w in api.writes()[before:] if w["method"] == "DELETE"]
    assert deletes[0] == ADMISSION_PATHS["MutatingWebhookConfiguration"], deletes
    assert set(ADMISSION_PATHS.values()) <= set(deletes)
    assert api.store.get("mutatingwebhookconfigurations", NAME, group="admissionregistration.k8s.io") is None
    assert api.store.get("deployments", ADMISSION, NS, group="apps") is None
    assert api.store.get("services", ADMISSION, NS) is None
    assert api.store.get("clusterroles", ADMISSION, group=RBAC) is None
    assert api.store.get("rolebindings", ADMISSION, "ml", group=RBAC) is None


def test_a_cluster_that_refuses_every_write_names_each_object_and_its_cause(api: FakeApiServer) -> None:
    """One module run applies every object; each refusal is kept and named, not only the first."""
    api.answer_errors(403)
    run = deploy(api, k8s_agent_install_crds=False)
    assert run.rc != 0 and api.writes() == []
    failed = [res["msg"] for task in run.result["plays"][0]["tasks"]
              if task["task"]["name"].endswith("naming each object that could not be applied")
              for res in task["hosts"]["localhost"]["results"] if res.get("failed")]
    assert len(failed) >= 6, failed
    assert failed[0].startswith(f"Namespace {NS}: ") and "forbidden" in failed[0], failed
    assert [m for m in failed if m.startswith(f"DaemonSet {NS}/{NAME}: ") and "forbidden" in m], failed
