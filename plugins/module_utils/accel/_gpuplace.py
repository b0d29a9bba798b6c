# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""GPU state of container snapshots: the GPUs a placeholder was given, and CUDA memory shared between processes.

A placeholder's GPUs are what its runtime gave it, read from the placeholder itself:

- ``NVIDIA_VISIBLE_DEVICES`` (the NVIDIA container toolkit's variable), else ``CUDA_VISIBLE_DEVICES``, in its
  environment: host GPU indices or UUIDs, ``all``, or ``none`` / ``void`` / empty (no GPU);
- its ``/dev/nvidia<N>`` device nodes (``/proc/<pid>/root/dev``): without a variable these are its GPUs (by
  index); with one, a listed GPU whose device node it lacks cannot be used, and is a problem.

CUDA memory shared between processes (``cuIpcGetMemHandle`` / ``cuMemExportToShareableHandle`` with a POSIX file
descriptor, or a worker forked after CUDA was initialised) cannot be checkpointed process by process. The sign
this module looks for is one any process shows: two processes of the tree holding file descriptors to the *same
open file description* of an NVIDIA device file (``kcmp(KCMP_FILE)``): a descriptor passed over a UNIX socket
(a VMM export) or inherited across ``fork``. A legacy ``cuIpcGetMemHandle`` handle, exchanged as 64 opaque bytes,
leaves no such sign (tests/device/container_gpu.py shows it on a real GPU): NVIDIA documents IPC memory as
unsupported by the CUDA checkpoint, so a driver refusal (``CUDA_ERROR_NOT_SUPPORTED``) rolls the checkpoint back.

MIG: the CUDA checkpoint cannot save a process on a MIG instance. ``mig_problems`` finds one before anything is
locked from what such a process shows: a MIG device (``MIG-<uuid>``) in its visible-devices variable, or an open
MIG capability (``/dev/nvidia-caps/nvidia-cap<N>``, or ``/proc/driver/nvidia/capabilities/.../mig/...`` where
the driver hands capabilities out through procfs).
"""
from __future__ import annotations

import ctypes
import os
import re
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cuda as cu
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cudaabi as cuabi
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cudabackends as cubk
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

VISIBLE_ENV = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
NO_GPU = ("none", "void", "")
DEVICE_PREFIXES = ("/dev/nvidia",)
MIG_CAPS = ("/dev/nvidia-caps/", "/proc/driver/nvidia/capabilities/")
KCMP_FILE = 0
SYS_KCMP = {"x86_64": 312, "aarch64": 272, "ppc64le": 364, "s390x": 343}
Gpu = Dict[str, Any]


class GpuPlaceError(WarmstartError):
    """GPU state cannot go into this placeholder, or CUDA memory is shared between processes."""


def device_nodes(pid: int) -> List[int]:
    """The N of every ``/dev/nvidia<N>`` device node in the root file system ``pid`` sees, sorted."""
    try:
        names = os.listdir(f"/proc/{pid}/root/dev")
    except OSError:
        return []
    return sorted(int(m.group(1)) for m in (re.fullmatch(r"nvidia(\d+)", n) for n in names) if m)


def _pick(token: str, node_gpus: Sequence[Gpu]) -> Optional[Gpu]:
    for gpu in node_gpus:
        uuid = str(gpu.get("uuid") or "")
        if token.isdigit() and gpu.get("index") == int(token):
            return gpu
        if not token.isdigit() and uuid and (uuid == token or uuid.startswith(token)):
            return gpu
    return None


def visible_gpus(env: Dict[str, str], nodes: List[int], node_gpus: Sequence[Gpu]) -> Tuple[List[Gpu], str, List[str]]:
    """``(the GPUs given, how that was learnt, problems)`` from a placeholder's environment and device nodes."""
    key = next((k for k in VISIBLE_ENV if k in env), None)
    node_text = ", ".join(f"/dev/nvidia{n}" for n in nodes) or "no /dev/nvidia<N> device node"
    if key is None:
        given = [g for g in node_gpus if g.get("index") in nodes]
        return given, f"no {' / '.join(VISIBLE_ENV)}; {node_text}", []
    value = env[key].strip()
    how = f"{key}={value}; {node_text}"
    if value.lower() in NO_GPU:
        return [], how, []
    if value.lower() == "all":
        picked = list(node_gpus)
    else:
        picked, problems = [], []
        for token in [t.strip() for t in value.split(",") if t.strip()]:
            gpu = _pick(token, node_gpus)
            if gpu is None:
                problems.append(f"{key} names GPU {token!r}, which this node does not have")
            elif gpu not in picked:
                picked.append(gpu)
        if problems:
            return picked, how, problems
    if nodes:
        lacking = [g for g in picked if g.get("index") not in nodes]
        if lacking:
            return [g for g in picked if g not in lacking], how, [
                f"GPU {g.get('index')} ({g.get('uuid')}) is visible but the placeholder has no /dev/nvidia"
                f"{g.get('index')}" for g in lacking]
    return picked, how, []


def placeholder_pairs(pid: int, name: str, gpu: Dict[str, Any],
                      node_gpus: Sequence[Gpu]) -> Tuple[Optional[List[Tuple[str, str]]], List[str]]:
    """The snapshot's GPUs paired with the placeholder's (``_cuda.device_map``), or every problem.

    ``(None, [])`` when the snapshot recorded no GPU list (its node had no inventory): the driver is then left to
    restore onto the same GPUs."""
    source = list(gpu.get("gpus") or [])
    if not source:
        return None, []
    try:
        given, how, problems = visible_gpus(proc.environ(pid), device_nodes(pid), node_gpus)
    except OSError as exc:
        return None, [f"gpu: placeholder {name}: cannot read its environment ({exc.strerror or exc})"]
    problems = [f"gpu: placeholder {name}: {p}" for p in problems]
    try:
        pairs = cu.device_map(source, given)
    except cuabi.GpuMismatch as exc:
        listed = "[" + ", ".join(f"{g.get('uuid')} {g.get('name')}" for g in given) + "]"
        problems.append(f"gpu: placeholder {name} was given {len(given)} GPU(s) {listed} ({how}), the snapshot "
                        f"used {len(source)}: {exc}")
        return None, problems
    return (None, problems) if problems else (pairs, [])


def restored_cuda_pids(root: int, recorded: Sequence[Dict[str, Any]]) -> List[int]:
    """Host pids of the restored CUDA processes: the snapshot's namespace pids found in the tree of ``root``."""
    by_ns: Dict[int, int] = {}
    for pid in proc.descendants(root):
        try:
            by_ns.setdefault(proc.ns_pids(pid)[-1], pid)
        except OSError:
            continue
    missing = [str(p["ns_pid"]) for p in recorded if int(p["ns_pid"]) not in by_ns]
    if missing:
        raise GpuPlaceError(f"cuda: the restored tree of pid {root} has no process with namespace pid(s) "
                            f"{', '.join(missing)} (CUDA processes at checkpoint)")
    return [by_ns[int(p["ns_pid"])] for p in recorded]


def resume(root: int, gpu: Dict[str, Any], backend: Optional[cubk.Backend], why: str,
           pairs: Optional[List[Tuple[str, str]]], timings: Dict[str, float]) -> Dict[str, Any]:
    """After CRIU restored a container's tree: every CUDA process restored (onto ``pairs``), then all unlocked."""
    if backend is None:
        raise GpuPlaceError(f"cuda: this node cannot restore GPU state: {why}")
    t0 = time.monotonic()
    pids = restored_cuda_pids(root, list(gpu.get("pids") or []))
    timings["cuda_map"] = time.monotonic() - t0
    timings.update(cu.restore_and_unlock(pids, pairs, backend))
    return {"used": True, "pids": pids, "gpu_pairs": [list(p) for p in pairs or []], "backend": backend.describe()}


# --- CUDA memory shared between processes ----------------------------------------

def _kcmp() -> Any:
    nr = SYS_KCMP.get(os.uname().machine)
    if nr is None:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    return lambda a, b, fa, fb: int(libc.syscall(nr, a, b, KCMP_FILE, fa, fb))


def device_fds(pid: int, prefixes: Sequence[str] = DEVICE_PREFIXES) -> List[Tuple[int, str]]:
    out = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    for fd in fds:
        try:
            path = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if any(path.startswith(p) for p in prefixes):
            out.append((int(fd), path))
    return out


def shared_device_files(pids: Sequence[int], prefixes: Sequence[str] = DEVICE_PREFIXES) -> List[str]:
    """Each pair of ``pids`` that holds one open file description of a device file (``prefixes``), described."""
    cmp = _kcmp()
    if cmp is None:
        return []
    fds = {pid: device_fds(pid, prefixes) for pid in pids}
    found: List[str] = []
    for i, one in enumerate(pids):
        for two in pids[i + 1:]:
            for fa, path in fds[one]:
                hit = next((fb for fb, other in fds[two] if other == path and cmp(one, two, fa, fb) == 0), None)
                if hit is not None:
                    found.append(f"pid {one} (fd {fa}) and pid {two} (fd {hit}) share one open {path}")
                    break
    return found


def shared_memory_problems(pids: Sequence[int], prefixes: Sequence[str] = DEVICE_PREFIXES) -> List[str]:
    """Every sign that CUDA processes of a tree share GPU memory; checked before anything is locked."""
    if len(pids) < 2:
        return []
    return [f"cuda: {s}: CUDA memory shared between processes (an exported or IPC allocation, or a worker forked "
            "after CUDA was initialised) cannot be checkpointed process by process; start workers with 'spawn' "
            "and disable CUDA IPC / P2P (see the README's GPU section)" for s in shared_device_files(pids, prefixes)]


# --- MIG --------------------------------------------------------------------------

def mig_problems(pids: Sequence[int]) -> List[str]:
    """Each CUDA process of ``pids`` that runs on a MIG instance, with the sign it shows; before anything is locked."""
    found = []
    for pid in pids:
        signs = []
        try:
            env = proc.environ(pid)
        except OSError:
            env = {}
        for key in VISIBLE_ENV:
            tokens = [t.strip() for t in env.get(key, "").split(",")]
            signs += [f"{key} names {t}" for t in tokens if t.upper().startswith("MIG-")][:2]
        caps = [path for _fd, path in device_fds(pid, MIG_CAPS)
                if path.startswith(MIG_CAPS[0]) or "/mig/" in path]
        if caps:
            signs.append(f"it holds MIG capability {caps[0]} open")
        if signs:
            found.append(f"cuda: pid {pid} runs on a MIG instance ({'; '.join(signs)}): the CUDA checkpoint cannot "
                         "save a MIG process; run it on a whole GPU (MIG mode off) to snapshot it")
    return found
