# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The checkpoint module's runner: resolve the target (a pod's container, a container, a process), snapshot it.

Keeps the runners' invariants (``_common``). Besides:

- A failure carries ``target`` (empty until the target is resolved).
- A checkpoint counts itself in the metrics directory (``metrics_dir``, else E(WARMSTART_METRICS_DIR); none =
  off) after the fact, success or failure, never in check mode; a metrics problem is a warning, never the
  task's failure (``_metrics``).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Mapping, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _accel as acc
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _checkpoint as ckpt
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _container as ctr
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _metrics as mt
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _profile as pf
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _common as common
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import Params, Result, with_context
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import CriuOptions
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._runtime import get_runtime, pod_container


def run(p: Params, check_mode: bool) -> Result:
    """Resolve the target, snapshot it; a failure carries ``target`` (empty until resolved)."""
    target_info: Dict[str, Any] = {}
    try:
        store = common.store_from(p)
        target = _target(p)
        if p.get("app_profile") is not None:
            target = dataclasses.replace(target, profile=pf.resolve(p["app_profile"], "app_profile"))
        target_info.update(pid=target.pid, name=target.name, workload=target.workload,
                           container=target.name if target.capture else None, control_dir=target.control_dir)
        name = p["name"] or target.workload or (target.name if target.capture else "process")
        chosen, cuda, node = acc.choose(p.get("accelerator"), p.get("cuda"))
        if chosen == "ascend" and target.capture:
            raise acc.AcceleratorError("accelerator: ascend snapshots processes only, not containers or pods")
        result = ckpt.checkpoint(store, target, name, p["labels"], _criu_options(p), leave_running=p["leave_running"],
                                 wait_ready=p["wait_ready"], ready_timeout=p["ready_timeout"],
                                 criu_path=p["criu_path"], pod=_pod_record(p.get("pod"), target),
                                 cuda=cuda, gpu_node=node,
                                 cuda_lock_timeout=p["cuda_lock_timeout"],
                                 check_mode=check_mode)
    except (WarmstartError, OSError) as exc:
        raise common.with_warning(with_context(exc, target=target_info), _record(p, check_mode, None))
    if check_mode:  # {"cuda", "msg"}: what would be snapshot
        return dict(result, changed=True, target=target_info)
    if store.transfer:
        result["transfer"] = dict(store.transfer)
    warning = _record(p, check_mode, result)
    return dict(changed=True, snapshot=result, target=target_info, **({"warnings": [warning]} if warning else {}))


def _criu_options(p: Params) -> CriuOptions:
    """The module's CRIU options (CRIU counts its ``timeout`` in whole seconds: a fraction is rounded up)."""
    return CriuOptions(tcp=p["tcp"], ext_unix_sk=p["ext_unix_sk"], file_locks=p["file_locks"],
                       link_remap=p["link_remap"], ghost_limit=p["ghost_limit"], timeout=math.ceil(p["timeout"]))


def _target(p: Params) -> Any:
    """The checkpoint's target: a pod's container, a container, or a process (pid, pidfile, workload)."""
    pod = p.get("pod")
    if pod:
        cid = pod_container(get_runtime(p["runtime"]), pod)
        return ctr.resolve(p["runtime"], cid, name=pod["container"], volumes=p.get("volumes") or ())
    if p.get("container"):
        return ctr.resolve(p["runtime"], p["container"], volumes=p.get("volumes") or ())
    if p.get("volumes"):
        raise snap.SnapshotError("volumes: only a container or pod target has volumes to take along")
    return snap.resolve_target(p["pid"], p["pidfile"], p["workload"], p["workloads_root"])


def _pod_record(pod: Optional[Mapping[str, Any]], target: Any) -> Optional[Dict[str, Any]]:
    """The manifest's pod section: which pod and container this snapshot came from (None without ``pod``)."""
    if not pod:
        return None
    return {"namespace": pod.get("namespace") or "default", "name": pod["name"], "uid": pod.get("uid"),
            "container": pod["container"], "spec_hash": pod.get("spec_hash"),
            "container_id": target.capture.info.id if target.capture else None}


def _record(p: Params, check_mode: bool, snapshot: Optional[Result]) -> Optional[str]:
    """Count a checkpoint (``snapshot``: its result; None: it failed); None or the warning to show."""
    directory = mt.resolve_dir(p.get("metrics_dir"))
    if check_mode or not directory:
        return None
    if snapshot is None:
        return mt.record_capture(directory, "failed")
    return mt.record_capture(directory, "succeeded", snapshot.get("timings"), int(snapshot.get("size") or 0))
