# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The CUDA checkpoint ABI: constants, the driver's argument structs, result and state names, errors, GPU UUIDs.

NVIDIA drivers >= 570 (CUDA 12.8) export six calls that move a process's GPU
state into host memory and back; r580 (CUDA 13.0) adds GPU remapping on
restore. Per process the state machine is::

    RUNNING --lock--> LOCKED --checkpoint--> CHECKPOINTED --restore--> LOCKED --unlock--> RUNNING

A CHECKPOINTED process holds no GPU resource, so CRIU can dump it. The argument
structs mirror the driver's 64-byte layouts and are checked against them at
import (``ImportError`` on a platform where they differ). The backends that
drive the state machine are in ``_cudabackends``; the per-process operations
over a tree in ``_cuda``.
"""
from __future__ import annotations

import ctypes
import re
from typing import Any, Optional, Sequence, Tuple, Union

from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

MIN_DRIVER = "NVIDIA driver >= 570 (CUDA 12.8)"
REMAP_DRIVER = "NVIDIA driver >= 580 (CUDA 13.0)"
REMAP_CUDA_VERSION = 13000

# CUprocessState
RUNNING = 0
LOCKED = 1
CHECKPOINTED = 2
FAILED = 3
STATE_NAMES = {RUNNING: "RUNNING", LOCKED: "LOCKED", CHECKPOINTED: "CHECKPOINTED", FAILED: "FAILED"}

# CUresult
SUCCESS = 0
INVALID_VALUE = 1
NOT_INITIALIZED = 3
ILLEGAL_STATE = 401
NOT_READY = 600
NOT_SUPPORTED = 801
TIMEOUT = 909
RESULT_NAMES = {
    SUCCESS: "CUDA_SUCCESS",
    INVALID_VALUE: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    NOT_INITIALIZED: "CUDA_ERROR_NOT_INITIALIZED",
    4: "CUDA_ERROR_DEINITIALIZED",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    201: "CUDA_ERROR_INVALID_CONTEXT",
    304: "CUDA_ERROR_OPERATING_SYSTEM",
    ILLEGAL_STATE: "CUDA_ERROR_ILLEGAL_STATE",
    NOT_READY: "CUDA_ERROR_NOT_READY",
    NOT_SUPPORTED: "CUDA_ERROR_NOT_SUPPORTED",
    TIMEOUT: "CUDA_ERROR_TIMEOUT",
    999: "CUDA_ERROR_UNKNOWN",
}
CHECKPOINT_SYMBOLS = (
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
    "cuCheckpointProcessGetState",
    "cuCheckpointProcessGetRestoreThreadId",
)


class CUuuid(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_char * 16)]


class CUcheckpointLockArgs(ctypes.Structure):
    _fields_ = [
        ("timeoutMs", ctypes.c_uint),   # first: 0 = no timeout
        ("reserved0", ctypes.c_uint),
        ("reserved1", ctypes.c_uint64 * 7),
    ]


class CUcheckpointCheckpointArgs(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_uint64 * 8)]


class CUcheckpointUnlockArgs(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_uint64 * 8)]


class CUcheckpointGpuPair(ctypes.Structure):
    _fields_ = [("oldUuid", CUuuid), ("newUuid", CUuuid)]


class CUcheckpointRestoreArgs(ctypes.Structure):
    """CUDA 13.0 ABI; before 13.0 the same 64 bytes were all reserved (zero = no remapping)."""

    _fields_ = [
        ("gpuPairs", ctypes.POINTER(CUcheckpointGpuPair)),
        ("gpuPairsCount", ctypes.c_uint),
        ("reserved", ctypes.c_char * (52 - ctypes.sizeof(ctypes.c_void_p))),
        ("reserved1", ctypes.c_uint64),
    ]


def _check_layouts() -> None:
    sizes = {
        CUcheckpointLockArgs: 64, CUcheckpointCheckpointArgs: 64, CUcheckpointUnlockArgs: 64,
        CUcheckpointRestoreArgs: 64, CUcheckpointGpuPair: 32, CUuuid: 16,
    }
    for struct, size in sizes.items():
        if ctypes.sizeof(struct) != size:
            raise ImportError(f"{struct.__name__} is {ctypes.sizeof(struct)} bytes on this platform, the CUDA ABI needs {size}")
    if CUcheckpointLockArgs.timeoutMs.offset != 0 or CUcheckpointRestoreArgs.gpuPairsCount.offset != 8:
        raise ImportError("CUDA checkpoint argument layout differs from the driver's (timeoutMs at 0, gpuPairsCount at 8)")


_check_layouts()

GpuPairs = Sequence[Tuple[str, str]]


class CudaError(WarmstartError):
    """A CUDA checkpoint call failed: names the pid, the call and the result."""

    def __init__(self, pid: Optional[int], call: str, result: Optional[Union[int, str]], message: str) -> None:
        super().__init__(message)
        self.pid = pid
        self.call = call
        self.result = result

    @classmethod
    def failed(cls, pid: int, call: str, code: int, name: str, hint: str = "") -> "CudaError":
        text = f"pid {pid}: {call} failed: {name}"
        return cls(pid, call, code, f"{text} ({hint})" if hint else text)


class CudaStateError(CudaError):
    """A transition refused before the driver was asked: the process is in the wrong state."""


class CudaUnavailable(WarmstartError):
    """No usable CUDA checkpoint backend on this node (message: why)."""


class GpuMismatch(WarmstartError, ValueError):
    """The snapshot's GPUs cannot be mapped onto this node's: different count or models."""


def result_name(code: int, lib: Any = None) -> str:
    """``CUDA_ERROR_ILLEGAL_STATE`` for 401: the driver's cuGetErrorName when exported, else a table, else CUDA_ERROR_<n>."""
    func = getattr(lib, "cuGetErrorName", None) if lib is not None else None
    if func is not None:
        text = ctypes.c_char_p()
        try:
            if func(int(code), ctypes.byref(text)) == SUCCESS and text.value:
                return text.value.decode("ascii", "replace")
        except (OSError, ctypes.ArgumentError):
            pass
    return RESULT_NAMES.get(code, f"CUDA_ERROR_{code}")


def state_name(state: int) -> str:
    return STATE_NAMES.get(state, f"UNKNOWN({state})")


def uuid_bytes(uuid: str) -> bytes:
    """NVML's ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` (or bare hex) as the 16 bytes of a CUuuid."""
    text = uuid.strip()
    for prefix in ("GPU-", "gpu-"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    digits = text.replace("-", "")
    if not re.fullmatch(r"[0-9a-fA-F]{32}", digits):
        raise ValueError(f"GPU UUID {uuid!r} is not GPU-<32 hex digits> (MIG devices cannot be checkpointed)")
    return bytes.fromhex(digits)


def uuid_text(raw: bytes) -> str:
    """16 bytes as NVML's ``GPU-8-4-4-4-12`` text."""
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
