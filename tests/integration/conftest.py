"""Integration tests run against this machine, prepared by the real role first.

They need root (CRIU, mounts, podman); `make test` runs them as root. The
session fixture runs warmstart.snapshot.prepare_nodes on localhost once, so
CRIU and pycriu are there whichever test runs first; test_node_prep checks
what that first run did.
"""
from __future__ import annotations

import os

import pytest

from .ansible_run import playbook


@pytest.fixture(scope="session", autouse=True)
def prepared_node() -> dict:
    if os.geteuid() != 0:
        pytest.fail("integration tests need root (CRIU, tmpfs mounts, privileged podman): run `make test` as root")
    run = playbook("warmstart.snapshot.prepare_nodes")
    assert run.rc == 0, run.messages() or run.stderr[-3000:]
    return run.stats()
