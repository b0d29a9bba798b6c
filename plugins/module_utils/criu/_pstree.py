# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A container's dumped process tree made the leader of its own session, so it restores beside any PID 1.

Why: a workload under the container's init (``podman run --init``, a pod's pause process) belongs to the
init's session and process group, whose leader is not part of the dump. CRIU's ``--shell-job`` restores such
a tree by moving it into the restorer's session, numbered as the restorer sees it, in the host's PID
namespace. Restored into a placeholder's PID namespace, where that leader is invisible (``getsid`` is 0 there),
the root task is let through but every child fails CRIU's check ("Requested sid N doesn't match inherited
0"): only single-process trees restored.

What this does, at checkpoint time, on the staged ``pstree.img``: every ``sid`` and ``pgid`` that names no
task of the dumped tree (the init's session and group) becomes the root task's pid. The restored root then
calls ``setsid()`` itself, its children inherit that session inside the placeholder's namespace, and the
restored tree can be checkpointed again (its session leader is inside it). Invariants: ids that name a task
of the tree are kept; the image header and every other field are kept; nothing changes when the root already
leads its session. Decoding uses pycriu's generated ``pstree_entry`` message only (works across protobuf
versions, unlike pycriu's dict decoder).
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _images as im


class PstreeError(WarmstartError):
    """pstree.img cannot be read or rewritten."""


def _message() -> Any:
    try:
        return im.message("pstree_pb2", "pstree_entry")
    except im.ImageError as exc:
        raise PstreeError(str(exc)) from None


def decode(data: bytes) -> Tuple[bytes, List[Any]]:
    """(header, entries) of a pstree image."""
    try:
        return im.decode(data, _message(), "pstree image")
    except im.ImageError as exc:
        raise PstreeError(str(exc)) from None


def encode(header: bytes, entries: List[Any]) -> bytes:
    return im.encode(header, entries)


def own_session(entries: List[Any]) -> Dict[str, Dict[int, int]]:
    """Rewrite, in place, sids and pgids naming no task of the tree to the root's pid; returns what changed."""
    if not entries:
        return {}
    root = entries[0].pid
    tasks = {e.pid for e in entries}
    changed: Dict[str, Dict[int, int]] = {"sid": {}, "pgid": {}}
    for entry in entries:
        for field in ("sid", "pgid"):
            value = getattr(entry, field)
            if value not in tasks:
                changed[field][value] = root
                setattr(entry, field, root)
    return {k: v for k, v in changed.items() if v}


def rewrite_file(path: str) -> Dict[str, Dict[int, int]]:
    """``own_session`` on the pstree image at ``path`` (replaced atomically, mode kept); returns what changed."""
    changed: Dict[str, Dict[int, int]] = {}

    def change(entries: List[Any]) -> bool:
        changed.update(own_session(entries))
        return bool(changed)

    try:
        im.rewrite(path, _message(), change)
    except im.ImageError as exc:
        raise PstreeError(str(exc)) from None
    return changed
