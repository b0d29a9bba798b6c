"""CriuOptions -> CRIU's RPC options (_criu_rpc.to_rpc): every field lands in exactly its protobuf field.

Checked against an attribute bag shaped like pycriu's ``criu_opts`` (repeated fields with ``add()`` /
``append``) and, where this node has pycriu's generated rpc_pb2 (node_prep's CRIU bundle), against it too.
"""
from __future__ import annotations

import os
import sys
from types import SimpleNamespace
from typing import Any, List

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils._criu_rpc import (
    CGROUPS_MODE, NETWORK_LOCK, CriuOptions, ExtMount, InheritFd, JoinNs, to_rpc)

BUNDLE_PYTHON = "/opt/warmstart/criu/current/python"


class Repeated(List[Any]):
    """A protobuf repeated message field: ``add()`` appends a new message and returns it."""

    def add(self) -> SimpleNamespace:
        msg = SimpleNamespace()
        self.append(msg)
        return msg


def bag() -> SimpleNamespace:
    return SimpleNamespace(external=[], ext_mnt=Repeated(), inherit_fd=Repeated(), join_ns=Repeated(),
                           cg_root=Repeated())


FULL = CriuOptions(
    tcp="close", ext_unix_sk=False, file_locks=False, link_remap=False, ghost_limit=1 << 20, timeout=30,
    shell_job=True, network_lock="skip", manage_cgroups=True, root="/var/lib/ctr/rootfs",
    manage_cgroups_mode="soft", cgroup_root="/machine.slice/ph.scope",
    external=["net[4026532001]:warmstart-net", "pid[4026532002]:warmstart-pid"],
    ext_mnt=[ExtMount("/data", "/srv/data")], inherit_fd=[InheritFd("warmstart-net", 7), InheritFd("pipe:[42]", 9)],
    join_ns=[JoinNs("uts", "/proc/1/fd/5"), JoinNs("ipc", "/proc/1/fd/6")], mntns_compat_mode=True,
    lazy_pages=True)


def test_every_field_lands_in_its_rpc_field() -> None:
    opts = bag()
    to_rpc(FULL, opts)
    assert opts.tcp_close is True and not hasattr(opts, "tcp_established")
    assert (opts.ext_unix_sk, opts.file_locks, opts.link_remap) == (False, False, False)
    assert (opts.ghost_limit, opts.timeout, opts.shell_job) == (1 << 20, 30, True)
    assert opts.network_lock == NETWORK_LOCK["skip"] == 3
    assert opts.log_level == 4
    assert opts.root == "/var/lib/ctr/rootfs"
    assert opts.manage_cgroups is True and opts.manage_cgroups_mode == CGROUPS_MODE["soft"] == 3
    assert [c.path for c in opts.cg_root] == ["/machine.slice/ph.scope"]
    assert opts.external == ["net[4026532001]:warmstart-net", "pid[4026532002]:warmstart-pid"]
    assert [(m.key, m.val) for m in opts.ext_mnt] == [("/data", "/srv/data")]
    assert [(i.key, i.fd) for i in opts.inherit_fd] == [("warmstart-net", 7), ("pipe:[42]", 9)]
    assert [(j.ns, j.ns_file) for j in opts.join_ns] == [("uts", "/proc/1/fd/5"), ("ipc", "/proc/1/fd/6")]
    assert opts.mntns_compat_mode is True and opts.lazy_pages is True


def test_defaults_leave_the_target_fields_at_criu_defaults() -> None:
    opts = bag()
    to_rpc(CriuOptions(), opts)
    assert opts.tcp_established is True and opts.network_lock == NETWORK_LOCK["nftables"]
    assert not hasattr(opts, "timeout"), "timeout 0 means CRIU's default"
    for name in ("root", "manage_cgroups", "manage_cgroups_mode", "mntns_compat_mode", "lazy_pages"):
        assert not hasattr(opts, name), name
    assert not (opts.external or opts.ext_mnt or opts.inherit_fd or opts.join_ns or opts.cg_root)


def test_a_manifest_sets_only_the_options_it_records() -> None:
    """A store writer cannot hand CRIU a root, inherited fds or lazy pages through a manifest."""
    recorded = dict(CriuOptions(tcp="none", timeout=5).as_dict(), root="/", lazy_pages=True,
                    inherit_fd=[{"key": "x", "fd": 0}], manage_cgroups=True, extra={"a": 1})
    got = CriuOptions.from_manifest(recorded)
    assert got == CriuOptions(tcp="none", timeout=5)


@pytest.mark.skipif(not os.path.isdir(BUNDLE_PYTHON), reason="no CRIU bundle (pycriu) on this machine")
def test_every_field_fits_pycriu_s_criu_opts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(BUNDLE_PYTHON)
    before = set(sys.modules)
    try:
        rpc_pb2 = pytest.importorskip("pycriu.rpc_pb2")
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
    assert list(opts.external) == FULL.external and opts.lazy_pages and opts.mntns_compat_mode
