# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Control-directory sentinels shared by a workload and warmstart.

The workload writes ``ready-for-snapshot`` when warm; a restore writes
``restore-complete`` (``pid=<pid in the workload's pid namespace>``) or
``restore-failed``. Writes are atomic (temp file + rename).
"""
from __future__ import annotations

import os
import time
from typing import Dict, Optional

READY = "ready-for-snapshot"
RESTORE_COMPLETE = "restore-complete"
RESTORE_FAILED = "restore-failed"
ENV_VAR = "SNAPSHOT_CONTROL_DIR"


def write(control_dir: str, name: str, content: str = "") -> str:
    path = os.path.join(control_dir, name)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(content)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(tmp, 0o644)
    os.rename(tmp, path)
    return path


def clear(control_dir: str, *names: str) -> None:
    for name in names:
        try:
            os.unlink(os.path.join(control_dir, name))
        except FileNotFoundError:
            pass


def present(control_dir: str, name: str) -> bool:
    return os.path.exists(os.path.join(control_dir, name))


def wait_for(control_dir: str, name: str, timeout: float, alive: Optional[int] = None,
             interval: float = 0.1) -> float:
    """Wait until ``name`` appears; return the seconds waited.

    Raises TimeoutError after ``timeout`` s, or ProcessLookupError when the
    process ``alive`` exits while we wait.
    """
    start = time.monotonic()
    path = os.path.join(control_dir, name)
    while not os.path.exists(path):
        if alive is not None and not _running(alive):
            raise ProcessLookupError(f"process {alive} exited before writing {path}")
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{path} did not appear within {timeout:g} s")
        time.sleep(interval)
    return time.monotonic() - start


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def process_control_dir(pid: int) -> Optional[str]:
    """The SNAPSHOT_CONTROL_DIR a process was started with, if any."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            env = handle.read().split(b"\0")
    except OSError:
        return None
    prefix = ENV_VAR.encode() + b"="
    for item in env:
        if item.startswith(prefix):
            return item[len(prefix):].decode("utf-8", "replace") or None
    return None


def parse_kv(text: str) -> Dict[str, str]:
    out = {}
    for line in text.splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out
