# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Retention applied to a store and this node: plan, remove, report.

``cleanup`` runs in phases, each a short function:

1. plan: list the store, its staging entries and the restore work dirs; ``_retention.plan`` decides
   (it is pure), plus the snapshots named in ``snapshot_ids``;
2. remove the doomed snapshots (unpublished first by the store);
3. remove the stale staging entries and restore work dirs;
4. prune this node's cache of an object store (``prune_node_cache``): cached snapshots no longer published;
5. report: what went, what was kept, the bytes freed.

Invariants:

- In check mode nothing is removed: every phase only measures what it would remove.
- One entry that cannot be removed does not stop the others; every such failure is collected and the run
  then raises ``CleanupError`` whose details are the whole result plus ``errors``.
- Something already gone (another cleanup) is skipped; a vanished snapshot is a warning.
- Only entries the store lists as warmstart's own (staging naming, restore dir naming) are ever touched.
"""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.catalog import _info as info
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _progress as prog
from ansible_collections.warmstart.snapshot.plugins.module_utils.catalog import _retention as ret
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._storeapi import Store


class CleanupError(WarmstartError):
    """Some of what cleanup planned could not be removed; ``details`` hold the whole result and ``errors``."""


@dataclass
class _Done:
    """What the removal phases did: each list in result order, plus the failures and warnings met."""

    snapshots: List[Dict[str, Any]] = field(default_factory=list)
    staging: List[Dict[str, Any]] = field(default_factory=list)
    restore_dirs: List[Dict[str, Any]] = field(default_factory=list)
    cache: List[Dict[str, Any]] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)

    def everything(self) -> List[Dict[str, Any]]:
        return self.snapshots + self.staging + self.restore_dirs + self.cache


def cleanup(store: Store, pol: ret.Policy, snapshot_ids: Sequence[str] = (), restore_root: Optional[str] = None,
            prune_node_cache: bool = False, check_mode: bool = False, now: Optional[float] = None) -> Dict[str, Any]:
    """Apply ``pol`` (and ``snapshot_ids``) to ``store`` and ``restore_root``; the cleanup module's result.

    Raises ``CleanupError`` (details: this result and ``errors``) when anything planned stayed behind.
    """
    now = time.time() if now is None else now
    listed = [info.mark_newer_schema(store, d) if "error" in d else d for d in store.list()]
    decision = ret.plan(listed, info.staging(store, now), pol, now=now,
                        restore_dirs=info.restore_dirs(restore_root, now))
    doomed, missing = _doomed(decision, listed, snapshot_ids)
    done = _Done()
    _remove_snapshots(store, doomed, check_mode, done)
    _remove_paths(decision.remove_staging, store, check_mode, done.staging, done.errors)
    _remove_paths(decision.remove_restore_dirs, None, check_mode, done.restore_dirs, done.errors)
    if prune_node_cache:
        _prune_cache(store, listed, check_mode, done)
    result = _report(decision, {d["id"]: d for d in listed if "error" not in d}, missing, done, check_mode)
    if done.errors:
        raise CleanupError("cleanup could not remove everything", reasons=done.errors, errors=list(done.errors),
                           **{k: v for k, v in result.items() if k != "msg"})
    return result


def _doomed(decision: ret.Plan, listed: List[Dict[str, Any]],
            snapshot_ids: Sequence[str]) -> Tuple[List[Dict[str, Any]], List[str]]:
    """The snapshots to remove (the plan's, those named in ``snapshot_ids``, broken ones marked for removal)
    and the named ids that are not published."""
    doomed = [dict(entry) for entry in decision.remove]
    published = {d["id"]: d for d in listed if "error" not in d}
    missing = []
    for sid in snapshot_ids:
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
    return doomed, missing


def _remove_snapshots(store: Store, doomed: List[Dict[str, Any]], check_mode: bool, done: _Done) -> None:
    """Remove (check mode: measure) each doomed snapshot; a vanished one warns, a failure is collected."""
    for entry in doomed:
        try:
            entry["size"] = st.tree_size(store.snapshot_dir(entry["id"])) if check_mode else store.delete(entry["id"])
        except FileNotFoundError:
            done.warnings.append(f"snapshot {entry['id']} was gone before cleanup removed it (another cleanup?)")
            continue
        except OSError as exc:
            done.errors.append(f"snapshot {entry['id']}: {exc.strerror or exc}")
            continue
        done.snapshots.append(entry)


def _remove_paths(planned: List[Dict[str, Any]], store: Optional[Store], check_mode: bool, out: List[Dict[str, Any]],
                  errors: List[str]) -> None:
    """Remove (check mode: measure) staging entries (``store`` given) or restore work dirs (``store`` None)."""
    for entry in planned:
        item = dict(entry)
        try:
            if check_mode:
                item["size"] = item["size"] if item.get("size") is not None else st.tree_size(item["path"])
            else:
                item["size"] = remove_path(item["path"], store)
        except FileNotFoundError:
            continue
        except OSError as exc:
            errors.append(f"{item['path']}: {exc.strerror or exc}")
            continue
        out.append(item)


def remove_path(path: str, store: Optional[Store] = None) -> int:
    """Remove a staging entry (through ``store``) or a restore work dir; its size. OSError when something stays."""
    if path.startswith("s3://") and store is not None:
        return int(store.delete_staging(path))
    if os.path.islink(path) or not os.path.isdir(path):
        size = os.lstat(path).st_size
        os.unlink(path)
        return size
    if store is not None:
        size = int(store.delete_staging(path))
    else:
        size = st.tree_size(path)
        shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        raise OSError(f"{path} could not be removed completely (permissions, or files still in use)")
    return size


def _prune_cache(store: Store, listed: List[Dict[str, Any]], check_mode: bool, done: _Done) -> None:
    """Remove this node's cached copies of snapshots the store no longer publishes (none for a filesystem store)."""
    root = store.cache_root()
    if root is None or not os.path.isdir(root):
        return
    gone = {e["id"] for e in done.snapshots}
    published = {d["id"] for d in listed if "error" not in d} - gone
    for entry in sorted(os.listdir(root)):
        if not mf.is_id(entry) or entry in published:
            continue
        full = os.path.join(root, entry)
        item = {"id": entry, "path": full, "size": st.tree_size(full), "reason": "no longer published in the store"}
        if not check_mode:
            shutil.rmtree(full, ignore_errors=True)
            if os.path.lexists(full):
                done.errors.append(f"{full}: could not be removed completely")
                continue
        done.cache.append(item)


def _report(decision: ret.Plan, published: Dict[str, Dict[str, Any]], missing: List[str], done: _Done,
            check_mode: bool) -> Dict[str, Any]:
    """The module result for what the phases did (``warnings`` included for the adapter)."""
    freed = sum(int(e.get("size") or 0) for e in done.everything())
    removed = {e["id"] for e in done.snapshots}
    kept = [{"id": k, "name": published[k].get("name"), "labels": published[k].get("labels") or {},
             "created_at": published[k].get("created_at")}
            for k in decision.kept if k not in removed and k in published]
    msg = (f"{'would remove' if check_mode else 'removed'} {len(done.snapshots)} snapshot(s), "
           f"{len(done.staging)} staging dir(s) and {len(done.restore_dirs)} restore work dir(s)"
           + (f", {len(done.cache)} cached snapshot(s)" if done.cache else "")
           + f", {prog.human(freed)}; kept {len(kept)} snapshot(s)")
    return dict(
        changed=bool(done.everything()), removed=done.snapshots,
        removed_staging=done.staging, removed_restore_dirs=done.restore_dirs, removed_cache=done.cache,
        missing=missing, bytes_freed=freed, kept=kept,
        broken=[{k: b[k] for k in ("id", "error", "remove", "reason")} for b in decision.broken],
        msg=msg, warnings=list(done.warnings))
