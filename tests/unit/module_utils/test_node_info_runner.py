"""runners/_node_info: an option the engine cannot read is an engine error."""
from __future__ import annotations

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _node_info
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError


def test_node_info_unreadable_kernel_min_version_is_an_engine_error() -> None:
    params = dict(snapshot_root="/var/lib/warmstart", criu_path=None, kernel_min_version="abc", probe_features=False)
    with pytest.raises(WarmstartError) as raised:
        _node_info.run(params, False)
    assert str(raised.value).startswith("kernel_min_version: ")
