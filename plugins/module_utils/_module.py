# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Glue between AnsibleModule parameters and the engine, shared by the modules.

Each ``run_*`` takes the module object, calls one engine function and ends
with ``exit_json`` / ``fail_json``; errors carry every reason and, when CRIU
failed, the tail of its log.
"""
from __future__ import annotations

from typing import Any, Dict

from ansible_collections.warmstart.snapshot.plugins.module_utils import _snapshot as snap
from ansible_collections.warmstart.snapshot.plugins.module_utils._criu import CriuError
from ansible_collections.warmstart.snapshot.plugins.module_utils._criu_rpc import CriuOptions
from ansible_collections.warmstart.snapshot.plugins.module_utils._manifest import ManifestError
from ansible_collections.warmstart.snapshot.plugins.module_utils._proc import TargetError
from ansible_collections.warmstart.snapshot.plugins.module_utils._store import StoreError, open_store

ENGINE_ERRORS = (CriuError, ManifestError, TargetError, StoreError, snap.SnapshotError, OSError)


def fail(module: Any, exc: BaseException, **extra: Any) -> None:
    result: Dict[str, Any] = dict(extra)
    reasons = getattr(exc, "reasons", None)
    msg = str(exc)
    if reasons:
        result["reasons"] = reasons
        msg += ": " + "; ".join(reasons)
    tail = getattr(exc, "log_tail", None)
    if tail:
        result["criu_log_tail"] = tail.splitlines()
    if isinstance(exc, OSError) and not isinstance(exc, (StoreError,)):
        msg = f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": ")
    module.fail_json(msg=msg, **result)


def criu_options(p: Dict[str, Any]) -> CriuOptions:
    return CriuOptions(tcp=p["tcp"], ext_unix_sk=p["ext_unix_sk"], file_locks=p["file_locks"],
                       link_remap=p["link_remap"], ghost_limit=p["ghost_limit"], timeout=p["timeout"])


def run_checkpoint(module: Any) -> None:
    p = module.params
    target_info: Dict[str, Any] = {}
    try:
        store = open_store(p["store"])
        target = snap.resolve_target(p["pid"], p["pidfile"], p["workload"], p["workloads_root"])
        target_info = {"pid": target.pid, "name": target.name, "workload": target.workload,
                       "control_dir": target.control_dir}
        name = p["name"] or target.workload or "process"
        if module.check_mode:
            store.ensure()
            module.exit_json(changed=True, target=target_info, msg=f"would snapshot pid {target.pid} as {name}")
        result = snap.checkpoint(store, target, name, p["labels"], criu_options(p), leave_running=p["leave_running"],
                                 wait_ready=p["wait_ready"], ready_timeout=p["ready_timeout"],
                                 criu_path=p["criu_path"])
    except ENGINE_ERRORS as exc:
        fail(module, exc, target=target_info)
    module.exit_json(changed=True, snapshot=result, target=target_info)


def run_restore(module: Any) -> None:
    p = module.params
    try:
        store = open_store(p["store"])
        if module.check_mode:
            plan = snap.plan_restore(store, p["snapshot"], p["name"], p["labels"], verify=p["verify"],
                                     skip_compat=p["skip_compat_check"], criu_path=p["criu_path"])
            module.exit_json(changed=True, restore=plan, msg=f"would restore snapshot {plan['id']}")
        result = snap.restore(store, snapshot_id=p["snapshot"], name=p["name"], labels=p["labels"],
                              verify=p["verify"], skip_compat=p["skip_compat_check"], criu_path=p["criu_path"],
                              restore_root=p["restore_root"])
    except ENGINE_ERRORS as exc:
        fail(module, exc)
    module.exit_json(changed=True, restore=result)
