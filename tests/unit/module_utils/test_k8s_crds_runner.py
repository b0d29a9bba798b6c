"""runners/_k8s_crds: every definition is checked before anything is applied (no API server needed)."""
from __future__ import annotations

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _k8s_crds
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import K8sError

NO_SERVER = {"host": "http://127.0.0.1:9", "request_timeout": 1}  # a connection attempt would fail differently


def test_crd_definitions_are_checked_before_anything_is_applied() -> None:
    good = {"kind": "CustomResourceDefinition", "metadata": {"name": "a.example.io"}, "spec": {}}
    not_a_crd = {"kind": "ConfigMap", "metadata": {"name": "x"}}
    for definitions, message in (
            ([good, not_a_crd], "definitions: ConfigMap x is not a CustomResourceDefinition"),
            ([{"kind": "List", "items": [good, {"spec": {}}]}], "a CRD definition has no metadata.name")):
        for state in ("present", "absent"):
            with pytest.raises(K8sError) as refused:
                _k8s_crds.run(dict(NO_SERVER, definitions=definitions, state=state, wait=False), False)
            assert str(refused.value) == message
