"""Integration tests run against this machine, prepared by the real role first.

They need root (CRIU, mounts, podman); `make test` runs them as root. The
session fixture runs warmstart.snapshot.prepare_nodes on localhost once, so
CRIU and pycriu are there whichever test runs first; test_node_prep checks
what that first run did.

The fixtures the test modules share live here; their helpers live in the
non-test modules process_lab, container_lab, s3_lab and podman_lab. No test
module imports from another one.
"""
from __future__ import annotations

import fcntl
import json
import os
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from .ansible_run import playbook, prep_vars
from .process_lab import Lab, free_port, needs_root_and_criu
from .s3_lab import SECRET, serve


@pytest.fixture(scope="session", autouse=True)
def prepared_node(node_keys_of_our_own: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """prepare_nodes on this machine with the tests' variables (``ansible_run.prep_vars``).

    Under pytest-xdist every worker is a session of its own: they take turns (a lock in the run's shared
    temporary directory); the first runs the playbook and leaves its stats there, the others take them (the
    node is prepared: running the playbook again would only cost them its time)."""
    if os.geteuid() != 0:
        pytest.fail("integration tests need root (CRIU, tmpfs mounts, privileged podman): run `make test` as root")
    assert os.environ["WARMSTART_KEYS_DIR"] == str(node_keys_of_our_own)
    shared = tmp_path_factory.getbasetemp().parent
    done = shared / "prepare_nodes.json"
    with open(shared / "prepare_nodes.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return dict(json.loads(done.read_text()))
        run = playbook("warmstart.snapshot.prepare_nodes", extra=prep_vars())
        assert run.rc == 0, run.messages() or run.stderr[-3000:]
        done.write_text(json.dumps(run.stats()))
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


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    """One moto S3 server on loopback per test module that asks for it."""
    port = free_port()
    proc = serve(port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def s3(endpoint: str, lab: Lab, monkeypatch: pytest.MonkeyPatch) -> Dict[str, Any]:
    """A fresh bucket on ``endpoint``, credentials in the environment, and the store options naming both."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "warmstart-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    import boto3  # pylint: disable=import-outside-toplevel
    client = boto3.client("s3", endpoint_url=endpoint)
    bucket = f"ws-{uuid.uuid4().hex[:10]}"
    client.create_bucket(Bucket=bucket)
    cache = lab.tmp / "cache"
    return {"url": f"s3://{bucket}/fleet", "bucket": bucket, "client": client, "cache": cache,
            "opts": {"endpoint_url": endpoint, "cache_dir": str(cache), "concurrency": 4}}
