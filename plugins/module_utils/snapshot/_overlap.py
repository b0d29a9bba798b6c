# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Verify overlapped with CRIU's restore: a target's page images are hashed while CRIU restores its tree stopped.

On a node that has never seen a snapshot, hashing its memory images before CRIU starts cost as much as the
restore itself. Here the preflight verifies everything else first (manifest, small images, the workload's
files), then CRIU restores the tree with ``leave_stopped`` while the page images are hashed on the other
cores (``_digest``), and the tree runs only once every digest matched.

Invariants:

- restored code never runs on unverified bytes: the tree stays SIGSTOPped until ``Overlap.finish`` returned
  no problem; on a problem (or any failure before) the caller kills it (``_restore._kill_copy``);
- CRIU failing meanwhile does not end the hashing: bytes a store writer changed are the failure's cause,
  and the error names the mismatch rather than CRIU's stumble on them (``_restore._mismatch_first``);
- nothing but the target's ``pages-*.img`` is deferred: every file the restore writes onto the node or
  CRIU parses (images, the workload's files) is verified before anything is touched, as without overlap;
- what is hashed is what CRIU reads: the node's own private copy (``_storecopy`` copies the deferred page
  images out of a store read in place without hashing them; nobody but root can change the copy), the
  store's own file pinned under a read lease (``_storecopy.pin``: a write open since breaks the lease, and
  ``finish`` then refuses), or an object store's download, verified as it is fetched;
- it is used only where nothing else must run first: a snapshot
  without compression (a compressed one is checked as it is decompressed into the node's copy), an eager
  restore (no lazy-pages daemon serving pages to a running tree), no GPU state, ``verify`` on.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _checksums as ck
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _digest as dg
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _progress as prog

Items = List[Tuple[str, Dict[str, Any]]]


def deferrable(doc: Dict[str, Any]) -> Set[str]:
    """The manifest paths that may be hashed while CRIU restores: the single target's page images."""
    targets = doc.get("targets") or []
    if len(targets) != 1 or "path" not in targets[0]:
        return set()
    prefix = f"{targets[0]['path']}/criu/pages-"
    return {e["path"] for e in doc.get("files", []) if e["path"].startswith(prefix) and e["path"].endswith(".img")}


def usable(doc: Dict[str, Any], verify: bool, reads_in_place: bool, lazy: bool) -> Tuple[bool, str]:
    """(use it?, why not): see the module docstring for when an overlapped verify is sound."""
    if not verify:
        return False, "verify: false"
    if not reads_in_place:
        return False, "the store's copy is verified as it is fetched"
    if doc.get("compression") is not None:
        return False, "a compressed snapshot is checked as it is decompressed"
    if lazy:
        return False, "a lazy restore serves pages to a running tree"
    if doc.get("gpu"):
        return False, "GPU state is restored into a running tree"
    if not deferrable(doc):
        return False, "no page images"
    return True, ""


class Overlap:
    """The deferred page images hashed on a thread of their own; ``finish`` waits and says what did not match."""

    def __init__(self, items: Items, cache: Optional[ck.VerifiedFiles] = None, pins: Optional[Any] = None,
                 record: Optional[Tuple[ck.VerifiedFiles, str]] = None) -> None:
        self.items = items
        self.cache = cache
        self.pins = pins  # _storecopy.Pins of the items read in place, or None
        self.record = record  # (this node's record, the store's snapshot dir): the pinned files, once they matched
        self.matched = False
        self._problems: List[str] = []
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="warmstart-verify", daemon=True)
        self.bytes = sum(int(e["size"]) for _p, e in items)
        self.waited = 0.0
        self.held: Optional[Any] = None  # the restorer child waiting for the verdict (_restorer.Held)

    def _run(self) -> None:
        try:
            # one core left to CRIU, which restores the tree meanwhile
            self._problems = ck.hash_problems(self.items, self.cache, threads=max(1, dg.workers() - 1))
        except BaseException as exc:  # reported by finish(): the tree is then killed, never resumed
            self._error = exc

    def start(self) -> "Overlap":
        if self.items:
            prog.phase("restore + verify", self.bytes)
            self._thread.start()
        return self

    def finish(self) -> List[str]:
        """Every checksum problem of the deferred files (empty: the tree may run); waits for the hashing."""
        t0 = time.monotonic()
        if self._thread.is_alive() or self._thread.ident is not None:
            self._thread.join()
        self.waited = time.monotonic() - t0
        if self._error is not None:
            return [f"verify of the page images failed: {self._error}"]
        problems = [f"checksum: {p}" for p in self._problems + self.broken()]
        self.matched = not problems
        return problems

    def broken(self) -> List[str]:
        """The pinned page images someone opened for writing since they were pinned (checked after CRIU and the
        hashing are done: what both read is then what the lease kept)."""
        return self.pins.broken() if self.pins is not None else []

    def release(self) -> None:
        """Let go of the pinned files (after the verdict, or when the restore stops before it); when they matched,
        record them as hashed on this node first (``Pins.record``)."""
        if self.pins is not None:
            if self.matched and self.record is not None:
                self.pins.record(*self.record)
            self.pins.release()
