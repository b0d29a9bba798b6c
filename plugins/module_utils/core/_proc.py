# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Process facts from /proc and process-tree signalling. Stdlib only."""
from __future__ import annotations

import os
import re
import signal
import stat
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

PF_KTHREAD = 0x00200000


class TargetError(WarmstartError, ValueError):
    """A checkpoint target that cannot be used; the message says which and why."""


def alive(pid: int) -> bool:
    """``pid`` exists and is neither a zombie nor dead."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


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
            key, _sep, value = line.partition(":")
            out[key] = value.strip()
    return out


def environ(pid: int) -> Dict[str, str]:
    """The environment ``pid`` was started with (``/proc/<pid>/environ``); entries without ``=`` are left out."""
    with open(f"/proc/{pid}/environ", "rb") as handle:
        raw = handle.read()
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out


def memory_available(meminfo: str = "/proc/meminfo") -> Optional[int]:
    """The kernel's estimate of memory that can be had without swapping (``MemAvailable``), in bytes; None unknown."""
    try:
        with open(meminfo, "r", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


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


def children(pid: int) -> List[int]:
    """The children of ``pid``, of every thread (/proc/<pid>/task/*/children), in the kernel's order; [] when
    ``pid`` is gone."""
    out: List[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "r", encoding="ascii") as handle:
                out.extend(int(c) for c in handle.read().split())
        except OSError:
            continue
    return out


def parent(pid: int) -> int:
    """The parent PID of ``pid`` (as this PID namespace sees it); 0 when unknown."""
    try:
        return int(stat_fields(pid)[1])
    except (OSError, IndexError, ValueError):
        return 0


def descendants(pid: int) -> List[int]:
    """``pid`` and all its descendants (via /proc/<pid>/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        cur = todo.pop()
        out.append(cur)
        todo.extend(children(cur))
    return out


def signal_tree(pid: int, sig: int) -> None:
    for p in descendants(pid):
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def unstopped(pid: int) -> List[int]:
    """The threads of ``pid``'s tree that are neither stopped (``T``, or ``t`` under a tracer) nor gone."""
    out = []
    for p in descendants(pid):
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                state = stat_fields(int(tid))[0]  # /proc/<tid> is each thread's, listed or not
            except (OSError, IndexError, ValueError):
                continue
            if state not in ("T", "t", "Z", "X"):
                out.append(int(tid))
    return out


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
    safefs.write_file(os.path.abspath(path), f"{pid}\n".encode("ascii"), 0o644)


def catches(pid: int, sig: int) -> bool:
    """Whether ``pid`` has a handler installed for ``sig`` (SigCgt)."""
    try:
        return bool(int(status(pid).get("SigCgt", "0"), 16) & (1 << (sig - 1)))
    except (OSError, ValueError):
        return False


def terminate(pid: int, timeout: float) -> str:
    """SIGTERM, then SIGKILL after ``timeout``; returns how it ended.

    The kernel drops signals sent to a PID namespace's init that it has no
    handler for (only SIGKILL and SIGSTOP are forced from outside), so such an
    init that does not catch SIGTERM is killed at once instead of after
    ``timeout`` seconds of waiting for nothing.
    """
    if not alive(pid):
        return "gone"
    try:
        deaf = is_ns_init(pid) and not catches(pid, signal.SIGTERM)
    except OSError:
        deaf = False
    if not deaf:
        os.kill(pid, signal.SIGTERM)
        if wait_gone(pid, timeout):
            return "terminated"
    os.kill(pid, signal.SIGKILL)
    wait_gone(pid, 10)
    return "killed"


def files_in_use(pid: int, exclude: Tuple[str, ...] = ()) -> Dict[str, int]:
    """Regular files the tree maps or holds open, with their sizes.

    CRIU refuses to restore when such a file has another size on the
    restoring node; the restore preflight compares them before it starts.
    Files under ``exclude`` prefixes (restored from the snapshot itself),
    deleted files (CRIU carries those) and pseudo files are left out. Each
    is looked at as its process sees it (through ``/proc/<pid>/root``: a
    workload's mount namespace may differ from ours).
    """
    paths: Dict[str, int] = {}
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/maps", "r", encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    parts = line.split(None, 5)
                    if len(parts) == 6 and parts[5].startswith("/") and not parts[5].rstrip().endswith("(deleted)"):
                        paths.setdefault(parts[5].rstrip("\n"), p)
        except OSError:
            continue
        try:
            fds = os.listdir(f"/proc/{p}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{p}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("/") and not target.endswith("(deleted)"):
                paths.setdefault(target, p)
    out = {}
    for path in sorted(paths):
        if path.startswith(("/dev/", "/proc/", "/sys/", "/memfd:")) or any(path.startswith(e) for e in exclude):
            continue
        try:
            st = os.stat(f"/proc/{paths[path]}/root{path}")
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out[path] = st.st_size
    return out


_NODE_LOCAL_HINTS = (
    (re.compile(r"^/tmp/hsperfdata_[^/]+/\d+$"),
     "a JVM's performance-data file, which exists only where that JVM started: run the JVM with "
     "-XX:-UsePerfData (or -XX:+PerfDisableSharedMem) so that it maps no file of its own"),
    (re.compile(r"^/dev/shm/"),
     "a shared-memory file (POSIX shm), which lives only on the node that took the snapshot: restore there, or "
     "let the workload create it after the restore"),
)


def _missing_hint(path: str) -> str:
    """Why a file a process maps can be missing on another node, for files that are node-local by nature."""
    return next(("; " + hint for pattern, hint in _NODE_LOCAL_HINTS if pattern.match(path)), "")


def file_mismatches(expected: Dict[str, int], limit: int = 8) -> List[str]:
    """Reasons, one per file, why this node's files differ from ``expected`` sizes (with a hint for files that
    are node-local by nature, such as a JVM's perf data)."""
    reasons = []
    for path, size in sorted(expected.items()):
        try:
            have = os.stat(path).st_size
        except FileNotFoundError:
            reasons.append(f"file {path}: missing on this node{_missing_hint(path)}")
            continue
        except OSError as exc:
            reasons.append(f"file {path}: {exc.strerror}")
            continue
        if have != size:
            reasons.append(f"file {path}: {have} bytes on this node, {size} at checkpoint (different software)")
    if len(reasons) > limit:
        reasons = reasons[:limit] + [f"... and {len(reasons) - limit} more files differ"]
    return reasons


def detach(body: Callable[[], None], keep: Sequence[int] = ()) -> None:
    """Run ``body`` in a detached grandchild: its own session, stdio on /dev/null, no descriptor open but ``keep``.

    Returns once the grandchild exists (the intermediate child is reaped at once, so the grandchild is
    nobody's zombie and outlives this process); the grandchild exits when ``body`` returns or raises.
    """
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked child
        try:
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            devnull = os.open(os.devnull, os.O_RDWR | os.O_NOFOLLOW)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            low = 3
            for fd in sorted({fd for fd in keep if fd >= 3} | {65536}):
                os.closerange(low, fd)
                low = fd + 1
            body()
        finally:
            os._exit(0)
    os.waitpid(child, 0)
