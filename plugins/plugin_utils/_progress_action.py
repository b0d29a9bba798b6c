# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side of long-running modules: run the module, print its progress while it works.

The module runs as usual (same connection, become, pipelining) in a thread of
the worker; meanwhile this side reads the small JSON file the module keeps up
to date (``progress_file``, in the task's remote temporary directory) every
``progress_interval`` seconds and prints one line per read, on the
controller's standard error (so that a stdout callback such as json stays
parseable):

    [node2] warmstart.snapshot.restore: download: 312.0 MiB of 516.0 MiB (60%), 85.2 MiB/s, ~2 s left

Runs shorter than one interval print nothing; an unreadable progress file
prints nothing; the task's result is the module's, untouched. A task with
``async`` runs the module the ordinary way.
"""
from __future__ import annotations

import json
import shlex
import threading
import time
from typing import Any, Dict, List, Optional

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible.utils.vars import merge_hash

from ansible_collections.warmstart.snapshot.plugins.module_utils.core._progress import human

display = Display()


def format_progress(doc: Dict[str, Any]) -> Optional[str]:
    """One readable line for a progress document, or None when there is nothing to say."""
    phase = doc.get("phase")
    if not phase or phase == "done":
        return None
    done = int(doc.get("done") or 0)
    total = doc.get("total")
    elapsed = float(doc.get("elapsed") or 0)
    rate = float(doc.get("rate") or 0)
    parts: List[str] = []
    if total:
        pct = min(100, int(done * 100 / total)) if total else 0
        parts.append(f"{human(done)} of {human(total)} ({pct}%)")
    elif done:
        parts.append(human(done))
    if done and rate > 0:
        parts.append(f"{human(rate)}/s")
        if total and total > done:
            parts.append(f"~{(total - done) / rate:.0f} s left")
    if not parts or not done:
        parts.append(f"{elapsed:.0f} s")
    return f"{phase}: " + ", ".join(parts)


class ProgressActionBase(ActionBase):
    """Base of the action plugins of modules that report progress (checkpoint, restore)."""

    _supports_check_mode = True
    _supports_async = True
    #: how often the module's file is looked at between progress lines (seconds)
    POLL = 0.5

    def run(self, tmp: Any = None, task_vars: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        result = super().run(tmp, task_vars)
        del tmp
        args = dict(self._task.args)
        try:
            interval = float(args.get("progress_interval", 10))
        except (TypeError, ValueError):
            interval = 0.0  # the module rejects the value with its own message
        wrap_async = bool(self._task.async_val) and not self._connection.has_native_async
        if wrap_async or interval <= 0:
            result = merge_hash(result, self._execute_module(task_vars=task_vars, wrap_async=wrap_async))
            if not wrap_async:
                self._remove_tmp_path(self._connection._shell.tmpdir)
            return result

        tmpdir = self._connection._shell.tmpdir or self._make_tmp_path()
        progress_file = args.get("progress_file") or self._connection._shell.join_path(tmpdir, "warmstart-progress.json")
        args["progress_file"] = progress_file
        outcome: Dict[str, Any] = {}

        def work() -> None:
            try:
                outcome["result"] = self._execute_module(module_args=args, task_vars=task_vars)
            except BaseException as exc:  # re-raised in the worker's main thread below
                outcome["error"] = exc

        worker = threading.Thread(target=work, name="warmstart-module", daemon=True)
        worker.start()
        host = (task_vars or {}).get("inventory_hostname", "?")
        if self._task.delegate_to:
            host = f"{host} -> {self._task.delegate_to}"
        label = self._task.action
        next_line = time.monotonic() + interval
        while worker.is_alive():
            worker.join(self.POLL)
            if worker.is_alive() and time.monotonic() >= next_line:
                line = self._read_progress(progress_file)
                if line:
                    # stderr: a stdout callback such as json keeps its document whole
                    display.display(f"[{host}] {label}: {line}", stderr=True)
                next_line = time.monotonic() + interval
        try:
            if "error" in outcome:
                raise outcome["error"]
            return merge_hash(result, outcome["result"])
        finally:
            self._remove_tmp_path(tmpdir)

    def _read_progress(self, path: str) -> Optional[str]:
        # Read as the connection user (no become): the file is world-readable counters in its own tmp dir,
        # and a become wrapper here would race the module's own become handshake on the same connection.
        try:
            res = self._low_level_execute_command("cat " + shlex.quote(path), sudoable=False)
        except Exception:  # pylint: disable=broad-except
            # progress must never fail the task
            return None
        if res.get("rc") != 0:
            return None
        try:
            return format_progress(json.loads(res.get("stdout") or "{}"))
        except (ValueError, TypeError, AttributeError):
            return None
