"""The page server over CRIU's mutual TLS, with real CRIU: a lazy restore with the right certificates gets all
its memory; a client without a certificate of the CA is refused in the handshake (noted, no page sent) and a
restore that presents one fails cleanly with CRIU's reason, leaving nothing running; serving in the clear
beyond loopback is refused unless ``insecure: true``.

The page server listens on 0.0.0.0 (not loopback: TLS or ``insecure`` needed) and the restore connects to
127.0.0.1, the address the page server's certificate names, so no test depends on this machine's addresses.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import stat
import time
from pathlib import Path
from typing import Any, Dict, Optional

import pytest

from tests.support.tls_certs import Pki

from .ansible_run import playbook
from .process_lab import Lab, checkpointed, free_port, gone, port_open, query

pytestmark = pytest.mark.integration


@pytest.fixture(name="pki")
def fixture_pki(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> Dict[str, Any]:
    """CA "fleet" (a page-server certificate for 127.0.0.1, a restoring node's certificate in this test's keys
    dir under tls/, as node_prep lays it out) and CA "other" (a rogue client's certificate)."""
    pki = Pki(lab.tmp / "pki")
    fleet = pki.ca("fleet")
    other = pki.ca("other")
    server_cert, server_key = pki.issue("holder", "fleet", ips=["127.0.0.1"], dns=["localhost"], server=True)
    keys = lab.tmp / "keys"
    node = Pki(keys / "tls")
    node._cas = pki._cas  # pylint: disable=protected-access  # the same CA issues the restoring node's certificate
    node.issue("cert", "fleet", dns=["restorer"])[1].rename(keys / "tls" / "key.pem")
    (keys / "tls" / "ca.pem").write_bytes(fleet.read_bytes())
    rogue_cert, rogue_key = pki.issue("rogue", "other", dns=["restorer"])
    monkeypatch.setenv("WARMSTART_KEYS_DIR", str(keys))  # the modules' default keys dir, this test's own
    return {"ca": str(fleet), "other_ca": str(other), "server": {"tls": True, "tls_ca": str(fleet),
            "tls_cert": str(server_cert), "tls_key": str(server_key)},
            "rogue": (str(rogue_cert), str(rogue_key)), "keys": keys}


def serve(lab: Lab, snap_id: str, port: int, expect_fail: bool = False, **args: Any) -> Dict[str, Any]:
    task: Dict[str, Any] = {"name": "serve", "warmstart.snapshot.page_server": {
        "store": str(lab.store), "snapshot": snap_id, "address": "0.0.0.0", "port": port, "timeout": 120,
        "log_dir": str(lab.tmp / "ps"), **args}}
    if expect_fail:
        task["ignore_errors"] = True
    return lab.play([task])["serve"]


def tls_client(port: int, ca: str, cert: Optional[str] = None, key: Optional[str] = None) -> bytes:
    """Connect as a TLS client (with ``cert``, or none), send a request's worth of bytes; what came back."""
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
                conn.sendall(b"\0" * 64)
                return conn.recv(4096)
        except (ssl.SSLError, OSError):
            return b""


def wait_notes(path: str, count: int, timeout: float = 15) -> str:
    end = time.monotonic() + timeout
    text = ""
    while time.monotonic() < end:
        text = Path(path).read_text() if Path(path).exists() else ""
        if text.count("refused 127.0.0.1") >= count:
            return text
        time.sleep(0.1)
    pytest.fail(f"the page server did not note {count} refused client(s): {text}")


def stop(pid: int) -> None:
    if not gone(pid, 0):
        os.kill(pid, signal.SIGKILL)
        gone(pid, 5)


def test_tls_lazy_restore_after_refused_clients(lab: Lab, pki: Dict[str, Any]) -> None:
    """Clients without a certificate of the CA are refused in the handshake and noted; the page server then
    serves its restore (TLS files from the node's keys dir) and the memory is the source's."""
    snap = checkpointed(lab, "tls1", 64)
    port = free_port()
    served = serve(lab, snap["id"], port, **pki["server"])["page_server"]
    assert served["tls"] is True and served["address"] == "0.0.0.0"
    assert tls_client(port, pki["ca"]) == b"", "a client without a certificate got an answer"
    wait_notes(served["connections_log"], 1)
    assert tls_client(port, pki["ca"], *pki["rogue"]) == b"", "a client of another CA got an answer"
    notes = wait_notes(served["connections_log"], 2)
    assert "TLS failed (tls: TLS handshake failed: Certificate is required.)" in notes, notes
    assert "The certificate is NOT trusted" in notes and notes.count("no page was sent") == 2, notes
    assert not gone(served["pid"], 0.5), "a refused client ended the page server"
    res = lab.play([lab.restore("restore", snapshot=snap["id"], page_server=f"127.0.0.1:{port}", tls=True,
                                lazy_wait=True)])
    out = res["restore"]["restore"]
    assert out["lazy"]["used"] is True and out["lazy"]["complete_after"] > 0, out["lazy"]
    got = query(snap["port"])
    assert got["sha256"] == got["digest_at_start"], "restored memory differs from the source's"
    assert "TLS handshake completed" in (Path(out["work_dir"]) / "lazy-pages.log").read_text()
    assert "TLS handshake completed" in Path(served["log"]).read_text()
    assert gone(served["pid"], 15), "the page server did not exit after serving its restore"


def test_restore_with_the_wrong_certificate_fails_cleanly(lab: Lab, pki: Dict[str, Any]) -> None:
    """A restore presenting a certificate of another CA, or none (plain TCP), is refused by the page server's
    CRIU before a page is sent; the restore fails with the reason and nothing of it runs."""
    snap = checkpointed(lab, "tls2", 32)
    port = free_port()
    served = serve(lab, snap["id"], port, **pki["server"])["page_server"]
    try:
        rogue_cert, rogue_key = pki["rogue"]
        res = lab.play([
            lab.restore("restore, other CA", snapshot=snap["id"], page_server=f"127.0.0.1:{port}", tls=True,
                        tls_ca=pki["other_ca"], tls_cert=rogue_cert, tls_key=rogue_key, expect_fail=True),
            lab.restore("restore, no TLS", snapshot=snap["id"], page_server=f"127.0.0.1:{port}", expect_fail=True),
        ])
        other = res["restore, other CA"]
        assert other["failed"] and f"page server 127.0.0.1:{port}" in other["msg"], other["msg"]
        assert "tls: " in other["msg"] and "certificate" in other["msg"].lower(), other["msg"]
        plain = res["restore, no TLS"]
        assert plain["failed"] and f"page server 127.0.0.1:{port}" in plain["msg"], plain["msg"]
        notes = wait_notes(served["connections_log"], 2)
        assert notes.count("no page was sent") == 2, notes
        assert "An unexpected TLS packet was received" in notes, notes
        assert not lab.ours(), "a restored copy is running"
        assert (lab.wdir("tls2") / "control" / "restore-failed").exists()
        assert not gone(served["pid"], 0.5), "the page server stopped waiting for its restore"
    finally:
        stop(served["pid"])


def test_plain_tcp_beyond_loopback_needs_insecure(lab: Lab, pki: Dict[str, Any]) -> None:
    """Without TLS, 0.0.0.0 is refused before anything listens; with insecure: true it serves as before."""
    snap = checkpointed(lab, "tls3", 32)
    port = free_port()
    refused = serve(lab, snap["id"], port, expect_fail=True)
    assert refused["failed"] and refused["msg"].startswith("page server: refusing to listen on 0.0.0.0 without TLS")
    assert "insecure: true" in refused["msg"], refused["msg"]
    assert not port_open(port) and not (lab.tmp / "ps").exists(), "a refused page server started something"
    bad_key = serve(lab, snap["id"], port, expect_fail=True, tls=True, tls_ca=pki["ca"],
                    tls_cert=pki["server"]["tls_cert"], tls_key=str(pki["keys"] / "tls" / "ca.pem"))
    assert bad_key["msg"].startswith("TLS for the page server cannot be set up: tls_key "), bad_key["msg"]
    assert "ca.pem is not a PEM private key" in bad_key["msg"] and not port_open(port)
    served = serve(lab, snap["id"], port, insecure=True)["page_server"]
    assert served["tls"] is False
    # the asking side too: a restore does not read pages in the clear from beyond loopback unless told so
    beyond = lab.play([lab.restore("beyond", snapshot=snap["id"], page_server=f"192.0.2.1:{port}",
                                   expect_fail=True)])["beyond"]
    assert beyond["failed"] and "reading pages in the clear from beyond loopback is refused" in beyond["msg"], beyond
    assert "criu_log_tail" not in beyond and lab.ours() == []
    out = lab.play([lab.restore("restore", snapshot=snap["id"], page_server=f"127.0.0.1:{port}",
                                lazy_wait=True)])["restore"]["restore"]
    assert out["lazy"]["used"] is True and out["lazy"]["complete_after"] > 0
    got = query(snap["port"])
    assert got["sha256"] == got["digest_at_start"]
    assert gone(served["pid"], 15)


def test_node_prep_installs_the_tls_files(tmp_path: Path) -> None:
    """The role's tls.yml writes <keys>/tls/{ca,cert,key}.pem (dir 0700, key 0600) from PEM text, idempotently,
    never showing the key; a partial setup is refused."""
    pki = Pki(tmp_path / "pki")
    ca = pki.ca("fleet")
    cert, key = pki.issue("node", "fleet", ips=["127.0.0.1"], server=True)
    keys = tmp_path / "keys"
    tls = {"node_prep_keys_dir": str(keys), "node_prep_tls_ca": ca.read_text(),
           "node_prep_tls_cert": cert.read_text(), "node_prep_tls_key": key.read_text()}
    book = tmp_path / "tls.yml"
    include = {"name": "warmstart.snapshot.node_prep", "tasks_from": "tls.yml"}
    book.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False,
                                 "tasks": [{"name": "tls files", "ansible.builtin.include_role": include}]}]))
    first = playbook(str(book), extra=tls)
    assert first.rc == 0, first.messages() or first.stderr[-2000:]
    assert first.stats()["changed"] == 3
    secret = key.read_text().splitlines()[1]
    assert secret not in first.stdout + first.stderr, "the TLS key is in Ansible's output"
    for name, want, mode in (("ca.pem", ca, 0o644), ("cert.pem", cert, 0o644), ("key.pem", key, 0o600)):
        path = keys / "tls" / name
        assert path.read_text() == want.read_text() and stat.S_IMODE(path.stat().st_mode) == mode, name
    assert stat.S_IMODE((keys / "tls").stat().st_mode) == 0o700
    again = playbook(str(book), extra=tls)
    assert again.rc == 0 and again.stats()["changed"] == 0, again.stdout[-2000:]
    partial = playbook(str(book), extra=dict(tls, node_prep_tls_key=""))
    assert partial.rc != 0 and "set all three or none" in partial.messages(), partial.messages()
