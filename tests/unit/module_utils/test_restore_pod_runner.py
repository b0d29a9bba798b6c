"""runners/_restore_pod: the restore_pod module's own refusals and the actions that need no API server.

Each refusal is raised before a connection is made, and the module adapter reports it in its one shape.
"""
from __future__ import annotations

from typing import Any, Dict

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _restore_pod
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podbuild as podbuild
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import failure
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import K8sError

TEMPLATE = {"metadata": {"labels": {"app": "embed"}},
            "spec": {"containers": [{"name": "main", "image": "registry.local/embed:1.0"}]}}
NO_SERVER = {"host": "http://127.0.0.1:9", "request_timeout": 1}  # a connection attempt would fail differently


def restore_params(**kw: Any) -> Dict[str, Any]:
    base: Dict[str, Any] = dict(NO_SERVER, action="build", pod=None, template=TEMPLATE, snapshot="embed-1",
                                container_map=None, skip_compat_check=False, startup_probe=True,
                                seccomp_profile=podapi.SECCOMP_PROFILE, namespace=None, name=None, grouping_labels=[],
                                scope="whole-pod", count=1, name_prefix=None, skip_binding_check=False,
                                outcome=None, condition_message="", entrypoint="inert")
    base.update(kw)
    return base


def test_count_below_one_is_refused_for_every_action() -> None:
    for action in ("build", "create"):
        with pytest.raises(WarmstartError) as refused:
            _restore_pod.run(restore_params(action=action, count=0), False)
        assert failure(refused.value)["msg"] == "count must be at least 1"


def test_build_needs_no_api_server_and_its_refusals_carry_every_reason() -> None:
    built = _restore_pod.run(restore_params(), False)
    assert built == {"changed": False, "pod": podbuild.build(TEMPLATE, "embed-1")}
    with pytest.raises(podapi.ContractError) as bad:
        _restore_pod.run(restore_params(container_map="main=ghost"), False)
    out = failure(bad.value)
    assert out["msg"].startswith("cannot make pod template a restore pod for snapshot 'embed-1': ")
    assert any("'ghost'" in r for r in out["reasons"])


def test_validate_reports_its_problems_as_a_result_field() -> None:
    assert _restore_pod.run(restore_params(action="validate", pod=podbuild.build(TEMPLATE, "embed-1"),
                                           template=None), False) == \
        {"changed": False, "problems": [], "entrypoints": {"main": "inert"}}
    standby = _restore_pod.run(restore_params(entrypoint="standby"), False)["pod"]
    assert standby["spec"]["containers"][0]["env"][-1] == {"name": "SNAPSHOT_RESTORE_STANDBY", "value": "1"}
    assert _restore_pod.run(restore_params(action="validate", pod=standby, template=None), False) == \
        {"changed": False, "problems": [], "entrypoints": {"main": "standby"}}
    with pytest.raises(K8sError) as bad:
        _restore_pod.run(restore_params(action="validate", pod=TEMPLATE, template=None), False)
    out = failure(bad.value)
    assert out["problems"] == pc.validate(TEMPLATE) == out["reasons"]
    assert out["msg"] == "Pod <unnamed> is not a restore pod: " + "; ".join(out["problems"])


def test_classify_a_given_pod_needs_no_api_server() -> None:
    out = _restore_pod.run(restore_params(action="classify", pod=podbuild.build(TEMPLATE, "embed-1")), False)
    assert out == {"changed": False, "pod_outcome": "Pending", "losses": [], "condition": None,
                   "pod_name": None}
    pod = podbuild.build(TEMPLATE, "embed-1")
    pod["status"] = {"phase": "Running", "conditions": [
        {"type": "nvidia.com/Restored", "status": "False", "reason": "RestorePartiallySucceeded"}]}
    out = _restore_pod.run(restore_params(action="classify", pod=pod), False)
    assert (out["pod_outcome"], out["condition"]["type"]) == ("PartiallySucceeded", "nvidia.com/Restored")
    assert "state" not in out
