# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Pages checked on demand: a lazy restore on a node that has not verified the snapshot's page images starts
its tree before they are hashed, and each page reaches the tree only from a piece of its image that matched.

Without this, a lazy restore on such a node copies and hashes every page image first (gigabytes, before the
first answer). Here the restore stages the small images and the pages CRIU restores itself, checked
(``_restorework.stage_remote``); the lazy supervisor is the page server (``_lazy.start(serve_pages=...)``) and
answers the lazy-pages daemon (``_pagewire``) from pieces of the store's page images that matched their
manifest digest when read (``_pageranges``); a checked piece is kept in a private copy in the work dir, so a
piece is read and hashed once however often the tree's faults come back to it.

Invariants:

- used only when asked (the restore's ``lazy_verify: on_demand``; the default ``before`` hashes every page image
  before the tree runs), and only where it is sound and pays: a lazy restore (no page server given) with
  ``verify`` on, of a single process, from a store read in place (a local or shared filesystem), without
  compression or encryption, whose page images this node has not recorded as verified (``VerifiedFiles``: the
  node that wrote the snapshot lets CRIU read them directly, as before). It is not the default because a piece
  is 64 MiB: a first request touching pages of many pieces waits for each to be read and hashed, one at a time;
- a piece that does not match (a store writer changed it after the checkpoint, or while the tree runs) is
  never served: the daemon's connection is cut, the tree killed, and ``restore-failed`` names the image, the
  piece and its bytes;
- the service runs in the forked supervisor: it opens the store's files itself for every piece it reads.
"""
from __future__ import annotations

import os
import socket
from typing import Any, Dict, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _pagewire as pw
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._lazy import PageService
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _overlap as ov
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _checksums as ck
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _pageranges as pr
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._storeapi import Store

PIECES_HELD = 2  # checked 64 MiB pieces the server keeps: a fault elsewhere does not drop the one being drained
BEFORE, ON_DEMAND = "before", "on_demand"
LAZY_VERIFY = (BEFORE, ON_DEMAND)  # the restore option lazy_verify


def usable(store: Store, doc: Dict[str, Any], verify: bool, lazy: bool, page_server: bool,
           wanted: str = ON_DEMAND) -> Tuple[bool, str]:
    """(serve the pages checked on demand?, why not): see the module docstring."""
    targets = doc.get("targets") or []
    if wanted != ON_DEMAND:
        return False, f"lazy_verify: {wanted}"
    if not lazy or page_server:
        return False, "not a lazy restore from this node's store" if not lazy else "pages from the page server"
    if not verify:
        return False, "verify: false - CRIU reads the page images as they are"
    if not store.reads_in_place:
        return False, "an object store's copy is verified as it is fetched"
    if doc.get("compression") is not None or doc.get("encryption"):
        return False, "a compressed or encrypted snapshot is checked as it is decoded"
    if len(targets) != 1 or targets[0].get("kind") != "process":
        return False, "a snapshot of more than one process"
    known = ck.VerifiedFiles(doc["id"], record=False)
    top = store.local_dir(doc["id"])
    pages = ov.deferrable(doc)  # the target's page images
    if all(known.known(os.path.join(top, e["path"]), str(e["sha256"])) for e in doc.get("files", [])
           if e["path"] in pages):
        return False, "this node verified the page images already: CRIU reads them"
    return True, ""


def service(store: Store, doc: Dict[str, Any], images: str, scratch: str) -> PageService:
    """The supervisor's answer to the daemon: pages of the staged pagemaps in ``images``, from checked pieces."""
    index = pw.PageIndex.from_images(images)
    prefix = f"{doc['targets'][0]['path']}/criu/"
    ranges = pr.PageRanges(store, doc, prefix, scratch, verify=True, keep=PIECES_HELD, keep_checked=True)

    def serve(conn: socket.socket) -> None:
        try:
            pw.serve(conn, index, ranges.read)
        finally:
            ranges.close()

    return serve
