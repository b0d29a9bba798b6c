"""An S3-compatible server on loopback for the integration tests (moto's server from .venv).

The ``endpoint`` (one server per test module) and ``s3`` (one fresh bucket per test) fixtures live in
conftest.py and are built from ``serve``; ``Gate`` puts an endpoint that is down for a while in front of one.
SECRET is the secret key they hand every client and module, which must never show up in any output. Shared by
the integration test modules, none of which imports from another.
"""
from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
import uuid
from typing import Any, Dict, List, Optional

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


class Gate:
    """A TCP forwarder on loopback in front of the server on ``target`` that can be shut for a while: shut, nothing
    listens on its ``port`` (connection refused, as an endpoint that is down) and open connections are cut;
    opened again, it forwards on the same port. The server and its objects are untouched throughout."""

    def __init__(self, target: int) -> None:
        self.target = target
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._srv: Optional[socket.socket] = None
        self._live: List[socket.socket] = []
        self._lock = threading.Lock()
        self.open()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def open(self) -> None:
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", self.port))
        srv.listen(64)
        self._srv = srv
        threading.Thread(target=self._serve, args=(srv,), daemon=True).start()

    def shut(self) -> None:
        srv, self._srv = self._srv, None
        if srv is not None:
            srv.shutdown(socket.SHUT_RDWR)  # wakes its accept (Linux)
            srv.close()
        with self._lock:
            live, self._live = self._live, []
        for sock in live:
            _close(sock)

    def _serve(self, srv: socket.socket) -> None:
        while True:
            try:
                conn = srv.accept()[0]
            except OSError:
                return
            try:
                up = socket.create_connection(("127.0.0.1", self.target), timeout=10)
            except OSError:
                conn.close()
                continue
            with self._lock:
                self._live += [conn, up]
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _pump(src: socket.socket, dest: socket.socket) -> None:
    try:
        while True:
            data = src.recv(1 << 16)
            if not data:
                break
            dest.sendall(data)
    except OSError:
        pass
    finally:
        _close(src)
        _close(dest)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
