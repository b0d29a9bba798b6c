"""The GPU device check (tests/device/run.sh) as a test: runs where an NVIDIA driver is, skipped elsewhere."""
from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
from pathlib import Path
from typing import Optional

import pytest

REPO = Path(__file__).resolve().parents[2]


def _no_gpu() -> Optional[str]:
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi not found"
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "libcuda.so.1 not found"
    return None


NO_GPU = _no_gpu()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(NO_GPU is not None, reason=f"no NVIDIA GPU here ({NO_GPU}): run tests/device/run.sh on a GPU machine"),
]


@pytest.fixture(scope="module", autouse=True)
def prepared_node() -> dict:
    """The CUDA check needs neither root nor CRIU: do not prepare the node (overrides the conftest fixture)."""
    return {}


def test_cuda_checkpoint_device_script(tmp_path: Path) -> None:
    out = tmp_path / "device.json"
    done = subprocess.run(["bash", str(REPO / "tests" / "device" / "run.sh"), "--json", str(out)],
                          capture_output=True, text=True, timeout=320, check=False)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-6000:]
    assert "SUMMARY: PASS" in done.stdout
    results = json.loads(out.read_text())
    assert results["ok"] and {r["check"] for r in results["results"] if r["status"] == "PASS"} >= {
        "lock + checkpoint", "restore + unlock", "tensors intact"}
