"""runners/_pod_snapshot: options that only make sense together are refused before a connection is made."""
from __future__ import annotations

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _pod_snapshot
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import failure
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

NO_SERVER = {"host": "http://127.0.0.1:9", "request_timeout": 1}  # a connection attempt would fail differently


def test_failed_reason_needs_ready_false() -> None:
    params = dict(NO_SERVER, namespace="default", name="s", state="present", source_pod="p", ready=True,
                  failed_reason="CheckpointFailed")
    with pytest.raises(WarmstartError) as refused:
        _pod_snapshot.run(params, False)
    assert failure(refused.value) == {"msg": "failed_reason needs ready=false", "reasons": []}
