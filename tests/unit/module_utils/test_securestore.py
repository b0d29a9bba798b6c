"""SecureStore's signing hooks with real files: what a signing node publishes, what a trusting node admits."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Dict, List

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.catalog import _info as info
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _paths as paths
from ansible_collections.warmstart.snapshot.plugins.module_utils.store.security import _securestore as sec
from ansible_collections.warmstart.snapshot.plugins.module_utils.store.security import _signing as sg
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _stores as stores
from tests.support.signing_keys import keys_dir, new_key, trust, write_signing_key
from tests.support.store_fixtures import make_snapshot

PAGES = "containers/embed/criu/pages-1.img"


@pytest.fixture(name="keys")
def fixture_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Dict[str, Any]:
    """A node keys directory (WARMSTART_KEYS_DIR) with a signing key that is also trusted."""
    kid = keys_dir(tmp_path / "keys")
    monkeypatch.setenv(paths.KEYS_DIR_ENV, str(tmp_path / "keys"))
    return {"dir": tmp_path / "keys", "kid": kid}


def _open(tmp_path: Path, **options: Any) -> Any:
    return stores.open_store(str(tmp_path / "store"), dict(options, cache_dir=str(tmp_path / "cache")))


def _rewrite(store: Any, doc: Dict[str, Any], payload: bytes) -> None:
    """The attack: an image rewritten and its digest (and size) updated in manifest.json."""
    top = store.snapshot_dir(doc["id"])
    path = os.path.join(top, PAGES)
    os.chmod(path, 0o600)
    with open(path, "wb") as handle:
        handle.write(payload)
    raw = json.loads(Path(top, mf.MANIFEST).read_text())
    for entry in raw["files"]:
        if entry["path"] == PAGES:
            entry.update(size=len(payload), sha256=hashlib.sha256(payload).hexdigest())
    os.chmod(os.path.join(top, mf.MANIFEST), 0o600)
    Path(top, mf.MANIFEST).write_text(json.dumps(raw))


def test_keys_dir_defaults_turn_signing_on(keys: Dict[str, Any], tmp_path: Path) -> None:
    store = _open(tmp_path)
    assert isinstance(store, sec.SecureStore)
    assert store.config.signing_key == str(keys["dir"] / "signing.key")
    assert store.config.trusted_keys == str(keys["dir"] / "trusted")
    doc = make_snapshot(store)
    on_disk = json.loads(Path(store.snapshot_dir(doc["id"]), mf.MANIFEST).read_text())
    assert on_disk["signature"]["key_id"] == keys["kid"]
    loaded = _open(tmp_path).load(doc["id"])
    assert loaded["signature"] == on_disk["signature"]
    assert _open(tmp_path).verify(loaded) == []


def test_explicit_options_win_over_the_keys_dir(keys: Dict[str, Any], tmp_path: Path) -> None:
    private, public, kid = new_key()
    other = tmp_path / "other"
    write_signing_key(other, private)
    trust(other, "x", public)
    store = _open(tmp_path, signing_key=str(other / "signing.key"), trusted_keys=str(other / "trusted"))
    doc = make_snapshot(store)
    assert store.load(doc["id"])["signature"]["key_id"] == kid
    with pytest.raises(sg.SignatureError, match=f"signed by key {kid}, which is not in the trust set"):
        _open(tmp_path).load(doc["id"])  # the node's own trust set does not hold that key


def test_rewritten_image_with_updated_digest_is_refused_by_load_and_listed_as_error(keys: Dict[str, Any],
                                                                                    tmp_path: Path) -> None:
    store = _open(tmp_path)
    doc = make_snapshot(store)
    _rewrite(store, doc, b"planted code")
    assert st.FsStore(str(tmp_path / "store")).verify(st.FsStore(str(tmp_path / "store")).load(doc["id"])) == []
    with pytest.raises(sg.SignatureError, match="bad signature by key .* was changed after it was signed"):
        _open(tmp_path).load(doc["id"])
    found = info.snapshot_info(_open(tmp_path), verify=True)
    assert found["snapshots"] == []
    assert [b["id"] for b in found["broken"]] == [doc["id"]]
    assert "is refused: bad signature" in found["broken"][0]["error"]


def test_unsigned_snapshot_refused_once_a_trust_set_is_configured(keys: Dict[str, Any], tmp_path: Path) -> None:
    doc = make_snapshot(st.FsStore(str(tmp_path / "store")))  # a node without keys
    with pytest.raises(sg.SignatureError, match="is refused: it is not signed"):
        _open(tmp_path).load(doc["id"])
    os.unlink(keys["dir"] / "trusted" / "fleet-1.pub")
    os.rmdir(keys["dir"] / "trusted")
    assert _open(tmp_path).load(doc["id"])["id"] == doc["id"]  # no trust set: signatures are not required


def test_empty_trust_set_fails_the_listing(keys: Dict[str, Any], tmp_path: Path) -> None:
    make_snapshot(_open(tmp_path))
    os.unlink(keys["dir"] / "trusted" / "fleet-1.pub")
    with pytest.raises(sg.KeyFileError, match="holds no \\*.pub public key"):
        _open(tmp_path).list()


def test_unsafe_signing_key_refuses_before_staging(keys: Dict[str, Any], tmp_path: Path) -> None:
    os.chmod(keys["dir"] / "signing.key", 0o644)
    store = _open(tmp_path)
    with pytest.raises(sg.KeyFileError, match="is accessible by group or others"):
        store.stage(mf.new_id())
    with pytest.raises(sg.KeyFileError, match="is accessible by group or others"):
        store.check_usable()
    assert not os.path.exists(tmp_path / "store" / "tmp") or os.listdir(tmp_path / "store" / "tmp") == []


def test_keys_are_loaded_once_per_store(keys: Dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = sg.load_trust_set
    monkeypatch.setattr(sg, "load_trust_set", lambda path: calls.append(path) or real(path))
    store = _open(tmp_path)
    for name in ("a", "b", "c"):
        make_snapshot(store, name)
    store.list()
    assert len(calls) == 1


class _Copying:
    """A backend that copies a snapshot to this node and reads its manifest again while doing so (like S3)."""

    reads_in_place = False

    def __init__(self, fs: st.FsStore, cache: Path) -> None:
        self.fs = fs
        self.cache = cache

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fs, name)

    def local_dir(self, snapshot_id: str) -> str:
        dest = self.cache / snapshot_id
        shutil.copytree(self.fs.snapshot_dir(snapshot_id), dest, dirs_exist_ok=True)
        return str(dest)

    def verify(self, doc: Dict[str, Any], fetch: bool = True, cached: bool = False) -> List[str]:
        del cached
        return self.fs.verify(self.fs.load(doc["id"]) if fetch else doc)


def test_a_manifest_swapped_between_the_check_and_the_copy_is_refused(keys: Dict[str, Any], tmp_path: Path) -> None:
    fs = st.FsStore(str(tmp_path / "store"))
    doc = make_snapshot(_open(tmp_path))
    config = sec.SecurityConfig.from_options({}, str(tmp_path / "cache"))
    store = sec.SecureStore(_Copying(fs, tmp_path / "cache"), config)
    admitted = store.load(doc["id"])
    assert store.local_dir(doc["id"]) == str(tmp_path / "cache" / doc["id"])
    assert store.verify(admitted) == []
    _rewrite(fs, doc, b"planted code")  # the bucket changes after this node checked the signature
    shutil.rmtree(tmp_path / "cache")
    for call in (lambda: store.local_dir(doc["id"]), lambda: store.verify(admitted)):
        with pytest.raises(sg.SignatureError, match="its manifest changed in the store while this node read it"):
            call()
        assert not (tmp_path / "cache" / doc["id"]).exists(), "the copy of the swapped manifest was kept"
    fresh = sec.SecureStore(_Copying(fs, tmp_path / "cache"), config)
    with pytest.raises(sg.SignatureError, match="bad signature"):
        fresh.local_dir(doc["id"])  # never loaded by this object: the copy's own signature is checked
    assert not (tmp_path / "cache" / doc["id"]).exists()
