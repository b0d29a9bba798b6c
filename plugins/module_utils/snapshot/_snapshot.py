# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a snapshot is taken of, and what checkpoint and restore share: the engine's ground.

- ``Target``: the process tree a checkpoint dumps (a pid, a pidfile's, a workload's, or a container's
  workload); ``Capture`` is what a target kind other than a plain process adds (see _container);
- ``lock_target``: one checkpoint of a tree at a time;
- ``need_criu``: this node's CRIU, or how to get one;
- ``SnapshotError``: a checkpoint or restore that cannot go ahead, every cause in ``reasons``.

The package, by concept: _checkpoint (checkpoint and its phases) with _gpuhooks (GPU state and the
workload's lifecycle stages) and _guardian (resumes a stopped source if we die mid-checkpoint); _restore
(restore of a process snapshot) with _preflight (which snapshot, and what refuses it before any process is
touched) and _restorework (its work dir); _container (container capture), _placeholder (the checks of a
placeholder container) and _restoreinto (restore into placeholders); _overlap, _pageserver.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Optional, Protocol

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _paths
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _control as ctl
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _restorer as rst
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _profile as pf
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _workload as wl
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu import CriuError, find_criu
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import CriuOptions


class SnapshotError(WarmstartError):
    """A checkpoint or restore that cannot go ahead; ``reasons`` lists every cause."""


class Capture(Protocol):
    """What a target kind other than a plain process adds to a checkpoint (see _container)."""

    def criu_options(self, base: CriuOptions) -> CriuOptions:
        """``base`` with what dumping this kind adds (root, external namespaces and mounts, ...); may refuse
        (SnapshotError) before CRIU touches anything."""

    def while_stopped(self, target_dir: str) -> Dict[str, Any]:
        """Capture what must match the memory image (runs while the tree is stopped); entry fields."""

    def entry(self) -> Dict[str, Any]:
        """Manifest fields of this target."""

    def before_resume(self) -> None:
        """Undo what the dump left for a stopped tree that is now resumed (network lock)."""


@dataclass
class Target:
    pid: int
    name: str
    workload: Optional[str] = None
    workloads_root: str = wl.DEFAULT_ROOT
    control_dir: Optional[str] = None
    capture: Optional[Capture] = None
    profile: Optional[pf.Profile] = None   # the application profile (_profile) that quiesces and releases it


def resolve_target(pid: Optional[int], pidfile: Optional[str], workload: Optional[str],
                   workloads_root: str = wl.DEFAULT_ROOT) -> Target:
    if workload:
        found = wl.running_pid(workloads_root, workload)
        if found is None:
            raise proc.TargetError(f"workload {workload} is not running (no live pid in {wl.paths(workloads_root, workload)['pidfile']})")
        return Target(found, workload, workload, workloads_root, wl.paths(workloads_root, workload)["control"],
                      profile=wl.profile_of(workloads_root, workload))
    if pidfile:
        found = proc.read_pidfile(pidfile)
        if found is None:
            raise proc.TargetError(f"pidfile {pidfile} does not exist")
        pid = found
    if pid is None:
        raise proc.TargetError("no target: give pid, pidfile or workload")
    proc.check_target(pid)
    return Target(pid, "process", None, workloads_root, ctl.process_control_dir(pid))


def need_criu(criu_path: Optional[str]) -> str:
    """This node's CRIU (``criu_path`` or found), or a CriuError saying how to get one."""
    criu = find_criu(criu_path)
    if not criu:
        raise CriuError("no CRIU found on this node; prepare it with warmstart.snapshot.node_prep")
    return criu


LOCK_DIR = _paths.LOCK_DIR


def lock_target(pid: int, what: str, lock_dir: str = LOCK_DIR) -> int:
    """Hold the checkpoint lock of process ``pid`` (its start time in the name: a reused PID is another target).

    A second checkpoint of the same tree while one runs is refused: never two
    dumps of one tree, never two half-snapshots. The lock goes with the fd
    (also when this process dies).
    """
    os.makedirs(lock_dir, mode=0o700, exist_ok=True)
    try:
        start = proc.stat_fields(pid)[19]
    except (OSError, IndexError):
        start = "0"
    try:
        return rst.hold(os.path.join(lock_dir, f"checkpoint-{pid}-{start}.lock"))
    except rst.Busy as holder:
        raise SnapshotError(f"{what}: another checkpoint of it is running (warmstart pid {holder}); "
                            "run one at a time") from None
