# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A restored tree is never left untracked, and at most one copy of a workload is restored at a time.

Invariants:

- ``exclusive(lock_dir, key)`` holds a per-node lock (flock) from the "is it already running?" check to
  the moment the restored tree is recorded; a second restore of the same workload meanwhile is refused
  with the holder's pid. The lock belongs to the open file, so it also covers the restorer child below.
- ``restore_recorded`` runs CRIU's restore in a child of its own session that holds the lock and, once
  CRIU returns the tree's pid, calls ``record(pid)`` (the workload's pidfile) before anything else. If
  the calling module is killed meanwhile (Ansible's timeout, SIGKILL, a lost connection), the child
  still finishes the restore and records the tree, so the next restore sees it running instead of
  starting a second, untracked copy.
- ``restore_held`` does the same for a tree CRIU leaves stopped until the module's verdict (the page images
  hashed meanwhile, ``_overlap``): the child waits for that verdict, and when the module dies first it gives
  its own (``orphaned(pid)``: hash again, then resume or kill) - a stopped tree is never left behind, and
  never resumed unverified.

Stdlib only.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
from typing import Any, Callable, Dict, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _paths
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

LOCK_DIR = _paths.LOCK_DIR


class Busy(WarmstartError):
    """Another restore of the same workload holds the lock."""


def hold(path: str) -> int:
    """Lock ``path`` exclusively without waiting (flock; the lock goes with the fd, also when we die) and write
    our pid into it; its fd. ``Busy(holder pid)`` when another process holds it."""
    fd = safefs.open_file(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
        raise Busy(holder or "?") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def exclusive(key: str, lock_dir: str = LOCK_DIR) -> int:
    """Hold the restore lock of ``key``; returns its fd (closing it releases the lock)."""
    os.makedirs(lock_dir, mode=0o700, exist_ok=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    try:
        return hold(os.path.join(lock_dir, f"restore-{digest}.lock"))
    except Busy as exc:
        raise Busy(f"another restore of {key} is running on this node (warmstart pid {exc}); "
                   "run one at a time") from None


def _child(run: Callable[[], int], record: Callable[[int], None], out: int,  # pragma: no cover - forked
           verdict: Optional[int] = None, orphaned: Optional[Callable[[int], None]] = None) -> None:
    """In the restorer child: restore, record, report (then, held, wait for the verdict); never returns."""
    code = 0
    pid = 0
    try:
        os.setsid()  # a signal to the module's process group does not stop a restore half-way
        try:
            pid = run()
        except Exception as exc:  # pylint: disable=broad-except  # reported to the parent, which re-raises
            report: Dict[str, Any] = {"error": str(exc), "type": type(exc).__name__,
                                      "log_tail": exc.log_tail if isinstance(exc, WarmstartError) else None}
        else:
            try:
                record(pid)
                report = {"pid": pid}
            except Exception as exc:  # pylint: disable=broad-except  # never an untracked copy: end it
                os.kill(pid, signal.SIGKILL)  # a workload's root is its PID namespace's init: the tree goes with it
                report = {"error": f"the restored tree (pid {pid}) could not be recorded ({exc}); it was killed",
                          "type": "RuntimeError"}
        data = json.dumps(report).encode()
        while data:
            try:
                data = data[os.write(out, data):]
            except BrokenPipeError:  # the module is gone: the tree is recorded, nobody to tell
                break
        os.close(out)
        if verdict is not None and orphaned is not None and "pid" in report:
            if not os.read(verdict, 1):  # end of file, no verdict: the module died with the tree stopped
                orphaned(pid)
    except BaseException:  # pylint: disable=broad-except
        code = 1
    finally:
        os._exit(code)


def restore_recorded(run: Callable[[], int], record: Callable[[int], None],
                     rebuild: Callable[[Dict[str, Any]], BaseException]) -> int:
    """``run()`` (a CRIU restore returning the tree's pid) in a restorer child that calls ``record(pid)``.

    Returns the pid; a failure of ``run`` is re-raised here as ``rebuild(report)`` (report: error text,
    exception type name, CRIU log tail).
    """
    child, report = _start(run, record, None)
    os.waitpid(child, 0)
    return _pid(report, rebuild)


class Held:
    """A tree CRIU restored stopped, its restorer child waiting for ``settled()`` (or for the module to die)."""

    def __init__(self, pid: int, child: int, verdict: int) -> None:
        self.pid, self._child, self._verdict = pid, child, verdict

    def settled(self) -> None:
        """The module resumed or killed the tree itself: the child may go."""
        if self._verdict >= 0:
            try:
                os.write(self._verdict, b"s")
            except OSError:
                pass
            os.close(self._verdict)
            self._verdict = -1
            os.waitpid(self._child, 0)


def restore_held(run: Callable[[], int], record: Callable[[int], None],
                 rebuild: Callable[[Dict[str, Any]], BaseException], orphaned: Callable[[int], None]) -> Held:
    """``restore_recorded`` for a tree restored stopped: the child stays until ``Held.settled``; should the
    module die first, the child calls ``orphaned(pid)`` (which resumes or kills the tree) and ends."""
    vr, vw = os.pipe()  # not inheritable (O_CLOEXEC): CRIU and its tree never hold the verdict's write end
    try:
        child, report = _start(run, record, (vr, vw, orphaned))
    finally:
        os.close(vr)
    try:
        return Held(_pid(report, rebuild), child, vw)
    except BaseException:
        os.close(vw)  # CRIU failed: the child is ending (it waits for no verdict)
        os.waitpid(child, 0)
        raise


def _start(run: Callable[[], int], record: Callable[[int], None],
           held: Optional[Tuple[int, int, Callable[[int], None]]]) -> Tuple[int, Dict[str, Any]]:
    """Fork the restorer child; (its pid, its report) once it has written the report."""
    rfd, wfd = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked child
        os.close(rfd)
        if held is not None:
            os.close(held[1])
        _child(run, record, wfd, held[0] if held else None, held[2] if held else None)
    os.close(wfd)
    chunks = []
    try:
        while True:
            chunk = os.read(rfd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(rfd)
    try:
        report = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        report = {}
    return child, report


def _pid(report: Dict[str, Any], rebuild: Callable[[Dict[str, Any]], BaseException]) -> int:
    if "pid" in report:
        return int(report["pid"])
    if "error" not in report:
        report = {"error": "the restorer process ended without a result (killed?)", "type": "RuntimeError"}
    raise rebuild(report)


def tree_recorder(pidfile: Optional[str], write: Callable[[str, int], None]) -> Callable[[int], None]:
    """``record`` for ``restore_recorded``: write the pidfile, when the target has one."""
    def record(pid: int) -> None:
        if pidfile:
            write(pidfile, pid)
    return record
