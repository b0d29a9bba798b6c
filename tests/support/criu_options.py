"""A CriuOptions with every field set, for the tests of how options become CRIU's RPC options."""
from __future__ import annotations

from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import CriuOptions, ExtMount, InheritFd, JoinNs

FULL = CriuOptions(
    tcp="close", ext_unix_sk=False, file_locks=False, link_remap=False, ghost_limit=1 << 20, timeout=30,
    shell_job=True, network_lock="skip", manage_cgroups=True, root="/var/lib/ctr/rootfs",
    manage_cgroups_mode="soft", cgroup_root="/machine.slice/ph.scope",
    external=["net[4026532001]:warmstart-net", "pid[4026532002]:warmstart-pid"],
    ext_mnt=[ExtMount("/data", "/srv/data")], inherit_fd=[InheritFd("warmstart-net", 7), InheritFd("pipe:[42]", 9)],
    join_ns=[JoinNs("uts", "/proc/1/fd/5"), JoinNs("ipc", "/proc/1/fd/6")], mntns_compat_mode=True,
    skip_mnt=["/run/user/0", "/var/lib/kubelet/pods/x"], auto_ext_mnt=True, ext_masters=True,
    lazy_pages=True, leave_stopped=True)
