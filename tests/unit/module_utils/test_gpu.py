"""GPU inventory through a fake NVML module and libcuda probing (_gpu)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _gpu
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._gpu import (
    cuda_checkpoint_api,
    cuda_version_string,
    gpu_inventory,
)


from tests.support.fake_nvml import FakeNvml, FakeNVMLError


def test_inventory_maps_every_gpu() -> None:
    nvml = FakeNvml()
    gpus, reason = gpu_inventory(nvml, checkpoint_api=lambda: True)
    assert reason is None
    assert gpus == [
        {
            "index": 0,
            "uuid": "GPU-aaaa",  # bytes from old bindings are decoded
            "name": "NVIDIA H100 80GB HBM3",
            "memory_total": 85520809984,
            "driver_version": "580.65.06",
            "cuda_driver_version": "13.0",
            "cuda_checkpoint_api": True,
        },
        {
            "index": 1,
            "uuid": "GPU-bbbb",
            "name": "NVIDIA H100 80GB HBM3",
            "memory_total": 85520809984,
            "driver_version": "580.65.06",
            "cuda_driver_version": "13.0",
            "cuda_checkpoint_api": True,
        },
    ]
    assert nvml.calls[0] == "nvmlInit"
    assert nvml.calls[-1] == "nvmlShutdown"


def test_inventory_reports_missing_checkpoint_api() -> None:
    gpus = gpu_inventory(FakeNvml(cuda=12040), checkpoint_api=lambda: False)[0]
    assert {g["cuda_checkpoint_api"] for g in gpus} == {False}
    assert {g["cuda_driver_version"] for g in gpus} == {"12.4"}


def test_init_failure_is_a_reason_not_an_exception() -> None:
    nvml = FakeNvml(init_error=FakeNVMLError("Driver Not Loaded"))
    gpus, reason = gpu_inventory(nvml)
    assert gpus == []
    assert reason == "NVML unavailable: Driver Not Loaded"
    assert "nvmlShutdown" not in nvml.calls  # nothing to shut down


def test_query_failure_is_a_reason_and_nvml_is_shut_down() -> None:
    nvml = FakeNvml(fail_on="nvmlDeviceGetMemoryInfo")
    gpus, reason = gpu_inventory(nvml, checkpoint_api=lambda: True)
    assert gpus == []
    assert reason is not None and "GPU is lost" in reason
    assert nvml.calls[-1] == "nvmlShutdown"


def test_no_gpu() -> None:
    gpus, reason = gpu_inventory(FakeNvml(devices=[]))
    assert gpus == []
    assert reason == "NVML found no GPU"


def test_missing_bindings(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pynvml() -> Any:
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(_gpu, "_import_nvml", no_pynvml)
    gpus, reason = gpu_inventory()
    assert gpus == []
    assert reason is not None and "nvidia-ml-py" in reason


def test_real_pynvml_never_raises() -> None:
    """With the real bindings: GPUs on a GPU node, else an empty list and a reason."""
    pytest.importorskip("pynvml")
    gpus, reason = gpu_inventory()
    if gpus:
        assert reason is None
        assert all(g["uuid"].startswith("GPU-") and g["memory_total"] > 0 for g in gpus)
    else:
        assert reason


@pytest.mark.parametrize(("raw", "text"), [(13000, "13.0"), (12080, "12.8"), (12040, "12.4"), (11020, "11.2")])
def test_cuda_version_string(raw: int, text: str) -> None:
    assert cuda_version_string(raw) == text


def test_checkpoint_api_probe_with_fake_loaders() -> None:
    def unloadable(name: str) -> Any:
        raise OSError(f"{name}: cannot open shared object file")

    assert cuda_checkpoint_api(loader=unloadable) is False
    assert cuda_checkpoint_api(loader=lambda name: SimpleNamespace(cuCheckpointProcessLock=object())) is True
    assert cuda_checkpoint_api(loader=lambda name: SimpleNamespace(cuInit=object())) is False


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build fake libcuda")
@pytest.mark.parametrize(("source", "expected"), [
    ("int cuInit(unsigned f) { return 0; }\n"
     "int cuCheckpointProcessLock(int pid, void *args) { return 0; }\n", True),
    ("int cuInit(unsigned f) { return 0; }\n", False),
])
def test_checkpoint_api_probe_with_real_shared_library(tmp_path: Path, source: str, expected: bool) -> None:
    (tmp_path / "fake.c").write_text(source)
    lib = tmp_path / "libcuda.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "fake.c")], check=True)
    assert cuda_checkpoint_api(str(lib)) is expected


def test_checkpoint_api_without_libcuda() -> None:
    assert cuda_checkpoint_api("/nonexistent/libcuda.so.1") is False
