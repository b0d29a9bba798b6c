# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Ascend NPU process snapshots: a ctypes binding of CANN's runtime snapshot API, and the NPU inventory.

CANN (Atlas A2 / A3) exports four calls that move the calling process's
device state into host memory and back::

    RUNNING --lock--> LOCKED --backup--> BACKED_UP --restore--> LOCKED --unlock--> RUNNING

(``unlock`` is also legal from BACKED_UP.) Unlike CUDA's checkpoint API the
CANN calls act on the **calling process only**: the runtime refuses any pid
but its own. This binding is therefore meant to run inside the NPU process
(a workload helper asked by the node agent), never across processes. CANN
9.0.0 declares the calls without parameters; the runtime's later ABI takes
``(int pid, void *reserve)`` and checks pid == getpid() and reserve == NULL.
Calling with ``(getpid(), NULL)`` - for backup and restore ``(getpid(), &args)``
with zeroed args (flags 0, as the later runtime's args struct takes them) -
satisfies both (extra arguments are ignored by the C calling conventions of
x86-64 and aarch64).

Every transition is checked against the state this binding tracks before the
library is asked (``AscendStateError``); the library's own answer is checked
after. ``lock_and_backup`` rolls back (restore if backed up, then unlock) on
any failure; ``force_unlock`` brings the process back to RUNNING whatever step
it reached and is registered with ``atexit`` by ``guard`` - as CANN's runtime
does on exit - so no thread stays blocked on a lock the snapshot left behind.

The library path can be overridden with ``WARMSTART_LIBASCENDCL``. The
inventory (``npu_inventory``) never loads the library: it reads device nodes
(``/dev/davinci<N>``) and the driver's ``version.info``, under a root that
tests point at a fake tree.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _paths
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

LIBASCENDCL = "libascendcl.so"
LIBASCENDCL_ENV = "WARMSTART_LIBASCENDCL"
AGENT_ROOT = _paths.ASCEND_AGENT_DIR
AGENT_ROOT_ENV = "WARMSTART_ASCEND_AGENT_DIR"
AGENT_ACTIONS = ("state", "lock", "backup", "restore", "unlock", "force_unlock")
DRIVER_VERSION_FILE = "usr/local/Ascend/driver/version.info"

RUNNING = "RUNNING"
LOCKED = "LOCKED"
BACKED_UP = "BACKED_UP"

ACL_SUCCESS = 0
RESULT_NAMES = {
    0: "ACL_SUCCESS",
    100000: "ACL_ERROR_INVALID_PARAM",
    507899: "ACL_ERROR_RT_INTERNAL_ERROR",
}
SNAPSHOT_SYMBOLS = (
    "aclrtSnapShotProcessLock",
    "aclrtSnapShotProcessBackup",
    "aclrtSnapShotProcessRestore",
    "aclrtSnapShotProcessUnlock",
)
# action -> (symbol, states it is legal from, state after)
_TRANSITIONS = {
    "lock": ("aclrtSnapShotProcessLock", (RUNNING,), LOCKED),
    "backup": ("aclrtSnapShotProcessBackup", (LOCKED,), BACKED_UP),
    "restore": ("aclrtSnapShotProcessRestore", (BACKED_UP,), LOCKED),
    "unlock": ("aclrtSnapShotProcessUnlock", (LOCKED, BACKED_UP), RUNNING),
}
_WHY = {
    ("lock", LOCKED): "already locked",
    ("lock", BACKED_UP): "it is backed up: restore it, then unlock",
    ("backup", RUNNING): "lock it first",
    ("backup", BACKED_UP): "already backed up",
    ("restore", RUNNING): "it is not backed up",
    ("restore", LOCKED): "it is not backed up, only locked: unlock it",
    ("unlock", RUNNING): "it is not locked",
}


class _SnapShotArgs(ctypes.Structure):
    """aclrtSnapShotBackupArgs / RestoreArgs as later runtimes take them: flags first (0 = the default flow),
    the rest reserved; zeroed, and larger than the runtime's struct so it never reads past it."""

    _fields_ = [("flags", ctypes.c_uint32), ("reserved", ctypes.c_uint32 * 15)]


class AscendError(WarmstartError):
    """A CANN snapshot call failed: names the pid, the call and the result."""

    def __init__(self, pid: int, call: str, result: Optional[int], message: str) -> None:
        super().__init__(message)
        self.pid = pid
        self.call = call
        self.result = result


class AscendStateError(AscendError):
    """A transition refused before the library was asked: the process is in the wrong state."""


class AscendUnavailable(WarmstartError):
    """No usable CANN snapshot API in this process (message: why)."""


def result_name(code: int) -> str:
    return RESULT_NAMES.get(code, f"aclError {code}")


class AclSnapshot:
    """The CANN snapshot API of this process through ctypes; tracks and enforces the state machine."""

    def __init__(self, library: Optional[str] = None, loader: Callable[[str], Any] = ctypes.CDLL) -> None:
        self.library = library or os.environ.get(LIBASCENDCL_ENV) or LIBASCENDCL
        try:
            self.lib = loader(self.library)
        except OSError as exc:
            raise AscendUnavailable(f"{self.library} not found (no CANN toolkit in this process?): {exc}") from exc
        missing = [name for name in SNAPSHOT_SYMBOLS if not hasattr(self.lib, name)]
        if missing:
            raise AscendUnavailable(f"{self.library} lacks {', '.join(missing)}: the snapshot API needs CANN >= 9.0 "
                                    "on Atlas A2 / A3")
        for name in SNAPSHOT_SYMBOLS:
            func = getattr(self.lib, name)
            func.restype = ctypes.c_int
            func.argtypes = [ctypes.c_int, ctypes.c_void_p]
        self.pid = os.getpid()
        self.state = RUNNING

    def describe(self) -> str:
        return f"CANN snapshot API ({self.library})"

    def _do(self, action: str) -> None:
        symbol, legal, after = _TRANSITIONS[action]
        pid = os.getpid()
        if pid != self.pid:
            raise AscendStateError(pid, action, None, f"pid {pid}: this binding was made in pid {self.pid}; the CANN "
                                   "snapshot API acts on the calling process only (make a new one after fork)")
        if self.state not in legal:
            why = _WHY.get((action, self.state), "not a legal transition")
            raise AscendStateError(pid, action, None,
                                   f"pid {pid}: cannot {action} an NPU process in state {self.state} ({why})")
        args = ctypes.byref(_SnapShotArgs()) if action in ("backup", "restore") else None
        code = int(getattr(self.lib, symbol)(pid, args))
        if code != ACL_SUCCESS:
            raise AscendError(pid, symbol, code, f"pid {pid}: {symbol} failed: {result_name(code)}; "
                              f"the process stays {self.state}")
        self.state = after

    def lock(self) -> None:
        """RUNNING -> LOCKED: runtime calls that change device resources block; queries do not."""
        self._do("lock")

    def backup(self) -> None:
        """LOCKED -> BACKED_UP: device resources saved in host memory (the last backup counts)."""
        self._do("backup")

    def restore(self) -> None:
        """BACKED_UP -> LOCKED: devices re-opened (same device ids), resources and memory restored."""
        self._do("restore")

    def unlock(self) -> None:
        """LOCKED or BACKED_UP -> RUNNING."""
        self._do("unlock")

    def force_unlock(self) -> List[str]:
        """Back to RUNNING from any state (restore first when backed up); the problems met, never raises."""
        problems: List[str] = []
        if os.getpid() != self.pid:
            return problems
        if self.state == BACKED_UP:
            try:
                self.restore()
            except AscendError as exc:
                problems.append(str(exc))
        if self.state in (LOCKED, BACKED_UP):
            try:
                self.unlock()
            except AscendError as exc:
                problems.append(str(exc))
        return problems


def guard(acl: AclSnapshot) -> Callable[[], List[str]]:
    """Register ``acl.force_unlock`` to run at exit (CANN's own runtime does the same); returns it."""
    atexit.register(acl.force_unlock)
    return acl.force_unlock


def lock_and_backup(acl: AclSnapshot) -> Dict[str, float]:
    """Lock, then back up; ``{"npu_lock": s, "npu_backup": s}``.

    All or nothing: on any failure the process is brought back to RUNNING
    (restored when backed up, unlocked) and an AscendError says what failed
    and whether the rollback worked. A state refusal touches nothing.
    """
    timings = {"npu_lock": 0.0, "npu_backup": 0.0}
    t0 = time.monotonic()
    acl.lock()
    timings["npu_lock"] = time.monotonic() - t0
    t0 = time.monotonic()
    try:
        acl.backup()
    except BaseException as exc:
        problems = acl.force_unlock()
        if not isinstance(exc, AscendError):
            raise
        note = (f"; rolling back failed, it may stay locked: {'; '.join(problems)}" if problems
                else f"; rolled back: pid {acl.pid} running again")
        raise type(exc)(exc.pid, exc.call, exc.result, f"{exc}{note}") from exc
    timings["npu_backup"] = time.monotonic() - t0
    return timings


def restore_and_unlock(acl: AclSnapshot) -> Dict[str, float]:
    """Restore, then unlock; ``{"npu_restore": s, "npu_unlock": s}``.

    A failed restore raises and leaves the process BACKED_UP (locked): a
    half-restored copy is killed by the caller, never let run.
    """
    timings = {"npu_restore": 0.0, "npu_unlock": 0.0}
    t0 = time.monotonic()
    acl.restore()
    timings["npu_restore"] = time.monotonic() - t0
    t0 = time.monotonic()
    acl.unlock()
    timings["npu_unlock"] = time.monotonic() - t0
    return timings


def agent_root() -> str:
    """Where NPU processes serve their snapshot agent: ``$WARMSTART_ASCEND_AGENT_DIR`` or /run/warmstart/ascend."""
    return os.environ.get(AGENT_ROOT_ENV) or AGENT_ROOT


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (a reader never sees half of it)."""
    safefs.write_file(path, text.encode("utf-8"), 0o600)


def _answer(acl: AclSnapshot, action: str) -> str:
    if action not in AGENT_ACTIONS:
        return f"error {action!r} is not one of {', '.join(AGENT_ACTIONS)}"
    if action == "state":
        return f"ok {acl.state}"
    if action == "force_unlock":
        problems = acl.force_unlock()
        return f"error {'; '.join(problems)}" if problems else f"ok {acl.state}"
    try:
        getattr(acl, action)()
    except AscendError as exc:
        return f"error {exc}"
    return f"ok {acl.state}"


def serve(acl: AclSnapshot, root: Optional[str] = None, poll: float = 0.02) -> threading.Thread:
    """Run this process's snapshot agent in a daemon thread; the node side asks it through ``AgentClient``.

    CANN acts on the calling process only, so an NPU process answers for itself: ``<root>/<pid>/request``
    holds one action (state, lock, backup, restore, unlock, force_unlock), answered in ``reply`` as ``ok <state>``
    or ``error <why>``. The thread is plain host memory: CRIU dumps and restores it with the process (same
    pid), so a restored copy answers ``restore`` / ``unlock`` where the source stopped. Also ``guard``s acl.
    """
    folder = os.path.join(root or agent_root(), str(acl.pid))
    os.makedirs(folder, exist_ok=True)
    request = os.path.join(folder, "request")
    write_atomic(os.path.join(folder, "agent"), f"{acl.pid}\n")
    guard(acl)

    def loop() -> None:  # pragma: no cover - runs in the NPU process's thread
        while True:
            try:
                with open(request, encoding="utf-8") as handle:
                    action = handle.read().strip()
                os.unlink(request)
            except OSError:
                time.sleep(poll)
                continue
            write_atomic(os.path.join(folder, "reply"), _answer(acl, action) + "\n")

    thread = threading.Thread(target=loop, name="warmstart-ascend-agent", daemon=True)
    thread.start()
    return thread


def _driver_version(root: Path) -> Tuple[Optional[str], Optional[str]]:
    path = root / DRIVER_VERSION_FILE
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None, f"no Ascend driver version file (/{DRIVER_VERSION_FILE})"
    for line in text.splitlines():
        key, value = (line.split("=", 1) + [""])[:2]
        if key.strip().lower() == "version" and value.strip():
            return value.strip(), None
    return None, f"/{DRIVER_VERSION_FILE} names no Version="


def npu_inventory(root: Path = Path("/")) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """Ascend NPUs from ``/dev/davinci<N>`` and the driver's version file, without loading any library.

    ``(devices, facts)``: devices ``[{"index", "path"}]`` by index; facts
    ``{"driver_version", "manager": bool (/dev/davinci_manager present), "reason": why empty / partial, or None}``.
    Never raises.
    """
    devices: List[Dict[str, Any]] = []
    dev = root / "dev"
    try:
        names = os.listdir(dev)
    except OSError:
        names = []
    for name in names:
        match = re.fullmatch(r"davinci(\d+)", name)
        if match:
            devices.append({"index": int(match.group(1)), "path": f"/dev/{name}"})
    devices.sort(key=lambda d: int(d["index"]))
    version, why = _driver_version(root)
    reasons = []
    if not devices:
        reasons.append("no /dev/davinci<N> device nodes")
    if why:
        reasons.append(why)
    facts = {"driver_version": version, "manager": (dev / "davinci_manager").exists(),
             "reason": "; ".join(reasons) or None}
    return devices, facts
