# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Nodes restoring one snapshot from an object store share its chunks (``store_options.peers``).

Each node of ``peers`` fetches its share of the chunks from the store (chunk ``i`` of file ``f`` belongs to
``peers[(crc32(f) + i) % n]``) and asks the owners for the rest, while it serves what it has verified to
them. The store then sends each chunk about once, however many nodes restore.

Invariants:

- A peer is untrusted. A chunk from a peer is used only once its SHA256 matched the manifest's digest of that
  chunk (the manifest came from the store, its signature checked when the node has a trust set); a mismatch,
  a short or failed answer, or a peer that does not answer within ``wait`` seconds sends the node to the
  store for that chunk. Only files with 64 MiB chunk digests are shared; the rest always comes from the store.
- A node never waits on a peer for its own share, so no two nodes wait on each other: every wait is bounded.
  A peer that refuses connections is taken for one not started yet during ``GRACE`` seconds, then for down
  (the store sends its share); one that fails the TLS handshake or breaks a connection is down at once, and
  so is one that kept the node waiting ``wait`` seconds for a chunk (a peer that stalls costs one wait).
- A node serves only chunks it has verified, of the one snapshot it is fetching, of files that snapshot's
  manifest lists: a request names a manifest path, which is looked up, never joined onto a directory.
- Serving stops once every peer said it is done, or nobody asked for ``linger`` seconds, and always when the
  download fails; the listening socket never outlives ``Session.finish``.
- In the clear a node listens on loopback only, unless ``insecure`` (``_tls.check_listen``); with TLS both
  sides present a certificate of the node CA (``node_prep_tls_*``) and a client checks that the peer's
  certificate names the address it dials.
"""
from __future__ import annotations

import hashlib
import http.client
import http.server
import os
import socket
import ssl
import threading
import time
import urllib.parse
import zlib
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Set, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _tls
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

WAIT = 60.0      # seconds a node waits for a peer's chunk before it reads that chunk from the store
LINGER = 10.0    # seconds a node that has everything keeps serving after the last request, at most
TIMEOUT = 30.0   # socket timeout of one request
GRACE = 5.0      # seconds from a session's start in which a refused connection means "not up yet", not "down"
_RETRY = 0.1     # seconds between asks for a chunk its owner has not verified yet


class PeerError(WarmstartError):
    """Peer options that cannot work."""


def split_address(text: str) -> Tuple[str, int]:
    """``host:port`` (``[v6]:port``) as (host, port); PeerError when it is not one."""
    host, sep, port = str(text).strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise PeerError(f"peer address {text!r} is not host:port (a port 1-65535)")
    return host, int(port)


def _is_local(host: str) -> bool:
    """Whether this node can bind ``host`` (it is one of this node's addresses)."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
        return True
    except OSError:
        return False


@dataclass(frozen=True)
class PeerConfig:
    """Who shares: every node's ``host:port`` (sorted, the same list on every node) and this node's entry."""

    peers: Tuple[str, ...]
    listen: str
    tls: Optional[_tls.TlsFiles] = None
    insecure: bool = False
    wait: float = WAIT
    linger: float = LINGER

    @classmethod
    def from_options(cls, options: Dict[str, Any]) -> Optional["PeerConfig"]:
        """The config of ``store_options`` (None without ``peers``); PeerError listing every problem."""
        given = [str(p) for p in options.get("peers") or []]
        if not given:
            return None
        problems: List[str] = []
        for text in given + ([str(options["peer_listen"])] if options.get("peer_listen") else []):
            try:
                split_address(text)
            except PeerError as exc:
                problems.append(str(exc))
        listen = str(options.get("peer_listen") or "") or next(
            (p for p in given if not problems and _is_local(split_address(p)[0])), "")
        if not problems and listen not in given:
            problems.append(f"peer_listen {listen!r} is not one of peers" if listen else
                            "none of peers is an address of this node: set peer_listen to this node's entry")
        tls: Optional[_tls.TlsFiles] = None
        try:
            tls = _tls.resolve(bool(options.get("peer_tls")))
        except _tls.TlsError as exc:
            problems += [f"peer_tls: {reason}" for reason in (exc.reasons or [str(exc)])]
        if problems:
            raise PeerError("store_options peers cannot work", reasons=problems)
        host = split_address(listen)[0]
        _tls.check_listen(host, tls, bool(options.get("peer_insecure")), what="peer chunk server")
        if tls is None and not options.get("peer_insecure"):  # the asking side too: no chunk travels in the clear
            beyond = [p for p in given if not _tls.loopback(split_address(p)[0])]
            if beyond:
                raise PeerError("store_options peers: fetching chunks in the clear from peers beyond loopback is "
                                f"refused ({', '.join(beyond)}): set peer_tls: true (the node_prep_tls_* files), or "
                                "peer_insecure: true on a network you trust")
        return cls(tuple(sorted(set(given))), listen, tls, bool(options.get("peer_insecure")),
                   float(options.get("peer_wait") or WAIT), float(options.get("peer_linger") or LINGER))

    def owner(self, rel: str, index: int) -> str:
        """The node that fetches chunk ``index`` of ``rel`` from the store."""
        return self.peers[(zlib.crc32(rel.encode()) + index) % len(self.peers)]


class _Handler(http.server.BaseHTTPRequestHandler):
    """``GET /v1/chunk?snapshot=&path=&start=`` and ``POST /v1/done?snapshot=&peer=``; nothing else."""

    server: "_Server"
    protocol_version = "HTTP/1.1"
    timeout = TIMEOUT

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        code, body = self.server.session.answer("GET", self.path)
        self._send(code, body)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        code, body = self.server.session.answer("POST", self.path)
        self._send(code, body)

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # pylint: disable=redefined-builtin
        """Quiet: requests are counted, not logged."""


class _Server(http.server.ThreadingHTTPServer):
    """One thread per connection; with TLS the handshake runs in that thread, never in the accept loop."""

    daemon_threads = True

    def __init__(self, session: "Session", address: Tuple[str, int], tls: Optional[ssl.SSLContext]) -> None:
        self.session = session
        self.tls = tls
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.tls is not None:
            request.settimeout(TIMEOUT)
            request = self.tls.wrap_socket(request, server_side=True)  # a failed handshake ends here
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that failed the handshake or hung up: counted, not printed."""
        with self.session.lock:
            self.session.transfer["peer_refused"] += 1


@dataclass
class _Entry:
    path: str           # where the verified file (or its .part) lies on this node
    size: int
    digests: List[str]  # SHA256 of each 64 MiB chunk


class Session:
    """One node's sharing of one snapshot: serves what it verified, asks the owners for what it lacks."""

    def __init__(self, config: PeerConfig, snapshot_id: str, files: Dict[str, _Entry], chunk: int,
                 transfer: Dict[str, Any]) -> None:
        self.config = config
        self.snapshot_id = snapshot_id
        self.files = files
        self.chunk = chunk
        self.transfer = transfer
        for key in ("from_peers", "served", "peer_rejected", "peer_refused"):
            transfer.setdefault(key, 0)
        self.have: Dict[str, Set[int]] = {rel: set() for rel in files}
        self.done_peers: Set[str] = set()
        self.dead: Set[str] = set()
        self.lock = threading.Lock()
        self.started = self.last_request = time.monotonic()
        self.server: Optional[_Server] = None
        self.client_ctx = self._client_context()

    @staticmethod
    def entry(path: str, size: int, digests: List[str]) -> _Entry:
        return _Entry(path, size, digests)

    # -- serving --------------------------------------------------------------------------------
    def start(self) -> "Session":
        host, port = split_address(self.config.listen)
        ctx: Optional[ssl.SSLContext] = None
        if self.config.tls is not None:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=self.config.tls.ca)
            ctx.load_cert_chain(self.config.tls.cert, self.config.tls.key)
            ctx.verify_mode = ssl.CERT_REQUIRED
        try:
            self.server = _Server(self, (host, port), ctx)
        except OSError as exc:
            raise PeerError(f"peer chunk server: cannot listen on {self.config.listen}: {exc}") from exc
        threading.Thread(target=self.server.serve_forever, name="warmstart-peers", daemon=True).start()
        return self

    def mark(self, rel: str, start: int) -> None:
        """Chunk at ``start`` of ``rel`` is verified on this node: peers may have it."""
        with self.lock:
            self.have[rel].add(start)

    def mark_file(self, rel: str) -> None:
        entry = self.files[rel]
        with self.lock:
            self.have[rel].update(range(0, entry.size, self.chunk))

    def answer(self, method: str, target: str) -> Tuple[int, bytes]:
        """(HTTP status, body) for one request; every field of it is untrusted."""
        self.last_request = time.monotonic()
        url = urllib.parse.urlsplit(target)
        query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        if query.get("snapshot") != self.snapshot_id:
            return 404, b"not serving that snapshot\n"
        if method == "POST" and url.path == "/v1/done":
            with self.lock:
                self.done_peers.add(query.get("peer", "")[:300])
            return 200, b"ok\n"
        if method != "GET" or url.path != "/v1/chunk":
            return 400, b"unknown request\n"
        rel, start = query.get("path", ""), query.get("start", "")
        entry = self.files.get(rel)
        if entry is None or not start.isdigit():
            return 404, b"no such file in this snapshot\n"
        with self.lock:
            ready = int(start) in self.have[rel]
        if not ready:
            return 409, b"not verified here yet\n"
        data = self._read(entry, int(start))
        if data is None:
            return 409, b"not readable here\n"
        with self.lock:
            self.transfer["served"] += len(data)
        return 200, data

    def _read(self, entry: _Entry, start: int) -> Optional[bytes]:
        length = min(self.chunk, entry.size - start)
        for path in (entry.path, entry.path + ".part"):  # renamed into place once whole
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                data = os.pread(fd, length, start)
            finally:
                os.close(fd)
            if len(data) == length:
                return data
        return None

    # -- asking ---------------------------------------------------------------------------------
    def _client_context(self) -> Optional[ssl.SSLContext]:
        tls = self.config.tls
        if tls is None:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca)
        ctx.load_cert_chain(tls.cert, tls.key)
        return ctx

    def _request(self, peer: str, method: str, query: Dict[str, Any], limit: int,
                 deadline: Optional[float] = None) -> Tuple[int, bytes]:
        """One request; the whole answer must arrive by ``deadline`` (monotonic; default TIMEOUT from now), however
        the peer paces its bytes - each receive waits only for what is left (socket.timeout past it)."""
        end = deadline if deadline is not None else time.monotonic() + TIMEOUT
        host, port = split_address(peer)
        left = max(0.001, min(TIMEOUT, end - time.monotonic()))
        conn: http.client.HTTPConnection
        if self.client_ctx is not None:
            conn = http.client.HTTPSConnection(host, port, timeout=left, context=self.client_ctx)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=left)
        try:
            conn.request(method, f"/v1/{'chunk' if method == 'GET' else 'done'}?{urllib.parse.urlencode(query)}")
            resp = conn.getresponse()
            body = bytearray()
            while len(body) <= limit:
                left = end - time.monotonic()
                if left <= 0:
                    raise socket.timeout(f"peer {peer}: the answer did not arrive in time")
                if conn.sock is not None:
                    conn.sock.settimeout(min(TIMEOUT, left))
                piece = resp.read1(min(1 << 20, limit + 1 - len(body)))
                if not piece:
                    break
                body += piece
            return resp.status, bytes(body)
        finally:
            conn.close()

    def owned_here(self, rel: str, start: int) -> bool:
        return self.config.owner(rel, start // self.chunk) == self.config.listen

    def fetch(self, rel: str, start: int) -> Optional[bytes]:
        """Chunk at ``start`` of ``rel`` from its owner, verified; None when the store must send it."""
        owner = self.config.owner(rel, start // self.chunk)
        entry = self.files[rel]
        length = min(self.chunk, entry.size - start)
        deadline = time.monotonic() + self.config.wait
        query = {"snapshot": self.snapshot_id, "path": rel, "start": start}
        while owner not in self.dead and time.monotonic() < deadline:
            try:
                code, body = self._request(owner, "GET", query, length, deadline)
            except ConnectionRefusedError:
                if time.monotonic() - self.started < GRACE:
                    time.sleep(_RETRY * 3)  # started later than this node, perhaps
                    continue
                self.dead.add(owner)
                return None
            except (OSError, http.client.HTTPException, ssl.SSLError):
                self.dead.add(owner)  # down, broken, or not one of us: the store sends its chunks
                return None
            if code == 200:
                if len(body) == length and hashlib.sha256(body).hexdigest() == entry.digests[start // self.chunk]:
                    with self.lock:
                        self.transfer["from_peers"] += length
                    return body
                with self.lock:
                    self.transfer["peer_rejected"] += 1
                return None
            if code != 409:
                return None
            time.sleep(_RETRY)
        self.dead.add(owner)  # kept this node waiting ``wait`` seconds: its other chunks come from the store
        return None

    # -- ending ---------------------------------------------------------------------------------
    def finish(self, ok: bool) -> None:
        """Tell the peers this node is done (when ``ok``), keep serving while they may still ask, then stop."""
        others = [p for p in self.config.peers if p != self.config.listen]
        if ok:
            for peer in others:
                if peer not in self.dead:
                    try:
                        self._request(peer, "POST", {"snapshot": self.snapshot_id, "peer": self.config.listen}, 16)
                    except (OSError, http.client.HTTPException, ssl.SSLError):
                        pass
            cap = time.monotonic() + self.config.wait
            while time.monotonic() < cap and time.monotonic() - self.last_request < self.config.linger:
                with self.lock:
                    if set(others) - self.dead <= self.done_peers:  # a peer found down will not ask
                        break
                time.sleep(_RETRY)
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
