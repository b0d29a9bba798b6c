"""A workload's mount namespace (_mountns): which mounts a snapshot leaves out, what CRIU is told, and what a
restore needs of the node. The real dump and restore run in tests/integration/test_workload_mounts.py."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _mountns as mns
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _namespaces as nsu
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import CriuOptions

NODE = """\
22 1 254:0 / / rw shared:1 - ext4 /dev/vda rw
23 22 0:5 / /dev rw shared:2 - devtmpfs udev rw
24 23 0:21 / /dev/shm rw shared:3 - tmpfs tmpfs rw
25 22 0:22 / /run rw shared:4 - tmpfs tmpfs rw
26 25 0:48 / /run/user/1000 rw shared:9 - tmpfs tmpfs rw
27 22 0:50 / /var/lib/containers/storage/overlay/abc/merged rw - overlay overlay rw
28 22 0:4 net:[4026532301] /run/netns/cni-1 rw shared:10 - nsfs nsfs rw
29 22 0:60 / /mnt/models rw - nfs4 srv:/models rw
30 22 0:7 / /sys/kernel/debug rw - debugfs debugfs rw
31 22 0:61 / /data rw - ext4 /dev/sdb rw
"""


def mounts(text: str = NODE) -> List[nsu.Mount]:
    return nsu.parse_mountinfo(text)


def by_path(path: str, text: str = NODE) -> nsu.Mount:
    return next(m for m in mounts(text) if m.mountpoint == path)


def test_mountinfo_keeps_the_propagation_tags() -> None:
    node = by_path("/")
    assert node.tags == ("shared:1",) and node.shared and not node.slave
    slave = nsu.parse_mountinfo("90 89 254:0 / / rw master:1 - ext4 /dev/vda rw\n")[0]
    assert slave.slave and not slave.shared
    both = nsu.parse_mountinfo("91 90 0:5 / /dev rw shared:7 master:2 - devtmpfs udev rw\n")[0]
    assert both.slave and both.shared
    assert by_path("/mnt/models").tags == ()


@pytest.mark.parametrize("path, local", [
    ("/", False), ("/dev", False), ("/dev/shm", False), ("/run", False), ("/mnt/models", False), ("/data", False),
    ("/run/user/1000", True), ("/var/lib/containers/storage/overlay/abc/merged", True), ("/run/netns/cni-1", True),
    ("/sys/kernel/debug", True),
])
def test_node_local_mounts_are_those_of_other_containers_pods_sessions_and_kernel_facilities(
        path: str, local: bool) -> None:
    assert mns.node_local(by_path(path)) is local


CID = "a60e81c85468e14e999df0e6d3707b959c98cfa973c043c0622cf7c0f2cf9b23"
ELSEWHERE = f"""\
50 22 0:80 / /data/containers/graph/overlay-containers/{CID}/userdata/shm rw - tmpfs shm rw
51 22 0:81 / /var/tmp/build.x1/rootfs/proc rw - proc proc rw
52 22 0:82 / /var/tmp/build.x1/rootfs/sys rw - sysfs sysfs rw
53 22 0:83 / /srv/chroot/dev/pts rw - devpts devpts rw
54 22 0:84 / /proc rw - proc proc rw
55 22 0:85 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw
56 22 0:86 / /scratch rw - tmpfs tmpfs rw
57 22 0:87 / /run/k8s/{CID[:12]} rw - tmpfs tmpfs rw
"""


@pytest.mark.parametrize("path, local", [
    (f"/data/containers/graph/overlay-containers/{CID}/userdata/shm", True),  # a container's, any graph root
    ("/var/tmp/build.x1/rootfs/proc", True), ("/var/tmp/build.x1/rootfs/sys", True), ("/srv/chroot/dev/pts", True),
    ("/proc", False), ("/sys/fs/cgroup", False), ("/scratch", False),
    (f"/run/k8s/{CID[:12]}", False),  # 12 hex digits are no container id
])
def test_other_roots_kernel_file_systems_and_container_paths_are_node_local(path: str, local: bool) -> None:
    assert mns.node_local(by_path(path, NODE + ELSEWHERE)) is local


def test_node_local_dirs_match_whole_components_only() -> None:
    lookalike = nsu.parse_mountinfo("40 22 0:70 / /run/username rw - tmpfs tmpfs rw\n")[0]
    assert not mns.node_local(lookalike)


def test_choose_keeps_the_node_s_mounts_and_what_the_tree_uses() -> None:
    node = mounts()
    kept, skipped = mns.choose(node, used=set())
    assert [m.mountpoint for m in kept] == ["/", "/dev", "/dev/shm", "/run", "/mnt/models", "/data"]
    assert skipped == ["/run/netns/cni-1", "/run/user/1000", "/sys/kernel/debug",
                       "/var/lib/containers/storage/overlay/abc/merged"]
    kept, skipped = mns.choose(node, used={26})  # a file open under /run/user/1000
    assert "/run/user/1000" in [m.mountpoint for m in kept] and "/run/user/1000" not in skipped


def test_a_used_mount_below_a_node_local_one_keeps_it() -> None:
    node = mounts(NODE + "32 27 0:62 / /var/lib/containers/storage/overlay/abc/merged/models rw - xfs /dev/sdc rw\n")
    kept, skipped = mns.choose(node, used={32})
    points = [m.mountpoint for m in kept]
    assert "/var/lib/containers/storage/overlay/abc/merged" in points
    assert "/var/lib/containers/storage/overlay/abc/merged/models" in points
    assert not any(p.startswith("/var/lib/containers") for p in skipped)


def test_a_mountpoint_with_a_kept_mount_is_never_skipped() -> None:
    """Two mounts stacked at one path, one kept: CRIU skips by mountpoint, so that one must not be listed."""
    node = mounts(NODE + "33 25 0:63 / /run/user/1000 rw - tmpfs tmpfs rw\n")
    kept, skipped = mns.choose(node, used={33})
    assert "/run/user/1000" not in skipped


def test_the_plan_tells_criu_to_skip_and_to_take_the_node_s_mounts_as_external() -> None:
    plan = mns.MountPlan(kept=[by_path("/"), by_path("/dev")], skipped=["/run/user/1000"], own_proc=True)
    opts = plan.criu_options(CriuOptions(tcp="close"))
    assert opts.skip_mnt == ["/run/user/1000"] and opts.auto_ext_mnt and opts.ext_masters and opts.tcp == "close"
    assert plan.record() == {"own_proc": True, "skipped": ["/run/user/1000"], "mounts": [
        {"path": "/", "fstype": "ext4", "slave": False}, {"path": "/dev", "fstype": "devtmpfs", "slave": False}]}


def test_restore_options_only_for_a_snapshot_with_a_mount_namespace() -> None:
    base = CriuOptions(tcp="close")
    assert mns.restore_options(None, base) is base
    assert mns.restore_options({}, base) is base
    opts = mns.restore_options({"own_proc": True, "mounts": [], "skipped": []}, base)
    assert (opts.root, opts.auto_ext_mnt, opts.ext_masters, opts.tcp) == ("/", True, True, "close")


def record(*entries: tuple) -> dict:
    return {"own_proc": True, "skipped": [],
            "mounts": [{"path": p, "fstype": f, "slave": s} for p, f, s in entries]}


def test_restore_problems_name_every_missing_path_and_every_master_that_is_not_shared(tmp_path: Path) -> None:
    here = tmp_path / "here"
    here.mkdir()
    gone = tmp_path / "gone"
    node = mounts(NODE + f"50 22 0:80 / {here} rw - tmpfs tmpfs rw\n")
    problems = mns.restore_problems(record(("/", "ext4", True), ("/proc", "proc", False), (str(gone), "nfs4", False),
                                           (str(here), "tmpfs", True), (str(tmp_path), "ext4", True)), node)
    assert problems == [
        f"mount {gone}: the workload had it (nfs4), this node has no {gone}",
        f"mount {here}: the workload's copy of it was a slave of the node's (it received the node's mounts); here "
        f"{here} is a tmpfs mount that is not shared, so it cannot be its master (make it shared: mount "
        f"--make-shared {here}, as systemd does for every mount)",
        f"mount {tmp_path}: the workload's copy of it was a slave of the node's (it received the node's mounts); "
        f"here {tmp_path} is not a mount point, so it cannot be its master (make it shared: mount --make-shared "
        f"{tmp_path}, as systemd does for every mount)",
    ]


def test_the_mount_on_top_decides(tmp_path: Path) -> None:
    """Two mounts at one path: the later one in mountinfo is the one a bind would take."""
    node = mounts(f"22 1 254:0 / / rw shared:1 - ext4 /dev/vda rw\n60 22 0:81 / {tmp_path} rw shared:5 - tmpfs a rw\n"
                  f"61 60 0:82 / {tmp_path} rw - tmpfs b rw\n")
    assert mns.restore_problems(record((str(tmp_path), "tmpfs", True)), node) != []
    node = mounts(f"22 1 254:0 / / rw shared:1 - ext4 /dev/vda rw\n60 22 0:81 / {tmp_path} rw - tmpfs a rw\n"
                  f"61 60 0:82 / {tmp_path} rw shared:6 - tmpfs b rw\n")
    assert mns.restore_problems(record((str(tmp_path), "tmpfs", True)), node) == []


@pytest.mark.parametrize("bad", ["x", {"mounts": "x"}, {"mounts": [{"path": "rel"}]}, {"mounts": [7]}])
def test_a_malformed_record_is_a_problem_not_a_crash(bad: object) -> None:
    problems = mns.restore_problems(bad, mounts())
    assert problems and all(p.startswith("mount namespace: ") for p in problems), problems


def test_a_process_in_our_mount_namespace_needs_no_plan() -> None:
    assert mns.plan(os.getpid(), [os.getpid()]) is None


def test_used_mounts_cover_open_files_maps_and_cwd(tmp_path: Path) -> None:
    """The mount ids a process holds something on, read the way CRIU resolves them (fdinfo mnt_id)."""
    held = tmp_path / "held.txt"
    held.write_text("x")
    child = subprocess.Popen([sys.executable, "-c", f"import time; f = open({str(held)!r}); time.sleep(60)"],
                             cwd=str(tmp_path))
    try:
        end = time.monotonic() + 10
        while time.monotonic() < end and not any(
                os.path.realpath(f"/proc/{child.pid}/fd/{fd}") == str(held) for fd in os.listdir(f"/proc/{child.pid}/fd")):
            time.sleep(0.02)
        used = mns.used_mounts([child.pid])
        ours = {m.mount_id: m for m in nsu.mountinfo()}
        want = nsu.mount_for(list(ours.values()), str(held))
        assert want is not None and want.mount_id in used
        exe_mount = nsu.mount_for(list(ours.values()), os.path.realpath(sys.executable))
        assert exe_mount is not None and exe_mount.mount_id in used
    finally:
        child.kill()
        child.wait()
