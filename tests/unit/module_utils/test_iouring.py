"""io_uring refused in workloads (_iouring): the seccomp filter answers ENOSYS to io_uring alone, and a process
holding an instance is named with the fix."""
from __future__ import annotations

import ctypes
import errno
import os
import struct
from typing import Any

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _iouring as iou

LIBC: Any = ctypes.CDLL(None, use_errno=True)


def setup_ring() -> int:
    """io_uring_setup(4): an fd, or -errno."""
    params = ctypes.create_string_buffer(120)
    fd = LIBC.syscall(425, 4, params)
    return int(fd) if fd >= 0 else -ctypes.get_errno()


def in_child(test: Any) -> int:
    """Run ``test()`` in a forked child (a filter cannot be taken off again); its exit status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            code = int(test())
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_the_program_sends_io_uring_to_enosys_and_lets_the_rest_and_other_arches_through() -> None:
    code = iou.filter_program("x86_64")
    assert code is not None and len(code) % 8 == 0
    insns = [struct.unpack("HBBI", code[i:i + 8]) for i in range(0, len(code), 8)]
    assert insns[0] == (iou.LD_ABS_W, 0, 0, 4)
    assert insns[-2:] == [(iou.RET_K, 0, 0, iou.RET_ERRNO | errno.ENOSYS), (iou.RET_K, 0, 0, iou.RET_ALLOW)]
    assert iou.filter_program("aarch64") is not None and iou.filter_program("s390x") is None


@pytest.mark.skipif(os.uname().machine not in iou.AUDIT_ARCH, reason="no filter for this arch")
def test_under_the_filter_io_uring_is_enosys_everything_else_works_and_children_inherit_it() -> None:
    def child() -> int:
        iou.refuse_in_this_process()
        if setup_ring() != -errno.ENOSYS or os.getpid() <= 0:
            return 2
        if "Seccomp:\t2" not in open(f"/proc/{os.getpid()}/status", encoding="ascii").read():
            return 3
        return in_child(lambda: 0 if setup_ring() == -errno.ENOSYS else 4)  # a grandchild: still refused
    assert in_child(child) == 0


def test_a_process_holding_a_ring_is_named_with_the_fix() -> None:
    fd = setup_ring()
    if fd < 0:
        pytest.skip(f"this kernel gives no io_uring ({os.strerror(-fd)})")
    try:
        found = iou.problems([os.getpid()])
        assert found == [f"pid {os.getpid()} ({open('/proc/self/comm', encoding='utf-8').read().strip()}) holds an "
                         f"io_uring instance (fd {fd}), which CRIU cannot checkpoint: {iou.FIX}"]
    finally:
        os.close(fd)
    assert iou.problems([os.getpid()]) == [] and iou.holds(os.getpid()) is None
    assert iou.problems([2 ** 22 + 7]) == []  # gone meanwhile: nothing to say
