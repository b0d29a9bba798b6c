# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The restore compatibility check: two node descriptions (``_node.describe_node``), a snapshot's GPU state
against this node's GPUs, and the host memory its page images need against what this node has free."""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cuda as cu
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cudaabi as cuabi
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _gpu
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._gpunode import GpuNode
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._progress import human
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._version import compare_versions


def _older(have: Optional[str], need: Optional[str]) -> bool:
    if not have or not need:
        return False
    try:
        return compare_versions(have, need) < 0
    except ValueError:
        return have != need


def incompatibilities(source: Dict[str, Any], target: Dict[str, Any]) -> List[str]:
    """Every reason ``target`` cannot restore a snapshot taken on ``source`` (empty = compatible)."""
    reasons = []
    if source.get("arch") != target.get("arch"):
        reasons.append(f"architecture: snapshot is {source.get('arch')}, this node is {target.get('arch')}")
    if _older(target.get("kernel"), source.get("kernel")):
        reasons.append(f"kernel: this node runs {target.get('kernel')}, older than the source's {source.get('kernel')}")
    if not target.get("criu_version"):
        reasons.append("criu: no CRIU on this node")
    elif _older(target.get("criu_version"), source.get("criu_version")):
        reasons.append(f"criu: this node has {target.get('criu_version')}, older than the source's {source.get('criu_version')}")
    if source.get("cpu_vendor") and source.get("cpu_vendor") != target.get("cpu_vendor"):
        reasons.append(f"cpu vendor: snapshot is {source.get('cpu_vendor')}, this node is {target.get('cpu_vendor')}")
    missing = sorted(set(source.get("cpu_flags") or []) - set(target.get("cpu_flags") or []))
    if missing:
        shown = ", ".join(missing[:12]) + (f" and {len(missing) - 12} more" if len(missing) > 12 else "")
        reasons.append(f"cpu flags: this node lacks {shown}")
    return reasons


def page_bytes(doc: Dict[str, Any]) -> int:
    """The bytes of memory a snapshot's page images hold once restored (plaintext sizes where compressed)."""
    compression: Dict[str, Any] = doc["compression"] if isinstance(doc.get("compression"), dict) else {}
    plain: Dict[str, Any] = compression["files"] if isinstance(compression.get("files"), dict) else {}
    total = 0
    for entry in doc.get("files") or []:
        path = str(entry.get("path") or "") if isinstance(entry, dict) else ""
        name = path.rsplit("/", 1)[-1]
        if name.startswith("pages-") and name.endswith(".img"):
            known = plain.get(path)
            size = known.get("size") if isinstance(known, dict) else entry.get("size")
            total += size if isinstance(size, int) and not isinstance(size, bool) else 0
    return total


def memory_problems(doc: Dict[str, Any], available: Optional[int] = None) -> List[str]:
    """Why this node lacks the host memory the restore needs: every page of the snapshot comes back into memory.

    With GPU state those pages include the device memory the CUDA checkpoint staged in host memory; it is
    moved back onto the GPU only after CRIU has restored it, so the node needs it all at once.
    """
    need = page_bytes(doc)
    have = proc.memory_available() if available is None else available
    if have is None or need <= have:
        return []
    gpu = " (with the GPU memory the CUDA checkpoint staged there)" if doc.get("gpu") else ""
    return [f"memory: the snapshot's page images need {human(need)} of host memory{gpu}, this node has "
            f"{human(have)} available (MemAvailable); free memory or restore on a larger node"]


CUDA_MODES = ("auto", "required", "off")


# accelerator -> (what its processes are called, what its device is called)
def _gpu_text(gpus: List[Dict[str, Any]]) -> str:
    return "[" + ", ".join(f"{g.get('uuid')} {g.get('name')}" for g in gpus) + "]"


def gpu_incompatibilities(gpu: Optional[Dict[str, Any]], node: GpuNode, cuda: str = "auto",
                          hard_only: bool = False) -> List[str]:
    """Every reason this node cannot restore the GPU state of a snapshot (its manifest's ``gpu`` section, or None).

    ``cuda``: V(off) refuses a snapshot holding GPU state; V(required) refuses one without; V(auto) takes both.
    With GPU state: a usable CUDA checkpoint backend, a CUDA driver not older than the source's, and the same
    GPU models and count (``_cuda.device_map``; remapping onto other UUIDs needs CUDA 13.0 / r580).
    ``hard_only`` (skip_compat_check) keeps only what no restore can do without: the mode and a backend.
    """
    if cuda not in CUDA_MODES:
        return [f"cuda: {cuda!r} is not one of {', '.join(CUDA_MODES)}"]
    if not gpu:
        return [f"{node.asked(cuda)}, but the snapshot holds no {node.device_word} state (it was taken CPU-only)"
                ] if cuda == "required" else []
    pids = ", ".join(str(p.get("pid")) for p in gpu.get("pids") or [])
    if cuda == "off":
        return [f"cuda: off, but the snapshot holds the GPU state of CUDA pid(s) {pids}: restoring it without "
                "restoring that state would leave them locked (use cuda auto or required)"]
    reasons = []
    backend, why = node.backend()
    if backend is None:
        reasons.append(f"{node.asked(cuda)}: the snapshot holds {node.device_word} state ({node.process_word} pid(s) "
                       f"{pids}), but this node cannot restore it: {why}")
    if hard_only:
        return reasons
    have = backend.driver_version() if backend is not None else None
    need = gpu.get("cuda_version")
    if have and need and int(have) < int(need):
        reasons.append(f"cuda driver: this node's CUDA driver is {_gpu.cuda_version_string(int(have))}, older than "
                       f"the source's {_gpu.cuda_version_string(int(need))}")
    source = list(gpu.get("gpus") or [])
    if not source:
        return reasons
    target, inv_reason = node.gpus()
    if _older(str(target[0].get("driver_version") or "") if target else None, gpu.get("driver_version")):
        reasons.append(f"nvidia driver: this node has {target[0].get('driver_version')}, older than the source's "
                       f"{gpu.get('driver_version')}")
    if not target:
        reasons.append(f"gpu: the snapshot used {len(source)} GPU(s) {_gpu_text(source)}, this node has none "
                       f"that warmstart can see ({inv_reason})")
        return reasons
    try:
        pairs = cu.device_map(source, target)
    except cuabi.GpuMismatch as exc:
        reasons.append(f"gpu: {exc}")
        return reasons
    moved = [f"{old} -> {new}" for old, new in pairs if old != new]
    if moved and have and int(have) < cuabi.REMAP_CUDA_VERSION:
        reasons.append(f"gpu: restoring onto other GPUs ({', '.join(moved)}) needs {cuabi.REMAP_DRIVER}; this node's "
                       f"CUDA driver is {_gpu.cuda_version_string(int(have))}")
    return reasons
