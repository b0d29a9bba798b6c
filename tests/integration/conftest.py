"""Integration tests run against this machine, prepared by the real role first.

They need root (CRIU, mounts, podman); `make test` runs them as root. The
session fixture runs warmstart.snapshot.prepare_nodes on localhost once, so
CRIU and pycriu are there whichever test runs first; test_node_prep checks
what that first run did.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from .ansible_run import playbook
from .test_process_snapshot import Lab, needs_root_and_criu


@pytest.fixture(scope="session", autouse=True)
def prepared_node() -> dict:
    if os.geteuid() != 0:
        pytest.fail("integration tests need root (CRIU, tmpfs mounts, privileged podman): run `make test` as root")
    run = playbook("warmstart.snapshot.prepare_nodes")
    assert run.rc == 0, run.messages() or run.stderr[-3000:]
    return run.stats()


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    """A per-test store, workloads root and restore root; stops everything it started."""
    needs_root_and_criu()
    world = Lab(tmp_path)
    try:
        yield world
    finally:
        world.cleanup()
