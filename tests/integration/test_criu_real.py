"""The CRIU discovery helpers against the real CRIU that prepare_nodes installed."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
from typing import Any

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu import (
    FEATURES, criu_check, criu_version, find_criu, probe_features)
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import to_rpc
from tests.support.criu_options import FULL

BUNDLE_PYTHON = "/opt/warmstart/criu/current/python"


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


def test_every_field_fits_pycriu_s_criu_opts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every CriuOptions field fits pycriu's generated criu_opts of the CRIU bundle prepare_nodes installed."""
    assert os.path.isdir(BUNDLE_PYTHON), f"{BUNDLE_PYTHON} missing although prepare_nodes ran"
    monkeypatch.syspath_prepend(BUNDLE_PYTHON)
    before = set(sys.modules)
    try:
        rpc_pb2 = importlib.import_module("pycriu.rpc_pb2")
        _check_real(rpc_pb2)
    finally:  # the test venv has no pycriu: leave none behind for the other tests
        for name in set(sys.modules) - before:
            if name.startswith("pycriu"):
                del sys.modules[name]


def _check_real(rpc_pb2: Any) -> None:
    opts = rpc_pb2.criu_opts()
    to_rpc(FULL, opts)
    assert opts.root == "/var/lib/ctr/rootfs" and opts.rst_sibling is False
    assert opts.manage_cgroups_mode == rpc_pb2.SOFT and opts.network_lock == rpc_pb2.SKIP
    assert [c.path for c in opts.cg_root] == ["/machine.slice/ph.scope"]
    assert [(i.key, i.fd) for i in opts.inherit_fd] == [("warmstart-net", 7), ("pipe:[42]", 9)]
    assert [(j.ns, j.ns_file) for j in opts.join_ns] == [("uts", "/proc/1/fd/5"), ("ipc", "/proc/1/fd/6")]
    assert list(opts.external) == FULL.external and opts.lazy_pages and opts.mntns_compat_mode and opts.leave_stopped
    assert list(opts.skip_mnt) == FULL.skip_mnt and opts.auto_ext_mnt and opts.ext_masters
