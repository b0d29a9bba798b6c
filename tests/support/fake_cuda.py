"""A fake libcuda.so.1 for tests: built here from fake_libcuda.c, with its state file and call log.

The fake keeps per-PID state in a file and logs every call with its decoded
arguments and the raw 64 bytes of each argument struct, so tests see what the
C side of the ABI receives. gcc is required: without it the tests fail.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cudaabi
from tests.support.fake_build import compile_library

FAKE_SOURCE = Path(__file__).resolve().parent / "fake_libcuda.c"


def hexid(uuid: str) -> str:
    return _cudaabi.uuid_bytes(uuid).hex()


def compile_fake(out: Path, *defines: str) -> Path:
    """Build the fake libcuda into ``out`` (``-D`` ``defines``: FAKE_WITHOUT_CHECKPOINT_API, ...)."""
    return compile_library(FAKE_SOURCE, out, *defines)


class Fake:
    """The fake driver's state file and call log."""

    def __init__(self, root: Path, lib: Path) -> None:
        self.state_file = root / "cuda.state"
        self.log_file = root / "cuda.log"
        self.lib = lib
        self.state_file.write_text("")

    def add(self, pid: int, state: str = "running", busy: bool = False, gpus: Optional[List[str]] = None) -> None:
        line = f"{pid} {state}" + (" busy" if busy else "")
        if gpus:
            line += " gpus=" + ",".join(hexid(g) for g in gpus)
        with self.state_file.open("a") as handle:
            handle.write(line + "\n")

    def states(self) -> Dict[int, str]:
        out = {}
        for line in self.state_file.read_text().splitlines():
            pid, state = line.split()[:2]
            out[int(pid)] = state
        return out

    def calls(self, *names: str) -> List[Dict[str, str]]:
        if not self.log_file.exists():
            return []
        out = []
        for line in self.log_file.read_text().splitlines():
            fields = dict(item.split("=", 1) for item in line.split())
            if not names or fields["call"] in names:
                out.append(fields)
        return out

    def clear_log(self) -> None:
        if self.log_file.exists():
            self.log_file.unlink()


# What a test's environment may carry over that would steer the fake or the engine elsewhere.
FAKE_ENV = ("FAKE_CUDA_FAIL", "FAKE_CUDA_DRIVER_VERSION", "FAKE_CUDA_REQUIRE_INIT", "FAKE_CUDA_INIT_RESULT",
            "WARMSTART_LIBCUDA", "WARMSTART_CUDA_CHECKPOINT")


def install(root: Path, lib: Path, monkeypatch: pytest.MonkeyPatch, *unset: str) -> Fake:
    """A fresh fake driver world under ``root`` for ``lib``, its state and log in the environment; FAKE_ENV and
    ``unset`` removed from it."""
    world = Fake(root, lib)
    monkeypatch.setenv("FAKE_CUDA_STATE", str(world.state_file))
    monkeypatch.setenv("FAKE_CUDA_LOG", str(world.log_file))
    for name in FAKE_ENV + unset:
        monkeypatch.delenv(name, raising=False)
    return world


def task_environment(root: Path, adopt: Path) -> Tuple[Dict[str, Any], Path, Path]:
    """For tests that run the modules through playbooks: the fake built under ``root`` (fakecuda/libcuda.so.1)
    with a fresh world there (empty state file, call log), and the task ``environment`` that points the modules
    at it, every process running the script ``adopt`` adopted as a RUNNING CUDA process: (env, state, log)."""
    world = Fake(root, compile_fake(root / "fakecuda" / "libcuda.so.1"))
    env: Dict[str, Any] = {"WARMSTART_LIBCUDA": str(world.lib), "FAKE_CUDA_STATE": str(world.state_file),
                           "FAKE_CUDA_LOG": str(world.log_file), "FAKE_CUDA_ADOPT": f"{adopt}=running"}
    return env, world.state_file, world.log_file
