"""An S3-compatible server on loopback for the integration tests (moto's server from .venv).

The ``endpoint`` (one server per test module) and ``s3`` (one fresh bucket per test) fixtures live in
conftest.py and are built from ``serve``; SECRET is the secret key they hand every client and module, which
must never show up in any output. Shared by the integration test modules, none of which imports from another.
"""
from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from typing import Any, Dict

import pytest

from .ansible_run import REPO

SECRET = "wS-" + uuid.uuid4().hex  # must never show up in any output


def serve(port: int, **env: str) -> subprocess.Popen:
    """moto_server listening on 127.0.0.1:PORT (ENV added to its environment), once it accepts connections."""
    proc = subprocess.Popen([str(REPO / ".venv" / "bin" / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, **env))
    end = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > end:
                proc.kill()
                pytest.fail("moto_server did not start (is moto[server] in .venv? make venv)")
            time.sleep(0.1)


def keys(s3: Dict[str, Any]) -> Dict[str, int]:
    """Every object of the ``s3`` fixture's bucket: key -> size."""
    pages = s3["client"].get_paginator("list_objects_v2").paginate(Bucket=s3["bucket"])
    return {o["Key"]: o["Size"] for p in pages for o in p.get("Contents", [])}
