# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""CRIU dump and restore through pycriu's RPC (``criu swrk``).

Every failure raises CriuError carrying the tail of CRIU's own log.
"""
from __future__ import annotations

import os
import socket
import struct
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _namespaces as nsu
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu import CriuError

LOG_TAIL_LINES = 25
# criu_network_lock_method in rpc.proto
NETWORK_LOCK = {"iptables": 1, "nftables": 2, "skip": 3}
# criu_cg_mode in rpc.proto
CGROUPS_MODE = {"ignore": 0, "none": 1, "props": 2, "soft": 3, "full": 4, "strict": 5, "default": 6}


@dataclass(frozen=True)
class ExtMount:
    """An external mount: ``key`` names it in the images (its mount point at dump), ``val`` is the host path
    bound there on restore (the mount point itself at dump)."""

    key: str
    val: str


@dataclass(frozen=True)
class InheritFd:
    """A file descriptor of ours that the restored tree gets for the resource ``key`` (``--inherit-fd``).
    It must be inheritable (CRIU runs as our child)."""

    key: str
    fd: int


@dataclass(frozen=True)
class JoinNs:
    """A namespace the restored tree joins (``--join-ns``): ``ns`` is uts, ipc, net...; ``ns_file`` its path."""

    ns: str
    ns_file: str


@dataclass
class CriuOptions:
    """Every CRIU option warmstart sets (names follow the CLI and rpc.proto); ``to_rpc`` is the one place they
    become CRIU's RPC options.

    The first group is what users choose and a manifest records (``as_dict``); the rest is what a target kind
    or a restore mode adds (``dataclasses.replace`` of the user's options): never recorded, never read from a
    manifest. What belongs to one call (images and work dir, pid, log file, leave_stopped, rst_sibling: a
    restore is always detached) is set by ``dump`` / ``restore`` themselves.
    """

    tcp: str = "established"            # established | close | none
    ext_unix_sk: bool = True
    file_locks: bool = True
    link_remap: bool = True
    ghost_limit: int = 512 << 20
    timeout: int = 0                    # seconds; 0 = CRIU's default
    shell_job: bool = False
    network_lock: str = "nftables"      # a key of NETWORK_LOCK
    manage_cgroups: bool = False
    # --- set by a target kind or a restore mode
    root: Optional[str] = None          # the tree's root directory (a container's rootfs)
    manage_cgroups_mode: Optional[str] = None  # a key of CGROUPS_MODE; None = CRIU's default
    cgroup_root: Optional[str] = None   # restore: the cgroup the tree's root cgroup becomes
    external: List[str] = field(default_factory=list)   # --external, e.g. net[INODE]:KEY
    ext_mnt: List[ExtMount] = field(default_factory=list)
    inherit_fd: List[InheritFd] = field(default_factory=list)
    join_ns: List[JoinNs] = field(default_factory=list)
    mntns_compat_mode: bool = False
    skip_mnt: List[str] = field(default_factory=list)   # dump: mountpoints of the tree's mount namespace left out
    auto_ext_mnt: bool = False          # mounts that are views of the node's are external (--external mnt[])
    ext_masters: bool = False           # ... and may be slaves of the node's (--enable-external-masters)
    lazy_pages: bool = False            # restore: memory from a lazy-pages daemon (_lazy)
    leave_stopped: bool = False         # restore: the tree stays SIGSTOPped (a verify still runs, _overlap)

    def as_dict(self) -> Dict[str, Any]:
        return {"tcp": self.tcp, "ext_unix_sk": self.ext_unix_sk, "file_locks": self.file_locks,
                "link_remap": self.link_remap, "ghost_limit": self.ghost_limit, "timeout": self.timeout,
                "shell_job": self.shell_job, "network_lock": self.network_lock}

    @classmethod
    def from_manifest(cls, recorded: Dict[str, Any]) -> "CriuOptions":
        """The options a manifest recorded (``as_dict``); other keys are ignored."""
        return cls(**{k: v for k, v in recorded.items() if k in RECORDED})


RECORDED = frozenset(CriuOptions().as_dict())


def load_pycriu() -> Any:
    try:
        import pycriu  # pylint: disable=import-outside-toplevel
    except ImportError as exc:
        raise CriuError(
            f"pycriu cannot be imported by this Python ({exc}); prepare the node with "
            "warmstart.snapshot.node_prep (it installs pycriu for the module interpreter)"
        ) from None
    return pycriu


def log_tail(path: str, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            data = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


# Errors CRIU logs on runs that then succeed (not a cause of anything).
BENIGN_ERRORS = ("rlimit: Can't setup RLIMIT_NOFILE", "cgroupd: recv req error")


def _error_lines(path: str) -> str:
    """CRIU's first real 'Error' line (the cause) and its last one (what failed), joined by ' | '.

    The first is the cause (e.g. ``File x has bad size``, ``Can't dump file 3 of that type``); the lines
    after it are the unwinding (``Unable to open fd``, ``Dumping FAILED.``). Known benign errors are skipped.
    """
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            errs = [ln.strip() for ln in handle if "Error (" in ln and not any(b in ln for b in BENIGN_ERRORS)]
    except OSError:
        return ""
    return " | ".join(errs[:1] + errs[-1:]) if len(errs) > 1 else "".join(errs)


def to_rpc(o: CriuOptions, opts: Any) -> None:
    """Fill ``opts`` (pycriu's ``criu_opts`` message, or any object with its fields) from ``o``: the one place a
    CriuOptions becomes CRIU's RPC options. Repeated fields are appended to (``add()`` / ``append``)."""
    if o.tcp == "established":
        opts.tcp_established = True
    elif o.tcp == "close":
        opts.tcp_close = True
    opts.ext_unix_sk = o.ext_unix_sk
    opts.file_locks = o.file_locks
    opts.link_remap = o.link_remap
    opts.ghost_limit = o.ghost_limit
    opts.shell_job = o.shell_job
    if o.timeout:
        opts.timeout = o.timeout
    opts.network_lock = NETWORK_LOCK[o.network_lock]
    opts.log_level = 4
    _target_to_rpc(o, opts)


def _target_to_rpc(o: CriuOptions, opts: Any) -> None:
    """The options a target kind or a restore mode adds; an unset one is left at CRIU's default."""
    if o.root is not None:
        opts.root = o.root
    if o.manage_cgroups:
        opts.manage_cgroups = True
    if o.manage_cgroups_mode is not None:
        opts.manage_cgroups_mode = CGROUPS_MODE[o.manage_cgroups_mode]
    if o.cgroup_root is not None:
        opts.cg_root.add().path = o.cgroup_root
    for spec in o.external:
        opts.external.append(spec)
    for mnt in o.ext_mnt:
        ext = opts.ext_mnt.add()
        ext.key, ext.val = mnt.key, mnt.val
    for inherit in o.inherit_fd:
        inh = opts.inherit_fd.add()
        inh.key, inh.fd = inherit.key, inherit.fd
    for join in o.join_ns:
        ns = opts.join_ns.add()
        ns.ns, ns.ns_file = join.ns, join.ns_file
    if o.mntns_compat_mode:
        opts.mntns_compat_mode = True
    for point in o.skip_mnt:
        opts.skip_mnt.append(point)
    if o.auto_ext_mnt:
        opts.auto_ext_mnt = True
    if o.ext_masters:
        opts.ext_masters = True
    if o.lazy_pages:
        opts.lazy_pages = True
    if o.leave_stopped:
        opts.leave_stopped = True


def _client(criu_path: str) -> Any:
    pycriu = load_pycriu()
    client = pycriu.criu()
    client.use_binary(criu_path)
    return client


def _fail(what: str, exc: Exception, log: str, log_kept: bool = True) -> CriuError:
    """CriuError naming CRIU's own cause; pycriu's generic text only when the log has none."""
    cause = _error_lines(log) or str(exc)
    where = f"; log {log}" if log_kept else ""
    return CriuError(f"CRIU {what} failed: {cause}{where}", log_tail=log_tail(log))


def dump(criu_path: str, pid: int, images_dir: str, options: CriuOptions, leave_stopped: bool = True) -> None:
    """Dump the tree rooted at ``pid`` into ``images_dir``.

    With ``leave_stopped`` the tree stays SIGSTOPped after a successful dump,
    so the caller can finish and publish the snapshot before it decides to
    resume (SIGCONT) or end (SIGKILL) the source. On failure CRIU resumes it.
    ``options`` carries what a target kind adds (``ContainerCapture.criu_options``).
    """
    client = _client(criu_path)
    fd = os.open(images_dir, os.O_DIRECTORY)
    try:
        client.opts.images_dir_fd = fd
        client.opts.pid = pid
        client.opts.log_file = "dump.log"
        if leave_stopped:
            client.opts.leave_stopped = True
        else:
            client.opts.leave_running = True
        to_rpc(options, client.opts)
        try:
            client.dump()
        except Exception as exc:  # pycriu raises CRIUExceptionExternal / OSError
            # images_dir is a staging dir that the caller removes on failure: cite no path that will be gone
            raise _fail(f"dump of pid {pid}", exc, os.path.join(images_dir, "dump.log"), log_kept=False) from None
    finally:
        os.close(fd)


@contextmanager
def _children_in(pid_ns: Optional[int]) -> Iterator[None]:
    """Within: the processes this thread starts are born in PID namespace ``pid_ns`` (an fd; None: ours)."""
    if pid_ns is None:
        yield
        return
    ours = os.open("/proc/self/ns/pid", os.O_RDONLY)
    try:
        nsu.enter_pid_ns_for_children(pid_ns)
        try:
            yield
        finally:
            nsu.enter_pid_ns_for_children(ours)
    finally:
        os.close(ours)


def _restore_in(criu_path: str, opts: Any, pid_ns: int) -> Any:
    """One CRIU restore request answered by a ``criu swrk`` born in PID namespace ``pid_ns`` (an fd); CRIU's
    restore response.

    CRIU there gets a mount namespace of its own whose /proc shows that namespace (``nsu.own_proc``), and the
    images and work dirs opened again in it (mounts of another mount namespace cannot be mounted on). It opens
    them as ``/proc/<requester>/fd/N``, and a requester outside its PID namespace has no PID there: so the request
    socket is made by CRIU's own process before it runs CRIU, and handed to us.
    """
    rpc = load_pycriu().rpc
    joined = {int(j.ns_file[len("/proc/self/fd/"):]) for j in opts.join_ns if j.ns_file.startswith("/proc/self/fd/")}
    keep = sorted({inh.fd for inh in opts.inherit_fd} | joined | {opts.images_dir_fd, opts.work_dir_fd})
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    slot = os.open(os.devnull, os.O_RDONLY)  # an fd number kept for CRIU's end of the request socket

    def in_child() -> None:  # pragma: no cover - runs in the forked child
        nsu.own_proc()
        for fd in (opts.images_dir_fd, opts.work_dir_fd):  # the same dirs, as mounted in CRIU's mount namespace
            again = os.open(os.readlink(f"/proc/self/fd/{fd}"), os.O_DIRECTORY)
            os.dup2(again, fd)
            os.close(again)
        mine, criu_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        socket.send_fds(theirs, [b"s"], [mine.fileno()])
        os.dup2(criu_end.fileno(), slot)

    try:
        with _children_in(pid_ns):
            child = subprocess.Popen(  # pylint: disable=consider-using-with  # waited for below
                [criu_path, "swrk", str(slot)], pass_fds=[theirs.fileno(), slot, *keep], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                preexec_fn=in_child)  # pylint: disable=subprocess-popen-preexec-fn
        try:
            resp = _ask(ours, rpc.criu_req(type=rpc.RESTORE, opts=opts), rpc)
        finally:
            child.wait()
    finally:
        for closing in (ours, theirs):
            closing.close()
        os.close(slot)
    if not resp.success:
        raise OSError(resp.cr_errno, f"CRIU answered {resp}")
    return resp.restore


def _ask(channel: socket.socket, req: Any, rpc: Any) -> Any:
    """Receive the request socket on ``channel``, send ``req`` over it, return the answer."""
    _msg, fds, _flags, _addr = socket.recv_fds(channel, 16, 1)
    if not fds:
        raise OSError("CRIU's process did not start (no request socket)")
    with socket.socket(fileno=fds[0]) as sk:
        sk.send(req.SerializeToString())
        resp = rpc.criu_resp()
        resp.ParseFromString(sk.recv(len(sk.recv(1, socket.MSG_TRUNC | socket.MSG_PEEK))))
    return resp


def restore(criu_path: str, images_dir: str, work_dir: str, options: CriuOptions,
            in_pid_ns: Optional[int] = None) -> int:
    """Restore the tree in ``images_dir`` detached (as our sibling); return its host PID.

    The file descriptors of ``options.inherit_fd`` must be inheritable. With ``in_pid_ns`` (an fd of a PID
    namespace) CRIU runs in that namespace (with a /proc of its own that shows it), so that a tree dumped as
    PID 1 of its own PID namespace comes back as PID 1 of a new one nested in it; the PID returned is then the
    one that namespace sees.
    """
    client = _client(criu_path)
    img = os.open(images_dir, os.O_DIRECTORY)
    work = os.open(work_dir, os.O_DIRECTORY)
    try:
        client.opts.images_dir_fd = img
        client.opts.work_dir_fd = work
        client.opts.log_file = "restore.log"
        client.opts.rst_sibling = True
        to_rpc(options, client.opts)
        try:
            resp = client.restore() if in_pid_ns is None else _restore_in(criu_path, client.opts, in_pid_ns)
        except Exception as exc:
            raise _fail("restore", exc, os.path.join(work_dir, "restore.log")) from None
    finally:
        os.close(img)
        os.close(work)
    return int(resp.pid)


# --- stats images ---------------------------------------------------------
# A stats image is: u32 IMG_SERVICE magic, u32 STATS magic, then one entry
# (u32 size + protobuf stats_entry). Decoded with the generated message only,
# which works across protobuf versions (pycriu's dict decoder does not).

def read_stats(path: str) -> Dict[str, float]:
    """CRIU's ``stats-dump`` / ``stats-restore``: its counters as they are, its times (``*_time``, microseconds in
    the image) in seconds like every duration warmstart reports; {} when there is none or pycriu cannot read it."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return {}
    if len(data) < 12:
        return {}
    try:
        from pycriu.images import stats_pb2  # pylint: disable=import-outside-toplevel
    except ImportError:
        return {}
    (size,) = struct.unpack_from("<I", data, 8)
    entry = stats_pb2.stats_entry()
    entry.ParseFromString(data[12:12 + size])
    out: Dict[str, float] = {}
    for part in ("dump", "restore"):
        if entry.HasField(part):
            msg = getattr(entry, part)
            for desc, value in msg.ListFields():
                out[desc.name] = round(int(value) / 1e6, 6) if desc.name.endswith("_time") else int(value)
    return out
