# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Accelerator backends: one interface for the device state of a process tree (CUDA, Ascend CANN).

Every backend does the same five things for a checkpoint or restore::

    pids = accel.find_pids(tree)                           # which processes hold device state
    problems = accel.refusals(pids)                        # why they cannot be snapshot: before anything is touched
    timings = accel.lock_and_checkpoint(pids, timeout_ms)  # all together; all rolled back on any failure
    ... CRIU dump / restore ...
    timings = accel.restore_and_unlock(pids, pairs)        # all restored before any is unlocked
    undone, problems = accel.rollback(pids)                # force unlock, whatever step each reached (guardian)

``CudaAccelerator`` wraps ``_cuda`` (its functions stay the public CUDA API);
``AscendAccelerator`` asks each NPU process's own agent (``_ascend.serve``),
since CANN's snapshot calls act on the calling process only. ``resolve``
turns the ``accelerator`` option (auto | cuda | ascend | off) and its alias
``cuda`` (auto | required | off) into one decision, refusing the two when
they disagree.

Device memory is restored eagerly by every backend (the driver copies it back
inside restore); only host memory may come back lazily (see README).
"""
from __future__ import annotations

import os
import time
from typing import Dict, List, Optional, Protocol, Sequence, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _ascend as asc
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cuda as cu
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cudaabi as cuabi
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cudabackends as cubk
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._gpunode import GpuNode
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

ACCELERATORS = ("auto", "cuda", "ascend", "off")
CUDA_ALIAS = {"auto": "auto", "required": "cuda", "off": "off"}
DevicePairs = Sequence[Tuple[str, str]]


class AcceleratorError(WarmstartError):
    """An accelerator step failed or was refused (message: which processes and why)."""


class Accelerator(Protocol):
    """What checkpoint and restore need of one kind of accelerator."""

    name: str

    def describe(self) -> str:
        """The backend in words (library, version)."""

    def find_pids(self, tree: Sequence[int]) -> List[int]:
        """The pids of ``tree`` that hold device state, in tree order."""

    def refusals(self, pids: Sequence[int]) -> List[str]:
        """Every reason these pids cannot be snapshot, before anything is locked; empty when they can."""

    def lock_and_checkpoint(self, pids: Sequence[int], timeout_ms: int) -> Dict[str, float]:
        """Lock all, then move every device state into host memory; on failure all are rolled back and it raises."""

    def restore_and_unlock(self, pids: Sequence[int], pairs: Optional[DevicePairs] = None) -> Dict[str, float]:
        """Restore every device state (onto ``pairs`` old->new device), then unlock all."""

    def rollback(self, pids: Sequence[int]) -> Tuple[List[int], List[str]]:
        """Force every pid back to RUNNING; ``(pids undone, problems)``, never raises."""


def resolve(accelerator: Optional[str], cuda: Optional[str]) -> Tuple[str, str]:
    """``(accelerator, cuda mode)`` from the two options; ``cuda`` is the older spelling of the same choice.

    accelerator auto = cuda auto, cuda = required, off = off, ascend = CUDA off. Given both and
    disagreeing: AcceleratorError naming both.
    """
    if accelerator is not None and accelerator not in ACCELERATORS:
        raise AcceleratorError(f"accelerator: {accelerator!r} is not one of {', '.join(ACCELERATORS)}")
    if cuda is not None and cuda not in CUDA_ALIAS:
        raise AcceleratorError(f"cuda: {cuda!r} is not one of {', '.join(CUDA_ALIAS)}")
    from_cuda = CUDA_ALIAS[cuda] if cuda is not None else None
    if accelerator is not None and from_cuda is not None and accelerator != from_cuda:
        raise AcceleratorError(f"accelerator: {accelerator} and cuda: {cuda} disagree (cuda: {cuda} means accelerator: "
                               f"{from_cuda}); give one of them")
    chosen = accelerator or from_cuda or "auto"
    mode = {"auto": "auto", "cuda": "required", "ascend": "off", "off": "off"}[chosen]
    return chosen, mode


def choose(accelerator: Optional[str], cuda: Optional[str]) -> Tuple[str, str, Optional[GpuNode]]:
    """``(accelerator, cuda mode, node)`` from the two options (``resolve``); node None = this node's CUDA.

    V(ascend) runs the engine's accelerator path with the NPU agents' backend (``ascend_gpu_node``).
    """
    chosen, mode = resolve(accelerator, cuda)
    if chosen == "ascend":
        return chosen, "required", ascend_gpu_node()
    return chosen, mode, None


class CudaAccelerator:
    """NVIDIA GPUs through ``_cuda`` (driver API or cuda-checkpoint)."""

    name = "cuda"

    def __init__(self, backend: cubk.Backend) -> None:
        self.backend = backend

    def describe(self) -> str:
        return self.backend.describe()

    def find_pids(self, tree: Sequence[int]) -> List[int]:
        return cu.find_cuda_pids(tree, self.backend)

    def refusals(self, pids: Sequence[int]) -> List[str]:
        return []

    def lock_and_checkpoint(self, pids: Sequence[int], timeout_ms: int) -> Dict[str, float]:
        return cu.lock_and_checkpoint(pids, timeout_ms, self.backend)

    def restore_and_unlock(self, pids: Sequence[int], pairs: Optional[DevicePairs] = None) -> Dict[str, float]:
        return cu.restore_and_unlock(pids, pairs, self.backend)

    def rollback(self, pids: Sequence[int]) -> Tuple[List[int], List[str]]:
        return cu.rollback(pids, self.backend)


def _maps_library(pid: int, proc_root: str) -> bool:
    try:
        with open(os.path.join(proc_root, str(pid), "maps"), encoding="utf-8", errors="replace") as handle:
            return any(os.path.basename(line.split()[-1]).startswith("libascendcl.so")
                       for line in handle if "/" in line)
    except OSError:
        return False


class AscendAccelerator:
    """Huawei Ascend NPUs: each NPU process runs ``_ascend.serve``; this side writes requests and reads replies."""

    name = "ascend"

    def __init__(self, root: Optional[str] = None, proc_root: str = "/proc", reply_timeout: float = 60.0) -> None:
        self.root = root or asc.agent_root()
        self.proc_root = proc_root
        self.reply_timeout = reply_timeout

    def describe(self) -> str:
        return f"CANN snapshot API through each NPU process's agent ({self.root})"

    def has_agent(self, pid: int) -> bool:
        """Whether pid serves its snapshot agent under this root."""
        try:
            with open(os.path.join(self.root, str(pid), "agent"), encoding="utf-8") as handle:
                return handle.read().strip() == str(pid)
        except OSError:
            return False

    def find_pids(self, tree: Sequence[int]) -> List[int]:
        return [int(pid) for pid in tree if self.has_agent(int(pid)) or _maps_library(int(pid), self.proc_root)]

    def refusals(self, pids: Sequence[int]) -> List[str]:
        return [f"pid {pid} loads libascendcl.so but serves no warmstart snapshot agent in {self.root}/{pid} (CANN "
                "snapshots act on the calling process only: the workload must call _ascend.serve)"
                for pid in pids if not self.has_agent(pid)]

    def ask(self, pid: int, action: str, timeout: Optional[float] = None) -> str:
        """Send ``action`` to pid's agent and wait for its reply; the state it reports. AscendError on error."""
        folder = os.path.join(self.root, str(pid))
        reply = os.path.join(folder, "reply")
        if os.path.exists(reply):
            os.unlink(reply)
        asc.write_atomic(os.path.join(folder, "request"), action + "\n")
        deadline = time.monotonic() + (timeout or self.reply_timeout)
        while time.monotonic() < deadline:
            try:
                with open(reply, encoding="utf-8") as handle:
                    text = handle.read().strip()
            except OSError:
                time.sleep(0.01)
                continue
            os.unlink(reply)
            word, rest = (text.split(" ", 1) + [""])[:2]
            if word == "ok":
                return rest
            raise asc.AscendError(pid, action, None, rest)
        raise asc.AscendError(pid, action, None, f"pid {pid}: its snapshot agent did not answer {action} within "
                              f"{timeout or self.reply_timeout:g} s")

    def lock_and_checkpoint(self, pids: Sequence[int], timeout_ms: int) -> Dict[str, float]:
        timings = {"npu_lock": 0.0, "npu_backup": 0.0}
        touched: List[int] = []
        wait = timeout_ms / 1000.0 + 5 if timeout_ms > 0 else None
        try:
            for key, action in (("npu_lock", "lock"), ("npu_backup", "backup")):
                t0 = time.monotonic()
                for pid in pids:
                    if pid not in touched:
                        touched.append(pid)
                    self.ask(pid, action, wait)
                timings[key] = time.monotonic() - t0
        except BaseException as exc:
            undone, problems = self.rollback(touched)
            if not isinstance(exc, asc.AscendError):
                raise
            note = (f"; rolling back failed, these may stay locked: {'; '.join(problems)}" if problems
                    else f"; rolled back: pid(s) {', '.join(map(str, undone))} running again")
            raise AcceleratorError(f"ascend: {exc}{note}") from None
        return timings

    def restore_and_unlock(self, pids: Sequence[int], pairs: Optional[DevicePairs] = None) -> Dict[str, float]:
        if pairs and any(old != new for old, new in pairs):
            raise AcceleratorError("ascend: CANN restores onto the same device ids only; asked to move "
                                   + ", ".join(f"{old} -> {new}" for old, new in pairs if old != new))
        timings = {"npu_restore": 0.0, "npu_unlock": 0.0}
        for key, action in (("npu_restore", "restore"), ("npu_unlock", "unlock")):
            t0 = time.monotonic()
            for pid in pids:
                try:
                    self.ask(pid, action)
                except asc.AscendError as exc:
                    raise AcceleratorError(f"ascend: {exc}") from None
            timings[key] = time.monotonic() - t0
        return timings

    def rollback(self, pids: Sequence[int]) -> Tuple[List[int], List[str]]:
        undone: List[int] = []
        problems: List[str] = []
        for pid in pids:
            try:
                self.ask(pid, "force_unlock", min(self.reply_timeout, 30.0))
                undone.append(pid)
            except (asc.AscendError, OSError) as exc:
                problems.append(f"pid {pid}: {exc}")
        return undone, problems


_AS_CUDA = {asc.RUNNING: cuabi.RUNNING, asc.LOCKED: cuabi.LOCKED, asc.BACKED_UP: cuabi.CHECKPOINTED}


class AscendBackend(cubk.Backend):
    """The NPU agents behind a ``_cudabackends.Backend`` (LOCKED / BACKED_UP read as LOCKED / CHECKPOINTED).

    So the engine's accelerator path - lock and checkpoint before the dump, rollback and guardian on
    failure, restore and unlock of the restored pids before restore-complete - drives NPU processes
    unchanged. A process that loads libascendcl.so without an agent is refused (not taken for "no NPU").
    """

    name = "ascend"

    def __init__(self, accel: Optional[AscendAccelerator] = None) -> None:
        self.accel = accel or AscendAccelerator()

    def describe(self) -> str:
        return self.accel.describe()

    def _ask(self, pid: int, action: str, timeout: Optional[float] = None) -> int:
        try:
            state = self.accel.ask(pid, action, timeout)
        except asc.AscendError as exc:
            raise cuabi.CudaError(pid, action, "ascend", f"ascend: {exc}") from None
        return _AS_CUDA.get(state, cuabi.FAILED)

    def state(self, pid: int) -> int:
        if not self.accel.has_agent(pid):
            raise cuabi.CudaError(pid, "state", cuabi.INVALID_VALUE, f"pid {pid}: no NPU snapshot agent")
        return self._ask(pid, "state")

    def restore_thread_id(self, pid: int) -> int:
        refused = self.accel.refusals([pid]) if _maps_library(pid, self.accel.proc_root) else []
        if refused:
            raise cuabi.CudaError(pid, "find", "no agent", refused[0])
        self.state(pid)  # INVALID_VALUE without an agent: not an NPU process
        return pid

    def _lock(self, pid: int, timeout_ms: int) -> None:
        self._ask(pid, "lock", timeout_ms / 1000.0 + 5 if timeout_ms > 0 else None)

    def _checkpoint(self, pid: int) -> None:
        self._ask(pid, "backup")

    def _restore(self, pid: int, gpu_pairs: cuabi.GpuPairs) -> None:
        moved = [f"{old} -> {new}" for old, new in gpu_pairs if old != new]
        if moved:
            raise cuabi.CudaError(pid, "restore", "remap", f"ascend: pid {pid}: CANN restores onto the same device ids "
                                  f"only; asked to move {', '.join(moved)}")
        self._ask(pid, "restore")

    def _unlock(self, pid: int) -> None:
        self._ask(pid, "unlock")


def ascend_gpu_node(accel: Optional[AscendAccelerator] = None) -> GpuNode:
    """The engine's accelerator node for ``accelerator: ascend``: the agent backend, no GPU list to remap."""
    backend = AscendBackend(accel)
    return GpuNode(availability=lambda: (backend, backend.describe()),
                   inventory=lambda: ([], "Ascend NPUs are restored onto the same device ids (no remapping)"),
                   accelerator="ascend", absent=npu_absent)


def npu_absent(dev: str = "/dev") -> Optional[str]:
    """Why this node has no Ascend NPU (no ``/dev/davinci<N>``), or None when it has one."""
    try:
        found = [n for n in os.listdir(dev) if n.startswith("davinci") and n[len("davinci"):].isdigit()]
    except OSError:
        found = []
    return None if found else f"this node has no Ascend NPU ({dev}/davinci<N> missing)"
