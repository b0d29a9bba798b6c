"""Pure parts of container support: mountinfo, host paths, external mounts, container maps."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _namespaces as nsu
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _container as ctr
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot._placeholder import parse_container_map
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import CriuOptions
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot._snapshot import SnapshotError

CONTAINER = """\
80 53 0:41 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
81 80 0:44 / /sys ro,nosuid - sysfs sysfs ro
82 80 254:0 /srv/app\\040dir /app ro,relatime - ext4 /dev/vda rw
83 80 0:45 / /proc rw,nosuid - proc proc rw
84 80 0:46 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k
85 84 0:47 / /dev/pts rw,nosuid - devpts devpts rw
88 80 254:0 /run/containers/x/userdata/hostname /etc/hostname rw - ext4 /dev/vda rw
91 84 0:40 / /dev/shm rw - tmpfs shm rw
94 80 0:29 /libpod_parent/libpod-abc /sys/fs/cgroup/cpu ro - cgroup cgroup rw,cpu
54 83 0:45 /bus /proc/bus ro - proc proc rw
59 83 0:46 /null /proc/keys rw - tmpfs tmpfs rw
60 80 0:99 /data /data rw - xfs /dev/sdb rw
"""
HOST = """\
22 1 254:0 / / rw - ext4 /dev/vda rw
30 22 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
31 22 0:99 / /mnt/big rw - xfs /dev/sdb rw
32 22 0:99 /data /srv/data rw - xfs /dev/sdb rw
"""


def test_parse_mountinfo_fields_and_escapes() -> None:
    mounts = nsu.parse_mountinfo(CONTAINER)
    app = next(m for m in mounts if m.mountpoint == "/app")
    assert app.root == "/srv/app dir" and app.dev == "254:0" and app.fstype == "ext4" and app.parent_id == 80
    assert len(mounts) == 12


def test_host_path_takes_the_longest_host_root() -> None:
    host = nsu.parse_mountinfo(HOST)
    assert nsu.host_path("254:0", "/run/containers/x/userdata/hostname", host) == "/run/containers/x/userdata/hostname"
    assert nsu.host_path("0:29", "/libpod_parent/libpod-abc", host) == "/sys/fs/cgroup/cpu/libpod_parent/libpod-abc"
    assert nsu.host_path("0:99", "/data/sub", host) == "/srv/data/sub"
    assert nsu.host_path("0:99", "/other", host) == "/mnt/big/other"
    assert nsu.host_path("0:77", "/x", host) is None


def test_external_mounts_are_binds_and_cgroups_not_recreated_file_systems() -> None:
    ext = {m.mountpoint for m in nsu.external_mounts(nsu.parse_mountinfo(CONTAINER))}
    assert ext == {"/app", "/etc/hostname", "/sys/fs/cgroup/cpu", "/data"}


def test_mount_for_finds_the_deepest_mountpoint() -> None:
    mounts = nsu.parse_mountinfo(CONTAINER)
    assert nsu.mount_for(mounts, "/app/x/y").mountpoint == "/app"
    assert nsu.mount_for(mounts, "/application").mountpoint == "/"
    assert nsu.mount_for(mounts, "/dev/shm/f").mountpoint == "/dev/shm"


@pytest.mark.parametrize("spec, want", [
    ("ph1", [("src", "ph1")]),
    ("src=ph1,src=ph2", [("src", "ph1"), ("src", "ph2")]),
    (["src=ph1", "ph2"], [("src", "ph1"), ("src", "ph2")]),
    ({"src": ["a", "b"]}, [("src", "a"), ("src", "b")]),
])
def test_container_map_forms(spec, want) -> None:
    assert parse_container_map(spec, ["src"]) == want


@pytest.mark.parametrize("spec, sources, needle", [
    ("", ["src"], "no destination"),
    ("a=ph,a=ph", ["a"], "destination 'ph' already receives 'a'"),
    ("b=ph", ["a"], "holds no container 'b'"),
    ("ph", ["a", "b"], "names no source container"),
    ("a=", ["a"], "'a=' has an empty destination"),
    ("a=x,a=x,c=y", ["a"], "already receives 'a'.*holds no container 'c'"),
])
def test_container_map_errors(spec, sources, needle) -> None:
    with pytest.raises(SnapshotError, match=needle):
        parse_container_map(spec, sources)


def test_unknown_runtime_is_refused_naming_the_supported_ones() -> None:
    from ansible_collections.warmstart.snapshot.plugins.module_utils.core._proc import TargetError
    from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._podman import Podman
    from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._runtime import get_runtime
    with pytest.raises(TargetError, match=r"runtime 'cri-o' is not supported \(supported: auto, containerd, podman\)"):
        get_runtime("cri-o")
    missing = Podman()
    missing.binary = ""
    with pytest.raises(TargetError, match="podman is not installed"):
        missing.inspect("x")
    with pytest.raises(TargetError, match="not valid"):
        Podman(binary="/bin/false").inspect("--all")


def test_a_container_whose_network_lock_cannot_be_read_is_refused_before_the_dump(monkeypatch: pytest.MonkeyPatch) -> None:
    """No libnftables: CRIU's network lock could not be lifted after the dump - refuse while nothing is touched."""
    def no_lib(pid: int) -> list:
        raise OSError("libnftables is not available (CRIU's bundle carries it)")

    monkeypatch.setattr(ctr.nsu, "criu_lock_tables", no_lib)
    info = SimpleNamespace(name="embed-1", rootfs="/r")
    cap = ctr.ContainerCapture(info=info, root_pid=4242, ns_pids=[2], external=[], stdio=[], net_ns=1, pid_ns=2,
                               control_path=None)
    opts = CriuOptions()
    expected = r"container embed-1: cannot read the nftables .*libnftables is not available.*node_prep"
    with pytest.raises(SnapshotError, match=expected):
        cap.criu_options(opts)
    assert opts.external == [], "nothing was set up for CRIU"
