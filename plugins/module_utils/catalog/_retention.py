# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Retention: which snapshots, staging directories and restore work dirs go.

Pure logic (stdlib only, no I/O): the caller lists the store and the node, this
module decides, the caller deletes. Rules:

- only snapshots matching the ``name`` / ``labels`` filter are considered;
  the others are neither kept nor removed (they do not appear in the plan);
- ``keep_last`` N per group (group = snapshot name, or the values of the
  ``group_by`` label keys); the newest N stay, 0 = unlimited;
- ``max_age``: snapshots older than this go (None = no age limit);
- ``last_access_timeout`` (GKE's ``retentionConfig.lastAccessTimeout``):
  snapshots not restored from for this long go - counted from their
  ``last_access_at`` (a Kubernetes PodSnapshot's ``status.lastAccessTime``),
  or from their creation when they were never restored from (None = no
  limit); a snapshot is removed when any rule says so;
- unreadable snapshots are reported and removed only with ``remove_broken``;
  never those whose manifest is merely newer than this collection understands;
- staging directories (and restore work dirs) go once nothing in them has
  changed for ``incomplete_older_than`` seconds; a running checkpoint writes
  into its staging directory, so it is never touched. Left-overs of an
  interrupted delete (``deleting-<id>-*``) are unpublished already and go at
  any age.
"""
from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _duration as dur
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

DEFAULT_INCOMPLETE_OLDER_THAN = 3600.0
DELETING_PREFIX = "deleting-"
NEWER_SCHEMA_MARK = "is newer than this warmstart understands"
# <snapshot id>-<8 hex>: the work dirs restore creates under restore_root.
RESTORE_DIR_RE = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}-[0-9a-f]{8}$")

Duration = dur.Duration


class RetentionError(WarmstartError, ValueError):
    """A retention option that cannot be used; the message says which and why."""


def parse_duration(value: Duration, what: str = "duration") -> Optional[float]:
    """``_duration.parse_duration``, failing as a RetentionError."""
    try:
        return dur.parse_duration(value, what)
    except dur.DurationError as exc:
        raise RetentionError(exc.message) from None


format_duration = dur.format_duration


# --- policy and plan ------------------------------------------------------

@dataclass
class Policy:
    """What to keep. Build it with :func:`policy` to get the options checked."""

    keep_last: int = 0
    max_age: Optional[float] = None
    incomplete_older_than: float = DEFAULT_INCOMPLETE_OLDER_THAN
    group_by: List[str] = field(default_factory=list)
    name: Optional[str] = None
    labels: Dict[str, str] = field(default_factory=dict)
    remove_broken: bool = False
    last_access_timeout: Optional[float] = None


def policy(keep_last: Optional[int] = 0, max_age: Duration = None,
           incomplete_older_than: Duration = DEFAULT_INCOMPLETE_OLDER_THAN,
           group_by: Optional[Sequence[str]] = None, name: Optional[str] = None,
           labels: Optional[Dict[str, Any]] = None, remove_broken: bool = False,
           last_access_timeout: Duration = None) -> Policy:
    """A checked :class:`Policy` from module-style options (raises :class:`RetentionError`)."""
    if keep_last is None:
        keep_last = 0
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0:
        raise RetentionError(f"keep_last: {keep_last!r} must be a whole number >= 0 (0 = keep any number)")
    age = parse_duration(max_age, "max_age")
    if age is not None and age <= 0:
        raise RetentionError("max_age: 0 would remove every snapshot; omit max_age for no age limit")
    idle = parse_duration(last_access_timeout, "last_access_timeout")
    if idle is not None and idle <= 0:
        raise RetentionError("last_access_timeout: 0 would remove every snapshot; omit it for no limit")
    incomplete = parse_duration(incomplete_older_than, "incomplete_older_than")
    if incomplete is None:
        incomplete = DEFAULT_INCOMPLETE_OLDER_THAN
    keys: List[str] = []
    for key in group_by or []:
        if not isinstance(key, str) or not key:
            raise RetentionError(f"group_by: {key!r} is not a label key")
        if key in keys:
            raise RetentionError(f"group_by: label key {key!r} is listed twice")
        keys.append(key)
    try:
        for key in keys:
            mf.check_labels({key: ""})
        if name:
            mf.check_name(name)
        checked = mf.check_labels(labels)
    except mf.ManifestError as exc:
        raise RetentionError(str(exc)) from None
    return Policy(keep_last=keep_last, max_age=age, incomplete_older_than=incomplete, group_by=keys,
                  name=name or None, labels=checked, remove_broken=bool(remove_broken), last_access_timeout=idle)


@dataclass
class Plan:
    """The decision. ``remove`` / ``remove_staging`` / ``remove_restore_dirs`` are what goes."""

    remove: List[Dict[str, Any]] = field(default_factory=list)
    kept: List[str] = field(default_factory=list)
    broken: List[Dict[str, Any]] = field(default_factory=list)
    remove_staging: List[Dict[str, Any]] = field(default_factory=list)
    kept_staging: List[str] = field(default_factory=list)
    remove_restore_dirs: List[Dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> Dict[str, Any]:
        return {
            "remove": self.remove,
            "kept": self.kept,
            "broken": self.broken,
            "remove_staging": self.remove_staging,
            "kept_staging": self.kept_staging,
            "remove_restore_dirs": self.remove_restore_dirs,
        }

    @property
    def empty(self) -> bool:
        return not (self.remove or self.remove_staging or self.remove_restore_dirs
                    or any(b["remove"] for b in self.broken))


def created_ts(doc: Dict[str, Any]) -> float:
    """Creation time (epoch seconds): ``created_at``, else the time in the snapshot id."""
    text = doc.get("created_at")
    if isinstance(text, str):
        for fmt in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):  # manifests; Kubernetes timestamps
            try:
                return datetime.datetime.strptime(text, fmt).replace(tzinfo=datetime.timezone.utc).timestamp()
            except ValueError:
                continue
    try:
        stamp = datetime.datetime.strptime(str(doc.get("id", ""))[:16], "%Y%m%dT%H%M%SZ")
    except ValueError:
        return 0.0
    return stamp.replace(tzinfo=datetime.timezone.utc).timestamp()


def accessed_ts(doc: Dict[str, Any]) -> Tuple[float, bool]:
    """When the snapshot was last restored from (epoch seconds, ``last_access_at``) and True; else its creation
    time (``created_ts``) and False - a snapshot never restored from counts from its creation."""
    text = doc.get("last_access_at")
    if isinstance(text, str) and text:
        stamp = created_ts({"created_at": text})
        if stamp:
            return stamp, True
    return created_ts(doc), False


def _idle_reason(doc: Dict[str, Any], pol: Policy, t_now: float) -> Optional[str]:
    """Why ``last_access_timeout`` removes ``doc`` (None: it does not)."""
    if pol.last_access_timeout is None:
        return None
    since, accessed = accessed_ts(doc)
    idle = t_now - since
    if idle <= pol.last_access_timeout:
        return None
    limit = format_duration(pol.last_access_timeout)
    if accessed:
        return f"not restored from for {format_duration(idle)} (last_access_timeout={limit})"
    return f"never restored from, created {format_duration(idle)} ago (last_access_timeout={limit})"


def newest_first(docs: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return sorted(docs, key=lambda d: (created_ts(d), str(d.get("id", ""))), reverse=True)


def group_key(doc: Dict[str, Any], group_by: Sequence[str]) -> Tuple[Optional[str], ...]:
    if not group_by:
        return (doc.get("name"),)
    labels = doc.get("labels") or {}
    return tuple(labels.get(k) for k in group_by)


def describe_group(key: Tuple[Optional[str], ...], group_by: Sequence[str]) -> str:
    if not group_by:
        return f"name={key[0]}"
    return ",".join(f"{k}={'(unset)' if v is None else v}" for k, v in zip(group_by, key))


def is_newer_schema(entry: Dict[str, Any]) -> bool:
    """An unreadable snapshot that a newer warmstart wrote: not broken, just not ours to judge."""
    return bool(entry.get("newer_schema")) or NEWER_SCHEMA_MARK in str(entry.get("error", ""))


def _now(now: Optional[float]) -> float:
    if now is not None:
        return float(now)
    return datetime.datetime.now(datetime.timezone.utc).timestamp()


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def plan(manifests: Sequence[Dict[str, Any]], staging: Sequence[Dict[str, Any]], pol: Policy,
         now: Optional[float] = None, restore_dirs: Optional[Sequence[Dict[str, Any]]] = None) -> Plan:
    """Decide what goes.

    ``manifests``: what ``Store.list()`` returns (unreadable ones as ``{"id", "error"}``).
    ``staging`` / ``restore_dirs``: ``{"path", "mtime"}`` entries (optionally ``newest_mtime``, the
    latest change anywhere inside, and ``size``). ``now``: epoch seconds (default: the clock).
    """
    t_now = _now(now)
    out = Plan()
    _plan_broken(manifests, pol, out)
    _plan_snapshots([d for d in manifests if "error" not in d], pol, t_now, out)
    _plan_staging(staging, pol, t_now, out)
    _plan_restore_dirs(restore_dirs or [], pol, t_now, out)
    return out


def _plan_broken(manifests: Sequence[Dict[str, Any]], pol: Policy, out: Plan) -> None:
    """Unreadable snapshots: removed only with ``remove_broken``, never when a newer warmstart wrote them."""
    for entry in manifests:
        if "error" not in entry:
            continue
        newer = is_newer_schema(entry)
        remove = pol.remove_broken and not newer
        out.broken.append({
            "id": entry.get("id"),
            "error": entry.get("error"),
            "remove": remove,
            "reason": ("unreadable snapshot (remove_broken)" if remove
                       else "written by a newer warmstart; never removed here" if newer
                       else "unreadable snapshot; kept (set remove_broken to remove it)"),
        })


def _removal_reasons(considered: List[Dict[str, Any]], pol: Policy, t_now: float) -> Dict[str, List[str]]:
    """Why each snapshot goes (keep_last per group, max_age, last_access_timeout), by id; absent = kept."""
    groups: Dict[Tuple[Optional[str], ...], List[Dict[str, Any]]] = {}
    for doc in newest_first(considered):
        groups.setdefault(group_key(doc, pol.group_by), []).append(doc)
    reasons: Dict[str, List[str]] = {}
    for key, docs in groups.items():
        for rank, doc in enumerate(docs, start=1):
            why: List[str] = []
            if pol.keep_last and rank > pol.keep_last:
                why.append(f"keep_last={pol.keep_last} for {describe_group(key, pol.group_by)} "
                           f"(it is the {_ordinal(rank)} newest)")
            age = t_now - created_ts(doc)
            if pol.max_age is not None and age > pol.max_age:
                why.append(f"older than max_age={format_duration(pol.max_age)} (age {format_duration(age)})")
            idle = _idle_reason(doc, pol, t_now)
            if idle:
                why.append(idle)
            if why:
                reasons[doc["id"]] = why
    return reasons


def _plan_snapshots(good: List[Dict[str, Any]], pol: Policy, t_now: float, out: Plan) -> None:
    """Published snapshots matching the policy's name and labels: removed or kept, newest first."""
    considered = [d for d in good if mf.matches(d, pol.name, pol.labels)]
    reasons = _removal_reasons(considered, pol, t_now)
    for doc in newest_first(considered):
        if doc["id"] in reasons:
            out.remove.append({
                "id": doc["id"],
                "name": doc.get("name"),
                "labels": doc.get("labels") or {},
                "created_at": doc.get("created_at"),
                "group": describe_group(group_key(doc, pol.group_by), pol.group_by),
                "reason": "; ".join(reasons[doc["id"]]),
            })
        else:
            out.kept.append(doc["id"])


def _plan_staging(staging: Sequence[Dict[str, Any]], pol: Policy, t_now: float, out: Plan) -> None:
    """Leftover deletes always go; incomplete snapshots once unchanged for ``incomplete_older_than``."""
    for entry in staging:
        base = str(entry["path"]).rstrip("/").rsplit("/", 1)[-1]
        age = t_now - _changed(entry)
        if base.startswith(DELETING_PREFIX):
            reason = "left over from an interrupted delete"
        elif age > pol.incomplete_older_than:
            reason = (f"incomplete snapshot, unchanged for {format_duration(age)} "
                      f"(incomplete_older_than={format_duration(pol.incomplete_older_than)})")
        else:
            out.kept_staging.append(entry["path"])
            continue
        out.remove_staging.append({"path": entry["path"], "reason": reason, "age": round(age, 1),
                                   "size": entry.get("size")})


def _plan_restore_dirs(restore_dirs: Sequence[Dict[str, Any]], pol: Policy, t_now: float, out: Plan) -> None:
    """Restore work dirs of warmstart's naming, unchanged for ``incomplete_older_than``."""
    for entry in restore_dirs:
        base = str(entry["path"]).rstrip("/").rsplit("/", 1)[-1]
        if not RESTORE_DIR_RE.match(base):
            continue
        age = t_now - _changed(entry)
        if age > pol.incomplete_older_than:
            out.remove_restore_dirs.append({
                "path": entry["path"], "age": round(age, 1), "size": entry.get("size"),
                "reason": (f"restore work dir unchanged for {format_duration(age)} "
                           f"(incomplete_older_than={format_duration(pol.incomplete_older_than)})"),
            })


def _changed(entry: Dict[str, Any]) -> float:
    """Latest change of an entry: its own mtime or, when known, anything inside it."""
    mtime = float(entry.get("mtime") or 0.0)
    inner = entry.get("newest_mtime")
    return max(mtime, float(inner)) if inner is not None else mtime
