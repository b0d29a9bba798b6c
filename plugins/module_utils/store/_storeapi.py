# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the engine may ask of a snapshot store: the ``Store`` and ``Staging`` protocols.

Two implementations: ``_store.FsStore`` (a local dir or shared mount, read in place) and
``_s3store.S3Store`` (a bucket, read through a node-local cache); ``_stores.open_store`` picks one.
The engine (``_snapshot``, ``_container``, the runners) only uses the members named here, never
the class or its ``kind``: a new backend implements this and nothing else.

Invariants every implementation keeps:

- a snapshot is published when its manifest is present, and the manifest is written last;
- every error is a ``StoreError`` naming the store and the cause (permission denied said as such);
- snapshot ids are checked (``_manifest.check_id``) before they become a path or a key.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Protocol, runtime_checkable


@runtime_checkable
class Staging(Protocol):
    """A snapshot being written: files go under ``path``; ``publish`` makes it visible, ``abort`` removes it."""

    path: str
    snapshot_id: str

    def publish(self, manifest: Dict[str, Any]) -> str:
        """Write ``manifest`` last and make the snapshot visible at once; returns where it now is.
        On failure nothing is published (what was written is removed, or left as staging for cleanup)."""

    def abort(self) -> None:
        """Remove what was staged; a no-op once published or aborted."""


@runtime_checkable
class Store(Protocol):
    """A place snapshots are published to and restored from (see the module docstring for invariants)."""

    root: str                    # the store as the user named it (a path or an ``s3://`` URL)
    kind: str                    # ``fs`` or ``s3``: for reports only; the engine never branches on it
    transfer: Dict[str, Any]     # bytes moved over a network by this store object (empty for a filesystem store)

    @property
    def snapshots(self) -> str:
        """Where the published snapshots are (``<root>/snapshots``)."""

    @property
    def reads_in_place(self) -> bool:
        """True when ``local_dir`` and ``fetch_file`` hand out the store's own files (symlinks into
        ``snapshot_dir``), so what they lead to must be checked in the store; False for a node-local copy."""

    def describe(self) -> Dict[str, Any]:
        """{url, kind, exists}: where the store is (what a store option names), for reports."""

    def cache_root(self) -> Optional[str]:
        """This node's cache of the store (None when it reads in place)."""

    def snapshot_dir(self, snapshot_id: str) -> str:
        """Where the snapshot ``snapshot_id`` is published (a path or URL; the id is checked)."""

    def check_usable(self) -> None:
        """Raise ``StoreError`` for whatever ``ensure`` would refuse (layout, permissions, reachability),
        writing nothing: what check mode asks before a checkpoint."""

    def ensure(self) -> None:
        """Create the store's layout (0700) or raise ``StoreError`` saying why it cannot be used."""

    def stage(self, snapshot_id: str) -> Staging:
        """A new staging area for snapshot ``snapshot_id`` (``ensure`` first)."""

    def exists(self, snapshot_id: str) -> bool:
        """Whether ``snapshot_id`` is published."""

    def load(self, snapshot_id: str) -> Dict[str, Any]:
        """The checked manifest of ``snapshot_id`` (``ManifestError`` or ``StoreError`` when it cannot be used)."""

    def list(self) -> List[Dict[str, Any]]:
        """Every published snapshot's manifest, oldest first; unreadable ones as ``{"id", "error"}``."""

    def local_dir(self, snapshot_id: str) -> str:
        """A local directory holding the snapshot's files (the store itself, or this node's verified copy)."""

    def verify(self, doc: Dict[str, Any], fetch: bool = True, cached: bool = False) -> List[str]:
        """Checksum problems of this node's copy of ``doc`` as sentences (empty = intact).

        Without ``fetch`` (check mode) nothing is downloaded: a remote store compares what it holds with
        the manifest. With ``cached``, files this node hashed before and that have not changed since
        are not hashed again.
        """

    def fetch_file(self, snapshot_id: str, entry: Dict[str, Any], path: str, verify: bool = True) -> None:
        """One file of the snapshot (its manifest ``entry``) at ``path``, checked against the entry."""

    def read_range(self, snapshot_id: str, rel: str, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` of the snapshot's file ``rel``."""

    def staging_entries(self) -> List[Dict[str, Any]]:
        """Unpublished leftovers warmstart made (path, mtime, size): what cleanup judges by age."""

    def delete(self, snapshot_id: str) -> int:
        """Unpublish ``snapshot_id`` (manifest first), then remove its files; returns the bytes freed."""

    def delete_staging(self, path: str) -> int:
        """Remove one entry of ``staging_entries``; returns the bytes freed."""
