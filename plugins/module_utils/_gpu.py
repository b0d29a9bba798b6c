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
