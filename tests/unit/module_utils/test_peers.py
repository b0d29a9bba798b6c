"""_peers: which options can work (every problem listed), who fetches which chunk, what a node serves to a request
it cannot trust, and mutual TLS between two real sessions on loopback. Sharing between real S3 stores runs in
tests/integration/test_peer_sharing.py."""
from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _peers as pr
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _tls
from tests.support.tls_certs import Pki

CHUNK = 4096


def port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_split_address() -> None:
    assert pr.split_address("10.0.0.1:7380") == ("10.0.0.1", 7380)
    assert pr.split_address("[::1]:80") == ("::1", 80)
    assert pr.split_address("node-a:1") == ("node-a", 1)
    for bad in ("10.0.0.1", ":80", "host:0", "host:70000", "host:http"):
        with pytest.raises(pr.PeerError, match="is not host:port"):
            pr.split_address(bad)


def test_options_without_peers_share_nothing() -> None:
    assert pr.PeerConfig.from_options({}) is None
    assert pr.PeerConfig.from_options({"peers": []}) is None


def test_every_problem_is_listed() -> None:
    with pytest.raises(pr.PeerError) as err:
        pr.PeerConfig.from_options({"peers": ["127.0.0.1:1", "bad"], "peer_listen": "nope"})
    assert any("'bad' is not host:port" in r for r in err.value.reasons)
    assert any("'nope' is not host:port" in r for r in err.value.reasons)
    with pytest.raises(pr.PeerError) as err:
        pr.PeerConfig.from_options({"peers": ["127.0.0.1:1", "127.0.0.1:2"], "peer_listen": "127.0.0.1:3"})
    assert "peer_listen '127.0.0.1:3' is not one of peers" in err.value.reasons


def test_this_node_is_found_among_the_peers_or_named() -> None:
    config = pr.PeerConfig.from_options({"peers": ["192.0.2.10:7380", "127.0.0.1:7380"], "peer_insecure": True})
    assert config is not None and config.listen == "127.0.0.1:7380"
    assert config.peers == ("127.0.0.1:7380", "192.0.2.10:7380"), "sorted: the same order on every node"
    with pytest.raises(pr.PeerError) as err:
        pr.PeerConfig.from_options({"peers": ["192.0.2.10:7380", "192.0.2.11:7380"]})
    assert "none of peers is an address of this node" in str(err.value.reasons)


def test_clear_text_beyond_loopback_needs_tls_or_insecure() -> None:
    peers = ["192.0.2.10:7380", "192.0.2.11:7380"]
    with pytest.raises(_tls.TlsError, match="peer chunk server: refusing to listen on 192.0.2.10 without TLS"):
        pr.PeerConfig.from_options({"peers": peers, "peer_listen": peers[0]})
    config = pr.PeerConfig.from_options({"peers": peers, "peer_listen": peers[0], "peer_insecure": True})
    assert config is not None and config.insecure


def test_the_asking_side_refuses_clear_text_beyond_loopback_too() -> None:
    """A node listening on loopback would still fetch from the others in the clear: refused, naming them."""
    with pytest.raises(pr.PeerError, match=r"fetching chunks in the clear from peers beyond loopback is refused "
                                           r"\(192\.0\.2\.10:7380\)"):
        pr.PeerConfig.from_options({"peers": ["192.0.2.10:7380", "127.0.0.1:7380"]})
    assert pr.PeerConfig.from_options({"peers": ["127.0.0.1:7381", "127.0.0.1:7380"],
                                       "peer_listen": "127.0.0.1:7380"}) is not None


def test_peer_tls_names_missing_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMSTART_KEYS_DIR", str(tmp_path))
    with pytest.raises(pr.PeerError) as err:
        pr.PeerConfig.from_options({"peers": ["127.0.0.1:1"], "peer_tls": True})
    assert str(tmp_path / "tls" / "ca.pem") in str(err.value.reasons)


def test_chunks_are_spread_over_the_nodes() -> None:
    config = pr.PeerConfig(peers=("a:1", "b:1", "c:1"), listen="a:1")
    owners = [config.owner("pages-1.img", i) for i in range(30)]
    assert {o: owners.count(o) for o in config.peers} == {"a:1": 10, "b:1": 10, "c:1": 10}
    assert config.owner("pages-1.img", 4) == pr.PeerConfig(peers=config.peers, listen="c:1").owner("pages-1.img", 4)


def session(tmp_path: Path, blob: bytes, listen: str = "127.0.0.1:1", **extra: Any) -> pr.Session:
    path = tmp_path / "pages-1.img"
    path.write_bytes(extra.get("content", blob))  # what this node has; the digests are the manifest's (blob's)
    digests = [hashlib.sha256(blob[o:o + CHUNK]).hexdigest() for o in range(0, len(blob), CHUNK)]
    config = pr.PeerConfig(peers=tuple(sorted({listen, *extra.get("peers", ())})), listen=listen,
                           tls=extra.get("tls"), wait=2, linger=0.2)
    return pr.Session(config, "snap-1", {"pages-1.img": pr.Session.entry(str(path), len(blob), digests)}, CHUNK, {})


def test_a_request_gets_only_verified_chunks_of_listed_files(tmp_path: Path) -> None:
    blob = os.urandom(3 * CHUNK + 10)
    s = session(tmp_path, blob)
    (tmp_path / "secret").write_bytes(b"not in the manifest")
    assert s.answer("GET", "/v1/chunk?snapshot=other&path=pages-1.img&start=0")[0] == 404
    for path in ("../secret", "/etc/passwd", "secret", "pages-1.img/../secret", ""):
        assert s.answer("GET", f"/v1/chunk?snapshot=snap-1&path={path}&start=0")[0] == 404, path
    assert s.answer("GET", "/v1/chunk?snapshot=snap-1&path=pages-1.img&start=-1")[0] == 404
    assert s.answer("GET", "/v1/chunk?snapshot=snap-1&path=pages-1.img&start=0")[0] == 409, "not verified yet"
    s.mark("pages-1.img", 0)
    assert s.answer("GET", "/v1/chunk?snapshot=snap-1&path=pages-1.img&start=0") == (200, blob[:CHUNK])
    assert s.answer("GET", "/v1/chunk?snapshot=snap-1&path=pages-1.img&start=5")[0] == 409, "not a chunk start"
    s.mark_file("pages-1.img")
    assert s.answer("GET", f"/v1/chunk?snapshot=snap-1&path=pages-1.img&start={3 * CHUNK}") == (200, blob[3 * CHUNK:])
    assert s.answer("PUT", "/v1/chunk?snapshot=snap-1&path=pages-1.img&start=0")[0] == 400
    assert s.answer("POST", "/v1/done?snapshot=snap-1&peer=127.0.0.1:2")[0] == 200
    assert s.done_peers == {"127.0.0.1:2"}
    assert s.transfer["served"] == CHUNK + 10


def test_a_symlink_in_place_of_a_cached_file_is_not_followed(tmp_path: Path) -> None:
    s = session(tmp_path, os.urandom(CHUNK))
    (tmp_path / "secret").write_bytes(os.urandom(CHUNK))
    os.unlink(tmp_path / "pages-1.img")
    os.symlink(tmp_path / "secret", tmp_path / "pages-1.img")
    s.mark_file("pages-1.img")
    assert s.answer("GET", "/v1/chunk?snapshot=snap-1&path=pages-1.img&start=0")[0] == 409


def pki_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Dict[str, Any]:
    pki = Pki(tmp_path / "pki")
    pki.ca("fleet")
    pki.ca("other")
    keys = tmp_path / "keys"
    (keys / "tls").mkdir(parents=True)
    cert, key = pki.issue("node", "fleet", ips=["127.0.0.1"], both=True)
    for src, name in ((tmp_path / "pki" / "fleet.pem", "ca.pem"), (cert, "cert.pem"), (key, "key.pem")):
        (keys / "tls" / name).write_bytes(Path(src).read_bytes())
    (keys / "tls" / "key.pem").chmod(0o600)
    monkeypatch.setenv("WARMSTART_KEYS_DIR", str(keys))
    rogue = pki.issue("rogue", "other", ips=["127.0.0.1"], both=True)
    return {"tls": _tls.resolve(True), "rogue": rogue}


def test_mutual_tls_between_two_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = pki_for(tmp_path, monkeypatch)
    blob = os.urandom(2 * CHUNK)
    a, b = f"127.0.0.1:{port()}", f"127.0.0.1:{port()}"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    server = session(tmp_path / "a", blob, listen=a, peers=(b,), tls=p["tls"]).start()
    try:
        server.mark_file("pages-1.img")
        client = session(tmp_path / "b", blob, content=b"", listen=b, peers=(a,), tls=p["tls"])
        owned: List[int] = [o for o in (0, CHUNK) if not client.owned_here("pages-1.img", o)]
        assert owned, "one of the two chunks belongs to the server node"
        assert client.fetch("pages-1.img", owned[0]) == blob[owned[0]:owned[0] + CHUNK]
        # a client with a certificate of another CA is refused in the handshake, and so is plain HTTP
        rogue_tls = _tls.TlsFiles(ca=p["tls"].ca, cert=str(p["rogue"][0]), key=str(p["rogue"][1]))
        rogue = session(tmp_path / "b", blob, content=b"", listen=b, peers=(a,), tls=rogue_tls)
        assert rogue.fetch("pages-1.img", owned[0]) is None and a in rogue.dead
        plain = session(tmp_path / "b", blob, content=b"", listen=b, peers=(a,))
        assert plain.fetch("pages-1.img", owned[0]) is None
    finally:
        server.finish(ok=False)
    assert server.server is None
    assert server.transfer["peer_refused"] >= 1


def test_finish_waits_for_the_other_nodes_then_stops(tmp_path: Path) -> None:
    a, b = f"127.0.0.1:{port()}", f"127.0.0.1:{port()}"
    s = session(tmp_path, os.urandom(CHUNK), listen=a, peers=(b,)).start()
    s.answer("POST", f"/v1/done?snapshot=snap-1&peer={b}")
    s.finish(ok=True)  # b is down: telling it fails quietly; b said it is done: no linger
    assert s.server is None
    with pytest.raises(OSError):
        socket.create_connection(pr.split_address(a), timeout=1).close()


def test_a_peer_that_stalls_costs_one_wait(tmp_path: Path) -> None:
    """A peer that answers "not yet" for ever keeps the node waiting ``wait`` seconds once, then is down."""
    a, b = f"127.0.0.1:{port()}", f"127.0.0.1:{port()}"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    blob = os.urandom(4 * CHUNK)
    staller = session(tmp_path / "a", blob, listen=a, peers=(b,)).start()  # never marks a chunk verified
    try:
        client = session(tmp_path / "b", blob, content=b"", listen=b, peers=(a,))
        client.config = pr.PeerConfig(peers=client.config.peers, listen=b, wait=0.5, linger=0.2)
        theirs = [o for o in range(0, 4 * CHUNK, CHUNK) if not client.owned_here("pages-1.img", o)]
        assert len(theirs) >= 2
        t0 = time.monotonic()
        assert [client.fetch("pages-1.img", o) for o in theirs] == [None] * len(theirs)
        assert time.monotonic() - t0 < 0.5 + 0.4, "one wait, not one per chunk"
        assert a in client.dead
    finally:
        staller.finish(ok=False)


def test_a_peer_that_trickles_its_answer_costs_one_wait(tmp_path: Path) -> None:
    """A hostile peer answers 200 and then sends a byte every 0.2 s: the node gives up at ``wait`` for the chunk
    (each receive is bounded by what is left of it), takes the peer for down and asks it nothing more."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    hostile = f"127.0.0.1:{srv.getsockname()[1]}"
    stop = threading.Event()

    def trickle() -> None:
        while not stop.is_set():
            srv.settimeout(0.2)
            try:
                conn, _addr = srv.accept()
            except OSError:
                continue
            with conn:
                conn.recv(4096)
                conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {CHUNK}\r\n\r\n".encode())
                while not stop.is_set():
                    try:
                        conn.sendall(b"x")
                    except OSError:
                        break
                    time.sleep(0.2)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        mine = f"127.0.0.1:{port()}"
        blob = os.urandom(4 * CHUNK)
        client = session(tmp_path, blob, content=b"", listen=mine, peers=(hostile,))
        client.config = pr.PeerConfig(peers=client.config.peers, listen=mine, wait=1.0, linger=0.2)
        theirs = [o for o in range(0, 4 * CHUNK, CHUNK) if not client.owned_here("pages-1.img", o)]
        assert theirs
        t0 = time.monotonic()
        assert [client.fetch("pages-1.img", o) for o in theirs] == [None] * len(theirs)
        assert time.monotonic() - t0 < 1.0 + 0.8, "one wait in all, however slowly the peer sends"
        assert hostile in client.dead
    finally:
        stop.set()
        thread.join(5)
        srv.close()
