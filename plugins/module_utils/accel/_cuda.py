# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""CUDA process checkpointing over a process tree: which pids are CUDA processes, GPU pairing, and the
all-or-nothing lock + checkpoint / restore + unlock of every pid (with its rollback).

Use from checkpoint / restore::

    backend, reason = _cudabackends.availability()   # None + reason when no driver / driver too old
    pids = find_cuda_pids(tree_pids, backend)
    timings = lock_and_checkpoint(pids, timeout_ms, backend)   # all or nothing: rolls back on failure
    ... CRIU dump / restore ...
    pairs = device_map(manifest_gpus, node_gpus)                # GpuMismatch when models / counts differ
    timings = restore_and_unlock(restored_pids, pairs, backend)

The state machine, result codes and errors are ``_cudaabi``'s; the backends
(driver API or ``cuda-checkpoint``) ``_cudabackends``'.
"""
from __future__ import annotations

import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Union

from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._cudaabi import (
    CHECKPOINTED,
    INVALID_VALUE,
    LOCKED,
    NOT_INITIALIZED,
    RESULT_NAMES,
    CudaError,
    CudaStateError,
    CudaUnavailable,
    GpuMismatch,
    GpuPairs,
)
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._cudabackends import Backend, availability

DEFAULT_LOCK_TIMEOUT_MS = 30000


def find_cuda_pids(pids: Iterable[int], backend: Optional[Backend] = None, nvml: Optional[Any] = None) -> List[int]:
    """The pids of a process tree that are CUDA processes, in the order given.

    Asks the driver for each pid's restore thread (GetState answers for any
    pid on some drivers; GetRestoreThreadId only for CUDA processes). NVML's
    running-process lists are a second source when ``nvml`` (pynvml) is given
    or importable; with no backend, NVML alone answers. A driver error other
    than "not a CUDA process" is raised, not taken for "no".
    """
    wanted = [int(pid) for pid in pids]
    found = set()
    if backend is not None:
        for pid in wanted:
            try:
                backend.restore_thread_id(pid)
            except CudaError as exc:
                if _not_cuda(exc):
                    continue
                raise
            found.add(pid)
    found |= nvml_gpu_pids(nvml) & set(wanted)
    return [pid for pid in wanted if pid in found]


def _not_cuda(exc: CudaError) -> bool:
    """Whether a driver error for a pid means "that process holds no CUDA state": INVALID_VALUE on most drivers;
    NOT_INITIALIZED on others (seen with driver 580 on an H200: the target never initialised CUDA - the caller's
    own cuInit has been done by then, ``DriverBackend._call``)."""
    if exc.result in (INVALID_VALUE, NOT_INITIALIZED, None, RESULT_NAMES[INVALID_VALUE], RESULT_NAMES[NOT_INITIALIZED]):
        return True
    return isinstance(exc.result, str) and exc.result.startswith("exit status")


def nvml_gpu_pids(nvml: Optional[Any] = None) -> Set[int]:
    """Host pids NVML lists as running on any GPU (compute or graphics); empty when NVML is unavailable."""
    if nvml is None:
        try:
            import pynvml  # pylint: disable=import-outside-toplevel
        except ImportError:
            return set()
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception:  # pylint: disable=broad-except
        return set()
    pids: Set[int] = set()
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            for query in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                func = getattr(nvml, query, None)
                if func is None:
                    continue
                try:
                    pids.update(int(proc.pid) for proc in func(handle))
                except Exception:  # pylint: disable=broad-except
                    continue
    except Exception:  # pylint: disable=broad-except
        pass
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # pylint: disable=broad-except
            pass
    return pids


def _gpu_fields(gpu: Union[str, Mapping[str, Any]]) -> Tuple[str, str]:
    if isinstance(gpu, str):
        return gpu, ""
    return str(gpu["uuid"]), str(gpu.get("name") or gpu.get("model") or "")


def _gpu_list(gpus: Sequence[Tuple[str, str]]) -> str:
    return "[" + ", ".join(f"{uuid} {name}".strip() for uuid, name in gpus) + "]"


def device_map(source_gpus: Sequence[Union[str, Mapping[str, Any]]],
               target_gpus: Sequence[Union[str, Mapping[str, Any]]]) -> List[Tuple[str, str]]:
    """Pair every snapshot GPU with one of this node's: ``[(old_uuid, new_uuid), ...]`` in source order.

    GPUs are ``{"uuid", "name"}`` dicts (the NVML inventory) or UUID strings.
    Identical UUIDs pair first; the rest pair by position among GPUs of the
    same model. Raises GpuMismatch, listing both sides, when the counts or
    the models differ.
    """
    source = [_gpu_fields(g) for g in source_gpus]
    target = [_gpu_fields(g) for g in target_gpus]
    both = f"snapshot GPUs {_gpu_list(source)}, this node's {_gpu_list(target)}"
    if len(source) != len(target):
        raise GpuMismatch(f"GPU count differs: the snapshot used {len(source)}, this node has {len(target)}: {both}")
    if sorted(gpu[1] for gpu in source) != sorted(gpu[1] for gpu in target):
        raise GpuMismatch(f"GPU models differ: {both}")
    pairs: Dict[int, str] = {}
    free = list(range(len(target)))
    target_index = {gpu[0]: i for i, gpu in enumerate(target)}
    for i, (uuid, name) in enumerate(source):
        j = target_index.get(uuid)
        if j is not None and j in free and target[j][1] == name:
            pairs[i] = uuid
            free.remove(j)
    for i, (uuid, name) in enumerate(source):
        if i in pairs:
            continue
        j = next(j for j in free if target[j][1] == name)  # exists: same multiset of models
        pairs[i] = target[j][0]
        free.remove(j)
    return [(source[i][0], pairs[i]) for i in range(len(source))]


def _backend(backend: Optional[Backend]) -> Backend:
    if backend is not None:
        return backend
    found, reason = availability()
    if found is None:
        raise CudaUnavailable(reason)
    return found


def _rollback(backend: Backend, touched: Sequence[int]) -> Tuple[List[int], List[str]]:
    """Bring every touched pid back to RUNNING (restore if checkpointed, then unlock): ``(pids undone, problems)``."""
    undone: List[int] = []
    problems: List[str] = []
    for pid in touched:
        try:
            current = backend.state(pid)
        except CudaError as exc:
            if not _not_cuda(exc):
                problems.append(str(exc))
            continue  # not a CUDA process (any more): nothing to undo
        try:
            if current == CHECKPOINTED:
                backend.restore(pid)
                current = LOCKED
            if current == LOCKED:
                backend.unlock(pid)
                undone.append(pid)
        except CudaError as exc:
            problems.append(str(exc))
    return undone, problems


def rollback(pids: Sequence[int], backend: Optional[Backend] = None) -> Tuple[List[int], List[str]]:
    """Bring every pid back to RUNNING, whatever step it reached (restore if checkpointed, then unlock).

    ``(pids undone, problems)``; never raises for a single pid (a pid that is
    not, or no longer, a CUDA process is skipped). For callers that locked
    through ``lock_and_checkpoint`` and then failed on their own side.
    """
    return _rollback(_backend(backend), list(pids))


def lock_and_checkpoint(pids: Sequence[int], timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
                        backend: Optional[Backend] = None) -> Dict[str, float]:
    """Lock every pid, then checkpoint every pid; ``{"cuda_lock": s, "cuda_checkpoint": s}``.

    All or nothing: if any step fails after a lock, every pid touched is
    restored and unlocked again (the source keeps running, never left
    locked) and a CudaError is raised that carries the original cause and
    says whether the rollback worked.
    """
    drv = _backend(backend)
    timings = {"cuda_lock": 0.0, "cuda_checkpoint": 0.0}
    touched: List[int] = []
    try:
        t0 = time.monotonic()
        for pid in pids:
            try:
                drv.lock(pid, timeout_ms)
            except CudaStateError:
                raise  # refused before the driver was asked: not ours to roll back
            except BaseException:
                touched.append(pid)  # a lock that failed may still have left it locked
                raise
            touched.append(pid)
        timings["cuda_lock"] = time.monotonic() - t0
        t0 = time.monotonic()
        for pid in pids:
            drv.checkpoint(pid)
        timings["cuda_checkpoint"] = time.monotonic() - t0
    except BaseException as exc:
        undone, problems = _rollback(drv, touched)
        if not isinstance(exc, CudaError):
            raise
        if problems:
            note = f"; rolling back failed, these may stay locked: {'; '.join(problems)}"
        elif undone:
            note = f"; rolled back: pid(s) {', '.join(map(str, undone))} running again"
        else:
            note = "; no process was left locked"
        raise type(exc)(exc.pid, exc.call, exc.result, f"{exc}{note}") from exc
    return timings


def restore_and_unlock(pids: Sequence[int], gpu_pairs: Optional[GpuPairs] = None,
                       backend: Optional[Backend] = None) -> Dict[str, float]:
    """Restore every pid (onto ``gpu_pairs``), then unlock every pid; ``{"cuda_restore": s, "cuda_unlock": s}``.

    No process runs CUDA work before all have their GPUs back. On failure a
    CudaError names the pid and the cause; there is no rollback (a
    half-restored copy is killed by the caller, never replayed).
    """
    drv = _backend(backend)
    timings = {"cuda_restore": 0.0, "cuda_unlock": 0.0}
    t0 = time.monotonic()
    for pid in pids:
        drv.restore(pid, gpu_pairs)
    timings["cuda_restore"] = time.monotonic() - t0
    t0 = time.monotonic()
    for pid in pids:
        drv.unlock(pid)
    timings["cuda_unlock"] = time.monotonic() - t0
    return timings
