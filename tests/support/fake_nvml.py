"""The subset of pynvml that _gpu uses, as a test double (two H100s by default)."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Dict, List, Optional


class FakeNVMLError(Exception):
    pass


class FakeNvml:
    """The subset of pynvml that _gpu uses, with two H100s by default."""

    def __init__(
        self,
        devices: Optional[List[Dict[str, Any]]] = None,
        init_error: Optional[Exception] = None,
        fail_on: Optional[str] = None,
        cuda: int = 13000,
    ) -> None:
        self.devices = devices if devices is not None else [
            {"uuid": b"GPU-aaaa", "name": b"NVIDIA H100 80GB HBM3", "total": 85520809984},
            {"uuid": "GPU-bbbb", "name": "NVIDIA H100 80GB HBM3", "total": 85520809984},
        ]
        self.init_error = init_error
        self.fail_on = fail_on
        self.cuda = cuda
        self.calls: List[str] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.fail_on == name:
            raise FakeNVMLError(f"{name} failed: GPU is lost")

    def nvmlInit(self) -> None:
        self._call("nvmlInit")
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlSystemGetDriverVersion(self) -> str:
        self._call("nvmlSystemGetDriverVersion")
        return "580.65.06"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._call("nvmlSystemGetCudaDriverVersion_v2")
        return self.cuda

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._call("nvmlDeviceGetHandleByIndex")
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> Any:
        self._call("nvmlDeviceGetUUID")
        return self.devices[handle]["uuid"]

    def nvmlDeviceGetName(self, handle: int) -> Any:
        self._call("nvmlDeviceGetName")
        return self.devices[handle]["name"]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        self._call("nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(total=self.devices[handle]["total"], free=1, used=2)
