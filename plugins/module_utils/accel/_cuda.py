# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""CUDA process checkpointing: the driver API (ctypes on libcuda.so.1) or the ``cuda-checkpoint`` binary.

NVIDIA drivers >= 570 (CUDA 12.8) export six calls that move a process's GPU
state into host memory and back; r580 (CUDA 13.0) adds GPU remapping on
restore. Per process the state machine is::

    RUNNING --lock--> LOCKED --checkpoint--> CHECKPOINTED --restore--> LOCKED --unlock--> RUNNING

A CHECKPOINTED process holds no GPU resource, so CRIU can dump it. Every
transition is checked against the process's current state before the driver
is asked, and refused with the reason (``CudaStateError``).

Use from checkpoint / restore::

    backend, reason = availability()          # None + reason when no driver / driver too old
    pids = find_cuda_pids(tree_pids, backend)
    timings = lock_and_checkpoint(pids, timeout_ms, backend)   # all or nothing: rolls back on failure
    ... CRIU dump / restore ...
    pairs = device_map(manifest_gpus, node_gpus)                # GpuMismatch when models / counts differ
    timings = restore_and_unlock(restored_pids, pairs, backend)

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
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Union

from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

LIBCUDA = "libcuda.so.1"
LIBCUDA_ENV = "WARMSTART_LIBCUDA"
CUDA_CHECKPOINT = "cuda-checkpoint"
CUDA_CHECKPOINT_ENV = "WARMSTART_CUDA_CHECKPOINT"
MIN_DRIVER = "NVIDIA driver >= 570 (CUDA 12.8)"
REMAP_DRIVER = "NVIDIA driver >= 580 (CUDA 13.0)"
REMAP_CUDA_VERSION = 13000
DEFAULT_LOCK_TIMEOUT_MS = 30000

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
