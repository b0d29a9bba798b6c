"""The GPU end-to-end device script (tests/device/e2e.sh), run here without a GPU (``--dry-run``).

The device machine is lent only to some sessions and has no registry: its script must already work when it
gets there. The dry run assembles what travels with the checkout (the CRIU bundle with cuda_plugin.so,
protobuf for pycriu, ansible-core for the module files) and checks it stays under 64 MiB, then runs every step
on the CPU with real CRIU - the inference server (a Llama decoder from its config, PyTorch and transformers
from the demo's venv) started cold through the workload module file, checkpointed and restored eagerly and
lazily through the module files with the carried ansible-core, dumped and restored by ``criu`` itself beside
it, and scaled over two memory sizes - and proves the same answer after every restore. Only the CUDA parts
(and CRIU's CUDA plugin) wait for a GPU; tests/device/README.md records that run.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from .ansible_run import REPO
from .process_lab import needs_root_and_criu

DEMO_PYTHON = Path("/opt/warmstart/demo-venv/bin/python")


@pytest.fixture(scope="module")
def torch_python() -> str:
    """The demo's venv (PyTorch CPU, transformers), built by demo/setup.sh when missing or stale."""
    done = subprocess.run(["bash", str(REPO / "demo" / "setup.sh")], capture_output=True, text=True, timeout=1800,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return str(DEMO_PYTHON)


def test_the_device_script_runs_every_step_without_a_gpu(tmp_path: Path, torch_python: str) -> None:
    needs_root_and_criu()
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(REPO / "tests" / "device" / "e2e.sh"), "--out", str(out), "--dry-run",
                           "--bundle", str(tmp_path / "bundle")],
                          cwd=REPO, env={"PYTHON": torch_python, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                          capture_output=True, text=True, timeout=480, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    report = json.loads((out / "e2e.json").read_text())
    assert report["ok"] is True
    status = {r["check"]: r["status"] for r in report["results"]}
    for check in ("bundle under 64 MiB", "criu check", "server answers the same twice", "checkpoint (accelerator: off)",
                  "eager restore, same answer", "criu dump", "criu restore", "criu's own restore, same answer",
                  "lazy restore, same answer", "scaling 16 MiB", "scaling 64 MiB"):
        assert status.get(check) == "PASS", (check, status)
    data = report["data"]
    assert data["bundle"]["bytes"] < 64 << 20 and set(data["bundle"]["parts"]) == {"criu", "protobuf", "ansible"}
    assert (tmp_path / "bundle" / "criu" / "lib" / "criu" / "cuda_plugin.so").is_file()
    assert data["server"]["cold_start_s"] > 0 and data["restore_eager"]["first_answer_s"] > 0
    assert data["raw_criu"]["restore_s"] > 0 and [r["size"] for r in data["scaling"]] == [16, 64]
    assert "| cold start to first answer" in (out / "e2e.md").read_text()
    assert "SUMMARY: PASS" in done.stdout
