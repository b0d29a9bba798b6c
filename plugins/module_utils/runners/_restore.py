# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The restore module's runner: a process snapshot here, or a container snapshot ``into`` placeholders.

Keeps the runners' invariants (``_common``). Besides:

- The result carries ``outcome`` at the top on success and on failure (``failed`` unless the engine said
  otherwise, e.g. ``incompatible`` for a snapshot refused before anything was touched); a container restore
  that did not fully succeed fails with ``restore``.
- A restore counts itself in the metrics directory (``metrics_dir``, else E(WARMSTART_METRICS_DIR); none =
  off) after the fact, success or failure, never in check mode; a metrics problem is a warning, never the
  task's failure (``_metrics``).
"""
from __future__ import annotations

import time
from typing import Any, List, Mapping, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _accel as acc
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _lazy as lz
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _metrics as mt
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _profile as pf
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _restore as rs
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _restoreinto as rinto
from ansible_collections.warmstart.snapshot.plugins.module_utils.catalog import _retention as ret
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _workload as wl
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _common as common
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import Params, Result, with_context
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._runtime import get_runtime, pod_container

# A placeholder's result -> the restore outcome it counts as (refused: before anything was touched).
_DESTINATION_OUTCOMES = {"succeeded": "succeeded", "refused": "incompatible", "failed": "failed"}


def run(p: Params, check_mode: bool) -> Result:
    """A process snapshot here, or a container snapshot ``into`` placeholders; ``outcome`` either way."""
    try:
        common.refuse_empty(p, "snapshot", "name")
        if p.get("into") and p.get("app_profile") is not None:
            raise pf.ProfileError("app_profile: a restore into placeholders releases containers through the "
                                  "snapshot's own profile only; give app_profile for process snapshots")
        if p.get("into") and p.get("if_running", "refuse") != "refuse":
            raise WarmstartError("if_running: applies to a process restore; a restore into placeholders restores into "
                                 "the running placeholders it is given")
        result = _restore_into(_into_params(p), check_mode) if p.get("into") else _restore_process(p, check_mode)
    except (WarmstartError, OSError) as exc:
        err = with_context(exc, outcome="failed")
        details = err.details if isinstance(err, WarmstartError) else {}
        raise common.with_warning(err, *_record(p, check_mode, details.get("restore") or {},
                                                str(details.get("outcome") or "failed")))
    warnings = _record(p, check_mode, result["restore"], result["outcome"])
    if warnings:
        result["warnings"] = list(result.get("warnings") or []) + warnings
    return result


def _into_params(p: Params) -> Params:
    """``p`` with ``cuda`` resolved from ``accelerator`` (its alias) for a restore into placeholders."""
    chosen, cuda = acc.choose(p.get("accelerator"), p.get("cuda"))[:2]
    if chosen == "ascend":
        raise acc.AcceleratorError("accelerator: ascend restores process snapshots only, not into placeholders")
    return dict(p, cuda=cuda)


def _restore_process(p: Params, check_mode: bool) -> Result:
    cuda, node = acc.choose(p.get("accelerator"), p.get("cuda"))[1:]
    result = rs.restore(common.store_from(p), snapshot_id=p["snapshot"], name=p["name"], labels=p["labels"],
                        verify=p["verify"], skip_compat=p["skip_compat_check"], criu_path=p["criu_path"],
                        restore_root=p["restore_root"], cuda=cuda, gpu_node=node,
                        lazy=bool(p.get("lazy")), lazy_wait=bool(p.get("lazy_wait")),
                        lazy_timeout=float(p.get("lazy_timeout") or lz.DEFAULT_TIMEOUT),
                        lazy_verify=p.get("lazy_verify") or "before", page_server=p.get("page_server"), control_roots=p.get("control_roots"),
                        workloads_root=p.get("workloads_root") or wl.DEFAULT_ROOT, check_mode=check_mode,
                        tcp=p.get("tcp"), tls=common.tls_files(p), skip_unreadable=bool(p.get("skip_unreadable")),
                        insecure=bool(p.get("insecure")), profile=pf.resolve(p.get("app_profile"), "app_profile"),
                        if_running=p.get("if_running") or "refuse")
    outcome = result.get("outcome", "succeeded")
    if result.get("already_running"):  # if_running: keep, and this snapshot's copy runs: nothing to do
        return dict(changed=False, restore=result, outcome=outcome,
                    msg=f"workload {result['workload_name']} already runs as the restore of snapshot {result['id']} "
                        f"(pid {result['pid']})")
    if check_mode:
        return dict(changed=True, restore=result, outcome=outcome, msg=f"would restore snapshot {result['id']}")
    return dict(changed=True, restore=result, outcome=outcome, warnings=list(result.get("warnings", [])))


def _restore_into(p: Params, check_mode: bool) -> Result:
    """A container snapshot into placeholder containers; anything but full success fails, with ``restore``."""
    into = p["into"]
    spec = into.get("container_map") or into.get("container")
    if into.get("pod"):
        cid = pod_container(get_runtime(into["runtime"]), into["pod"])
        spec = f"{into['pod']['source']}={cid}" if into["pod"].get("source") else cid
    result = rinto.restore_into(
        common.store_from(p), spec, snapshot_id=p["snapshot"], name=p["name"], labels=p["labels"], verify=p["verify"],
        skip_compat=p["skip_compat_check"], skip_image_check=into["skip_image_check"],
        kill_on_failure=into["kill_placeholder_on_failure"], runtime_name=into["runtime"],
        criu_path=p["criu_path"], restore_root=p["restore_root"], check_mode=check_mode, tcp=p.get("tcp"),
        cuda=p.get("cuda") or "auto", skip_unreadable=bool(p.get("skip_unreadable")), lazy=bool(p.get("lazy")),
        lazy_wait=bool(p.get("lazy_wait")), lazy_timeout=float(p.get("lazy_timeout") or lz.DEFAULT_TIMEOUT))
    done = [d["container"] for d in result["destinations"] if d["result"] in ("succeeded", "would restore")]
    if result["outcome"] != "succeeded":
        raise _into_failed(result, len(done))
    verb = "would restore" if check_mode else "restored"
    return dict(changed=True, restore=result, outcome=result["outcome"],
                msg=f"{verb} snapshot {result['id']} into {', '.join(done)}")


def _into_failed(result: Result, done: int) -> WarmstartError:
    """A container restore that did not fully succeed: every destination's error, their CRIU log tails joined."""
    errors = [d["error"] for d in result["destinations"] if d.get("error")]
    tails = [line for d in result["destinations"] for line in d.get("criu_log_tail", [])]
    return WarmstartError(
        f"restore of snapshot {result['id']} {result['outcome'].replace('_', ' ')}: "
        f"{done} of {len(result['destinations'])} container(s) restored; " + "; ".join(errors),
        log_tail="\n".join(tails) or None, restore=result, outcome=result["outcome"])


def _record(p: Params, check_mode: bool, restored: Mapping[str, Any], outcome: str) -> List[str]:
    """Count a restore: one per placeholder with ``into`` (each its own outcome and timings), else one.

    A successful one also adds the snapshot's size and sets its age (namespace: ``into.pod``'s). Returns the
    warnings to show (at most one).
    """
    directory = mt.resolve_dir(p.get("metrics_dir"))
    if check_mode or not directory:
        return []
    destinations = restored.get("destinations")
    records = [(outcome, restored.get("timings"))] if destinations is None else \
        [(_DESTINATION_OUTCOMES.get(str(d.get("result")), "failed"), d.get("timings")) for d in destinations]
    size, age = _snapshot_facts(p, restored.get("id")) if any(o == "succeeded" for o, _t in records) else (0, None)
    namespace = str(((p.get("into") or {}).get("pod") or {}).get("namespace") or "")
    warnings = []
    for result, timings in records:
        done = result == "succeeded"
        warnings.append(mt.record_restore(directory, result, timings, size if done else 0, age if done else None,
                                          namespace, str(restored.get("name") or "")))
    return sorted({w for w in warnings if w})[:1]


def _snapshot_facts(p: Params, snapshot_id: Any) -> Tuple[int, Optional[float]]:
    """(size in bytes, age in seconds) of a restored snapshot from its manifest; (0, None) when unreadable."""
    if not snapshot_id:
        return 0, None
    try:
        doc = common.store_from(p).load(str(snapshot_id))
    except (WarmstartError, OSError, ValueError):
        return 0, None
    created = ret.created_ts(doc)
    return int(doc.get("size") or 0), (max(time.time() - created, 0.0) if created else None)
