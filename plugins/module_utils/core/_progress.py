# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Progress of a long module run, as a small JSON file another process can read.

The engine calls ``phase()`` when it enters a phase (download, verify, dump,
upload, restore, ...) and ``add()`` as bytes go by; both are cheap no-ops
unless ``start()`` named a file. The file is rewritten atomically at most a
few times a second, so a reader (the collection's action plugins, which print
it as task progress, or any monitor) always sees a whole document:

    {"phase": "download", "done": 123, "total": 456, "elapsed": 1.2,
     "rate": 1.0e8, "phases": {"select": 0.01}, "pid": 4242, "updated": 1733....}

Reporting never fails the work: a progress file that cannot be written is
given up silently.
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Dict, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs

MIN_INTERVAL = 0.5
UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


class Reporter:
    """Phase and byte counters for one module run (thread-safe)."""

    def __init__(self, path: Optional[str], min_interval: float = MIN_INTERVAL) -> None:
        self.path = path
        self.min_interval = min_interval
        self._lock = threading.Lock()
        self._phase: Optional[str] = None
        self._total: Optional[int] = None
        self._done = 0
        self._t_phase = time.monotonic()
        self._t_written = 0.0
        self.phases: Dict[str, float] = {}

    def snapshot(self) -> Dict[str, Any]:
        elapsed = time.monotonic() - self._t_phase
        return {
            "phase": self._phase,
            "done": self._done,
            "total": self._total,
            "elapsed": round(elapsed, 3),
            "rate": round(self._done / elapsed, 1) if elapsed > 0 else 0.0,
            "phases": {k: round(v, 3) for k, v in self.phases.items()},
            "pid": os.getpid(),
            "updated": time.time(),
        }

    def _write(self, force: bool = False) -> None:
        if not self.path:
            return
        now = time.monotonic()
        if not force and now - self._t_written < self.min_interval:
            return
        self._t_written = now
        try:
            # readable by the connection user that polls it (it holds counters only); the progress dir may be
            # theirs, so the file is replaced through safefs, nothing followed
            safefs.write_file(os.path.abspath(self.path), json.dumps(self.snapshot()).encode("utf-8"), 0o644)
        except OSError:
            self.path = None  # no place to report to: the work goes on without progress

    def phase(self, name: str, total: Optional[int] = None) -> None:
        with self._lock:
            self._close_phase()
            self._phase, self._total, self._done = name, total, 0
            self._t_phase = time.monotonic()
            self._write(force=True)

    def _close_phase(self) -> None:
        if self._phase is not None:
            self.phases[self._phase] = self.phases.get(self._phase, 0.0) + time.monotonic() - self._t_phase

    def add(self, n: int) -> None:
        with self._lock:
            self._done += n
            self._write()

    def finish(self) -> None:
        with self._lock:
            self._close_phase()
            self._phase, self._total, self._done = "done", None, 0
            self._t_phase = time.monotonic()
            self._write(force=True)


_current = Reporter(None)


def start(path: Optional[str], min_interval: float = MIN_INTERVAL) -> Reporter:
    """Report this run's progress to ``path`` (None: report nowhere)."""
    global _current  # pylint: disable=global-statement
    _current = Reporter(path, min_interval)
    return _current


def current() -> Reporter:
    return _current


def phase(name: str, total: Optional[int] = None) -> None:
    """Enter phase ``name``; ``total`` is its size in bytes when known."""
    _current.phase(name, total)


def add(n: int) -> None:
    """``n`` more bytes of the current phase are done."""
    _current.add(n)


def finish() -> None:
    _current.finish()


def human(size: float) -> str:
    """``size`` bytes for people: whole bytes below 1 KiB, else one decimal of KiB, MiB, GiB or TiB."""
    value = float(size)
    for unit in UNITS[:-1]:
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} {UNITS[-1]}"
