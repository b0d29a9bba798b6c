# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Serve one process snapshot's pages to one lazy restore on another node (``criu page-server --lazy-pages``).

Invariants:

- Every refusal (no CRIU, a port outside 1-65535, TLS files that cannot work, a non-loopback address without
  TLS or ``insecure``, an unknown id, a snapshot that is not a single process, a snapshot that is not intact)
  comes before anything is started or written.
- With ``tls`` the page server runs CRIU's mutual TLS (``_tls``): a client without a certificate of the CA is
  refused in the handshake, noted, and the page server goes on waiting for its restore.
- Check mode verifies without fetching (sizes only for an object store), starts nothing and writes nothing.
- A real run serves only a snapshot whose local copy verified (an object store fetches it into its cache first).
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _lazy as lz
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _lazyserver as lzs
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _tls
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu import CriuError, find_criu
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._storeapi import Store


def _servable(store: Store, snapshot_id: str) -> Dict[str, Any]:
    """The manifest of ``snapshot_id``; SnapshotError unless it holds exactly one process."""
    doc: Dict[str, Any] = store.load(mf.check_id(snapshot_id))
    targets = doc.get("targets") or []
    if len(targets) != 1 or targets[0].get("kind") != "process":
        raise snap.SnapshotError(f"snapshot {doc['id']}: a page server serves single-process snapshots only")
    return doc


def _criu(criu_path: Optional[str], port: int) -> str:
    """The CRIU binary to run; refuses a node without CRIU and a port that is not a TCP port."""
    criu = find_criu(criu_path)
    if not criu:
        raise CriuError("no CRIU found on this node; prepare it with warmstart.snapshot.node_prep")
    if not 0 < port < 65536:
        raise lz.LazyError(f"port: {port} is not a TCP port (1-65535)")
    return criu


def serve(store: Store, snapshot_id: str, address: str, port: int, timeout: float, log_dir: str,
          criu_path: Optional[str] = None, verify: bool = True, check_mode: bool = False,
          tls: Optional[_tls.TlsFiles] = None, insecure: bool = False) -> Dict[str, Any]:
    """Check, verify and (unless ``check_mode``) serve ``snapshot_id`` on ``address:port``, detached.

    ``tls``: the checked files for CRIU's mutual TLS (``_tls.resolve``); without them a non-loopback
    ``address`` is refused unless ``insecure``.

    Returns the page_server result: ``snapshot_id``, ``address``, ``port``, ``tls`` and, when serving, what
    ``_lazyserver.serve`` reports (pid, logs, deadline).
    """
    criu = _criu(criu_path, port)
    _tls.check_listen(address, tls, insecure)
    doc = _servable(store, snapshot_id)
    if check_mode:
        problems = store.verify(doc, fetch=False) if verify else []
        if problems:
            raise snap.SnapshotError(f"snapshot {doc['id']} is not intact", reasons=problems)
        return {"snapshot_id": doc["id"], "address": address, "port": port, "tls": tls is not None}
    problems = store.verify(doc, cached=True) if verify else []
    if problems:
        raise snap.SnapshotError(f"refusing to serve snapshot {doc['id']}: it is not intact", reasons=problems)
    images = os.path.join(store.local_dir(doc["id"]), doc["targets"][0]["path"], "criu")
    os.makedirs(log_dir, mode=0o700, exist_ok=True)
    served = lzs.serve(criu, images, log_dir, address, port, float(timeout), tls.criu_args() if tls else [])
    served.update(snapshot_id=doc["id"], tls=tls is not None)
    return served
