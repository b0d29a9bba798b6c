# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Process facts from /proc and process-tree signalling. Stdlib only."""
from __future__ import annotations

import os
import signal
import time
from typing import Dict, List, Optional

PF_KTHREAD = 0x00200000


class TargetError(ValueError):
    """A checkpoint target that cannot be used; the message says which and why."""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except OSError:
        return False
    return fields[0] not in (b"Z", b"X")


def stat_fields(pid: int) -> List[str]:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        data = handle.read().decode("utf-8", "replace")
    return data.rsplit(")", 1)[1].split()


def cmdline(pid: int) -> List[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read()
    except OSError:
        return []
    return [p.decode("utf-8", "replace") for p in raw.split(b"\0") if p]


def status(pid: int) -> Dict[str, str]:
    out = {}
    with open(f"/proc/{pid}/status", "r", encoding="utf-8", errors="replace") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def ns_pids(pid: int) -> List[int]:
    """The PID in each nested namespace, outermost first (NSpid)."""
    return [int(p) for p in status(pid).get("NSpid", str(pid)).split()]


def is_ns_init(pid: int) -> bool:
    chain = ns_pids(pid)
    return len(chain) > 1 and chain[-1] == 1


def check_target(pid: int) -> None:
    """Refuse PIDs that cannot or must not be checkpointed."""
    if pid <= 0:
        raise TargetError(f"pid {pid} is not a process id")
    if pid == 1:
        raise TargetError("pid 1 is this node's init; it cannot be checkpointed")
    if pid == os.getpid():
        raise TargetError(f"pid {pid} is warmstart itself")
    if not alive(pid):
        raise TargetError(f"pid {pid}: no such running process")
    try:
        flags = int(stat_fields(pid)[6])
    except (OSError, IndexError, ValueError):
        raise TargetError(f"pid {pid}: vanished while it was inspected") from None
    if flags & PF_KTHREAD:
        raise TargetError(f"pid {pid} is a kernel thread ({status(pid).get('Name', '?')}); only user processes can be checkpointed")


def descendants(pid: int) -> List[int]:
    """``pid`` and all its descendants (via /proc/<pid>/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        cur = todo.pop()
        out.append(cur)
        try:
            tasks = os.listdir(f"/proc/{cur}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{cur}/task/{tid}/children", "r", encoding="ascii") as handle:
                    todo.extend(int(c) for c in handle.read().split())
            except OSError:
                continue
    return out


def signal_tree(pid: int, sig: int) -> None:
    for p in descendants(pid):
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def wait_gone(pid: int, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


def read_pidfile(path: str) -> Optional[int]:
    try:
        with open(path, "r", encoding="ascii") as handle:
            text = handle.read().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TargetError(f"pidfile {path}: {exc.strerror}") from None
    if not text.isdigit():
        raise TargetError(f"pidfile {path} does not hold a pid (found {text[:40]!r})")
    return int(text)


def write_pidfile(path: str, pid: int) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="ascii") as handle:
        handle.write(f"{pid}\n")
    os.rename(tmp, path)


def terminate(pid: int, timeout: float) -> str:
    """SIGTERM, then SIGKILL after ``timeout``; returns how it ended."""
    if not alive(pid):
        return "gone"
    os.kill(pid, signal.SIGTERM)
    if wait_gone(pid, timeout):
        return "terminated"
    os.kill(pid, signal.SIGKILL)
    wait_gone(pid, 10)
    return "killed"
