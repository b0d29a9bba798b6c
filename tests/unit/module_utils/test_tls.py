"""_tls: which files CRIU's mutual TLS uses and every refusal before anything starts; the page server's and the
restore's options through their runners, runners/_page_server and runners/_restore (real temporary stores; no CRIU
runs). The handshake itself runs against real CRIU in tests/integration/test_page_server_tls.py."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _lazyserver as lzs
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _page_server
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _restore
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _tls
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import failure
from tests.support.store_fixtures import make_snapshot, tree

CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
KEY = "-----BEGIN PRIVATE KEY-----\nMIGH\n-----END PRIVATE KEY-----\n"


def tls_dir(root: Path, key_mode: int = 0o600) -> Path:
    """<root>/tls with ca.pem, cert.pem and key.pem (PEM-shaped; nothing here parses them)."""
    tls = root / "tls"
    tls.mkdir(parents=True)
    (tls / "ca.pem").write_text(CERT)
    (tls / "cert.pem").write_text(CERT)
    (tls / "key.pem").write_text(KEY)
    (tls / "key.pem").chmod(key_mode)
    return tls


@pytest.fixture(name="keys")
def fixture_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A keys directory of this test's own (WARMSTART_KEYS_DIR), with no TLS files yet."""
    keys = tmp_path / "keys"
    keys.mkdir()
    monkeypatch.setenv("WARMSTART_KEYS_DIR", str(keys))
    return keys


def refused(**kwargs: Any) -> _tls.TlsError:
    with pytest.raises(_tls.TlsError) as raised:
        _tls.resolve(**kwargs)
    return raised.value


def test_off_looks_at_nothing(keys: Path) -> None:
    assert _tls.resolve(False) is None  # no tls/ directory at all: not looked at


def test_paths_without_tls_are_refused(keys: Path) -> None:
    err = refused(enabled=False, ca="/x/ca.pem", key="/x/key.pem")
    assert str(err) == "tls_ca, tls_key given without tls: true; set tls: true to use TLS (or drop them)"


def test_defaults_come_from_the_keys_dir(keys: Path) -> None:
    tls = tls_dir(keys)
    files = _tls.resolve(True)
    assert files == _tls.TlsFiles(str(tls / "ca.pem"), str(tls / "cert.pem"), str(tls / "key.pem"))
    assert files.criu_args() == ["--tls", "--tls-cacert", files.ca, "--tls-cert", files.cert, "--tls-key", files.key]
    assert _tls.default_paths() == files.result()


def test_given_paths_win_and_become_absolute(keys: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tls_dir(keys)
    other = tls_dir(tmp_path / "other")
    monkeypatch.chdir(other)
    files = _tls.resolve(True, cert="cert.pem")  # CRIU would resolve a relative path against its images dir
    assert files is not None and files.cert == str(other / "cert.pem") and files.ca == str(keys / "tls" / "ca.pem")


def test_every_missing_file_is_listed_with_its_path(keys: Path, tmp_path: Path) -> None:
    err = refused(enabled=True, ca=str(tmp_path / "nope.pem"))
    assert str(err) == "TLS for the page server cannot be set up"
    assert err.reasons == [f"tls_ca {tmp_path / 'nope.pem'} does not exist",
                           f"tls_cert {keys / 'tls' / 'cert.pem'} does not exist (distribute it with "
                           "warmstart.snapshot.node_prep: node_prep_tls_*)",
                           f"tls_key {keys / 'tls' / 'key.pem'} does not exist (distribute it with "
                           "warmstart.snapshot.node_prep: node_prep_tls_*)"]


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660, 0o602])
def test_a_key_others_can_access_is_refused(keys: Path, mode: int) -> None:
    tls = tls_dir(keys, key_mode=mode)
    err = refused(enabled=True)
    assert err.reasons == [f"tls_key {tls / 'key.pem'} is readable or writable by group or others "
                           f"(mode {mode:04o}); a private key must be 0600 (chmod 600)"]


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_key_private_to_its_owner_is_accepted(keys: Path, mode: int) -> None:
    tls_dir(keys, key_mode=mode)
    assert _tls.resolve(True) is not None


def test_files_of_the_wrong_kind_are_refused(keys: Path) -> None:
    tls = tls_dir(keys)
    (tls / "ca.pem").write_text("not a certificate\n")
    (tls / "cert.pem").write_text(KEY)  # a key where the certificate belongs
    os.remove(tls / "key.pem")
    (tls / "key.pem").mkdir()
    err = refused(enabled=True)
    assert err.reasons == [f"tls_ca {tls / 'ca.pem'} is not a PEM certificate",
                           f"tls_cert {tls / 'cert.pem'} is not a PEM certificate",
                           f"tls_key {tls / 'key.pem'} is not a regular file"]


@pytest.mark.parametrize("address, local", [("127.0.0.1", True), ("127.1.2.3", True), ("::1", True),
                                            ("[::1]", True), ("localhost", True), ("LOCALHOST", True),
                                            ("0.0.0.0", False), ("::", False), ("10.0.0.5", False),
                                            ("fd00::5", False), ("holder.example", False)])
def test_loopback(address: str, local: bool) -> None:
    assert _tls.loopback(address) is local


def test_check_listen(keys: Path) -> None:
    tls_dir(keys)
    files = _tls.resolve(True)
    _tls.check_listen("127.0.0.1", None, False)
    _tls.check_listen("0.0.0.0", files, False)
    _tls.check_listen("0.0.0.0", None, True)
    with pytest.raises(_tls.TlsError, match=r"^page server: refusing to listen on 10\.0\.0\.5 without TLS: .*"
                                            r"Set tls: true .* or set insecure: true"):
        _tls.check_listen("10.0.0.5", None, False)


def test_tls_refusal_reads_criu_tls_errors_only(tmp_path: Path) -> None:
    log = tmp_path / "page-server.log"
    assert lzs.tls_refusal(str(log)) == ""
    log.write_text("(00.01) tls: TLS handshake completed\n"
                   "(00.02) Error (criu/tls.c:226): tls: Invalid certificate\n"
                   "(00.03) Error (criu/tls.c:205): tls: The certificate is NOT trusted. \n"
                   "(00.04) Error (criu/page-xfer.c:1): page-xfer: something else\n")
    assert lzs.tls_refusal(str(log)) == "tls: Invalid certificate | tls: The certificate is NOT trusted."
    log.write_text("(00.04) Error (criu/page-xfer.c:1): page-xfer: Can't read\n")
    assert lzs.tls_refusal(str(log)) == ""


# --- through the modules' calls ------------------------------------------------------

def page_params(store: st.FsStore, tmp_path: Path, snapshot: str, **over: Any) -> Dict[str, Any]:
    return dict(dict(store=store.root, store_options={}, snapshot=snapshot, address="127.0.0.1", port=27000,
                     timeout=5, verify=True, criu_path=None, log_dir=str(tmp_path / "logs"), insecure=False,
                     tls=False, tls_ca=None, tls_cert=None, tls_key=None), **over)


@pytest.fixture(name="criu")
def fixture_criu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot._pageserver.find_criu",
                        lambda path: "/usr/local/bin/criu")


def fail(call: Any, params: Dict[str, Any], check_mode: bool = False) -> Dict[str, Any]:
    with pytest.raises(Exception) as raised:
        call(params, check_mode)
    return failure(raised.value)


@pytest.mark.usefixtures("criu")
@pytest.mark.parametrize("check_mode", [False, True])
def test_page_server_in_the_clear_beyond_loopback_is_refused_first(store: st.FsStore, tmp_path: Path, keys: Path,
                                                                   check_mode: bool) -> None:
    doc = make_snapshot(store)
    before = tree(tmp_path)
    out = fail(_page_server.run, page_params(store, tmp_path, doc["id"], address="0.0.0.0"), check_mode)
    assert out["msg"].startswith("page server: refusing to listen on 0.0.0.0 without TLS"), out
    assert "insecure: true" in out["msg"] and "tls: true" in out["msg"]
    out = fail(_page_server.run, page_params(store, tmp_path, "20260101T000000Z-00000000", address="10.0.0.5"))
    assert out["msg"].startswith("page server: refusing"), "the address is refused before the snapshot is looked up"
    assert tree(tmp_path) == before


@pytest.mark.usefixtures("criu")
def test_page_server_insecure_or_tls_in_check_mode(store: st.FsStore, tmp_path: Path, keys: Path) -> None:
    doc = make_snapshot(store)
    result = _page_server.run(page_params(store, tmp_path, doc["id"], address="0.0.0.0", insecure=True), True)
    assert result["page_server"] == {"snapshot_id": doc["id"], "address": "0.0.0.0", "port": 27000, "tls": False}
    out = fail(_page_server.run, page_params(store, tmp_path, doc["id"], address="0.0.0.0", tls=True), True)
    assert out["msg"].startswith("TLS for the page server cannot be set up: ") and len(out["reasons"]) == 3, out
    tls_dir(keys)
    before = tree(tmp_path)
    result = _page_server.run(page_params(store, tmp_path, doc["id"], address="0.0.0.0", tls=True), True)
    assert result["page_server"]["tls"] is True
    assert tree(tmp_path) == before


def test_restore_tls_needs_a_page_server(store: st.FsStore, tmp_path: Path, keys: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    tls_dir(keys)
    doc = make_snapshot(store)
    params = dict(store=store.root, store_options={}, snapshot=doc["id"], name=None, labels=None, verify=True,
                  skip_compat_check=False, criu_path=None, restore_root=str(tmp_path / "restore"),
                  workloads_root=str(tmp_path / "workloads"), control_roots=[str(tmp_path)], cuda="auto",
                  lazy=True, lazy_wait=False, lazy_timeout=600, page_server=None, into=None, tls=True)
    out = fail(_restore.run, params, True)
    assert out["msg"] == "tls: applies to a lazy restore from a page_server only (none given)", out
    (keys / "tls" / "key.pem").chmod(0o644)
    out = fail(_restore.run, dict(params, page_server="10.0.0.5:27100"), True)
    assert out["msg"].startswith("TLS for the page server cannot be set up: ") and "key.pem" in out["reasons"][0], out
