# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Namespaces and mounts of other processes, seen from the host. Stdlib only.

- mountinfo parsing, and the host path behind a mount of a container
  (so CRIU can bind the same source when it rebuilds the mount tree);
- which mounts of a container CRIU must treat as external (bind mounts of
  host files and directories, cgroup mounts) and which it recreates itself
  (proc, sysfs, tmpfs, devpts, mqueue and binds inside them);
- the processes of a PID namespace, by namespace inode;
- running a function inside another process's namespaces (a forked child
  calls setns(2), so the caller's own namespaces never change).
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
NS_GET_PARENT = 0xB702  # ioctl on an nsfs fd: an fd of the parent (PID and user namespaces)
NS_FLAGS = {"mnt": CLONE_NEWNS, "uts": CLONE_NEWUTS, "ipc": CLONE_NEWIPC, "net": CLONE_NEWNET, "pid": CLONE_NEWPID}

# File systems CRIU recreates from scratch when it restores a mount namespace.
RECREATED_FS = ("proc", "sysfs", "tmpfs", "devpts", "mqueue")


@dataclass
class Mount:
    mount_id: int
    parent_id: int
    dev: str
    root: str
    mountpoint: str
    options: str
    fstype: str
    source: str
    tags: Tuple[str, ...] = ()  # mountinfo's optional fields: shared:N, master:N, propagate_from:N, unbindable

    @property
    def slave(self) -> bool:
        """Whether the mount receives mounts from a peer group (``master:N``)."""
        return any(t.startswith("master:") for t in self.tags)

    @property
    def shared(self) -> bool:
        """Whether the mount is in a peer group (``shared:N``): a slave's master can be found through it."""
        return any(t.startswith("shared:") for t in self.tags)


def _unescape(text: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and len(text[i + 1:i + 4]) == 3 and text[i + 1:i + 4].isdigit():
            out.append(chr(int(text[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> List[Mount]:
    mounts = []
    for line in text.splitlines():
        parts = line.split()
        if "-" not in parts or len(parts) < 10:
            continue
        sep = parts.index("-")
        mounts.append(Mount(int(parts[0]), int(parts[1]), parts[2], _unescape(parts[3]), _unescape(parts[4]),
                            parts[5], parts[sep + 1], _unescape(parts[sep + 2]), tuple(parts[6:sep])))
    return mounts


def mountinfo(pid: int | str = "self") -> List[Mount]:
    with open(f"/proc/{pid}/mountinfo", "r", encoding="utf-8", errors="surrogateescape") as handle:
        return parse_mountinfo(handle.read())


def host_path(dev: str, root: str, host_mounts: Optional[List[Mount]] = None) -> Optional[str]:
    """The path in the host's mount namespace that shows ``root`` of file system ``dev``.

    A container's bind mount of /srv/x shows in its mountinfo as device 254:0,
    root /srv/x; the host has 254:0 mounted at / with root /, so the source is
    /srv/x. The host mount whose root is the longest prefix wins.
    """
    best: Optional[Mount] = None
    for m in host_mounts if host_mounts is not None else mountinfo():
        if m.dev != dev:
            continue
        mroot = m.root.rstrip("/")
        if root == m.root or root.startswith(mroot + "/") or m.root == "/":
            if best is None or len(m.root) > len(best.root):
                best = m
    if best is None:
        return None
    rest = root[len(best.root.rstrip("/")):] if best.root != "/" else root
    base = best.mountpoint.rstrip("/")
    path = base + rest if rest != "/" else (base or "/")
    return path or "/"


def external_mounts(mounts: List[Mount]) -> List[Mount]:
    """Mounts of a container that CRIU must take as given (bound in from outside).

    Everything except the root mount, the file systems CRIU recreates, and binds
    of a part of a file system that is itself mounted in the container (CRIU
    rebuilds those from the mount they come from). cgroup mounts are external:
    each is a view of the container's own cgroup, which a restore maps to the
    destination's.
    """
    whole = {m.dev for m in mounts if m.root == "/"}
    out = []
    for m in mounts:
        if m.mountpoint == "/":
            continue
        if m.fstype in ("cgroup", "cgroup2"):
            out.append(m)
            continue
        if m.fstype in RECREATED_FS and (m.root == "/" or m.dev in whole):
            continue
        if m.dev in whole:
            continue
        out.append(m)
    return out


def mount_for(mounts: List[Mount], path: str) -> Optional[Mount]:
    """The mount a path inside the namespace lives on (the deepest mountpoint above it)."""
    best: Optional[Mount] = None
    for m in mounts:
        mp = m.mountpoint.rstrip("/")
        if path == m.mountpoint or path.startswith(mp + "/") or m.mountpoint == "/":
            if best is None or len(m.mountpoint) >= len(best.mountpoint):
                best = m
    return best


def ns_inode(pid: int, ns: str) -> int:
    return os.stat(f"/proc/{pid}/ns/{ns}").st_ino


def pid_ns_members(ns_ino: int) -> Dict[int, Tuple[int, str]]:
    """Every process in the PID namespace with inode ``ns_ino``: {pid inside: (host pid, name)}."""
    out: Dict[int, Tuple[int, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}/ns/pid").st_ino != ns_ino:
                continue
            status: Dict[str, str] = {}
            with open(f"/proc/{entry}/status", "r", encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    key, _sep, value = line.partition(":")
                    status[key] = value.strip()
        except OSError:
            continue
        if status.get("State", "").startswith(("Z", "X")):
            continue
        inner = int(status.get("NSpid", entry).split()[-1])
        out[inner] = (int(entry), status.get("Name", "?"))
    return out


_libc = None


def _setns(fd: int, nstype: int) -> None:
    global _libc  # pylint: disable=global-statement
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, nstype) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def enter_pid_ns_for_children(fd: int) -> None:
    """Make the PID namespace ``fd`` refers to the one this thread's future children are born into (setns)."""
    _setns(fd, CLONE_NEWPID)


MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE, MS_SLAVE = 0x2, 0x4, 0x8, 0x4000, 0x40000, 0x80000
MNT_DETACH = 0x2


def _libc_call(name: str, *args: Any) -> None:
    global _libc  # pylint: disable=global-statement
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if getattr(_libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def own_proc() -> None:
    """Give this process a mount namespace of its own whose /proc shows the PID namespace it runs in: for a
    process born in another PID namespace than its parent's (the host's /proc would show other PIDs)."""
    _libc_call("unshare", CLONE_NEWNS)
    _libc_call("mount", None, b"/", None, MS_REC | MS_PRIVATE, None)
    _libc_call("mount", b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)


def slave_mount_ns() -> None:
    """Give this process a mount namespace of its own in which every mount is a slave of the node's: mounts and
    unmounts on the node still reach it (it pins nothing the node unmounts), none of its own reach the node."""
    _libc_call("unshare", CLONE_NEWNS)
    _libc_call("mount", None, b"/", None, MS_REC | MS_SLAVE, None)


def replace_proc() -> None:
    """In the init of a new PID namespace that has a mount namespace of its own (``slave_mount_ns``): the node's
    /proc (and what is mounted under it) detached, a /proc that shows this PID namespace mounted instead."""
    try:
        _libc_call("umount2", b"/proc", MNT_DETACH)
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # nothing mounted on /proc
            raise
    _libc_call("mount", b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)


def pid_ns_parent(pid: int) -> int:
    """Inode of the parent of ``pid``'s PID namespace (0 for the initial one, or when it cannot be read)."""
    try:
        fd = os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY)
    except OSError:
        return 0
    try:
        parent = fcntl.ioctl(fd, NS_GET_PARENT)
    except OSError:
        return 0
    finally:
        os.close(fd)
    try:
        return os.fstat(parent).st_ino
    finally:
        os.close(parent)


def nested_inits(ns_ino: int) -> List[int]:
    """Host PIDs of the PID-1 processes of the PID namespaces whose parent is the one with inode ``ns_ino``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "r", encoding="utf-8", errors="replace") as handle:
                nspid = next((line.split()[1:] for line in handle if line.startswith("NSpid:")), [])
        except OSError:
            continue
        if len(nspid) > 1 and nspid[-1] == "1" and pid_ns_parent(int(entry)) == ns_ino:
            found.append(int(entry))
    return sorted(found)


def fork_call(func: Callable[[], str], setup: Optional[Callable[[], None]] = None, what: str = "helper") -> str:
    """Run ``setup`` then ``func`` in a forked child; return what ``func`` returned.

    For work that must not change the caller: joining namespaces, chroot. The
    child reports through a pipe (``ok:<text>`` or ``err:<message>``); a failure
    raises OSError with the child's message.
    """
    rfd, wfd = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked child
        code = 0
        try:
            os.close(rfd)
            if setup is not None:
                setup()
            msg = "ok:" + func()
        except BaseException as exc:  # report everything to the parent
            msg, code = f"err:{exc}", 1
        try:
            os.write(wfd, msg.encode("utf-8", "replace"))
        finally:
            os._exit(code)
    os.close(wfd)
    chunks = []
    while True:
        data = os.read(rfd, 65536)
        if not data:
            break
        chunks.append(data)
    os.close(rfd)
    os.waitpid(child, 0)
    text = b"".join(chunks).decode("utf-8", "replace")
    if not text.startswith("ok:"):
        raise OSError(f"{what}: {text[4:] or 'the helper process died'}")
    return text[3:]


def run_in(pid: int, namespaces: Tuple[str, ...], func: Callable[[], str]) -> str:
    """Run ``func`` in a forked child that joined ``pid``'s namespaces (the caller's stay as they are)."""
    fds = {ns: os.open(f"/proc/{pid}/ns/{ns}", os.O_RDONLY) for ns in namespaces}

    def join() -> None:
        for ns in namespaces:
            _setns(fds[ns], NS_FLAGS[ns])

    try:
        return fork_call(func, join, what=f"in the namespaces of pid {pid}")
    finally:
        for fd in fds.values():
            os.close(fd)


def get_hostname(pid: int) -> str:
    return run_in(pid, ("uts",), socket.gethostname)


def set_hostname(pid: int, name: str) -> None:
    def _set() -> str:
        socket.sethostname(name)
        return name
    run_in(pid, ("uts",), _set)


NFT_LIBS = ("/opt/warmstart/criu/current/lib/libnftables.so.1", "libnftables.so.1")


def nft(pid: int, command: str, libs: Tuple[str, ...] = NFT_LIBS) -> str:
    """Run an nft command in ``pid``'s network namespace through libnftables (no nft binary needed).

    Returns nft's output; raises OSError with nft's error text.
    """
    def _run() -> str:
        lib = None
        for name in libs:
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if lib is None:
            raise OSError("libnftables is not available (CRIU's bundle carries it)")
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_get_output_buffer.restype = ctypes.c_char_p
        lib.nft_ctx_get_output_buffer.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
        lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
        ctx = lib.nft_ctx_new(0)
        lib.nft_ctx_buffer_output(ctx)
        lib.nft_ctx_buffer_error(ctx)
        rc = lib.nft_run_cmd_from_buffer(ctx, command.encode())
        out = (lib.nft_ctx_get_output_buffer(ctx) or b"").decode("utf-8", "replace")
        err = (lib.nft_ctx_get_error_buffer(ctx) or b"").decode("utf-8", "replace")
        lib.nft_ctx_free(ctx)
        if rc != 0:
            raise OSError(f"nft {command!r}: {err.strip() or rc}")
        return out
    return run_in(pid, ("net",), _run)


def criu_lock_tables(pid: int) -> List[str]:
    """CRIU's network-lock tables (``inet CRIU-<id>``) in ``pid``'s network namespace."""
    out = nft(pid, "list tables")
    return [line.split()[2] for line in out.splitlines()
            if line.startswith("table inet CRIU-") and len(line.split()) >= 3]
