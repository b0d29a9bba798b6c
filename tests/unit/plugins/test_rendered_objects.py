"""What the k8s_agent role renders (roles/k8s_agent/templates/objects.yml.j2 with its defaults and vars, through
Ansible's own templating, in process) passes Kubernetes' own schemas strictly - every object, for each shape of
the role's settings: the agent alone, namespaced with storage Secrets, profile ConfigMaps and a store on the
node, and with the admission webhook (a CA bundle, or cert-manager's injection). The same checker the fake API
server uses (tests/support/k8s_schemas.py); the CRDs are checked by its ``install_crds``."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from tests.support import k8s_schemas

ROLE = Path(__file__).resolve().parents[3] / "roles" / "k8s_agent"

SHAPES: Dict[str, Dict[str, Any]] = {
    "agent-only": {},
    "namespaced-with-secrets-profiles-and-a-node-store": {
        "k8s_agent_watch_namespaces": ["ml", "serving"],
        "k8s_agent_storage_secrets": [{"namespace": "warmstart-system", "name": "s3"}],
        "k8s_agent_profile_configmaps": [{"namespace": "ml", "name": "profiles"}],
        "k8s_agent_store_host_path": "/mnt/snapshots", "k8s_agent_lazy": True,
        "k8s_agent_extra_env": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
        "k8s_agent_node_selector": {"nvidia.com/gpu.present": "true"}, "k8s_agent_priority_class": "system-node-critical",
        "k8s_agent_labels": {"team": "inference"}},
    "admission-with-a-ca-bundle": {"k8s_agent_admission": True, "k8s_agent_admission_ca_bundle": "Y2EK"},
    "admission-with-cert-manager": {"k8s_agent_admission": True,
                                    "k8s_agent_admission_cert_manager_certificate": "warmstart-system/admission"},
}


def _trusted(value: Any) -> Any:
    """The role's YAML as Ansible loads it from the role: its strings are templates."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {k: _trusted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_trusted(v) for v in value]
    return value


def render(settings: Dict[str, Any]) -> List[Dict[str, Any]]:
    variables = _trusted({**yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()),
                          **yaml.safe_load((ROLE / "vars" / "main.yml").read_text())})
    variables.update({"k8s_agent_image": "agent:0.1.0", **settings})
    text = Templar(loader=DataLoader(), variables=variables).template(
        trust_as_template((ROLE / "templates" / "objects.yml.j2").read_text()))
    return [doc for doc in yaml.safe_load_all(str(text)) if doc]


def problems(obj: Dict[str, Any]) -> List[str]:
    found = k8s_schemas.check(obj)
    return found.invalid + [f"unknown field {p}" for p in found.unknown_paths()]


@pytest.mark.parametrize("settings", list(SHAPES.values()), ids=list(SHAPES))
def test_every_object_the_role_renders_passes_kubernetes_own_schema(settings: Dict[str, Any]) -> None:
    objects = render(settings)
    kinds = [o["kind"] for o in objects]
    assert "DaemonSet" in kinds and "ClusterRole" in kinds, kinds
    assert ("MutatingWebhookConfiguration" in kinds) == bool(settings.get("k8s_agent_admission")), kinds
    for obj in objects:
        name = f"{obj['kind']} {obj['metadata']['name']}"
        assert k8s_schemas.known(obj["kind"], obj["apiVersion"]), f"{name}: no schema to check it against"
        assert problems(obj) == [], name


def test_the_check_finds_what_a_real_server_refuses() -> None:
    """The check is not vacuous: a typo'd field and a wrong type in a rendered DaemonSet are both named."""
    (daemonset,) = [o for o in render({}) if o["kind"] == "DaemonSet"]
    broken = copy.deepcopy(daemonset)
    broken["spec"]["template"]["spec"]["hostPID"] = "yes"
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolice"] = "Always"
    found = problems(broken)
    assert any("hostPID" in p for p in found), found
    assert "unknown field spec.template.spec.containers[0].imagePullPolice" in found, found


@pytest.mark.parametrize("role,task,var", [("k8s_crds", "Apply the warmstart CRDs", "k8s_crds_validate_certs"),
                                           ("k8s_agent", None, "k8s_agent_validate_certs")])
def test_validate_certs_is_passed_only_when_set(role: str, task: Any, var: str) -> None:
    """Unset, the roles leave certificate checks to the kubeconfig (``insecure-skip-tls-verify``) and
    K8S_AUTH_VERIFY_SSL, as the modules do; set, they pass it on."""
    root = ROLE.parent / role
    tasks = yaml.safe_load((root / "tasks" / "main.yml").read_text())
    args = [args["validate_certs"] for t in tasks for args in t.values()
            if isinstance(args, dict) and "validate_certs" in args and (task is None or t.get("name") == task)]
    assert args, f"no task of {role} passes validate_certs"
    defaults = yaml.safe_load((root / "defaults" / "main.yml").read_text())
    for value, want in ((defaults[var], "OMITTED"), (False, False), (True, True)):
        templar = Templar(loader=DataLoader(), variables={var: value, "omit": "OMITTED"})
        assert [templar.template(trust_as_template(a)) for a in args] == [want] * len(args), (role, value)
