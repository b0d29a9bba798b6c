# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The work dir of a process restore: the images CRIU reads, the workload's files, the control dir.

A restore works in its own dir under ``restore_root`` (DEFAULT_RESTORE_ROOT): CRIU's log and stats go
there, never into the store. Its images are one of

- symlinks into a store read in place (``stage_images``; verify off);
- a copy hashed as it passes (``copy_verified``, a store read in place with verify on): CRIU and the
  put-back read only these copies, or page images pinned in the store under a read lease;
- fetched from the store with the pages as sparse files, for a lazy restore whose pages come from a page
  server (``stage_remote``).

The workload's own files go back under this node's ``workloads_root`` (``put_back_files``); the control dir
of the copy is this node's (``control_dir``): a manifest never chooses where we write.
"""
from __future__ import annotations

import os
import shutil
import time
from typing import Any, Dict, List, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _paths
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _lazy as lz
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _lazyimages as lzi
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _overlap as ov
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _pageranges as pr
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _preflight as pf
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _progress as prog
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _storecopy as sc
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _workload as wl
from ansible_collections.warmstart.snapshot.plugins.module_utils.store.compression import _zstd as zs
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._storeapi import Store


DEFAULT_RESTORE_ROOT = _paths.RESTORE_DIR
DEFAULT_CONTROL_ROOTS = _paths.CONTROL_ROOTS


def stage_images(src: str, dst: str) -> None:
    """A local images dir of symlinks: CRIU's restore log and stats stay off the store."""
    os.makedirs(dst, mode=0o700)
    for fname in os.listdir(src):
        if fname in ("dump.log",):
            continue
        os.symlink(os.path.join(src, fname), os.path.join(dst, fname))


def copy_verified(store: Store, doc: Dict[str, Any], target: Dict[str, Any], work: str,
                  defer: Any) -> Tuple[str, ov.Items, sc.Pins]:
    """A store read in place: the target's images copied into ``work/images`` and its workload files into
    ``work/snapshot``, hashed as they pass (``_storecopy``); CRIU and the put-back read only these copies, or
    page images pinned in the store under a read lease where the kernel allows (``_storecopy.pin``).
    Returns (the snapshot dir to read the workload files from, the page images left to the overlapped verify,
    the pinned ones among them). A mismatch or a shortage of space refuses the restore, the work dir removed."""
    images, files = f"{target['path']}/criu/", f"{target['path']}/files/"
    items = [(e, os.path.join(work, "images", e["path"][len(images):])) for e in doc.get("files", [])
             if e["path"].startswith(images) and e["path"][len(images):] != "dump.log" and "/" not in e["path"][len(images):]]
    items += [(e, os.path.join(work, "snapshot", e["path"])) for e in doc.get("files", [])
              if e["path"].startswith(files)]
    prog.phase("verified copy", sum(int(e["size"]) for e, _dest in items))
    pins, items = sc.pin(store.local_dir(doc["id"]), items, set(defer))
    problems = [p for p in [sc.space_problem(work, sum(int(e["size"]) for e, _dest in items))] if p]
    deferred: ov.Items = []
    if not problems:
        problems, deferred = sc.copy_verified(store.local_dir(doc["id"]), items, set(defer))
    if problems:
        pins.release()
        shutil.rmtree(work, ignore_errors=True)
        raise pf.refusal(doc, [f"checksum: {p}" for p in problems])
    os.makedirs(os.path.join(work, "images"), mode=0o700, exist_ok=True)
    return os.path.join(work, "snapshot"), pins.items + deferred, pins


def stage_remote(store: Store, doc: Dict[str, Any], target: Dict[str, Any], images: str,
                 verify: bool) -> Any:
    """Images for a restore whose pages come from a page server: every image but the pages, verified, and
    each pages image as a sparse file holding only what CRIU restores itself, from checked pieces of the store's
    (``_pageranges``). (problems, bytes of pages read)."""
    prefix, files_prefix = f"{target['path']}/criu/", f"{target['path']}/files/"
    os.makedirs(images, mode=0o700)
    sizes, problems = {}, []
    prog.phase("fetch images (pages from the page server)")
    for entry in doc.get("files", []):
        fname = entry["path"][len(prefix):] if entry["path"].startswith(prefix) else None
        if fname is not None and fname.startswith("pages-"):
            sizes[fname] = zs.plain_size(doc, entry)  # served by the page server, but for what CRIU restores itself
            continue
        if fname is not None and "/" not in fname and fname != "dump.log":
            dst = os.path.join(images, fname)
        elif entry["path"].startswith(files_prefix):  # the workload's own files, put back before the restore
            dst = os.path.join(os.path.dirname(images), "snapshot", entry["path"])
            os.makedirs(os.path.dirname(dst), mode=0o700, exist_ok=True)
        else:
            continue
        try:
            store.fetch_file(doc["id"], entry, dst, verify)
        except (st.StoreError, OSError) as exc:
            problems.append(f"{entry['path']}: {exc}")
    if problems:
        return problems, 0
    ranges = pr.PageRanges(store, doc, prefix, os.path.join(os.path.dirname(images), "pages-fetch"), verify)
    try:
        fetched = lzi.sparse_pages(images, sizes, ranges.read)
    except (lz.LazyError, st.StoreError, OSError) as exc:
        return [f"pages: {exc}"], 0
    finally:
        ranges.close()
    return [], fetched


def put_back_files(target: Dict[str, Any], snap_dir: str, workloads_root: str, src_within: List[str]) -> None:
    """The workload's own files, back into its dir under this node's ``workloads_root`` (never through a symlink;
    read through one only when it leads into ``src_within``: the links a page-server restore stages)."""
    base = wl.paths(workloads_root, target["workload"])["dir"]
    stamp = time.strftime("%Y%m%dT%H%M%S")
    os.makedirs(workloads_root, mode=0o700, exist_ok=True)
    os.close(safefs.open_dir(workloads_root, target["workload"]))
    for entry in target.get("workload_files", []):
        src = os.path.join(snap_dir, target["path"], "files", entry["path"])
        keep = f".pre-restore-{stamp}" if entry["path"].endswith(".log") else None
        safefs.copy_into(base, entry["path"], src, int(entry.get("mode", 0o600)), keep_old_suffix=keep,
                         src_within=src_within)


def control_dir(target: Dict[str, Any], workloads_root: str, control_roots: List[str]) -> Any:
    """(control dir to use, note): a workload's is derived from this node's root; a process's is used only
    when it lies under one of this node's ``control_roots`` and is a real directory."""
    if target.get("workload"):
        return wl.paths(workloads_root, target["workload"])["control"], None
    wanted = target.get("control_dir")
    if not wanted:
        return None, None
    if not safefs.inside(wanted, control_roots) or os.path.realpath(wanted) != wanted:
        return None, (f"control dir {wanted} is not under this node's control_roots ({', '.join(control_roots)}) "
                      "or is reached through a symlink: restore-complete was not written there")
    return wanted, None
