"""The CRIU discovery helpers against the real CRIU that prepare_nodes installed."""
from __future__ import annotations

import subprocess

from ansible_collections.warmstart.snapshot.plugins.module_utils._criu import (
    FEATURES, criu_check, criu_version, find_criu, probe_features)


def test_real_criu_check() -> None:
    criu = find_criu()
    assert criu is not None, "no CRIU found although prepare_nodes ran"
    version = criu_version(criu)
    assert version["version"] is not None and version["version"][0].isdigit()

    direct = subprocess.run([criu, "check"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    result = criu_check(criu)
    assert result.ok is (direct.returncode == 0)
    assert result.ok, result.output
    assert "Looks good." in result.output

    features = probe_features(criu)
    assert set(features) == set(FEATURES)
    assert all(isinstance(v, bool) for v in features.values())
    for name in ("timens", "pidfd_store"):
        rc = subprocess.run([criu, "check", "--feature", name], capture_output=True, check=False).returncode
        assert features[name] is (rc == 0)
