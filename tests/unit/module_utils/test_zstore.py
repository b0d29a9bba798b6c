"""_zstore.CompressedStore through open_store: filesystem store and S3 (moto in process), alone and with
encryption and signing.

The stored pages are smaller than the plaintext; the node that wrote a snapshot keeps its plaintext copy;
another node decompresses into its cache (0700/0600) after the stored bytes were checked; range reads and
fetch_file decompress only what they need; corruption is refused with the file named; old snapshots read
through a compressing store, compressed ones through a store with the switch off, and a bare backend refuses
them; without zstandard a compressed snapshot is refused naming node_prep.
"""
from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _stores as stores
from ansible_collections.warmstart.snapshot.plugins.module_utils.store.compression import _zstd as zs
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.store.compression._zstore import CompressedStore
from tests.support.store_fixtures import moto_bucket, publish_images

F = 1 << 16
PAGES = "containers/w/criu/pages-1.img"
CORE = "containers/w/criu/core-1.img"
PLAIN = (os.urandom(64) * 2000 + os.urandom(3000)) * 3 + b"tail"  # ~ 400 KiB: 7 frames, compressible


@pytest.fixture(autouse=True)
def _no_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMSTART_KEYS_DIR", str(tmp_path / "keys"))


def open_z(tmp_path: Path, spec: Optional[str] = None, cache: str = "cache", **opts: Any) -> CompressedStore:
    options = {"compression": "zstd", "cache_dir": str(tmp_path / cache), **opts}
    store = stores.open_store(spec or str(tmp_path / "store"), options)
    assert isinstance(store, CompressedStore)
    store.frame = F
    return store


def snapshot(store: Any, pages: bytes = PLAIN) -> Dict[str, Any]:
    """Stage files as CRIU would (pages, core, an empty file), record them, publish; the manifest published."""
    return publish_images(store, {"pages-1.img": pages, "core-1.img": b"core", "empty.img": b""})


def test_fs_round_trip_smaller_and_the_writer_keeps_its_plaintext(tmp_path: Path) -> None:
    store = open_z(tmp_path)
    doc = snapshot(store)
    block = doc["compression"]
    assert block["alg"] == zs.ALG and list(block["files"]) == [PAGES] and block["frame"] == F
    assert block["files"][PAGES]["size"] == len(PLAIN) and len(block["files"][PAGES]["frames"]) == 6
    stored = tmp_path / "store" / "snapshots" / doc["id"] / PAGES
    assert stored.stat().st_size < len(PLAIN) // 4
    entry = next(e for e in doc["files"] if e["path"] == PAGES)
    assert entry["size"] == stored.stat().st_size, "files[] describes the stored bytes"
    assert (tmp_path / "store" / "snapshots" / doc["id"] / CORE).read_bytes() == b"core", "small files stay plain"
    assert store.verify(doc, cached=True) == []
    local = Path(store.local_dir(doc["id"]))
    assert local == tmp_path / "cache" / "plain" / "zstd" / local.parent.name / doc["id"]
    assert (local / PAGES).read_bytes() == PLAIN
    assert all(p.stat().st_mode & 0o077 == 0 for p in local.rglob("*"))


def test_another_node_decompresses_once_and_reuses_its_copy(tmp_path: Path) -> None:
    doc = snapshot(open_z(tmp_path))
    other = open_z(tmp_path, cache="other")
    assert other.verify(other.load(doc["id"])) == []
    local = Path(other.local_dir(doc["id"]))
    assert (local / PAGES).read_bytes() == PLAIN and (local / CORE).read_bytes() == b"core"
    assert all(p.stat().st_mode & 0o077 == 0 for p in local.rglob("*"))
    again = open_z(tmp_path, cache="other")
    mtime = (local / PAGES).stat().st_mtime_ns
    assert again.verify(again.load(doc["id"]), cached=True) == []
    assert (local / PAGES).stat().st_mtime_ns == mtime, "reused, not decompressed again"
    assert again.transfer["reused"] == doc["size"], "a reused copy counts as reused, as an S3 cache hit does"


def test_range_reads_and_fetch_file_decompress_what_they_need(tmp_path: Path) -> None:
    doc = snapshot(open_z(tmp_path))
    other = open_z(tmp_path, cache="other")
    other.load(doc["id"])
    assert other.read_range(doc["id"], PAGES, F - 7, 2 * F + 14) == PLAIN[F - 7:3 * F + 7]
    assert other.read_range(doc["id"], CORE, 1, 2) == b"or"
    assert not (tmp_path / "other" / "plain").exists() or not list((tmp_path / "other" / "plain").rglob("*.img"))
    entry = next(e for e in doc["files"] if e["path"] == PAGES)
    other.fetch_file(doc["id"], entry, str(tmp_path / "pages"))
    assert (tmp_path / "pages").read_bytes() == PLAIN and not (tmp_path / "pages.zst").exists()


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_corrupted_compressed_chunk_is_refused(tmp_path: Path, where: str) -> None:
    doc = snapshot(open_z(tmp_path))
    stored = tmp_path / "store" / "snapshots" / doc["id"] / PAGES
    blob = bytearray(stored.read_bytes())
    at = {"first": 20, "middle": len(blob) // 2, "last": len(blob) - 10}[where]
    blob[at] ^= 0x10
    stored.write_bytes(bytes(blob))
    other = open_z(tmp_path, cache="other")
    problems = other.verify(other.load(doc["id"]))
    assert problems and PAGES in problems[0] and "SHA256" in problems[0], problems
    assert not (tmp_path / "other" / "plain").exists() or not list((tmp_path / "other" / "plain").rglob("*.img"))
    with pytest.raises(WarmstartError):
        other.local_dir(doc["id"])


def test_a_block_not_matching_the_stored_file_is_refused_before_decompressing(tmp_path: Path) -> None:
    doc = snapshot(open_z(tmp_path))
    top = tmp_path / "store" / "snapshots" / doc["id"]
    manifest = json.loads((top / "manifest.json").read_text())
    manifest["compression"]["files"][PAGES]["frames"][0] += 1
    (top / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(WarmstartError, match="add up to"):
        open_z(tmp_path, cache="other").load(doc["id"])


def test_old_snapshots_and_the_switch_off(tmp_path: Path) -> None:
    old = snapshot(stores.open_store(str(tmp_path / "store"), {"cache_dir": str(tmp_path / "cache")}))
    assert "compression" not in old
    store = open_z(tmp_path)
    assert store.verify(store.load(old["id"])) == []
    assert store.local_dir(old["id"]) == str(tmp_path / "store" / "snapshots" / old["id"]), "read in place"
    new = snapshot(store)
    off = stores.open_store(str(tmp_path / "store"), {"compression": "none", "cache_dir": str(tmp_path / "off")})
    assert isinstance(off, CompressedStore) and off.reads_in_place
    assert off.verify(off.load(new["id"])) == []
    assert Path(off.local_dir(new["id"]), PAGES).read_bytes() == PLAIN
    assert "compression" not in snapshot(off)
    bare = stores.open_store(str(tmp_path / "store"))
    with pytest.raises(WarmstartError, match="is compressed"):
        bare.load(new["id"])


def test_options_are_checked_and_zstandard_missing_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(WarmstartError, match="compression_level 25"):
        open_z(tmp_path, compression_level=25)
    doc = snapshot(open_z(tmp_path))

    def missing() -> Any:
        raise zs.CompressionError("the Python zstandard library is not installed (node_prep)")

    monkeypatch.setattr(zs, "require", missing)
    other = open_z(tmp_path, cache="other")
    with pytest.raises(WarmstartError, match="is compressed, but .*node_prep"):
        other.verify(other.load(doc["id"]))
    assert not (tmp_path / "other" / "plain").exists()
    with pytest.raises(WarmstartError, match="compression is zstd, but .*node_prep"):
        open_z(tmp_path).stage(mf.new_id())
    assert not list((tmp_path / "store" / "tmp").iterdir()) if (tmp_path / "store" / "tmp").exists() else True


def test_abort_and_staging_cleanup(tmp_path: Path) -> None:
    store = open_z(tmp_path)
    staging = store.stage(mf.new_id())
    assert os.path.dirname(staging.path) == str(tmp_path / "cache" / "tmp")
    assert staging.path in {e["path"] for e in store.staging_entries()}
    staging.abort()
    assert not os.path.exists(staging.path) and store.staging_entries() == []


def test_delete_drops_the_plaintext_copy(tmp_path: Path) -> None:
    store = open_z(tmp_path)
    doc = snapshot(store)
    assert os.path.isdir(store.plain_dir(doc["id"]))
    store.delete(doc["id"])
    assert not os.path.exists(store.plain_dir(doc["id"]))


# --- with encryption and signing ----------------------------------------------------------------------

def add_kek(keys: Path, name: str) -> None:
    (keys / "kek").mkdir(parents=True, exist_ok=True, mode=0o700)
    (keys / "kek" / f"{name}.key").write_text(base64.b64encode(os.urandom(32)).decode())
    (keys / "kek" / f"{name}.key").chmod(0o600)


def test_compressed_then_encrypted_and_signed(tmp_path: Path) -> None:
    from tests.support.signing_keys import keys_dir  # pylint: disable=import-outside-toplevel
    keys = tmp_path / "keys"
    add_kek(keys, "fleet")
    keys_dir(keys)
    store = open_z(tmp_path, encryption=True)
    doc = snapshot(store)
    assert doc["signature"] and doc["encryption"] and doc["compression"]
    stored = (tmp_path / "store" / "snapshots" / doc["id"] / PAGES).read_bytes()
    assert PLAIN[:64] not in stored and len(stored) < len(PLAIN) // 4, "compressed, then encrypted"
    other = open_z(tmp_path, cache="other", encryption=True)
    assert other.verify(other.load(doc["id"])) == []
    assert Path(other.local_dir(doc["id"]), PAGES).read_bytes() == PLAIN
    assert Path(other.local_dir(doc["id"]), CORE).read_bytes() == b"core"
    other.load(doc["id"])
    fresh = open_z(tmp_path, cache="third", encryption=True)
    fresh.load(doc["id"])
    assert fresh.read_range(doc["id"], PAGES, 3 * F - 1, 2) == PLAIN[3 * F - 1:3 * F + 1]
    top = tmp_path / "store" / "snapshots" / doc["id"]
    manifest = json.loads((top / "manifest.json").read_text())
    manifest["compression"]["files"][PAGES]["sha256"] = "0" * 64
    (top / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(WarmstartError, match="bad signature"):
        open_z(tmp_path, cache="fourth", encryption=True).load(doc["id"])


# --- S3 (moto in process) --------------------------------------------------------------------------

@pytest.fixture(name="bucket")
def fixture_bucket(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    yield from moto_bucket(monkeypatch, "zst")


def test_s3_round_trip(tmp_path: Path, bucket: Any) -> None:
    doc = snapshot(open_z(tmp_path, "s3://zst/fleet", concurrency=3))
    key = f"fleet/snapshots/{doc['id']}/{PAGES}"
    blob = bucket.get_object(Bucket="zst", Key=key)["Body"].read()
    assert len(blob) == sum(doc["compression"]["files"][PAGES]["frames"]) < len(PLAIN) // 4
    other = open_z(tmp_path, "s3://zst/fleet", cache="other")
    assert other.verify(other.load(doc["id"])) == []
    assert Path(other.local_dir(doc["id"]), PAGES).read_bytes() == PLAIN
    assert other.transfer["downloaded"] == doc["size"], "the compressed bytes crossed the network"
    ranged = open_z(tmp_path, "s3://zst/fleet", cache="third")
    ranged.load(doc["id"])
    assert ranged.read_range(doc["id"], PAGES, 2 * F + 5, F) == PLAIN[2 * F + 5:3 * F + 5]
    bucket.put_object(Bucket="zst", Key=key, Body=blob[:100] + bytes([blob[100] ^ 1]) + blob[101:])
    bad = open_z(tmp_path, "s3://zst/fleet", cache="fourth")
    try:  # the S3 backend refuses a corrupted download as it does for any snapshot (raised or listed)
        problems = bad.verify(bad.load(doc["id"]))
    except WarmstartError as exc:
        problems = [str(exc)]
    assert problems and PAGES in problems[0] and "SHA256" in problems[0], problems
    assert not (tmp_path / "fourth" / "plain").exists() or not list((tmp_path / "fourth" / "plain").rglob("*.img"))
