# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""io_uring never stops a snapshot: workloads run without it, and a tree that holds one is refused up front.

CRIU cannot checkpoint an io_uring instance (it fails deep in the dump with ``Unknown shit 600
(anon_inode:[io_uring])``). Stock servers reach io_uring without asking for it: libuv (Node, uvloop under
uvicorn[standard], as vLLM's and many FastAPI servers run) and liburing use it when the kernel offers it, and
fall back to epoll and threads when ``io_uring_setup`` fails with ENOSYS.

- ``refuse_in_this_process`` installs a seccomp filter that answers the three io_uring system calls with
  ENOSYS and lets everything else through; a process started by the ``workload`` module calls it just before
  its exec, so the server and every child it starts run without io_uring. CRIU dumps and restores the filter
  with the tree. Kubernetes pods get the same rule from the node's seccomp profile (``roles/node_prep``).
- ``problems`` names every process of a tree that holds an io_uring instance anyway (a ``pid:`` target, a
  container started without the profile), for the checkpoint to refuse before anything is touched.

Stdlib only.
"""
from __future__ import annotations

import ctypes
import os
import struct
from typing import List, Optional, Sequence

from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

IO_URING_SYSCALLS = (425, 426, 427)  # io_uring_setup, io_uring_enter, io_uring_register: one number everywhere
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
ENOSYS = 38
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
LD_ABS_W, JEQ_K, RET_K = 0x20, 0x15, 0x06
ANON_INODE = "anon_inode:[io_uring]"
FIX = ("start it through warmstart.snapshot.workload (io_uring is refused there, and libuv, uvloop and liburing "
       "fall back to epoll), run its container or pod with the node's seccomp profile "
       "/var/lib/kubelet/seccomp/profiles/block-iouring.json, or turn io_uring off in the server (UV_USE_IO_URING=0 "
       "for libuv)")


class IoUringError(WarmstartError):
    """io_uring cannot be refused in this process (no seccomp filter support)."""


def filter_program(arch: str) -> Optional[bytes]:
    """The classic BPF program (``struct sock_filter[]``) that answers io_uring with ENOSYS on ``arch`` (None
    where we do not know its audit arch). Another arch's system calls (a 32-bit binary) pass untouched."""
    audit = AUDIT_ARCH.get(arch)
    if audit is None:
        return None
    last = len(IO_URING_SYSCALLS) - 1
    prog = [(LD_ABS_W, 0, 0, 4),                              # A = seccomp_data.arch
            (JEQ_K, 0, 2 + len(IO_URING_SYSCALLS), audit),    # another arch: allow
            (LD_ABS_W, 0, 0, 0)]                              # A = seccomp_data.nr
    for i, nr in enumerate(IO_URING_SYSCALLS):                # io_uring: to the ENOSYS return, else on
        prog.append((JEQ_K, last - i, 0 if i < last else 1, nr))
    prog += [(RET_K, 0, 0, RET_ERRNO | ENOSYS), (RET_K, 0, 0, RET_ALLOW)]
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


def refuse_in_this_process() -> None:
    """Install the filter in the calling process (inherited by what it forks and execs); IoUringError when the
    kernel refuses. Without CAP_SYS_ADMIN, no_new_privs is set first, as the kernel demands."""
    code = filter_program(os.uname().machine)
    if code is None:
        raise IoUringError(f"cannot refuse io_uring on {os.uname().machine}: its system call ABI is not known here")
    libc = ctypes.CDLL(None, use_errno=True)
    insns = ctypes.create_string_buffer(code, len(code))

    class Fprog(ctypes.Structure):  # pylint: disable=too-few-public-methods
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    prog = Fprog(len(code) // 8, ctypes.addressof(insns))
    for attempt in range(2):
        if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) == 0:
            return
        err = ctypes.get_errno()
        if err != 13 or attempt:  # EACCES: neither CAP_SYS_ADMIN nor no_new_privs
            raise IoUringError(f"cannot refuse io_uring: seccomp filter refused ({os.strerror(err)})")
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise IoUringError(f"cannot refuse io_uring: no_new_privs refused ({os.strerror(err)})")


def holds(pid: int) -> Optional[str]:
    """How ``pid`` holds an io_uring instance (``fd 7``, ``a mapping``), or None."""
    base = f"/proc/{pid}"
    try:
        fds = os.listdir(f"{base}/fd")
    except OSError:
        fds = []
    for fd in sorted(fds, key=lambda n: int(n) if n.isdigit() else 0):
        try:
            if os.readlink(f"{base}/fd/{fd}") == ANON_INODE:
                return f"fd {fd}"
        except OSError:
            continue
    try:
        with open(f"{base}/maps", "r", encoding="utf-8", errors="replace") as handle:
            if any(line.rstrip().endswith(ANON_INODE) for line in handle):
                return "a mapping of its rings"
    except OSError:
        pass
    return None


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", "r", encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return "?"


def problems(pids: Sequence[int]) -> List[str]:
    """A sentence per process of the tree that holds an io_uring instance (CRIU cannot dump it): who, how, the
    fix."""
    out = []
    for pid in pids:
        how = holds(pid)
        if how is not None:
            out.append(f"pid {pid} ({_comm(pid)}) holds an io_uring instance ({how}), which CRIU cannot "
                       f"checkpoint: {FIX}")
    return out
