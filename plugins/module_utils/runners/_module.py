# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node-side modules' side of the engine: argument-spec helpers and one call per module.

Each module's ``main()`` is its argument spec and ``_adapter.run_module(module, <function here>)``.
Every function here has the shape ``x(params, check_mode) -> result``: it translates the module's
options into one engine call and shapes that call's result into the module result.

Invariants:

- Nothing here exits, reports or catches to report: failures are raised (``WarmstartError`` with every
  reason, or ``OSError``) and the adapter turns them into the one failure shape.
- Context a failure must still carry (checkpoint's ``target``, restore's ``outcome``, the container
  restore's ``restore``) is added to the raised error's details, never reported here.
- Check mode is passed down; the engine decides what it means.
- checkpoint and restore count themselves in the metrics directory (``metrics_dir``, else
  E(WARMSTART_METRICS_DIR); none = off) after the fact, success or failure, never in check mode; a metrics
  problem is a warning, never the task's failure (``_metrics``).
"""
from __future__ import annotations

import shlex
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _accel as acc
from ansible_collections.warmstart.snapshot.plugins.module_utils.catalog import _cleanup as cln
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _container as ctr
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cuda as cu
from ansible_collections.warmstart.snapshot.plugins.module_utils.store.security import _fleetkey as fk
from ansible_collections.warmstart.snapshot.plugins.module_utils.catalog import _info as inf
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _lazy as lz
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _metrics as mt
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _node as nd
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _pageserver as ps
from ansible_collections.warmstart.snapshot.plugins.module_utils.catalog import _retention as ret
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _tls
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _workload as wl
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import with_context
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._gpunode import GpuNode
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import CriuOptions
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._manifest import ManifestError
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._runtime import get_runtime, pod_container
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._storeapi import Store
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._stores import open_store

Params = Mapping[str, Any]
Result = Dict[str, Any]


# --- argument specs ---------------------------------------------------------------

def tls_argument_spec() -> Dict[str, Any]:
    """``tls``, ``tls_ca``, ``tls_cert``, ``tls_key``, as the doc fragment warmstart.snapshot.tls documents them."""
    return dict(tls=dict(type="bool", default=False), tls_ca=dict(type="path"), tls_cert=dict(type="path"),
                tls_key=dict(type="path", no_log=False))


def _tls_files(p: Params) -> Optional[_tls.TlsFiles]:
    """The checked TLS files the options name (None: TLS off); TlsError with every problem."""
    return _tls.resolve(bool(p.get("tls")), p.get("tls_ca"), p.get("tls_cert"), p.get("tls_key"))


def store_argument_spec() -> Dict[str, Any]:
    """``store`` and ``store_options``, as the doc fragment warmstart.snapshot.store documents them."""
    return dict(
        store=dict(type="str", default="/var/lib/warmstart/store"),
        store_options=dict(type="dict", default={}, options=dict(
            endpoint_url=dict(type="str"),
            region=dict(type="str"),
            profile=dict(type="str"),
            cache_dir=dict(type="path", default="/var/lib/warmstart/cache"),
            concurrency=dict(type="int", default=8),
            peers=dict(type="list", elements="str"),
            peer_listen=dict(type="str"),
            peer_tls=dict(type="bool", default=False),
            peer_insecure=dict(type="bool", default=False),
            peer_wait=dict(type="float", default=60.0),
            peer_linger=dict(type="float", default=10.0),
            encryption=dict(type="bool", default=False),
            compression=dict(type="str", choices=["none", "zstd"]),
            compression_level=dict(type="int", default=3),
            kek_dir=dict(type="path", no_log=False),
            kek=dict(type="str", no_log=False),
            sse=dict(type="str", choices=["AES256", "aws:kms"]),
            sse_kms_key_id=dict(type="str", no_log=False),
            sse_customer_key=dict(type="str", no_log=True),
            access_key_id=dict(type="str", no_log=False),
            secret_access_key=dict(type="str", no_log=True),
            session_token=dict(type="str", no_log=True),
            signing_key=dict(type="path", no_log=False),
            trusted_keys=dict(type="path"),
        )),
    )


def pod_argument_spec(**extra: Any) -> Dict[str, Any]:
    """A pod target (checkpoint ``pod``, restore ``into.pod``): found on the node by its CRI labels."""
    return dict(type="dict", options=dict(
        namespace=dict(type="str", default="default"),
        name=dict(type="str", required=True),
        container=dict(type="str", required=True),
        container_id=dict(type="str"),
        **extra,
    ))


def metrics_argument_spec() -> Dict[str, Any]:
    """``metrics_dir``, as the doc fragment warmstart.snapshot.metrics documents it."""
    return dict(metrics_dir=dict(type="path"))


def progress_argument_spec() -> Dict[str, Any]:
    """``progress_interval`` and ``progress_file``, as the doc fragment warmstart.snapshot.store.progress documents them."""
    return dict(progress_interval=dict(type="float", default=10.0), progress_file=dict(type="path"))


# --- shared option translation ----------------------------------------------------

def refuse_empty(p: Params, *keys: str) -> None:
    """An empty string is refused, never read as 'any': every such option named at once."""
    empty = [k for k in keys if isinstance(p.get(k), str) and not p[k].strip()]
    empty += [f"{k} (an element)" for k in keys if isinstance(p.get(k), list) and any(not str(v).strip() for v in p[k])]
    if empty:
        raise ManifestError(f"empty value for {', '.join(empty)}: give a snapshot id or name, or leave the option out")


def criu_options(p: Params) -> CriuOptions:
    """The checkpoint module's CRIU options."""
    return CriuOptions(tcp=p["tcp"], ext_unix_sk=p["ext_unix_sk"], file_locks=p["file_locks"],
                       link_remap=p["link_remap"], ghost_limit=p["ghost_limit"], timeout=p["timeout"])


def _store(p: Params) -> Store:
    return open_store(p["store"], p.get("store_options"))


# --- checkpoint -------------------------------------------------------------------

def _accelerator(p: Params) -> Tuple[str, str, Optional[GpuNode]]:
    """``(accelerator, cuda mode, node)`` from ``accelerator`` and its alias ``cuda``; node None = this node's CUDA.

    V(ascend) runs the engine's accelerator path with the NPU agents' backend (``_accel.ascend_gpu_node``).
    """
    chosen, mode = acc.resolve(p.get("accelerator"), p.get("cuda"))
    if chosen == "ascend":
        return chosen, "required", acc.ascend_gpu_node()
    return chosen, mode, None


def checkpoint(p: Params, check_mode: bool) -> Result:
    """The checkpoint module: resolve the target, snapshot it; a failure carries ``target`` (empty until resolved)."""
    target_info: Dict[str, Any] = {}
    try:
        store = _store(p)
        target = _checkpoint_target(p)
        target_info.update(pid=target.pid, name=target.name, workload=target.workload,
                           container=target.name if target.capture else None, control_dir=target.control_dir)
        name = p["name"] or target.workload or (target.name if target.capture else "process")
        chosen, cuda, node = _accelerator(p)
        if chosen == "ascend" and target.capture:
            raise acc.AcceleratorError("accelerator: ascend snapshots processes only, not containers or pods")
        result = snap.checkpoint(store, target, name, p["labels"], criu_options(p), leave_running=p["leave_running"],
                                 wait_ready=p["wait_ready"], ready_timeout=p["ready_timeout"],
                                 criu_path=p["criu_path"], pod=_pod_record(p.get("pod"), target),
                                 cuda=cuda, gpu_node=node,
                                 cuda_lock_timeout=p.get("cuda_lock_timeout", cu.DEFAULT_LOCK_TIMEOUT_MS),
                                 check_mode=check_mode)
    except (WarmstartError, OSError) as exc:
        raise _with_warning(with_context(exc, target=target_info), _record_capture(p, check_mode, None))
    if check_mode:  # {"cuda", "msg"}: what would be snapshot
        return dict(result, changed=True, target=target_info)
    if store.transfer:
        result["transfer"] = dict(store.transfer)
    warning = _record_capture(p, check_mode, result)
    return dict(changed=True, snapshot=result, target=target_info, **({"warnings": [warning]} if warning else {}))


def _checkpoint_target(p: Params) -> Any:
    """The checkpoint's target: a pod's container, a container, or a process (pid, pidfile, workload)."""
    pod = p.get("pod")
    if pod:
        cid = pod_container(get_runtime(p["runtime"]), pod)
        return ctr.resolve(p["runtime"], cid, name=pod["container"])
    if p.get("container"):
        return ctr.resolve(p["runtime"], p["container"])
    return snap.resolve_target(p["pid"], p["pidfile"], p["workload"], p["workloads_root"])


def _pod_record(pod: Optional[Mapping[str, Any]], target: Any) -> Optional[Dict[str, Any]]:
    """The manifest's pod section: which pod and container this snapshot came from (None without ``pod``)."""
    if not pod:
        return None
    return {"namespace": pod.get("namespace") or "default", "name": pod["name"], "uid": pod.get("uid"),
            "container": pod["container"], "spec_hash": pod.get("spec_hash"),
            "container_id": target.capture.info.id if target.capture else None}


# --- restore ----------------------------------------------------------------------

def restore(p: Params, check_mode: bool) -> Result:
    """The restore module: a process snapshot here, or a container snapshot ``into`` placeholders.

    The result carries ``outcome`` at the top on success and on failure (``failed`` unless the engine
    said otherwise, e.g. ``incompatible`` for a snapshot refused before anything was touched).
    """
    try:
        refuse_empty(p, "snapshot", "name")
        result = _restore_into(_into_params(p), check_mode) if p.get("into") else _restore_process(p, check_mode)
    except (WarmstartError, OSError) as exc:
        err = with_context(exc, outcome="failed")
        details = err.details if isinstance(err, WarmstartError) else {}
        raise _with_warning(err, *_record_restore(p, check_mode, details.get("restore") or {},
                                                  str(details.get("outcome") or "failed")))
    warnings = _record_restore(p, check_mode, result["restore"], result["outcome"])
    if warnings:
        result["warnings"] = list(result.get("warnings") or []) + warnings
    return result


def _into_params(p: Params) -> Params:
    """``p`` with ``cuda`` resolved from ``accelerator`` (its alias) for a restore into placeholders."""
    chosen, cuda = _accelerator(p)[:2]
    if chosen == "ascend":
        raise acc.AcceleratorError("accelerator: ascend restores process snapshots only, not into placeholders")
    return dict(p, cuda=cuda)


def _restore_process(p: Params, check_mode: bool) -> Result:
    cuda, node = _accelerator(p)[1:]
    result = snap.restore(_store(p), snapshot_id=p["snapshot"], name=p["name"], labels=p["labels"],
                          verify=p["verify"], skip_compat=p["skip_compat_check"], criu_path=p["criu_path"],
                          restore_root=p["restore_root"], cuda=cuda, gpu_node=node,
                          lazy=bool(p.get("lazy")), lazy_wait=bool(p.get("lazy_wait")),
                          lazy_timeout=float(p.get("lazy_timeout") or lz.DEFAULT_TIMEOUT),
                          page_server=p.get("page_server"), control_roots=p.get("control_roots"),
                          workloads_root=p.get("workloads_root") or wl.DEFAULT_ROOT, check_mode=check_mode,
                          tcp=p.get("tcp"), tls=_tls_files(p), skip_unreadable=bool(p.get("skip_unreadable")),
                          insecure=bool(p.get("insecure")))
    outcome = result.get("outcome", "succeeded")
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
    result = ctr.restore_into(
        _store(p), spec, snapshot_id=p["snapshot"], name=p["name"], labels=p["labels"], verify=p["verify"],
        skip_compat=p["skip_compat_check"], skip_image_check=into["skip_image_check"],
        kill_on_failure=into["kill_placeholder_on_failure"], runtime_name=into["runtime"],
        criu_path=p["criu_path"], restore_root=p["restore_root"], check_mode=check_mode, tcp=p.get("tcp"),
        cuda=p.get("cuda") or "auto", skip_unreadable=bool(p.get("skip_unreadable")))
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


# --- metrics ----------------------------------------------------------------------

# A placeholder's result -> the restore outcome it counts as (refused: before anything was touched).
_DESTINATION_OUTCOMES = {"succeeded": "succeeded", "refused": "incompatible", "failed": "failed"}


def _with_warning(exc: Exception, *warnings: Optional[str]) -> Exception:
    """``exc`` with ``warnings`` added to its failure's warnings (a WarmstartError's details); returns it."""
    if isinstance(exc, WarmstartError):
        exc.details.setdefault("warnings", []).extend(w for w in warnings if w)
    return exc


def _record_capture(p: Params, check_mode: bool, snapshot: Optional[Result]) -> Optional[str]:
    """Count a checkpoint (``snapshot``: its result; None: it failed); None or the warning to show."""
    directory = mt.resolve_dir(p.get("metrics_dir"))
    if check_mode or not directory:
        return None
    if snapshot is None:
        return mt.record_capture(directory, "failed")
    return mt.record_capture(directory, "succeeded", snapshot.get("timings"), int(snapshot.get("size") or 0))


def _record_restore(p: Params, check_mode: bool, restored: Mapping[str, Any], outcome: str) -> List[str]:
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
        doc = _store(p).load(str(snapshot_id))
    except (WarmstartError, OSError, ValueError):
        return 0, None
    created = ret.created_ts(doc)
    return int(doc.get("size") or 0), (max(time.time() - created, 0.0) if created else None)


# --- page_server, snapshot_info, cleanup ------------------------------------------

def page_server(p: Params, check_mode: bool) -> Result:
    """The page_server module: serve one snapshot's pages to one lazy restore (check mode: verify only)."""
    served = ps.serve(_store(p), p["snapshot"], p["address"], p["port"], p["timeout"], p["log_dir"],
                      criu_path=p["criu_path"], verify=p["verify"], check_mode=check_mode, tls=_tls_files(p),
                      insecure=bool(p.get("insecure")))
    return dict(changed=True, page_server=served)


def snapshot_info(p: Params, check_mode: bool) -> Result:  # pylint: disable=unused-argument  # reads only
    """The snapshot_info module: list, filter, verify, query; the same in check mode."""
    refuse_empty(p, "name")
    return inf.snapshot_info(_store(p), name=p["name"], labels=p["labels"], details=p["details"],
                             verify=p["verify"], query=p["query"])


def cleanup(p: Params, check_mode: bool) -> Result:
    """The cleanup module: the retention policy checked first, then applied (check mode: measured only)."""
    pol = ret.policy(keep_last=p["keep_last"], max_age=p["max_age"],
                     incomplete_older_than=p["incomplete_older_than"], group_by=p["group_by"],
                     name=p["name"], labels=p["labels"], remove_broken=p["remove_broken"])
    refuse_empty(p, "name", "snapshot_ids")
    return cln.cleanup(_store(p), pol, snapshot_ids=p.get("snapshot_ids") or [], restore_root=p["restore_root"],
                       prune_node_cache=bool(p.get("prune_node_cache")), check_mode=check_mode)


# --- node_info, workload ----------------------------------------------------------

def node_info(p: Params, check_mode: bool) -> Result:  # pylint: disable=unused-argument  # reads only
    """The node_info module: this node's facts, also as the fact ``warmstart_node``."""
    try:
        node = nd.collect(snapshot_root=p["snapshot_root"], criu_path=p["criu_path"],
                          kernel_min_version=p["kernel_min_version"], probe_features=p["probe_features"])
    except ValueError as exc:  # an option the engine cannot read (kernel_min_version)
        if isinstance(exc, WarmstartError):
            raise
        raise WarmstartError(str(exc)) from exc
    return dict(changed=False, node=node, ansible_facts={"warmstart_node": node})


def workload(p: Params, check_mode: bool) -> Result:
    """The workload module: bring a workload to ``state``; every failure names the workload."""
    try:
        changed, result = wl.ensure(
            p["root"], p["name"], p["state"], _command(p["command"]),
            env={k: str(v) for k, v in p["env"].items()}, chdir=p["chdir"], wait_ready=p["wait_ready"],
            ready_timeout=p["ready_timeout"], stop_timeout=p["stop_timeout"], check_mode=check_mode,
            mount_namespace=p.get("mount_namespace", True) is not False)
    except (WarmstartError, ValueError, OSError) as exc:
        raise wl.WorkloadError(f"workload {p['name']}: {exc}") from exc
    return dict(changed=changed, workload=result)


def _command(command: Any) -> List[str]:
    """The workload's argv: a list as given, a string split as a shell would (ValueError when it cannot be)."""
    if isinstance(command, str):
        command = shlex.split(command)
    return [str(c) for c in command or []]


def fleet_key(p: Params, check_mode: bool) -> Result:
    """The fleet_key module: the fleet's signing key at ``path``, made once; its public half returned."""
    key = fk.ensure(p["path"], check_mode)
    return dict(changed=key.created, path=key.path, key_id=key.key_id, public_key=key.public_pem)
