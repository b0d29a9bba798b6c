"""GPU containers into placeholders on the containerd runtime: a private containerd, real CRIU, the fake libcuda.

As test_container_gpu.py for podman: the source runs container_lab.APP with two workers (three CUDA processes,
``FAKE_CUDA_ADOPT``) under this node's init; the modules (``runtime: containerd``) load the fake through
``$WARMSTART_LIBCUDA``. The checkpoint locks and checkpoints all three, dumps, and gives them back; the restore
into an inert placeholder restores all three, then unlocks all three, then writes ``restore-complete``, and the
copy answers from the placeholder with the source's memory.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from tests.support.fake_cuda import compile_fake

from .containerd_lab import Daemon, Lab, ask

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    daemon = Daemon().start()
    try:
        world = Lab(tmp_path_factory.mktemp("containerd-gpu"), daemon)
        try:
            yield world
        finally:
            world.cleanup()
    finally:
        daemon.stop()


def changes(log: Path) -> List[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    calls = [dict(item.split("=", 1) for item in line.split()) for line in lines]
    return [f"{c['call']}:{c['pid']}" for c in calls if c["call"] in ("lock", "checkpoint", "restore", "unlock")]


def test_a_gpu_container_restores_into_a_containerd_placeholder(lab: Lab, tmp_path: Path) -> None:
    lib = compile_fake(tmp_path / "lib" / "libcuda.so.1")
    state, log = tmp_path / "cuda.state", tmp_path / "cuda.log"
    state.write_text("")
    env: Dict[str, Any] = {"WARMSTART_LIBCUDA": str(lib), "FAKE_CUDA_STATE": str(state), "FAKE_CUDA_LOG": str(log),
                           "FAKE_CUDA_ADOPT": "python3 /app/app.py=running"}
    src = lab.source("gsrc", APP_WORKERS="2", APP_MIB="8")
    before = ask(lab.pid1(src))
    task = dict(lab.checkpoint("checkpoint", container=src, cuda="required"), environment=env)
    snap = lab.play([task], "ctrd-gpu-ck")["checkpoint"]["snapshot"]
    order = snap["cuda"]["pids"]
    assert len(order) == 3, snap["cuda"]
    assert changes(log) == ([f"lock:{p}" for p in order] + [f"checkpoint:{p}" for p in order]
                            + [f"restore:{p}" for p in order] + [f"unlock:{p}" for p in order])

    ph = lab.placeholder("gph")
    log.unlink()
    task = dict(lab.restore("restore", snapshot=snap["id"], cuda="required", into={"container": ph}),
                environment=dict(env, FAKE_CUDA_ADOPT="python3 /app/app.py=checkpointed"))
    dest = lab.play([task], "ctrd-gpu-rs")["restore"]["restore"]["destinations"][0]
    assert dest["result"] == "succeeded", dest
    copies = dest["cuda"]["pids"]
    assert len(copies) == 3 and not set(copies) & set(order)
    assert changes(log) == [f"restore:{p}" for p in copies] + [f"unlock:{p}" for p in copies]
    assert f"host_pid={dest['pid']}" in (lab.control("gph") / "restore-complete").read_text()
    answer = ask(lab.pid1(ph))
    assert answer["token"] == before["token"] and answer["sha256"] == before["digest"]
    assert answer["workers"]["alive"] == 2
