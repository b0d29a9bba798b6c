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

import json
import os
import shutil
import sys
import time
from typing import Any, Dict, List, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils import _container as ctr
from ansible_collections.warmstart.snapshot.plugins.module_utils import _lazy as lz
from ansible_collections.warmstart.snapshot.plugins.module_utils import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils import _progress as prog
from ansible_collections.warmstart.snapshot.plugins.module_utils import _retention as ret
from ansible_collections.warmstart.snapshot.plugins.module_utils import _snapshot as snap
from ansible_collections.warmstart.snapshot.plugins.module_utils import _store as st
from ansible_collections.warmstart.snapshot.plugins.module_utils._criu import CriuError, find_criu
from ansible_collections.warmstart.snapshot.plugins.module_utils._criu_rpc import CriuOptions
from ansible_collections.warmstart.snapshot.plugins.module_utils._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils._manifest import ManifestError
from ansible_collections.warmstart.snapshot.plugins.module_utils._proc import TargetError
from ansible_collections.warmstart.snapshot.plugins.module_utils._rootfs import RootfsError
from ansible_collections.warmstart.snapshot.plugins.module_utils._runtime import get_runtime, pod_container
from ansible_collections.warmstart.snapshot.plugins.module_utils._store import StoreError
from ansible_collections.warmstart.snapshot.plugins.module_utils._stores import open_store

ENGINE_ERRORS = (CriuError, ManifestError, TargetError, StoreError, snap.SnapshotError, RootfsError, OSError)


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


def progress_argument_spec() -> Dict[str, Any]:
    """``progress_interval`` and ``progress_file``, as the doc fragment warmstart.snapshot.store.progress documents them."""
    return dict(progress_interval=dict(type="float", default=10.0), progress_file=dict(type="path"))


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


def refuse_empty(p: Dict[str, Any], *keys: str) -> None:
    """An empty string is refused, never read as 'any': every such option named at once."""
    empty = [k for k in keys if isinstance(p.get(k), str) and not p[k].strip()]
    empty += [f"{k} (an element)" for k in keys if isinstance(p.get(k), list) and any(not str(v).strip() for v in p[k])]
    if empty:
        raise ManifestError(f"empty value for {', '.join(empty)}: give a snapshot id or name, or leave the option out")


def criu_options(p: Dict[str, Any]) -> CriuOptions:
    return CriuOptions(tcp=p["tcp"], ext_unix_sk=p["ext_unix_sk"], file_locks=p["file_locks"],
                       link_remap=p["link_remap"], ghost_limit=p["ghost_limit"], timeout=p["timeout"])


def run_checkpoint(module: Any) -> None:
    prog.start(module.params.get("progress_file"))
    try:
        _run_checkpoint(module)
    finally:  # exit_json / fail_json end the run with SystemExit
        prog.finish()


def _run_checkpoint(module: Any) -> None:
    p = module.params
    target_info: Dict[str, Any] = {}
    try:
        store = open_store(p["store"], p.get("store_options"))
        pod = p.get("pod")
        if pod:
            cid = pod_container(get_runtime(p["runtime"]), pod)
            target = ctr.resolve(p["runtime"], cid, name=pod["container"])
        elif p.get("container"):
            target = ctr.resolve(p["runtime"], p["container"])
        else:
            target = snap.resolve_target(p["pid"], p["pidfile"], p["workload"], p["workloads_root"])
        target_info = {"pid": target.pid, "name": target.name, "workload": target.workload,
                       "container": target.name if target.capture else None, "control_dir": target.control_dir}
        name = p["name"] or target.workload or (target.name if target.capture else "process")
        cuda = p.get("cuda") or "auto"
        lock_ms = p.get("cuda_lock_timeout", snap.cu.DEFAULT_LOCK_TIMEOUT_MS)
        if module.check_mode:
            store.ensure()
            plan = snap.cuda_plan(cuda, snap.GpuNode(), lock_ms)
            snap.find_cuda(plan, target.pid)
            what = f"container {target.name} (workload pid {target.pid})" if target.capture else f"pid {target.pid}"
            module.exit_json(changed=True, target=target_info, cuda=plan.result(),
                             msg=f"would snapshot {what} as {name}" + (" with its GPU state" if plan.used else ""))
        result = snap.checkpoint(store, target, name, p["labels"], criu_options(p), leave_running=p["leave_running"],
                                 wait_ready=p["wait_ready"], ready_timeout=p["ready_timeout"],
                                 criu_path=p["criu_path"], pod=_pod_record(pod, target) if pod else None,
                                 cuda=cuda, cuda_lock_timeout=lock_ms)
    except ENGINE_ERRORS as exc:
        fail(module, exc, target=target_info)
    if getattr(store, "transfer", None):
        result["transfer"] = dict(store.transfer)
    module.exit_json(changed=True, snapshot=result, target=target_info)


def _pod_record(pod: Dict[str, Any], target: Any) -> Dict[str, Any]:
    """The manifest's pod section: which pod and container this snapshot came from."""
    return {"namespace": pod.get("namespace") or "default", "name": pod["name"], "uid": pod.get("uid"),
            "container": pod["container"], "spec_hash": pod.get("spec_hash"),
            "container_id": target.capture.info.id if target.capture else None}


def _restore_into(module: Any) -> None:
    p = module.params
    into = p["into"]
    spec = into.get("container_map") or into.get("container")
    try:
        if into.get("pod"):
            cid = pod_container(get_runtime(into["runtime"]), into["pod"])
            spec = f"{into['pod']['source']}={cid}" if into["pod"].get("source") else cid
        store = open_store(p["store"], p.get("store_options"))
        result = ctr.restore_into(
            store, spec, snapshot_id=p["snapshot"], name=p["name"], labels=p["labels"], verify=p["verify"],
            skip_compat=p["skip_compat_check"], skip_image_check=into["skip_image_check"],
            kill_on_failure=into["kill_placeholder_on_failure"], runtime_name=into["runtime"],
            criu_path=p["criu_path"], restore_root=p["restore_root"], check_only=module.check_mode)
    except ENGINE_ERRORS as exc:
        fail(module, exc)
    done = [d for d in result["destinations"] if d["result"] in ("succeeded", "would restore")]
    if result["outcome"] != "succeeded":
        errors = [d["error"] for d in result["destinations"] if d.get("error")]
        tails = [line for d in result["destinations"] for line in d.get("criu_log_tail", [])]
        extra: Dict[str, Any] = {"criu_log_tail": tails} if tails else {}
        module.fail_json(msg=f"restore of snapshot {result['id']} {result['outcome'].replace('_', ' ')}: "
                         f"{len(done)} of {len(result['destinations'])} container(s) restored; " + "; ".join(errors),
                         restore=result, **extra)
    verb = "would restore" if module.check_mode else "restored"
    module.exit_json(changed=True, restore=result,
                     msg=f"{verb} snapshot {result['id']} into {', '.join(d['container'] for d in done)}")


def run_restore(module: Any) -> None:
    prog.start(module.params.get("progress_file"))
    try:
        _run_restore(module)
    finally:  # exit_json / fail_json end the run with SystemExit
        prog.finish()


def _run_restore(module: Any) -> None:
    p = module.params
    try:
        refuse_empty(p, "snapshot", "name")
    except ManifestError as exc:
        fail(module, exc)
    if p.get("into"):
        _restore_into(module)
        return
    roots = dict(workloads_root=p.get("workloads_root") or snap.wl.DEFAULT_ROOT)
    try:
        store = open_store(p["store"], p.get("store_options"))
        if module.check_mode:
            plan = snap.plan_restore(store, p["snapshot"], p["name"], p["labels"], verify=p["verify"],
                                     skip_compat=p["skip_compat_check"], criu_path=p["criu_path"],
                                     cuda=p.get("cuda") or "auto", **roots)
            module.exit_json(changed=True, restore=plan, msg=f"would restore snapshot {plan['id']}")
        result = snap.restore(store, snapshot_id=p["snapshot"], name=p["name"], labels=p["labels"],
                              verify=p["verify"], skip_compat=p["skip_compat_check"], criu_path=p["criu_path"],
                              restore_root=p["restore_root"], cuda=p.get("cuda") or "auto",
                              lazy=bool(p.get("lazy")), lazy_wait=bool(p.get("lazy_wait")),
                              lazy_timeout=float(p.get("lazy_timeout") or lz.DEFAULT_TIMEOUT),
                              page_server=p.get("page_server"), control_roots=p.get("control_roots"), **roots)
    except ENGINE_ERRORS + (lz.LazyError,) as exc:
        fail(module, exc)
    for warning in result.get("warnings", []):
        module.warn(warning)
    module.exit_json(changed=True, restore=result)


def run_page_server(module: Any) -> None:
    """Serve one snapshot's pages to one lazy restore elsewhere (``criu page-server --lazy-pages``)."""
    p = module.params
    try:
        store = open_store(p["store"], p.get("store_options"))
        criu = find_criu(p["criu_path"])
        if not criu:
            raise CriuError("no CRIU found on this node; prepare it with warmstart.snapshot.node_prep")
        if not 0 < p["port"] < 65536:
            raise lz.LazyError(f"port: {p['port']} is not a TCP port (1-65535)")
        doc = store.load(mf.check_id(p["snapshot"]))
        targets = doc.get("targets") or []
        if len(targets) != 1 or targets[0].get("kind") != "process":
            raise snap.SnapshotError(f"snapshot {doc['id']}: a page server serves single-process snapshots only")
        if module.check_mode:
            problems = st.verify_local(store, doc, fetch=False) if p["verify"] else []
            if problems:
                raise snap.SnapshotError(f"snapshot {doc['id']} is not intact", reasons=problems)
            module.exit_json(changed=True, page_server={"snapshot": doc["id"], "address": p["address"],
                                                        "port": p["port"]})
        problems = st.verify_local(store, doc, cached=True) if p["verify"] else []
        if problems:
            raise snap.SnapshotError(f"refusing to serve snapshot {doc['id']}: it is not intact", reasons=problems)
        images = os.path.join(store.local_dir(doc["id"]), targets[0]["path"], "criu")
        os.makedirs(p["log_dir"], mode=0o700, exist_ok=True)
        served = lz.serve(criu, images, p["log_dir"], p["address"], p["port"], float(p["timeout"]))
    except ENGINE_ERRORS + (lz.LazyError,) as exc:
        fail(module, exc)
    served["snapshot"] = doc["id"]
    module.exit_json(changed=True, page_server=served)


# --- snapshot_info and cleanup ------------------------------------------------

class QueryError(WarmstartError):
    """A JMESPath query that cannot run here (library missing, or bad syntax)."""


def _jmespath_search(query: str, data: Any) -> Any:
    try:
        import jmespath  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise QueryError(
            f"query needs the Python library jmespath on the managed node, and {sys.executable} cannot import it: "
            "install it for that interpreter (Debian/Ubuntu: apt-get install python3-jmespath; "
            "otherwise: python3 -m pip install jmespath), or drop the query and use "
            "the community.general.json_query filter on the controller") from None
    try:
        return jmespath.search(query, data)
    except jmespath.exceptions.JMESPathError as exc:
        raise QueryError(f"query {query!r} is not valid JMESPath: {exc}") from None


def _newest_mtime(top: str) -> float:
    """Latest modification time of ``top`` or anything under it (symlinks not followed)."""
    try:
        newest = os.lstat(top).st_mtime
    except OSError:
        return 0.0
    if not os.path.isdir(top) or os.path.islink(top):
        return newest
    for dirpath, dirs, files in os.walk(top):
        for entry in dirs + files:
            try:
                newest = max(newest, os.lstat(os.path.join(dirpath, entry)).st_mtime)
            except OSError:
                pass
    return newest


def _staging(store: st.FsStore, now: float) -> List[Dict[str, Any]]:
    out = []
    for entry in store.staging_entries():
        newest = _newest_mtime(entry["path"])
        out.append(dict(entry, newest_mtime=newest, age=round(now - max(entry["mtime"], newest), 1)))
    return out


def _restore_dirs(root: Optional[str], now: float) -> List[Dict[str, Any]]:
    """Restore work dirs (``<snapshot id>-<8 hex>``) directly under ``root``; nothing else is looked at."""
    out: List[Dict[str, Any]] = []
    if not root or not os.path.isdir(root):
        return out
    for entry in sorted(os.listdir(root)):
        full = os.path.join(root, entry)
        if not ret.RESTORE_DIR_RE.match(entry) or os.path.islink(full) or not os.path.isdir(full):
            continue
        try:
            mtime = os.lstat(full).st_mtime
        except FileNotFoundError:
            continue
        newest = _newest_mtime(full)
        out.append({"path": full, "mtime": mtime, "newest_mtime": newest, "size": st.tree_size(full),
                    "age": round(now - max(mtime, newest), 1)})
    return out


def _mark_newer_schema(store: st.FsStore, entry: Dict[str, Any]) -> Dict[str, Any]:
    """Tag an unreadable snapshot whose manifest a newer warmstart wrote (it is not broken)."""
    newer = ret.is_newer_schema(entry)
    if not newer:
        try:
            fd = os.open(os.path.join(store.snapshot_dir(entry["id"]), mf.MANIFEST), os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as handle:
                schema = json.loads(handle.read(mf.MAX_MANIFEST_BYTES)).get("schema")
            newer = isinstance(schema, int) and schema > mf.SCHEMA_VERSION
        except (OSError, ValueError, AttributeError, RecursionError):
            newer = False
    return dict(entry, newer_schema=newer, path=store.snapshot_dir(entry["id"]))


def _verify(store: st.FsStore, doc: Dict[str, Any]) -> List[str]:
    try:
        return st.verify_local(store, doc)
    except OSError as exc:
        return [f"{exc.filename or doc['id']}: cannot be read ({exc.strerror or exc})"]


def run_snapshot_info(module: Any) -> None:
    p = module.params
    now = time.time()
    try:
        refuse_empty(p, "name")
        store = open_store(p["store"], p.get("store_options"))
        if p["name"] is not None:
            mf.check_name(p["name"])
        labels = mf.check_labels(p["labels"])
        listed = store.list()
        staging = _staging(store, now)
    except ENGINE_ERRORS as exc:
        fail(module, exc)
    broken = [_mark_newer_schema(store, d) for d in listed if "error" in d]
    docs = ret.newest_first([d for d in listed if "error" not in d and mf.matches(d, p["name"], labels)])
    snapshots = []
    for doc in docs:
        item = dict(doc) if p["details"] else mf.summary(doc)
        item["path"] = store.snapshot_dir(doc["id"])
        if p["verify"]:
            problems = _verify(store, doc)
            item["intact"] = not problems
            item["problems"] = problems
        snapshots.append(item)
    store_info = {"path": store.root, "kind": store.kind,
                  "exists": os.path.isdir(store.snapshots) if store.kind == "fs" else True}
    result: Dict[str, Any] = dict(
        changed=False, store=store_info,
        snapshots=snapshots, count=len(snapshots), broken=broken, staging=staging)
    if p["query"]:
        try:
            result["query_result"] = _jmespath_search(p["query"], snapshots)
        except QueryError as exc:
            module.fail_json(msg=str(exc), **result)
    module.exit_json(**result)


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # pragma: no cover


def _remove_path(path: str, store: Optional[st.FsStore] = None) -> int:
    """Remove a staging entry or restore work dir; raises OSError when something stays behind."""
    if path.startswith("s3://") and store is not None:
        return store.delete_staging(path)
    if os.path.islink(path) or not os.path.isdir(path):
        size = os.lstat(path).st_size
        os.unlink(path)
        return size
    if store is not None:
        size = store.delete_staging(path)
    else:
        size = st.tree_size(path)
        shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        raise OSError(f"{path} could not be removed completely (permissions, or files still in use)")
    return size


def run_cleanup(module: Any) -> None:
    p = module.params
    now = time.time()
    try:
        pol = ret.policy(keep_last=p["keep_last"], max_age=p["max_age"],
                         incomplete_older_than=p["incomplete_older_than"], group_by=p["group_by"],
                         name=p["name"], labels=p["labels"], remove_broken=p["remove_broken"])
    except ret.RetentionError as exc:
        module.fail_json(msg=str(exc))
    try:
        refuse_empty(p, "name", "snapshot_ids")
        store = open_store(p["store"], p.get("store_options"))
        listed = store.list()
        staging = _staging(store, now)
        restore_dirs = _restore_dirs(p["restore_root"], now)
    except ENGINE_ERRORS as exc:
        fail(module, exc)
    listed = [_mark_newer_schema(store, d) if "error" in d else d for d in listed]
    decision = ret.plan(listed, staging, pol, now=now, restore_dirs=restore_dirs)

    doomed = [dict(entry) for entry in decision.remove]
    published = {d["id"]: d for d in listed if "error" not in d}
    missing = []
    for sid in p.get("snapshot_ids") or []:
        if sid in {e["id"] for e in doomed}:
            continue
        doc = published.get(sid)
        if doc is None:
            missing.append(sid)
            continue
        doomed.append({"id": sid, "name": doc.get("name"), "labels": doc.get("labels") or {},
                       "created_at": doc.get("created_at"), "group": None, "reason": "named in snapshot_ids"})
    doomed += [{"id": b["id"], "name": None, "labels": {}, "created_at": None, "group": None,
                "reason": f"{b['reason']}: {b['error']}"} for b in decision.broken if b["remove"]]
    removed_snapshots: List[Dict[str, Any]] = []
    removed_staging: List[Dict[str, Any]] = []
    removed_restore: List[Dict[str, Any]] = []
    errors: List[str] = []
    for entry in doomed:
        try:
            if module.check_mode:
                entry["size"] = st.tree_size(store.snapshot_dir(entry["id"]))
            else:
                entry["size"] = store.delete(entry["id"])
        except FileNotFoundError:
            module.warn(f"snapshot {entry['id']} was gone before cleanup removed it (another cleanup?)")
            continue
        except OSError as exc:
            errors.append(f"snapshot {entry['id']}: {exc.strerror or exc}")
            continue
        removed_snapshots.append(entry)
    for plan_list, out in ((decision.remove_staging, removed_staging),
                           (decision.remove_restore_dirs, removed_restore)):
        for entry in plan_list:
            item = dict(entry)
            try:
                if module.check_mode:
                    item["size"] = item.get("size") if item.get("size") is not None else st.tree_size(item["path"])
                else:
                    item["size"] = _remove_path(item["path"], store if out is removed_staging else None)
            except FileNotFoundError:
                continue
            except OSError as exc:
                errors.append(f"{item['path']}: {exc.strerror or exc}")
                continue
            out.append(item)

    removed_cache: List[Dict[str, Any]] = []
    if p.get("prune_node_cache") and store.kind == "s3":
        gone = {e["id"] for e in removed_snapshots}
        published = {d["id"] for d in listed if "error" not in d} - gone
        root = store.cache_root()
        for entry in sorted(os.listdir(root)) if os.path.isdir(root) else []:
            if not mf.is_id(entry) or entry in published:
                continue
            full = os.path.join(root, entry)
            item = {"id": entry, "path": full, "size": st.tree_size(full), "reason": "no longer published in the store"}
            if not module.check_mode:
                shutil.rmtree(full, ignore_errors=True)
                if os.path.lexists(full):
                    errors.append(f"{full}: could not be removed completely")
                    continue
            removed_cache.append(item)
    freed = sum(int(e.get("size") or 0) for e in removed_snapshots + removed_staging + removed_restore + removed_cache)
    verb = "would remove" if module.check_mode else "removed"
    kept = [k for k in decision.kept if k not in {e["id"] for e in removed_snapshots}]
    result: Dict[str, Any] = dict(
        changed=bool(removed_snapshots or removed_staging or removed_restore or removed_cache),
        removed=[e["id"] for e in removed_snapshots],
        removed_snapshots=removed_snapshots,
        removed_staging=removed_staging,
        removed_restore_dirs=removed_restore,
        removed_cache=removed_cache,
        missing=missing,
        bytes_freed=freed,
        kept=kept,
        broken=[{k: b[k] for k in ("id", "error", "remove", "reason")} for b in decision.broken],
        msg=(f"{verb} {len(removed_snapshots)} snapshot(s), {len(removed_staging)} staging dir(s) and "
             f"{len(removed_restore)} restore work dir(s)"
             + (f", {len(removed_cache)} cached snapshot(s)" if removed_cache else "")
             + f", {_human(freed)}; kept {len(kept)} snapshot(s)"),
    )
    if errors:
        module.fail_json(**dict(result, msg="cleanup could not remove everything: " + "; ".join(errors),
                                errors=errors))
    module.exit_json(**result)
