# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The guardian: resumes a stopped source if we die mid-checkpoint.

A checkpoint forks a detached watcher before it stops the tree (``start_guardian``) and lets it go once the
source is resumed or ended (``release_guardian``). When this process dies first, the watcher waits until
CRIU has let go of the tree, sends SIGCONT to every stopped task until the tree has stayed untraced for
GUARDIAN_GRACE s, then runs the CUDA rollback: the source is never left frozen.
"""
from __future__ import annotations

import os
import signal
import time
from typing import Any, Callable, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc


GUARDIAN_DONE = b"done"
GUARDIAN_GRACE = 5.0  # seconds the tree must stay untraced before the guardian leaves


def start_guardian(pid: int, on_abandon: Optional[Callable[[], Any]] = None) -> int:
    """Fork a detached watcher; returns the write end of its pipe.

    ``release_guardian`` (the source is resumed or ended) lets it go at once.
    When the pipe closes without that (this process was killed or failed), the
    watcher waits until CRIU has let go of the tree (no task has a tracer: while
    CRIU's parasite runs, traced tasks show as S/R, not only 't'), sends SIGCONT
    to every stopped task, and keeps doing so until the tree has stayed
    untraced for GUARDIAN_GRACE s, so the source is never left frozen - not even
    by a CRIU that finishes its dump after we died. Then it runs ``on_abandon``
    (the CUDA rollback: restore + unlock of the processes locked for the dump).
    """
    rfd, wfd = os.pipe()

    def watch() -> None:  # pragma: no cover - runs in the detached watcher
        said = b""
        while True:
            data = os.read(rfd, 4096)
            if not data:
                break
            said += data
        if GUARDIAN_DONE not in said:
            _guard(pid)
            if on_abandon is not None:
                on_abandon()

    proc.detach(watch, keep=(rfd,))
    os.close(rfd)
    return wfd


def release_guardian(wfd: int) -> None:
    """The source is resumed or ended: the guardian has nothing left to do."""
    try:
        os.write(wfd, GUARDIAN_DONE)
    finally:
        os.close(wfd)


def _guard(pid: int) -> None:  # pragma: no cover - runs in the forked watcher
    end = time.monotonic() + 3600
    quiet_since: Optional[float] = None
    while time.monotonic() < end:
        tree = proc.descendants(pid)
        if any(_traced(p) for p in tree):
            quiet_since = None
        else:
            for p in tree:
                if _state(p) == "T":
                    try:
                        os.kill(p, signal.SIGCONT)
                    except OSError:
                        pass
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= GUARDIAN_GRACE:
                return
        time.sleep(0.1)


def _traced(pid: int) -> bool:
    try:
        return proc.status(pid).get("TracerPid", "0") not in ("0", "")
    except OSError:
        return False


def _state(pid: int) -> str:
    try:
        return proc.stat_fields(pid)[0]
    except (OSError, IndexError):
        return "X"
