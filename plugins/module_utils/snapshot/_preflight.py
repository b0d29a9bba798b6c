# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which snapshot a process restore takes, and everything that refuses it before any process is touched.

Guarantee: a restore touches no process before checksums and compatibility pass.

``select`` picks the manifest (by id, or the newest compatible one by name and labels, never an older one
silently); ``preflight`` lists every reason it cannot be restored here (compatibility, GPUs, checksums, files
in use, host memory, layout, the workload already running); ``refusal`` is the error that lists them.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _checksums as ck
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _mountns as mns
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _overlap as ov
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _workload as wl
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._gpunode import GpuNode
from ansible_collections.warmstart.snapshot.plugins.module_utils.node._compat import (
    gpu_incompatibilities,
    incompatibilities,
    memory_problems,
)
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._storeapi import Store


def select(store: Store, snapshot_id: Optional[str], name: Optional[str], labels: Optional[Dict[str, str]],
           node: Dict[str, Any], skip_compat: bool, gpu_node: Optional[GpuNode] = None,
           cuda: str = "auto", skip_unreadable: bool = False,
           passed_over: Optional[List[Dict[str, str]]] = None) -> Dict[str, Any]:
    """The manifest to restore: by id, or the newest compatible one matching name/labels (GPUs too, given ``gpu_node``).

    Never falls back to an older snapshot silently: each newer one passed over is appended to ``passed_over``
    with the reason. A newer snapshot this node cannot read or trust (signature, schema) refuses the selection,
    since nothing it claims - its name, its labels - can be believed, unless ``skip_unreadable``: whoever can break
    the newest signature would otherwise pick which version runs.
    """
    if snapshot_id is not None:  # "" is refused, never a wildcard
        return store.load(mf.check_id(snapshot_id))
    if name is not None:
        mf.check_name(name)
    listed = store.list()
    unreadable = [d for d in listed if "error" in d]
    candidates = [d for d in listed if "error" not in d and mf.matches(d, name, labels)]
    rejected: List[Dict[str, str]] = []
    chosen: Optional[Dict[str, Any]] = None
    for doc in sorted(candidates, key=lambda d: d["created_at"], reverse=True):
        reasons = [] if skip_compat else incompatibilities(doc["source"], node)
        reasons += _gpu_reasons(doc, gpu_node, cuda, skip_compat)
        if not reasons:
            chosen = doc
            break
        rejected.append({"id": doc["id"], "reason": "; ".join(reasons)})
    newer_unreadable = [{"id": str(d.get("id")), "reason": f"unreadable: {d['error']}"} for d in unreadable
                        if chosen is None or str(d.get("id"))[:16] >= chosen["id"][:16]]  # same second: newer
    if newer_unreadable and not skip_unreadable:
        what = "every match" if chosen is None else f"{chosen['id']}, the newest usable match,"
        raise snap.SnapshotError(f"{len(newer_unreadable)} snapshot(s) in {store.root} newer than {what} cannot be read or "
                                 "trusted, so whether they are newer versions of name={name!r} labels={labels} cannot be "
                                 "told; refusing to fall back to an older one silently (remove them with cleanup "
                                 "remove_broken, or set skip_unreadable to pass over them)".format(
                                     name=name, labels=labels or {}),
                                 reasons=[f"{r['id']}: {r['reason']}" for r in newer_unreadable], outcome="incompatible")
    if passed_over is not None:
        passed_over.extend(rejected + newer_unreadable)
    if chosen is not None:
        return chosen
    if not candidates:
        raise snap.SnapshotError(f"no published snapshot in {store.root} matches name={name!r} labels={labels or {}}")
    raise snap.SnapshotError(f"no snapshot matching name={name!r} labels={labels or {}} is compatible with this node",
                             reasons=[f"{r['id']}: {r['reason']}" for r in rejected], outcome="incompatible")


def _gpu_reasons(doc: Dict[str, Any], gpu_node: Optional[GpuNode], cuda: str, skip_compat: bool) -> List[str]:
    """GPU reasons against this node; probes it only for a snapshot with GPU state (or cuda=required)."""
    if gpu_node is None or (not doc.get("gpu") and cuda != "required"):
        return []
    return gpu_incompatibilities(doc.get("gpu"), gpu_node, cuda, hard_only=skip_compat)


def preflight(store: Store, doc: Dict[str, Any], node: Dict[str, Any], verify: bool,
              skip_compat: bool, fetch: bool = True, gpu_node: Optional[GpuNode] = None,
              cuda: str = "auto", workloads_root: str = wl.DEFAULT_ROOT,
              deferred: Optional[ov.Items] = None, copying: bool = False) -> List[str]:
    """Everything that stops this restore, before any process is touched (GPU checks with ``gpu_node``).

    Node-side locations come from this node (``workloads_root``); the manifest's are only compared with them.
    With ``deferred`` (an overlapped restore, ``_overlap``) the page images are checked for presence, type and
    size here, and handed to ``deferred`` to be hashed while CRIU restores the tree stopped.
    """
    problems = []
    if not skip_compat:
        problems += incompatibilities(doc["source"], node) + memory_problems(doc)
    problems += _gpu_reasons(doc, gpu_node, cuda, skip_compat)
    if verify:
        problems += [f"checksum: {p}" for p in _checksums(store, doc, fetch, deferred, copying)]
    if not skip_compat:
        for t in doc.get("targets") or []:
            problems += proc.file_mismatches(t.get("files_in_use") or {})
    targets = doc.get("targets") or []
    if targets and targets[0].get("kind") == "container":
        problems.append(f"snapshot: it holds container {targets[0]['name']}; restore it into a placeholder "
                        "container (option into)")
    elif len(targets) != 1 or targets[0].get("kind") != "process":
        problems.append("snapshot: not a single-process snapshot (restore it with the matching target kind)")
    else:
        t = targets[0]
        problems += _layout_problems(store, doc, t, verify)
        problems += mns.restore_problems(t.get("mount_namespace"))
        if t.get("workload"):
            if t.get("workloads_root") not in (None, workloads_root):
                problems.append(
                    f"workload {t['workload']}: it ran under {t['workloads_root']} at checkpoint and its open files "
                    f"are restored there, but this node's workloads_root is {workloads_root} (restore with "
                    f"workloads_root: {t['workloads_root']} if that is a workloads root of this node)")
            running = wl.running_pid(workloads_root, t["workload"])
            if running is not None:
                problems.append(
                    f"workload {t['workload']} is running on this node (pid {running}); a restored copy would "
                    "share its files and ports - stop it first")
    return problems


def _checksums(store: Store, doc: Dict[str, Any], fetch: bool, deferred: Optional[ov.Items],
               copying: bool = False) -> List[str]:
    """The snapshot's checksum problems (``Store.verify``); with ``deferred``, for a store read in place, the page
    images' hashing is left to the caller (the same check as ``FsStore.verify``, in two parts). ``copying``: only
    the layout and sizes here - the restore hashes what it copies (``_storecopy``)."""
    if copying:
        return ck.verify_files(store.local_dir(doc["id"]), doc, phase=False, hashed=False)
    if deferred is None:
        return ck.verify_local(store, doc, fetch=fetch, cached=True)
    return ck.verify_files(store.local_dir(doc["id"]), doc, cache=ck.VerifiedFiles(doc["id"], record=fetch),
                           defer=ov.deferrable(doc), deferred=deferred)


def _layout_problems(store: Store, doc: Dict[str, Any], target: Dict[str, Any], verified: bool) -> List[str]:
    """The target's images dir must be reached through real directories inside the snapshot (also unverified)."""
    if verified or not store.reads_in_place or "path" not in target or not mf.is_id(doc.get("id")):
        return []  # verify already refused any symlink or stray entry; an object store's copy is our own cache
    why = ck.real_dirs(store.snapshot_dir(doc["id"]), f"{target['path']}/criu")
    return [f"snapshot layout: {why}"] if why else []


def refusal(doc: Dict[str, Any], problems: List[str]) -> snap.SnapshotError:
    """Refused before anything is touched: the snapshot does not fit this node; every reason listed."""
    return snap.SnapshotError(f"refusing to restore snapshot {doc['id']} ({doc['name']}) on this node", reasons=problems,
                              outcome="incompatible")
