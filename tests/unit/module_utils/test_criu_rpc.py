"""CriuOptions -> CRIU's RPC options (_criu_rpc.to_rpc): every field lands in exactly its protobuf field.

Checked against an attribute bag shaped like pycriu's ``criu_opts`` (repeated fields with ``add()`` /
``append``); tests/integration/test_criu_real.py checks the same options against the bundle's real rpc_pb2.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, List

from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import CGROUPS_MODE, NETWORK_LOCK, CriuOptions, to_rpc
from tests.support.criu_options import FULL


class Repeated(List[Any]):
    """A protobuf repeated message field: ``add()`` appends a new message and returns it."""

    def add(self) -> SimpleNamespace:
        msg = SimpleNamespace()
        self.append(msg)
        return msg


def bag() -> SimpleNamespace:
    return SimpleNamespace(external=[], skip_mnt=[], ext_mnt=Repeated(), inherit_fd=Repeated(), join_ns=Repeated(),
                           cg_root=Repeated())


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
    assert opts.mntns_compat_mode is True and opts.lazy_pages is True and opts.leave_stopped is True
    assert opts.skip_mnt == ["/run/user/0", "/var/lib/kubelet/pods/x"]
    assert opts.auto_ext_mnt is True and opts.ext_masters is True


def test_defaults_leave_the_target_fields_at_criu_defaults() -> None:
    opts = bag()
    to_rpc(CriuOptions(), opts)
    assert opts.tcp_established is True and opts.network_lock == NETWORK_LOCK["nftables"]
    assert not hasattr(opts, "timeout"), "timeout 0 means CRIU's default"
    for name in ("root", "manage_cgroups", "manage_cgroups_mode", "mntns_compat_mode", "lazy_pages", "leave_stopped",
                 "auto_ext_mnt", "ext_masters"):
        assert not hasattr(opts, name), name
    assert not (opts.external or opts.skip_mnt or opts.ext_mnt or opts.inherit_fd or opts.join_ns or opts.cg_root)


def test_a_manifest_sets_only_the_options_it_records() -> None:
    """A store writer cannot hand CRIU a root, inherited fds or lazy pages through a manifest."""
    recorded = dict(CriuOptions(tcp="none", timeout=5).as_dict(), root="/", lazy_pages=True, leave_stopped=True,
                    inherit_fd=[{"key": "x", "fd": 0}], manage_cgroups=True, extra={"a": 1})
    got = CriuOptions.from_manifest(recorded)
    assert got == CriuOptions(tcp="none", timeout=5)
