# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""NVIDIA GPU inventory through NVML, and whether libcuda has the checkpoint API.

Never raises: a node without the NVML bindings, the driver or a GPU gets an
empty list and a short reason. ``pynvml`` (package ``nvidia-ml-py``) is
imported lazily; tests pass a fake module as ``nvml``.
"""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from typing import Any, Callable, Dict, List, Optional, Tuple

LIBCUDA = "libcuda.so.1"
CHECKPOINT_SYMBOL = "cuCheckpointProcessLock"


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def cuda_version_string(version: int) -> str:
    """NVML's integer CUDA driver version (e.g. 13000, 12080) as "13.0" / "12.8"."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def cuda_checkpoint_api(library: str = LIBCUDA, loader: Callable[[str], Any] = ctypes.CDLL) -> bool:
    """True when the CUDA driver library exports ``cuCheckpointProcessLock`` (driver r570+, CUDA 12.8+)."""
    try:
        lib = loader(library)
    except OSError:
        return False
    return hasattr(lib, CHECKPOINT_SYMBOL)


def _import_nvml() -> Any:
    import pynvml  # pylint: disable=import-outside-toplevel

    return pynvml


def gpu_inventory(
    nvml: Optional[Any] = None,
    checkpoint_api: Optional[Callable[[], bool]] = None,
) -> Tuple[List[Dict[str, Any]], Optional[str]]:
    """Return ``(gpus, reason)``; ``reason`` is None when NVML answered.

    Each GPU: index, uuid, name, memory_total (bytes), driver_version,
    cuda_driver_version ("13.0"), cuda_checkpoint_api (bool).
    """
    if nvml is None:
        try:
            nvml = _import_nvml()
        except ImportError:
            return [], "Python module pynvml (package nvidia-ml-py) is not installed"
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return [], f"NVML unavailable: {_text(exc) or type(exc).__name__}"
    try:
        count = nvml.nvmlDeviceGetCount()
        if count == 0:
            return [], "NVML found no GPU"
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        cuda = cuda_version_string(int(nvml.nvmlSystemGetCudaDriverVersion_v2()))
        has_api = (checkpoint_api or cuda_checkpoint_api)()
        gpus = []
        for index in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(
                {
                    "index": index,
                    "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
                    "name": _text(nvml.nvmlDeviceGetName(handle)),
                    "memory_total": int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                    "driver_version": driver,
                    "cuda_driver_version": cuda,
                    "cuda_checkpoint_api": has_api,
                }
            )
        return gpus, None
    except Exception as exc:  # any NVML error mid-query: report, never raise
        return [], f"NVML query failed: {_text(exc) or type(exc).__name__}"
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # pylint: disable=broad-except
            pass


NVIDIA_SMI = "nvidia-smi"
SMI_FIELDS = "index,uuid,name,memory.total,driver_version"


def smi_inventory(binary: Optional[str] = None, timeout: float = 30.0) -> Tuple[List[Dict[str, Any]], Optional[str]]:
    """The same list as ``gpu_inventory`` from ``nvidia-smi --query-gpu`` (for nodes without pynvml). Never raises."""
    found = shutil.which(binary or NVIDIA_SMI)
    if not found:
        return [], f"{binary or NVIDIA_SMI} not found"
    try:
        done = subprocess.run([found, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"{found} failed: {exc}"
    if done.returncode != 0:
        lines = (done.stdout + done.stderr).strip().splitlines()
        return [], f"{found} failed: {lines[-1] if lines else f'exit status {done.returncode}'}"
    gpus = []
    for line in done.stdout.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 5:
            continue
        try:
            index, memory = int(fields[0]), int(float(fields[3])) << 20  # MiB
        except ValueError:
            continue
        gpus.append({"index": index, "uuid": fields[1], "name": fields[2], "memory_total": memory,
                     "driver_version": fields[4]})
    if not gpus:
        return [], f"{found} listed no GPU"
    return gpus, None


def node_gpus(nvml: Optional[Any] = None, smi: Optional[str] = None) -> Tuple[List[Dict[str, Any]], Optional[str]]:
    """This node's GPUs for snapshots: NVML, else ``nvidia-smi``; ``(gpus, reason)`` as ``gpu_inventory``.

    Only what a snapshot records and a restore compares (index, uuid, name,
    memory_total, driver_version): the checkpoint-API probe is not repeated.
    """
    gpus, reason = gpu_inventory(nvml, checkpoint_api=lambda: True)
    if gpus or nvml is not None:
        return [{k: g[k] for k in ("index", "uuid", "name", "memory_total", "driver_version")} for g in gpus], reason
    more, smi_reason = smi_inventory(smi)
    if more:
        return more, None
    return [], f"{reason}; {smi_reason}"
