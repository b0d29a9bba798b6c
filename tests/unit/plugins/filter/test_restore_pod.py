"""The restore-pod contract's pure steps as filters (plugins/filter/restore_pod.py): check a pod against the
contract and classify a restore pod, with nothing but the pod - no API server."""
from __future__ import annotations

import copy

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.warmstart.snapshot.plugins.filter.restore_pod import (
    FilterModule, restore_pod_outcome, restore_pod_problems)
from ansible_collections.warmstart.snapshot.plugins.filter.restore_template import restore_template
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podbuild as podbuild
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc

TEMPLATE = {"metadata": {"labels": {"app": "embed"}},
            "spec": {"containers": [{"name": "main", "image": "registry.local/embed:1.0",
                                     "command": ["python", "-m", "server"]}]}}


def test_a_built_restore_pod_has_no_problems_and_a_plain_pod_has_every_one() -> None:
    built = restore_template(TEMPLATE, "embed-1")
    assert built == podbuild.build(TEMPLATE, "embed-1")  # the filter builds what the contract builds
    assert restore_pod_problems(built) == []
    problems = restore_pod_problems(TEMPLATE)
    assert problems == pc.validate(TEMPLATE) and problems
    assert any(podapi.ANN_RESTORE_FROM in p for p in problems)
    # another seccomp profile than the pod's is a problem too
    assert restore_pod_problems(built, seccomp_profile="profiles/other.json")


def test_the_outcome_follows_the_reference_table_and_names_the_entrypoints() -> None:
    built = restore_template(TEMPLATE, "embed-1")
    assert restore_pod_outcome(built) == {"pod_outcome": "Pending", "losses": [], "condition": None,
                                          "entrypoints": {"main": "inert"}}
    standby = restore_template(TEMPLATE, "embed-1", entrypoint="standby")
    assert restore_pod_problems(standby) == [] and restore_pod_outcome(standby)["entrypoints"] == {"main": "standby"}
    pod = copy.deepcopy(built)
    pod["status"] = {"phase": "Running", "conditions": [
        {"type": "nvidia.com/Restored", "status": "False", "reason": "RestorePartiallySucceeded"}]}
    out = restore_pod_outcome(pod)
    assert (out["pod_outcome"], out["condition"]["type"]) == ("PartiallySucceeded", "nvidia.com/Restored")
    pod["status"] = {"phase": "Failed", "conditions": [{"type": "Restored", "status": "True",
                                                        "reason": "RestoreSucceeded"}]}
    out = restore_pod_outcome(pod)
    assert out["pod_outcome"] == "Succeeded" and out["losses"], "a Failed pod lost its restore whatever the condition"
    assert built == podbuild.build(TEMPLATE, "embed-1"), "the filters never change their input"


@pytest.mark.parametrize("bad", [None, "a pod", ["a", "list"]])
def test_what_is_no_pod_is_refused_naming_the_filter(bad: object) -> None:
    for name, fn in FilterModule().filters().items():
        with pytest.raises(AnsibleFilterError, match=f"^{name}: expects a Pod or pod template"):
            fn(bad)
