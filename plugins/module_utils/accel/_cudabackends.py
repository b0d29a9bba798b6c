# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""CUDA checkpoint backends: the driver API (ctypes on libcuda.so.1) or the ``cuda-checkpoint`` binary.

Both drive the per-process state machine of ``_cudaabi``. Every transition is
checked against the process's current state before the driver is asked, and
refused with the reason (``CudaStateError``). ``availability`` picks the best
backend on this node, or says why there is none.

The library path can be overridden with ``WARMSTART_LIBCUDA`` and the binary
with ``WARMSTART_CUDA_CHECKPOINT`` (tests point them at fakes). Nothing here
calls ``cuInit``, except once when the driver answers NOT_INITIALIZED.
"""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from typing import Any, Callable, List, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._cudaabi import (
    CHECKPOINT_SYMBOLS,
    CHECKPOINTED,
    FAILED,
    ILLEGAL_STATE,
    INVALID_VALUE,
    LOCKED,
    MIN_DRIVER,
    NOT_INITIALIZED,
    NOT_READY,
    NOT_SUPPORTED,
    REMAP_CUDA_VERSION,
    REMAP_DRIVER,
    RUNNING,
    SUCCESS,
    TIMEOUT,
    CUcheckpointCheckpointArgs,
    CUcheckpointGpuPair,
    CUcheckpointLockArgs,
    CUcheckpointRestoreArgs,
    CUcheckpointUnlockArgs,
    CudaError,
    CudaStateError,
    CudaUnavailable,
    GpuPairs,
    result_name,
    state_name,
    uuid_bytes,
)

LIBCUDA = "libcuda.so.1"
LIBCUDA_ENV = "WARMSTART_LIBCUDA"
CUDA_CHECKPOINT = "cuda-checkpoint"
CUDA_CHECKPOINT_ENV = "WARMSTART_CUDA_CHECKPOINT"


_ILLEGAL = {
    ("lock", LOCKED): "already locked",
    ("lock", CHECKPOINTED): "it is checkpointed: restore it, then unlock",
    ("checkpoint", RUNNING): "lock it first",
    ("checkpoint", CHECKPOINTED): "already checkpointed",
    ("restore", RUNNING): "it is not checkpointed",
    ("restore", LOCKED): "it is not checkpointed, only locked: unlock it",
    ("unlock", RUNNING): "it is not locked",
    ("unlock", CHECKPOINTED): "restore it first",
}
_LEGAL_FROM = {"lock": RUNNING, "checkpoint": LOCKED, "restore": CHECKPOINTED, "unlock": LOCKED}


class Backend:
    """One way to drive the CUDA checkpoint state machine; subclasses do the four transitions and two queries."""

    name = "none"

    def state(self, pid: int) -> int:
        raise NotImplementedError

    def restore_thread_id(self, pid: int) -> int:
        raise NotImplementedError

    def driver_version(self) -> Optional[int]:
        """CUDA driver API version (13000 = CUDA 13.0), when known."""
        return None

    def describe(self) -> str:
        return self.name

    def _lock(self, pid: int, timeout_ms: int) -> None:
        raise NotImplementedError

    def _checkpoint(self, pid: int) -> None:
        raise NotImplementedError

    def _restore(self, pid: int, gpu_pairs: GpuPairs) -> None:
        raise NotImplementedError

    def _unlock(self, pid: int) -> None:
        raise NotImplementedError

    def _require(self, pid: int, action: str) -> None:
        current = self.state(pid)
        if current == _LEGAL_FROM[action]:
            return
        if current == FAILED:
            why = "the driver reports its CUDA state FAILED: it cannot be checkpointed or restored"
        else:
            why = _ILLEGAL.get((action, current), "not a legal transition")
        raise CudaStateError(pid, action, None, f"pid {pid}: cannot {action} a CUDA process in state {state_name(current)} ({why})")

    def lock(self, pid: int, timeout_ms: int = 0) -> None:
        """RUNNING -> LOCKED: CUDA calls that change GPU state block; in-flight work completes. 0 = wait forever."""
        self._require(pid, "lock")
        self._lock(pid, int(timeout_ms))

    def checkpoint(self, pid: int) -> None:
        """LOCKED -> CHECKPOINTED: device memory copied into host memory, GPU resources released."""
        self._require(pid, "checkpoint")
        self._checkpoint(pid)

    def restore(self, pid: int, gpu_pairs: Optional[GpuPairs] = None) -> None:
        """CHECKPOINTED -> LOCKED: GPUs re-acquired (remapped old->new UUID when pairs are given), memory copied back."""
        self._require(pid, "restore")
        self._restore(pid, list(gpu_pairs or []))

    def unlock(self, pid: int) -> None:
        """LOCKED -> RUNNING: CUDA calls proceed."""
        self._require(pid, "unlock")
        self._unlock(pid)


class DriverBackend(Backend):
    """The CUDA driver API through ctypes. Raises CudaUnavailable when the library or the API is missing."""

    name = "driver"

    def __init__(self, library: Optional[str] = None, loader: Callable[[str], Any] = ctypes.CDLL) -> None:
        self.library = library or os.environ.get(LIBCUDA_ENV) or LIBCUDA
        try:
            self.lib = loader(self.library)
        except OSError as exc:
            raise CudaUnavailable(f"{self.library} not found (no NVIDIA driver on this node?): {exc}") from exc
        self._version = self._query_version()
        missing = [name for name in CHECKPOINT_SYMBOLS if not hasattr(self.lib, name)]
        if missing:
            found = f"CUDA {_cuda_text(self._version)}" if self._version else "an older driver"
            raise CudaUnavailable(
                f"{self.library} ({found}) lacks {', '.join(missing)}: the CUDA checkpoint API needs {MIN_DRIVER}"
            )
        self._initialized = False
        for name in CHECKPOINT_SYMBOLS:
            getattr(self.lib, name).restype = ctypes.c_int
        self.lib.cuCheckpointProcessLock.argtypes = [ctypes.c_int, ctypes.POINTER(CUcheckpointLockArgs)]
        self.lib.cuCheckpointProcessCheckpoint.argtypes = [ctypes.c_int, ctypes.POINTER(CUcheckpointCheckpointArgs)]
        self.lib.cuCheckpointProcessRestore.argtypes = [ctypes.c_int, ctypes.POINTER(CUcheckpointRestoreArgs)]
        self.lib.cuCheckpointProcessUnlock.argtypes = [ctypes.c_int, ctypes.POINTER(CUcheckpointUnlockArgs)]
        self.lib.cuCheckpointProcessGetState.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        self.lib.cuCheckpointProcessGetRestoreThreadId.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]

    def _query_version(self) -> Optional[int]:
        func = getattr(self.lib, "cuDriverGetVersion", None)
        if func is None:
            return None
        value = ctypes.c_int(0)
        try:
            return value.value if func(ctypes.byref(value)) == SUCCESS and value.value > 0 else None
        except (OSError, ctypes.ArgumentError):
            return None

    def driver_version(self) -> Optional[int]:
        return self._version

    def describe(self) -> str:
        version = f", CUDA {_cuda_text(self._version)}" if self._version else ""
        return f"CUDA driver API ({self.library}{version})"

    def _call(self, pid: int, name: str, *args: Any) -> int:
        code = int(getattr(self.lib, name)(pid, *args))
        if code == NOT_INITIALIZED and not self._initialized and hasattr(self.lib, "cuInit"):
            # The checkpoint calls act on another process and normally need no cuInit here; some drivers want it.
            init = int(self.lib.cuInit(0))
            if init != SUCCESS:
                raise CudaError.failed(pid, "cuInit", init, result_name(init, self.lib), f"after {name} said NOT_INITIALIZED")
            self._initialized = True
            code = int(getattr(self.lib, name)(pid, *args))
        return code

    def _check(self, pid: int, name: str, code: int, hint: str = "") -> None:
        if code != SUCCESS:
            raise CudaError.failed(pid, name, code, result_name(code, self.lib), hint or _hint(code))

    def state(self, pid: int) -> int:
        value = ctypes.c_int(-1)
        self._check(pid, "cuCheckpointProcessGetState", self._call(pid, "cuCheckpointProcessGetState", ctypes.byref(value)))
        return value.value

    def restore_thread_id(self, pid: int) -> int:
        tid = ctypes.c_int(0)
        name = "cuCheckpointProcessGetRestoreThreadId"
        self._check(pid, name, self._call(pid, name, ctypes.byref(tid)))
        return tid.value

    def _lock(self, pid: int, timeout_ms: int) -> None:
        args = CUcheckpointLockArgs()
        args.timeoutMs = timeout_ms
        code = self._call(pid, "cuCheckpointProcessLock", ctypes.byref(args))
        hint = ""
        if code in (NOT_READY, TIMEOUT):
            hint = f"not locked within {timeout_ms} ms: CUDA work kept running in the process; it is still RUNNING"
        self._check(pid, "cuCheckpointProcessLock", code, hint)

    def _checkpoint(self, pid: int) -> None:
        args = CUcheckpointCheckpointArgs()
        self._check(pid, "cuCheckpointProcessCheckpoint", self._call(pid, "cuCheckpointProcessCheckpoint", ctypes.byref(args)))

    def _restore(self, pid: int, gpu_pairs: GpuPairs) -> None:
        args = CUcheckpointRestoreArgs()
        pairs = list(gpu_pairs)
        if pairs and self._version is not None and self._version < REMAP_CUDA_VERSION:
            moved = [f"{old} -> {new}" for old, new in pairs if uuid_bytes(old) != uuid_bytes(new)]
            if moved:
                raise CudaError(pid, "cuCheckpointProcessRestore", None,
                                f"pid {pid}: restoring onto other GPUs ({', '.join(moved)}) needs {REMAP_DRIVER}; "
                                f"this driver is CUDA {_cuda_text(self._version)}")
            pairs = []  # same GPUs: the pre-13.0 struct is all reserved
        array = (CUcheckpointGpuPair * max(len(pairs), 1))()
        for index, (old, new) in enumerate(pairs):
            array[index].oldUuid.bytes = uuid_bytes(old)
            array[index].newUuid.bytes = uuid_bytes(new)
        if pairs:
            args.gpuPairs = ctypes.cast(array, ctypes.POINTER(CUcheckpointGpuPair))
            args.gpuPairsCount = len(pairs)
        code = self._call(pid, "cuCheckpointProcessRestore", ctypes.byref(args))
        hint = ""
        if code == INVALID_VALUE and pairs:
            hint = "the GPU pairs must name every GPU the process used, each target GPU present on this node"
        self._check(pid, "cuCheckpointProcessRestore", code, hint)

    def _unlock(self, pid: int) -> None:
        args = CUcheckpointUnlockArgs()
        self._check(pid, "cuCheckpointProcessUnlock", self._call(pid, "cuCheckpointProcessUnlock", ctypes.byref(args)))


def _hint(code: int) -> str:
    return {
        INVALID_VALUE: "not a CUDA process, or no such process",
        ILLEGAL_STATE: "the process is not in the state this call needs",
        NOT_SUPPORTED: "the process uses something the CUDA checkpoint cannot save (UVM, IPC memory, MIG or MPS)",
        NOT_INITIALIZED: "the CUDA driver is not initialised",
    }.get(code, "")


def _cuda_text(version: Optional[int]) -> str:
    if not version:
        return "unknown"
    return f"{version // 1000}.{(version % 1000) // 10}"


_CLI_STATES = {"running": RUNNING, "locked": LOCKED, "checkpointed": CHECKPOINTED, "failed": FAILED}


class CliBackend(Backend):
    """The ``cuda-checkpoint`` utility (``--action lock|checkpoint|restore|unlock``, ``--get-state``, ``--get-restore-tid``)."""

    name = "cuda-checkpoint"

    def __init__(self, binary: Optional[str] = None, timeout_s: Optional[float] = None) -> None:
        wanted = binary or os.environ.get(CUDA_CHECKPOINT_ENV) or CUDA_CHECKPOINT
        found = shutil.which(wanted)
        if not found:
            raise CudaUnavailable(f"{wanted} not found on PATH")
        self.binary = found
        self.timeout_s = timeout_s
        try:
            helped = subprocess.run([found, "--help"], capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CudaUnavailable(f"{found} --help failed: {exc}") from exc
        if "--action" not in helped.stdout + helped.stderr:
            raise CudaUnavailable(f"{found} has no --action option: it needs an NVIDIA driver >= 555")

    def describe(self) -> str:
        return f"cuda-checkpoint utility ({self.binary})"

    def _run(self, pid: int, args: List[str], call: str, hint: str = "", timeout: Optional[float] = None) -> str:
        argv = [self.binary] + args + ["--pid", str(pid)]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout or self.timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            raise CudaError(pid, call, "timeout", f"pid {pid}: {call} did not finish within {exc.timeout:g} s") from exc
        except OSError as exc:
            raise CudaError(pid, call, None, f"pid {pid}: cannot run {self.binary}: {exc}") from exc
        output = (done.stdout + done.stderr).strip()
        if done.returncode != 0:
            match = re.search(r"CUDA_ERROR_[A-Z_]+", output)
            name = match.group(0) if match else f"exit status {done.returncode}"
            tail = output.splitlines()[-1] if output else "no output"
            text = f"pid {pid}: {call} failed: {name} ({tail}{'; ' + hint if hint else ''})"
            raise CudaError(pid, call, name, text)
        return done.stdout.strip()

    def state(self, pid: int) -> int:
        out = self._run(pid, ["--get-state"], "cuda-checkpoint --get-state")
        word = out.split()[0].lower() if out else ""
        if word not in _CLI_STATES:
            raise CudaError(pid, "cuda-checkpoint --get-state", None, f"pid {pid}: cuda-checkpoint --get-state printed {out!r}")
        return _CLI_STATES[word]

    def restore_thread_id(self, pid: int) -> int:
        out = self._run(pid, ["--get-restore-tid"], "cuda-checkpoint --get-restore-tid")
        match = re.search(r"-?\d+", out)
        if not match or int(match.group(0)) <= 0:
            raise CudaError(pid, "cuda-checkpoint --get-restore-tid", None, f"pid {pid}: not a CUDA process ({out or 'no output'})")
        return int(match.group(0))

    def _lock(self, pid: int, timeout_ms: int) -> None:
        args = ["--action", "lock"] + (["--timeout", str(timeout_ms)] if timeout_ms > 0 else [])
        hint = f"not locked within {timeout_ms} ms? the process stays RUNNING" if timeout_ms > 0 else ""
        budget = timeout_ms / 1000.0 + 60 if timeout_ms > 0 else None
        self._run(pid, args, "cuda-checkpoint --action lock", hint, budget)

    def _checkpoint(self, pid: int) -> None:
        self._run(pid, ["--action", "checkpoint"], "cuda-checkpoint --action checkpoint")

    def _restore(self, pid: int, gpu_pairs: GpuPairs) -> None:
        args = ["--action", "restore"]
        if gpu_pairs:
            args += ["--device-map", ",".join(f"{old}={new}" for old, new in gpu_pairs)]
        self._run(pid, args, "cuda-checkpoint --action restore")

    def _unlock(self, pid: int) -> None:
        self._run(pid, ["--action", "unlock"], "cuda-checkpoint --action unlock")


def availability(library: Optional[str] = None, binary: Optional[str] = None,
                 loader: Callable[[str], Any] = ctypes.CDLL) -> Tuple[Optional[Backend], str]:
    """The best backend on this node and what it is, or ``(None, why not)``. Never raises.

    The driver API first; the ``cuda-checkpoint`` utility when the API is not
    there (e.g. an r550..r565 driver) but the binary is on PATH.
    """
    try:
        backend: Backend = DriverBackend(library, loader)
        return backend, backend.describe()
    except CudaUnavailable as exc:
        api_reason = str(exc)
    try:
        backend = CliBackend(binary)
        return backend, f"{backend.describe()}; the driver API is not usable: {api_reason}"
    except CudaUnavailable as exc:
        return None, f"{api_reason}; and {exc}" if binary else api_reason
