# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The workload module's runner: bring a workload to ``state``; every failure names the workload.

Keeps the runners' invariants (``_common``).
"""
from __future__ import annotations

import shlex
from typing import Any, List

from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _profile as pf
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _workload as wl
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import Params, Result
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError


def run(p: Params, check_mode: bool) -> Result:
    """Bring a workload to ``state``; every failure names the workload."""
    try:
        changed, result = wl.ensure(
            p["root"], p["name"], p["state"], _command(p["command"]),
            env={k: str(v) for k, v in p["env"].items()}, chdir=p["chdir"], wait_ready=p["wait_ready"],
            ready_timeout=p["ready_timeout"], stop_timeout=p["stop_timeout"], check_mode=check_mode,
            mount_namespace=p.get("mount_namespace", True) is not False,
            profile=pf.resolve(p.get("app_profile"), "app_profile") if p["state"] == "started" else None)
    except (WarmstartError, ValueError, OSError) as exc:
        raise wl.WorkloadError(f"workload {p['name']}: {exc}") from exc
    return dict(changed=changed, workload=result)


def _command(command: Any) -> List[str]:
    """The workload's argv: a list as given, a string split as a shell would (ValueError when it cannot be)."""
    if isinstance(command, str):
        command = shlex.split(command)
    return [str(c) for c in command or []]
