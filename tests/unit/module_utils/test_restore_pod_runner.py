"""runners/_restore_pod: the restore_pod module's own refusals, raised before a connection is made and reported
in the adapter's one shape. The contract's pure steps are filters (tests/unit/plugins/filter/test_restore_pod.py)."""
from __future__ import annotations

from typing import Any, Dict

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _restore_pod
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import failure
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

TEMPLATE = {"metadata": {"labels": {"app": "embed"}},
            "spec": {"containers": [{"name": "main", "image": "registry.local/embed:1.0"}]}}
NO_SERVER = {"host": "http://127.0.0.1:9", "request_timeout": 1}  # a connection attempt would fail differently


def restore_params(**kw: Any) -> Dict[str, Any]:
    base: Dict[str, Any] = dict(NO_SERVER, action="create", pod=None, template=TEMPLATE, snapshot="embed-1",
                                container_map=None, skip_compat_check=False, startup_probe=True,
                                seccomp_profile=podapi.SECCOMP_PROFILE, namespace=None, name=None, grouping_labels=[],
                                scope="whole-pod", count=1, name_prefix=None, skip_binding_check=False,
                                outcome=None, condition_message="", entrypoint="inert")
    base.update(kw)
    return base


def test_count_below_one_is_refused_before_a_connection() -> None:
    with pytest.raises(WarmstartError) as refused:
        _restore_pod.run(restore_params(action="create", count=0), False)
    assert failure(refused.value)["msg"] == "count must be at least 1"


def test_the_pure_steps_are_filters_not_actions() -> None:
    assert sorted(_restore_pod._ACTIONS) == ["begin", "create", "finish", "select"]  # pylint: disable=protected-access
