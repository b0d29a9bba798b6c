"""_encstore through SecureStore (encryption at rest): filesystem store and S3 (moto in process).

What is stored holds no plaintext; this node's decrypted copy is made in one checked pass and reused;
tampering, truncating, swapping chunks or files between snapshots, a wrong or missing KEK, and a
plaintext snapshot in an encrypted store are refused, with the reason.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store.security import _crypt as cr
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _s3bucket as s3b
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _stores as stores
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.store.security._securestore import SecureStore, SecurityConfig
from tests.support.store_fixtures import moto_bucket, publish_images

C = 4096
MARKER = os.urandom(64)
PAGES = "containers/w/criu/pages-1.img"


@pytest.fixture(name="keys")
def fixture_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A keys dir with one KEK (kek/fleet.key), as node_prep lays it out."""
    keys = tmp_path / "keys"
    add_kek(keys, "fleet")
    monkeypatch.setenv("WARMSTART_KEYS_DIR", str(keys))
    return keys


def add_kek(keys: Path, name: str) -> bytes:
    (keys / "kek").mkdir(parents=True, exist_ok=True, mode=0o700)
    key = os.urandom(32)
    (keys / "kek" / f"{name}.key").write_text(base64.b64encode(key).decode())
    (keys / "kek" / f"{name}.key").chmod(0o600)
    return key


def open_enc(tmp_path: Path, spec: Optional[str] = None, **opts: Any) -> SecureStore:
    options = {"encryption": True, "cache_dir": str(tmp_path / "cache"), **opts}
    store = stores.open_store(spec or str(tmp_path / "store"), options)
    assert isinstance(store, SecureStore) and store.encryption is not None
    store.encryption.chunk = C
    return store


def snapshot(store: Any, pages: bytes = MARKER * 200, extra: bytes = b"") -> Dict[str, Any]:
    """Stage files as CRIU would (pages, core, an empty file), record them, publish; the manifest published."""
    return publish_images(store, {"pages-1.img": pages, "core-1.img": b"core" + extra, "empty.img": b""})


def stored_bytes(top: Path) -> Iterator[bytes]:
    for path in top.rglob("*"):
        if path.is_file():
            yield path.read_bytes()


def test_fs_round_trip_stores_no_plaintext(tmp_path: Path, keys: Path) -> None:
    store = open_enc(tmp_path)
    doc = snapshot(store)
    enc = doc["encryption"]
    assert enc["alg"] == cr.ALG and enc["chunk"] == C and enc["kek_id"] == cr.load_ring(str(keys / "kek"))[0].kid
    assert not any(MARKER[:32] in data for data in stored_bytes(tmp_path / "store")), "plaintext in the store"
    stored = {e["path"]: e for e in doc["files"]}
    assert stored[PAGES]["size"] == cr.stored_size(len(MARKER) * 200, C)
    assert stored["containers/w/criu/empty.img"]["size"] == 16
    assert doc["size"] == sum(e["size"] for e in doc["files"])
    assert store.inner.verify(doc) == [], "the backend checks the stored bytes unchanged"
    assert store.verify(doc, fetch=False) == []
    plain = Path(store.local_dir(doc["id"]))
    assert plain.parent.parent == tmp_path / "cache" / "plain" and (plain / PAGES).read_bytes() == MARKER * 200
    assert (plain / "containers/w/criu/empty.img").read_bytes() == b""
    assert plain.stat().st_mode & 0o777 == 0o700 and (plain / PAGES).stat().st_mode & 0o777 == 0o600
    assert not list((tmp_path / "cache" / "tmp").iterdir()), "the plaintext staging became the copy"
    assert not store.reads_in_place


def test_decrypted_copy_is_made_once_and_reused(tmp_path: Path, keys: Path) -> None:
    doc = snapshot(open_enc(tmp_path))
    plain = tmp_path / "cache" / "plain"
    shutil.rmtree(plain)
    fresh = open_enc(tmp_path)
    assert fresh.verify(fresh.load(doc["id"]), cached=True) == []
    copy = Path(fresh.local_dir(doc["id"]))
    assert (copy / PAGES).read_bytes() == MARKER * 200 and not list(copy.rglob("*.part"))
    mtime = (copy / PAGES).stat().st_mtime_ns
    again = open_enc(tmp_path)
    assert again.verify(again.load(doc["id"]), cached=True) == [] and again.transfer == {}
    assert (copy / PAGES).stat().st_mtime_ns == mtime, "a complete copy is reused"
    kept = Path(open_enc(tmp_path).local_dir(snapshot(open_enc(tmp_path))["id"]))
    assert (kept / ".unsynced").read_text() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    (kept / ".unsynced").write_text("another boot")  # the kept copy was never fsynced: not trusted after a reboot
    again = open_enc(tmp_path)
    assert again.verify(again.load(kept.name), cached=True) == [] and (kept / ".unsynced").read_text() != "another boot"
    (copy / PAGES).write_bytes(b"short")
    again = open_enc(tmp_path)
    assert Path(again.local_dir(doc["id"])).joinpath(PAGES).read_bytes() == MARKER * 200, "an incomplete copy is redone"
    assert again.delete(doc["id"]) > 0 and not copy.exists()


def test_range_reads_and_fetch_file_decrypt(tmp_path: Path, keys: Path) -> None:
    data = os.urandom(3 * C + 99)
    doc = snapshot(open_enc(tmp_path), pages=data)
    shutil.rmtree(tmp_path / "cache" / "plain")
    store = open_enc(tmp_path)
    store.load(doc["id"])
    for offset, length in ((0, 10), (C - 5, 10), (C, 2 * C + 1), (3 * C + 90, 50), (10 * C, 4)):
        assert store.read_range(doc["id"], PAGES, offset, length) == data[offset:offset + length]
    entry = next(e for e in doc["files"] if e["path"] == PAGES)
    store.fetch_file(doc["id"], entry, str(tmp_path / "one"))
    assert (tmp_path / "one").read_bytes() == data
    assert not (tmp_path / "cache" / "plain").exists() or not list((tmp_path / "cache" / "plain").rglob("*.img"))


def tamper(store_root: Path, doc: Dict[str, Any], rel: str, data: bytes, fix_digest: bool = True) -> None:
    """Write ``data`` as the stored file ``rel`` and (as a writer of the store could) fix its manifest entry."""
    top = store_root / "snapshots" / doc["id"]
    (top / rel).write_bytes(data)
    if fix_digest:
        manifest = json.loads((top / "manifest.json").read_text())
        for entry in manifest["files"]:
            if entry["path"] == rel:
                entry.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
        (top / "manifest.json").write_text(json.dumps(manifest))


def check_refused(tmp_path: Path, sid: str, why: str) -> None:
    shutil.rmtree(tmp_path / "cache" / "plain", ignore_errors=True)
    store = open_enc(tmp_path)
    problems = store.verify(store.load(sid))
    assert any(why in p for p in problems), problems
    assert not (tmp_path / "cache" / "plain").exists() or not list((tmp_path / "cache" / "plain").rglob("*.img"))
    with pytest.raises(st.StoreError, match=why):
        store.local_dir(sid)


@pytest.mark.parametrize("how,why", [
    ("flip", "chunk 1 does not authenticate"),
    ("truncate", "chunk 1 does not authenticate"),
    ("swap", "chunk 0 does not authenticate"),
    ("flip-nofix", "chunk 1 does not authenticate"),
    ("grow", "chunk 3 does not authenticate"),
    ("cut", "cannot be an encrypted file"),
])
def test_tampered_chunks_are_refused(tmp_path: Path, keys: Path, how: str, why: str) -> None:
    doc = snapshot(open_enc(tmp_path), pages=os.urandom(3 * C + 10))
    blob = (tmp_path / "store" / "snapshots" / doc["id"] / PAGES).read_bytes()
    n = C + 16
    changed = {"flip": blob[:n + 7] + bytes([blob[n + 7] ^ 1]) + blob[n + 8:], "truncate": blob[:2 * n],
               "swap": blob[n:2 * n] + blob[:n] + blob[2 * n:], "grow": blob + b"x" * 5,
               "cut": blob[:3 * n] + b"x" * 5}
    tamper(tmp_path / "store", doc, PAGES, changed[how.split("-")[0]], fix_digest=not how.endswith("nofix"))
    check_refused(tmp_path, doc["id"], why)


def test_a_file_from_another_snapshot_is_refused(tmp_path: Path, keys: Path) -> None:
    store = open_enc(tmp_path)
    victim, other = snapshot(store, pages=b"a" * (2 * C)), snapshot(store, pages=MARKER * 128)
    planted = (tmp_path / "store" / "snapshots" / other["id"] / PAGES).read_bytes()
    tamper(tmp_path / "store", victim, PAGES, planted)
    check_refused(tmp_path, victim["id"], "chunk 0 does not authenticate")
    # and another file of the same snapshot
    core = (tmp_path / "store" / "snapshots" / other["id"] / "containers/w/criu/core-1.img").read_bytes()
    tamper(tmp_path / "store", other, "containers/w/criu/empty.img", core)
    check_refused(tmp_path, other["id"], "does not authenticate")


def test_a_symlinked_stored_file_is_refused(tmp_path: Path, keys: Path) -> None:
    doc = snapshot(open_enc(tmp_path))
    path = tmp_path / "store" / "snapshots" / doc["id"] / PAGES
    shutil.move(str(path), str(tmp_path / "outside"))
    path.symlink_to(tmp_path / "outside")
    check_refused(tmp_path, doc["id"], "a symlink")


def test_wrong_missing_or_no_kek_is_refused_at_load(tmp_path: Path, keys: Path) -> None:
    doc = snapshot(open_enc(tmp_path))
    kid = doc["encryption"]["kek_id"]
    shutil.rmtree(keys / "kek")
    with pytest.raises(st.StoreError, match="cannot read .*node_prep_keks"):
        open_enc(tmp_path).load(doc["id"])
    add_kek(keys, "other")
    with pytest.raises(st.StoreError, match=f"wrapped by key-encryption key {kid}, which is not in .*other"):
        open_enc(tmp_path).load(doc["id"])
    listed = open_enc(tmp_path).list()
    assert listed[0]["id"] == doc["id"] and "not in" in listed[0]["error"]


def test_altered_wrapped_key_is_refused(tmp_path: Path, keys: Path) -> None:
    doc = snapshot(open_enc(tmp_path))
    top = tmp_path / "store" / "snapshots" / doc["id"]
    manifest = json.loads((top / "manifest.json").read_text())
    other = snapshot(open_enc(tmp_path))
    manifest["encryption"] = other["encryption"]  # another snapshot's wrapped key, same KEK
    (top / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(st.StoreError, match="does not unwrap .*copied from another snapshot"):
        open_enc(tmp_path).load(doc["id"])
    manifest["encryption"]["chunk"] = 3
    (top / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(st.StoreError, match="encryption.chunk"):
        open_enc(tmp_path).load(doc["id"])


def test_encryption_must_match_the_store(tmp_path: Path, keys: Path) -> None:
    doc = snapshot(open_enc(tmp_path))
    plain_store = SecureStore(st.FsStore(str(tmp_path / "store")), SecurityConfig(cache_dir=str(tmp_path / "cache")))
    with pytest.raises(st.StoreError, match="is encrypted: set store_options.encryption"):
        plain_store.load(doc["id"])
    assert "is encrypted" in plain_store.list()[0]["error"]
    bare = stores.open_store(str(tmp_path / "store"))  # no security at all: the backend alone refuses it
    with pytest.raises(st.StoreError, match="is encrypted: set store_options.encryption"):
        bare.load(doc["id"])
    assert "is encrypted" in bare.list()[0]["error"]
    planted = mf.new_id()
    shutil.copytree(tmp_path / "store" / "snapshots" / doc["id"], tmp_path / "store" / "snapshots" / planted)
    manifest = json.loads((tmp_path / "store" / "snapshots" / planted / "manifest.json").read_text())
    manifest["id"] = planted
    del manifest["encryption"]
    (tmp_path / "store" / "snapshots" / planted / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(st.StoreError, match="is not encrypted, but the store is .*planted"):
        open_enc(tmp_path).load(planted)


def test_no_kek_refuses_the_checkpoint_before_anything_is_staged(tmp_path: Path, keys: Path) -> None:
    add_kek(keys, "second")
    store = open_enc(tmp_path)
    with pytest.raises(st.StoreError, match=r"several key-encryption keys .*store_options.kek"):
        store.check_usable()
    with pytest.raises(st.StoreError, match="several key-encryption keys"):
        store.stage(mf.new_id())
    assert not (tmp_path / "store" / "tmp").exists() or not list((tmp_path / "store" / "tmp").iterdir())
    assert not (tmp_path / "cache" / "tmp").exists()
    doc = snapshot(open_enc(tmp_path, kek="second"))
    assert doc["encryption"]["kek_id"] == cr.find_kek(str(keys / "kek"), doc["encryption"]["kek_id"]).kid
    assert cr.find_kek(str(keys / "kek"), doc["encryption"]["kek_id"]).name == "second"


def test_abort_removes_both_stagings(tmp_path: Path, keys: Path) -> None:
    store = open_enc(tmp_path)
    staging = store.stage(mf.new_id())
    Path(staging.path, "x").write_bytes(b"secret")
    store_tmp = list((tmp_path / "store" / "tmp").iterdir())
    assert len(store_tmp) == 1 and Path(staging.path).parent == tmp_path / "cache" / "tmp"
    assert {e["path"] for e in store.staging_entries()} == {str(store_tmp[0]), staging.path}
    staging.abort()
    assert not list((tmp_path / "store" / "tmp").iterdir()) and not os.path.exists(staging.path)


def test_secrets_stay_out_of_describe_and_messages(tmp_path: Path, keys: Path) -> None:
    key = (keys / "kek" / "fleet.key").read_text().strip()
    store = open_enc(tmp_path)
    doc = snapshot(store)
    assert key not in json.dumps(store.describe()) and key not in json.dumps(doc)
    assert key not in repr(store.encryption.check_writable())


# --- S3 (moto in process) --------------------------------------------------------------------------

@pytest.fixture(name="bucket")
def fixture_bucket(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    yield from moto_bucket(monkeypatch, "enc")


def objects(client: Any) -> Dict[str, bytes]:
    listed = client.list_objects_v2(Bucket="enc").get("Contents", [])
    return {o["Key"]: client.get_object(Bucket="enc", Key=o["Key"])["Body"].read() for o in listed}


def test_s3_round_trip_and_sse(tmp_path: Path, keys: Path, bucket: Any) -> None:
    data = MARKER * (5 * C // 64) + b"tail"
    store = open_enc(tmp_path, "s3://enc/fleet", sse="aws:kms", sse_kms_key_id="kms-key-1", concurrency=3)
    doc = snapshot(store, pages=data)
    stored = objects(bucket)
    assert f"fleet/snapshots/{doc['id']}/manifest.json" in stored
    assert not any(MARKER[:32] in blob for blob in stored.values()), "plaintext in the bucket"
    head = bucket.head_object(Bucket="enc", Key=f"fleet/snapshots/{doc['id']}/{PAGES}")
    assert head["ServerSideEncryption"] == "aws:kms" and "kms-key-1" in head["SSEKMSKeyId"]
    assert not (tmp_path / "cache" / "s3" / "enc__fleet" / doc["id"]).exists(), "no ciphertext copy kept"
    shutil.rmtree(tmp_path / "cache" / "plain")
    fresh = open_enc(tmp_path, "s3://enc/fleet")
    assert fresh.verify(fresh.load(doc["id"])) == []
    assert Path(fresh.local_dir(doc["id"]), PAGES).read_bytes() == data
    assert fresh.transfer["downloaded"] == doc["size"]
    again = open_enc(tmp_path, "s3://enc/fleet")
    assert again.verify(again.load(doc["id"]), cached=True) == [] and again.transfer["reused"] == doc["size"]
    key = f"fleet/snapshots/{doc['id']}/{PAGES}"
    blob = stored[key]
    bucket.put_object(Bucket="enc", Key=key, Body=blob[:C + 16] + bytes([blob[C + 16] ^ 1]) + blob[C + 17:])
    shutil.rmtree(tmp_path / "cache" / "plain")
    problems = open_enc(tmp_path, "s3://enc/fleet").verify(doc)
    assert problems == [f"{PAGES}: chunk 1 does not authenticate (altered, moved, truncated, or from "
                        "another file or snapshot)"]


def test_sse_settings() -> None:
    assert s3b.sse_settings() == ({}, {})
    assert s3b.sse_settings("AES256") == ({"ServerSideEncryption": "AES256"}, {})
    assert s3b.sse_settings("aws:kms", "k") == ({"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "k"}, {})
    raw = os.urandom(32)
    for given in (base64.b64encode(raw).decode(), ):
        up, read = s3b.sse_settings(customer_key=given)
        assert up == read == {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": raw}
    assert s3b.sse_settings(customer_key="k" * 32)[1]["SSECustomerKey"] == b"k" * 32
    for args, why in ((("DES",), "use one of AES256, aws:kms"), (("AES256", None, "k" * 32), "exclude each other"),
                      (("AES256", "k"), "goes with sse: aws:kms"), ((None, None, "short"), "5 bytes")):
        with pytest.raises(st.StoreError, match=why) as err:
            s3b.sse_settings(*args)
        assert "short" not in str(err.value) and "k" * 32 not in str(err.value)
    with pytest.raises(st.StoreError, match="s3:// stores only"):
        stores.open_store("/tmp/x", {"sse": "AES256"})


def test_s3_sse_c_round_trip(tmp_path: Path, keys: Path, bucket: Any) -> None:
    key = base64.b64encode(os.urandom(32)).decode()
    store = open_enc(tmp_path, "s3://enc/fleet", sse_customer_key=key)
    doc = snapshot(store)
    assert key not in json.dumps(store.describe())
    shutil.rmtree(tmp_path / "cache" / "plain")
    fresh = open_enc(tmp_path, "s3://enc/fleet", sse_customer_key=key)
    assert Path(fresh.local_dir(doc["id"]), PAGES).read_bytes() == MARKER * 200


def test_signed_and_encrypted_the_signature_covers_the_stored_files_and_the_block(tmp_path: Path, keys: Path) -> None:
    from tests.support.signing_keys import keys_dir  # pylint: disable=import-outside-toplevel
    keys_dir(keys)
    doc = snapshot(open_enc(tmp_path))
    assert doc["signature"] and doc["encryption"]
    top = tmp_path / "store" / "snapshots" / doc["id"]
    manifest = json.loads((top / "manifest.json").read_text())
    manifest["encryption"] = snapshot(open_enc(tmp_path))["encryption"]  # another snapshot's block
    (top / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(WarmstartError, match="bad signature"):
        open_enc(tmp_path).load(doc["id"])
