# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The page server on the node that holds a snapshot's images, serving them to one lazy restore elsewhere.

``serve`` starts a detached listener that hands the first real client to
``criu page-server --lazy-pages --ps-socket``; the lazy-pages daemon of the
restoring node (``_lazy.start(page_server=...)``) is that client. CRIU's page
server needs large pipes (``raise_pipe_limit``); with TLS, a client CRIU
refused is named by ``tls_refusal`` and the listener waits for the next.
"""
from __future__ import annotations

import os
import select
import socket
import subprocess
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._lazy import LazyError

# CRIU's page server (serving images) tees up to PIPE_MAX_SIZE pages per request:
# 8 pages' worth of 40-byte pipe buffers = 819 pages. Without CAP_SYS_RESOURCE
# fs.pipe-max-size must allow that.
PIPE_BYTES_NEEDED = 819 * 4096
PIPE_MAX_SIZE = "/proc/sys/fs/pipe-max-size"


def pipe_limit_ok() -> Tuple[bool, int]:
    try:
        with open(PIPE_MAX_SIZE, "r", encoding="ascii") as handle:
            have = int(handle.read())
    except (OSError, ValueError):
        return True, 0
    return have >= PIPE_BYTES_NEEDED, have


def raise_pipe_limit() -> None:
    ok, have = pipe_limit_ok()
    if ok:
        return
    try:
        fd = safefs.open_file(PIPE_MAX_SIZE, os.O_WRONLY)
        try:
            os.write(fd, str(1 << 22).encode("ascii"))
        finally:
            os.close(fd)
    except OSError as exc:
        raise LazyError(f"fs.pipe-max-size is {have} bytes and cannot be raised to 4 MiB ({exc}); CRIU's page server "
                        f"needs {PIPE_BYTES_NEEDED} bytes per request pipe") from None


def _listen(address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    srv = socket.socket(family, socket.SOCK_STREAM)
    try:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((address, port))
        srv.listen(16)
    except OSError as exc:
        srv.close()
        raise LazyError(f"page server: cannot listen on {address}:{port}: {exc.strerror or exc} "
                        "(in use, or not an address of this node)") from None
    return srv


def _first_client(srv: socket.socket, deadline: float, note: Any) -> Optional[socket.socket]:
    """The first connection that sends a request; connections closed before sending one (port probes,
    health checks) are noted and dropped, and the listener goes on. None when ``deadline`` passes first."""
    pending: Dict[socket.socket, Any] = {}
    while time.monotonic() < deadline:
        ready, _w, _x = select.select([srv, *pending], [], [], min(1.0, max(0.0, deadline - time.monotonic())))
        for sock in ready:
            if sock is srv:
                conn, peer = srv.accept()
                pending[conn] = peer
                continue
            try:
                data = sock.recv(1, socket.MSG_PEEK)
            except OSError:
                data = b""
            peer = pending.pop(sock)
            if data:
                for other in pending:
                    other.close()
                note(f"serving {peer[0]}:{peer[1]}")
                return sock
            note(f"ignored a connection from {peer[0]}:{peer[1]}: closed without a page request (a port probe?)")
            sock.close()
    for other in pending:
        other.close()
    return None


def serve(criu: str, images: str, log_dir: str, address: str, port: int, timeout: float,
          tls_args: Sequence[str] = ()) -> Dict[str, Any]:
    """Serve ``images`` to one lazy restore on address:port, for at most ``timeout`` seconds.

    A detached listener accepts connections; one that closes without sending a page request (a port probe,
    a health check) is ignored and noted in ``page-server-<port>.connections.log``; the first that sends one is
    handed to ``criu page-server --lazy-pages --ps-socket``, which serves that restore; then all exits.
    With ``tls_args`` (CRIU's TLS options) a client that fails the TLS handshake or certificate check is
    refused by CRIU before any page is sent; that is noted with CRIU's reason and the listener goes on.
    """
    raise_pipe_limit()
    srv = _listen(address, port)
    log = os.path.join(log_dir, f"page-server-{port}.log")
    notes = os.path.join(log_dir, f"page-server-{port}.connections.log")
    deadline = time.monotonic() + timeout
    rfd, wfd = os.pipe()

    def announce() -> None:  # pragma: no cover - runs in the detached supervisor
        os.write(wfd, f"pid {os.getpid()}\n".encode())
        os.close(wfd)
        _serve_one(srv, [criu, "page-server", "--lazy-pages", "-D", images, "-o", log, "-v4", *tls_args], notes,
                   deadline, timeout)

    proc.detach(announce, keep=(wfd, srv.fileno()))
    os.close(wfd)
    srv.close()
    said = os.read(rfd, 256).decode("utf-8", "replace").split()
    os.close(rfd)
    if not said or said[0] != "pid":
        raise LazyError(f"page server did not start: {' '.join(said[1:]) or 'no answer'}")
    return {"pid": int(said[1]), "supervisor_pid": int(said[1]), "address": address, "port": port, "log": log,
            "connections_log": notes, "timeout": timeout}


def tls_refusal(log: str) -> str:
    """CRIU's TLS error in a page server's ``log`` (handshake or certificate check failed), else ""."""
    try:
        with open(log, "r", encoding="utf-8", errors="replace") as handle:
            errs = [ln.split("): ", 1)[-1].strip() for ln in handle if "Error (" in ln and "tls: " in ln]
    except OSError:
        return ""
    return " | ".join(dict.fromkeys(errs))


def _serve_one(srv: socket.socket, argv: List[str], notes: str, deadline: float,
               timeout: float) -> None:  # pragma: no cover - runs in the detached supervisor
    """The first real client handed to ``argv`` (criu page-server) as its ``--ps-socket``; killed at ``deadline``.

    A client CRIU refused in TLS (``tls_refusal``) is noted and the next one awaited; any other end is final.
    """
    def note(text: str) -> None:
        fd = safefs.open_file(notes, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        with os.fdopen(fd, "a", encoding="utf-8") as handle:
            handle.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n")

    log = argv[argv.index("-o") + 1]
    while True:
        client = _first_client(srv, deadline, note)
        if client is None:
            srv.close()
            note(f"no restore connected within {timeout:g} s; exiting")
            return
        peer = client.getpeername()
        server = subprocess.Popen(argv + ["--ps-socket", str(client.fileno())], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(client.fileno(),))
        client.close()
        try:
            server.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
            note(f"killed the page server after {timeout:g} s")
            break
        refused = tls_refusal(log) if server.returncode else ""
        if not refused:
            note(f"the page server exited with {server.returncode}")
            break
        note(f"refused {peer[0]}:{peer[1]}: TLS failed ({refused}); no page was sent; waiting for the restore")
    srv.close()
