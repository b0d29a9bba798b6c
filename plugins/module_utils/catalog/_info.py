# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a store holds: published snapshots (filtered, verified), broken ones, staging left-overs.

``snapshot_info`` is the read-only report behind the module of that name; the scans
(``staging``, ``restore_dirs``, ``mark_newer_schema``) are shared with cleanup.

Invariants:

- Nothing here writes: not the store, not the node (verification reads the local copy only).
- A broken snapshot is listed, never raised: one bad manifest does not hide the others.
- An age is measured from the newest change anywhere in an entry (symlinks not followed),
  so a staging dir that is still being written is young.
- A failing ``query`` raises ``QueryError`` carrying the whole result in its details.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Dict, List, Mapping, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.catalog import _retention as ret
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._storeapi import Store


class QueryError(WarmstartError):
    """A JMESPath query that cannot run here (library missing, or bad syntax)."""


def jmespath_search(query: str, data: Any) -> Any:
    """``query`` over ``data``; QueryError when jmespath is missing or the query is not valid."""
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


def newest_mtime(top: str) -> float:
    """Latest modification time of ``top`` or anything under it (symlinks not followed); 0 when gone."""
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


def staging(store: Store, now: float) -> List[Dict[str, Any]]:
    """The store's staging entries, each with ``newest_mtime`` and ``age`` (seconds since its last change)."""
    out = []
    for entry in store.staging_entries():
        newest = newest_mtime(entry["path"])
        out.append(dict(entry, newest_mtime=newest, age=round(now - max(entry["mtime"], newest), 1)))
    return out


def restore_dirs(root: Optional[str], now: float) -> List[Dict[str, Any]]:
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
        newest = newest_mtime(full)
        out.append({"path": full, "mtime": mtime, "newest_mtime": newest, "size": st.tree_size(full),
                    "age": round(now - max(mtime, newest), 1)})
    return out


def mark_newer_schema(store: Store, entry: Dict[str, Any]) -> Dict[str, Any]:
    """An unreadable snapshot's entry with ``newer_schema`` (a newer warmstart wrote it: not broken) and ``path``."""
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


def _problems(store: Store, doc: Dict[str, Any]) -> List[str]:
    """Checksum problems of ``doc``'s local copy; an unreadable file is a problem, not a failure."""
    try:
        return store.verify(doc)
    except OSError as exc:
        return [f"{exc.filename or doc['id']}: cannot be read ({exc.strerror or exc})"]


def _item(store: Store, doc: Dict[str, Any], details: bool, verify: bool) -> Dict[str, Any]:
    """One listed snapshot: the manifest or its summary, its path, and (``verify``) whether it is intact."""
    item = dict(doc) if details else mf.summary(doc)
    item["path"] = store.snapshot_dir(doc["id"])
    if verify:
        problems = _problems(store, doc)
        item["intact"] = not problems
        item["problems"] = problems
    return item


def snapshot_info(store: Store, name: Optional[str] = None, labels: Optional[Mapping[str, str]] = None,
                  details: bool = False, verify: bool = False, query: Optional[str] = None,
                  now: Optional[float] = None) -> Dict[str, Any]:
    """The snapshot_info result (``changed`` false): matching snapshots newest first, broken ones, staging.

    ``name`` and ``labels`` are checked before the store is read; ``query`` (JMESPath) runs over the
    listed snapshots and its result is ``query_result``.
    """
    now = time.time() if now is None else now
    if name is not None:
        mf.check_name(name)
    wanted = mf.check_labels(dict(labels or {}))
    listed = store.list()
    found = dict(changed=False, store=store.describe(), staging=staging(store, now),
                 broken=[mark_newer_schema(store, d) for d in listed if "error" in d])
    docs = ret.newest_first([d for d in listed if "error" not in d and mf.matches(d, name, wanted)])
    snapshots = [_item(store, doc, details, verify) for doc in docs]
    result: Dict[str, Any] = dict(found, snapshots=snapshots, count=len(snapshots))
    if query:
        try:
            result["query_result"] = jmespath_search(query, snapshots)
        except QueryError as exc:
            raise exc.with_details(**{k: v for k, v in result.items() if k != "msg"})
    return result
