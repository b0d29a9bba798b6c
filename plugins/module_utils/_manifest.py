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
import json
import os
import re
import secrets
from typing import Any, Dict, List, Optional

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_ID_RE = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}$")
_LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,126}[A-Za-z0-9])?$")


class ManifestError(ValueError):
    """A manifest, snapshot id, name or label that cannot be used."""


def check_name(value: str, what: str = "snapshot name") -> str:
    """A user handle that is safe as a path component (no '/', no '..')."""
    if not isinstance(value, str) or not _NAME_RE.match(value) or ".." in value:
        raise ManifestError(
            f"{what} {value!r} is not allowed: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit, without '/' or '..'"
        )
    return value


def is_id(value: Any) -> bool:
    return isinstance(value, str) and bool(_ID_RE.match(value))


def check_id(value: str) -> str:
    if not isinstance(value, str) or not _ID_RE.match(value):
        raise ManifestError(f"snapshot id {value!r} is malformed (expected e.g. 20261202T120000Z-1a2b3c4d)")
    return value


def check_labels(labels: Optional[Dict[str, Any]]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for key, value in (labels or {}).items():
        if not _LABEL_KEY_RE.match(str(key)):
            raise ManifestError(f"label key {key!r} is not allowed (letters, digits, '.', '_', '-', '/')")
        if len(str(value)) > 256:
            raise ManifestError(f"label {key!r} value is longer than 256 characters")
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
    """Check a loaded manifest; ``where`` names it in errors."""
    if not isinstance(doc, dict):
        raise ManifestError(f"{where}: manifest is not a JSON object")
    schema = doc.get("schema")
    if not isinstance(schema, int):
        raise ManifestError(f"{where}: manifest has no integer 'schema'")
    if schema > SCHEMA_VERSION:
        raise ManifestError(
            f"{where}: manifest schema {schema} is newer than this warmstart understands ({SCHEMA_VERSION}); "
            "upgrade the collection on this node"
        )
    for key, kind in (("id", str), ("name", str), ("source", dict), ("targets", list), ("files", list)):
        if not isinstance(doc.get(key), kind):
            raise ManifestError(f"{where}: manifest field '{key}' is missing or not a {kind.__name__}")
    check_id(doc["id"])
    check_name(doc["name"])
    for entry in doc["files"]:
        path = entry.get("path") if isinstance(entry, dict) else None
        if (not isinstance(path, str) or path.startswith("/") or ".." in path.split("/")
                or not isinstance(entry.get("size"), int) or not isinstance(entry.get("sha256"), str)):
            raise ManifestError(f"{where}: manifest file entry {entry!r} is malformed")
    return doc


def load(path: str) -> Dict[str, Any]:
    try:
        with open(path, "r", encoding="utf-8") as handle:
            doc = json.load(handle)
    except FileNotFoundError:
        raise ManifestError(f"{path}: manifest is missing (snapshot not published or incomplete)") from None
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path}: manifest cannot be read: {exc}") from None
    return validate(doc, path)


def dump(doc: Dict[str, Any], path: str) -> None:
    """Write the manifest durably (temp file, fsync, rename), mode 0600."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(doc, handle, indent=2, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.rename(tmp, path)


def summary(doc: Dict[str, Any]) -> Dict[str, Any]:
    """The short form snapshot_info and the modules return."""
    return {
        "id": doc["id"],
        "name": doc["name"],
        "labels": doc.get("labels", {}),
        "created_at": doc.get("created_at"),
        "size": doc.get("size", 0),
        "source_node": doc.get("source", {}).get("hostname"),
        "targets": [t.get("name") for t in doc.get("targets", [])],
    }


def matches(doc: Dict[str, Any], name: Optional[str], labels: Optional[Dict[str, str]]) -> bool:
    if name and doc.get("name") != name:
        return False
    have = doc.get("labels", {})
    return all(have.get(k) == v for k, v in (labels or {}).items())


def file_entries(doc: Dict[str, Any]) -> List[Dict[str, Any]]:
    return list(doc.get("files", []))
