# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Snapshot manifest: what a snapshot holds, where it came from, how to check it.

``manifest.json`` is written last into a snapshot; a snapshot is published
when its manifest is present. Plain Python (stdlib only).
"""
from __future__ import annotations

import datetime
import errno
import json
import os
import secrets
from typing import Any, Dict, Optional, cast

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _schema as schema
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 64 << 20


class ManifestError(WarmstartError, ValueError):
    """A manifest, snapshot id, name or label that cannot be used; ``reasons`` lists every bad field."""


def check_name(value: str, what: str = "snapshot name") -> str:
    """A user handle that is safe as a path component (no '/', no '..'), matched in full."""
    if not schema.is_name(value):
        raise ManifestError(
            f"{what} {value!r} is not allowed: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit, without '/' or '..'"
        )
    return value


def is_id(value: Any) -> bool:
    return schema.is_id(value)


def check_id(value: str) -> str:
    if not schema.is_id(value):
        raise ManifestError(f"snapshot id {value!r} is malformed (expected e.g. 20261202T120000Z-1a2b3c4d)")
    return value


def check_labels(labels: Optional[Dict[str, Any]]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for key, value in (labels or {}).items():
        if not schema.is_label_key(key):
            raise ManifestError(f"label key {key!r} is not allowed (letters, digits, '.', '_', '-', '/')")
        if not isinstance(value, (str, int, float, bool)) or len(str(value)) > 256:
            raise ManifestError(f"label {key!r} value is not a scalar or is longer than 256 characters")
        out[str(key)] = str(value)
    return out


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def iso(ts: datetime.datetime) -> str:
    return ts.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_iso(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)


def new_id(now: Optional[datetime.datetime] = None) -> str:
    """Sortable, unique snapshot id: UTC time + 32 random bits."""
    now = now or utcnow()
    return now.strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(4)


def new_manifest(snapshot_id: str, name: str, labels: Dict[str, str], source: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "schema": SCHEMA_VERSION,
        "id": check_id(snapshot_id),
        "name": check_name(name),
        "labels": check_labels(labels),
        "created_at": iso(utcnow()),
        "source": source,
        "targets": [],
        "files": [],
        "timings": {},
        "size": 0,
    }


def validate(doc: Any, where: str) -> Dict[str, Any]:
    """Check a loaded manifest against the schema (``_schema``); ``where`` names it in errors.

    The error's message is the first reason; ``reasons`` holds all of them.
    """
    found = schema.problems(doc, SCHEMA_VERSION)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        # one problem: the message says it all; several: every one in ``reasons``
        raise ManifestError(f"{where}: manifest {found[0]}{more}",
                            reasons=[f"{where}: {p}" for p in found] if len(found) > 1 else None)
    return cast(Dict[str, Any], doc)  # the schema checked it is a mapping


def parse(data: bytes, where: str) -> Dict[str, Any]:
    """Decode and validate a manifest's bytes, read from a store (untrusted)."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{where}: manifest is larger than {MAX_MANIFEST_BYTES >> 20} MiB")
    try:
        doc = json.loads(data)
    except RecursionError:
        raise ManifestError(f"{where}: manifest nested deeper than {schema.MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise ManifestError(f"{where}: manifest cannot be read: {exc}") from None
    return validate(doc, where)


def load(path: str) -> Dict[str, Any]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise ManifestError(f"{path}: manifest is missing (snapshot not published or incomplete)") from None
    except OSError as exc:
        raise ManifestError(f"{path}: manifest cannot be read: {exc.strerror}" +
                            (" (a symlink)" if exc.errno == errno.ELOOP else "")) from None
    try:
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise ManifestError(f"{path}: manifest cannot be read: {exc.strerror}") from None
    return parse(data, path)


def dump(doc: Dict[str, Any], path: str) -> None:
    """Write the manifest durably (temp file, fsync, rename), mode 0600."""
    safefs.write_file(path, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8"), 0o600, sync=True)


def summary(doc: Dict[str, Any]) -> Dict[str, Any]:
    """The short form snapshot_info and the modules return."""
    return {
        "id": doc["id"],
        "name": doc["name"],
        "labels": doc.get("labels", {}),
        "created_at": doc.get("created_at"),
        "size": doc.get("size", 0),
        # the node as the checkpoint module returns it (its CPU flags only in the manifest)
        "source_node": {k: v for k, v in (doc.get("source") or {}).items() if k != "cpu_flags"},
        "targets": [{"name": t.get("name"), "kind": t.get("kind")} for t in doc.get("targets", [])],
    }


def matches(doc: Dict[str, Any], name: Optional[str], labels: Optional[Dict[str, str]]) -> bool:
    if name and doc.get("name") != name:
        return False
    have = doc.get("labels", {})
    return all(have.get(k) == v for k, v in (labels or {}).items())
