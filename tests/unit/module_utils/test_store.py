"""FsStore and manifest with real files: stage, publish, list, load, delete; validation errors (the checksums:
test_checksums.py)."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Dict

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _stores as stores
from tests.support.store_fixtures import make_snapshot


@pytest.fixture()
def store(tmp_path: Path) -> st.FsStore:
    return st.FsStore(str(tmp_path / "store"))


# --- store --------------------------------------------------------------------

def test_store_needs_an_absolute_path() -> None:
    for bad in ("", "relative/store"):
        with pytest.raises(st.StoreError, match="must be an absolute path"):
            st.FsStore(bad)


def test_open_store_forms(tmp_path: Path) -> None:
    assert stores.open_store(str(tmp_path)).root == str(tmp_path)
    assert stores.open_store({"path": str(tmp_path)}).root == str(tmp_path)
    with pytest.raises(st.StoreError, match="store type 's3' is not supported here"):
        stores.open_store({"type": "s3", "path": "x"})
    with pytest.raises(st.StoreError, match="neither a path nor a mapping"):
        stores.open_store(42)


def test_stage_publish_list_load(store: st.FsStore) -> None:
    doc = make_snapshot(store, labels={"model": "m1"})
    assert store.exists(doc["id"])
    assert os.listdir(store.tmp) == []  # staging renamed away
    loaded = store.load(doc["id"])
    assert loaded == doc
    assert loaded["files"] == sorted(loaded["files"], key=lambda f: f["path"])
    assert {f["path"] for f in loaded["files"]} == {"containers/embed/criu/core-1.img",
                                                    "containers/embed/criu/pages-1.img"}
    assert [d["id"] for d in store.list()] == [doc["id"]]
    assert mf.summary(loaded) == {"id": doc["id"], "name": "embed", "labels": {"model": "m1"},
                                  "created_at": doc["created_at"], "size": doc["size"], "source_node": {"hostname": "node-a"},
                                  "targets": [{"name": "embed", "kind": doc["targets"][0].get("kind")}]}
    assert mf.matches(loaded, "embed", {"model": "m1"}) and not mf.matches(loaded, "embed", {"model": "m2"})
    assert not mf.matches(loaded, "other", None)


def test_publish_locks_down_modes(store: st.FsStore) -> None:
    doc = make_snapshot(store)
    top = store.snapshot_dir(doc["id"])
    assert stat.S_IMODE(os.stat(store.root).st_mode) == 0o700
    for dirpath, dirs, files in os.walk(top):
        assert stat.S_IMODE(os.stat(dirpath).st_mode) == 0o700, dirpath
        for fname in files:
            assert stat.S_IMODE(os.stat(os.path.join(dirpath, fname)).st_mode) == 0o600, fname
    assert os.path.isfile(os.path.join(top, mf.MANIFEST))
    assert not os.path.exists(os.path.join(top, mf.MANIFEST + ".tmp"))


def test_list_is_oldest_first_and_skips_foreign_entries(store: st.FsStore) -> None:
    first = make_snapshot(store, "a")
    second = make_snapshot(store, "b")
    os.makedirs(os.path.join(store.snapshots, "not-a-snapshot"))
    ids = [d["id"] for d in store.list()]
    assert ids == sorted([first["id"], second["id"]])


def test_list_of_missing_store_is_empty(tmp_path: Path) -> None:
    store = st.FsStore(str(tmp_path / "nowhere"))
    assert store.list() == [] and store.staging_entries() == []


def test_abort_removes_staging(store: st.FsStore) -> None:
    staging = store.stage(mf.new_id())
    Path(staging.path, "x").write_bytes(b"1")
    staging.abort()
    assert not os.path.exists(staging.path)
    staging.abort()  # twice is harmless


def test_staging_entries_and_delete_staging(store: st.FsStore) -> None:
    staging = store.stage(mf.new_id())
    Path(staging.path, "pages.img").write_bytes(b"x" * 4096)
    entries = store.staging_entries()
    assert [e["path"] for e in entries] == [staging.path]
    assert entries[0]["size"] == 4096 and entries[0]["mtime"] > 0
    assert store.delete_staging(staging.path) == 4096
    assert store.staging_entries() == []


def test_delete_unpublishes_then_removes(store: st.FsStore) -> None:
    keep = make_snapshot(store, "keep")
    doomed = make_snapshot(store, "doomed")
    assert store.delete(doomed["id"]) > doomed["size"]  # the files and the manifest
    assert not os.path.exists(store.snapshot_dir(doomed["id"]))
    assert os.listdir(store.tmp) == []
    assert [d["id"] for d in store.list()] == [keep["id"]]
    with pytest.raises(st.StoreError, match="not found in store"):
        store.load(doomed["id"])
    with pytest.raises(FileNotFoundError):
        store.delete(doomed["id"])


def test_delete_frees_the_files_and_the_manifest(store: st.FsStore) -> None:
    doc = make_snapshot(store)
    manifest_size = os.path.getsize(os.path.join(store.snapshot_dir(doc["id"]), mf.MANIFEST))
    assert store.delete(doc["id"]) == doc["size"] + manifest_size


# --- manifest validation ---------------------------------------------------------------

def write_manifest(store: st.FsStore, snapshot_id: str, doc: Any) -> str:
    top = os.path.join(store.snapshots, snapshot_id)
    os.makedirs(top, exist_ok=True)
    path = os.path.join(top, mf.MANIFEST)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def good_doc(snapshot_id: str = "20261202T120000Z-1a2b3c4d") -> Dict[str, Any]:
    return mf.new_manifest(snapshot_id, "embed", {}, {"hostname": "n"})


def test_missing_manifest_is_reported_by_list(store: st.FsStore) -> None:
    os.makedirs(os.path.join(store.snapshots, "20261202T120000Z-1a2b3c4d", "containers"))
    entry = store.list()[0]
    assert entry["id"] == "20261202T120000Z-1a2b3c4d"
    assert "manifest is missing (snapshot not published or incomplete)" in entry["error"]
    assert not store.exists("20261202T120000Z-1a2b3c4d")


def test_unparsable_manifest(store: st.FsStore) -> None:
    write_manifest(store, "20261202T120000Z-1a2b3c4d", "{not json")
    assert "manifest cannot be read" in store.list()[0]["error"]


def test_newer_schema_is_refused_with_advice(store: st.FsStore) -> None:
    doc = dict(good_doc(), schema=mf.SCHEMA_VERSION + 1)
    write_manifest(store, doc["id"], doc)
    with pytest.raises(mf.ManifestError, match="is newer than this warmstart understands.*upgrade the collection"):
        store.load(doc["id"])


def test_manifest_id_must_match_directory(store: st.FsStore) -> None:
    write_manifest(store, "20261202T120000Z-00000000", good_doc())
    with pytest.raises(st.StoreError, match="does not match its directory"):
        store.load("20261202T120000Z-00000000")


@pytest.mark.parametrize("change, fragment", [
    ({"schema": "1"}, "schema: missing or not a positive integer"),
    ({"name": 5}, "name 5 is not a safe name"),
    ({"files": {}}, "files: not a list"),
    ({"source": None}, "source: missing or not a mapping"),
    ({"name": "a/b"}, "name 'a/b' is not a safe name"),
    ({"name": "a..b"}, "name 'a..b' is not a safe name"),
    ({"name": ".hidden"}, "name '.hidden' is not a safe name"),
    ({"name": "embed\n"}, "name 'embed\\n' is not a safe name"),
    ({"id": "../../etc"}, "id '../../etc' is malformed"),
    ({"files": [{"path": "/etc/shadow", "size": 1, "sha256": "0" * 64}]}, "files[0].path '/etc/shadow' is absolute"),
    ({"files": [{"path": "a/../../b", "size": 1, "sha256": "0" * 64}]}, "has an empty, '.' or '..' component"),
    ({"files": [{"path": "a", "size": "1", "sha256": "0" * 64}]}, "files[0].size: not a int"),
    ({"files": [{"path": "a", "size": 1}]}, "files[0].sha256: not 64 lowercase hex digits"),
    ({"files": ["a"]}, "files[0]: not a mapping"),
])
def test_validate_rejects(change: Dict[str, Any], fragment: str) -> None:
    with pytest.raises(mf.ManifestError) as err:
        mf.validate(dict(good_doc(), **change), "where.json")
    assert str(err.value).startswith("where.json: manifest ")
    assert fragment in str(err.value)


def test_validate_rejects_non_objects() -> None:
    with pytest.raises(mf.ManifestError, match="not a JSON object"):
        mf.validate([1], "w")


@pytest.mark.parametrize("name", ["embed", "a", "model-1.2_x", "A" * 128])
def test_names_allowed(name: str) -> None:
    assert mf.check_name(name) == name


@pytest.mark.parametrize("name", ["", "a/b", "..", "a..b", "-x", "A" * 129, "a b", None])
def test_names_refused(name: Any) -> None:
    with pytest.raises(mf.ManifestError, match="without '/' or '..'"):
        mf.check_name(name)


def test_labels_checked() -> None:
    assert mf.check_labels({"model": 1, "a.b/c": "v"}) == {"model": "1", "a.b/c": "v"}
    with pytest.raises(mf.ManifestError, match="label key 'bad key' is not allowed"):
        mf.check_labels({"bad key": "v"})
    with pytest.raises(mf.ManifestError, match="longer than 256"):
        mf.check_labels({"k": "v" * 257})


def test_ids_sort_by_time_and_round_trip_iso() -> None:
    import datetime
    early = mf.new_id(datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc))
    late = mf.new_id(datetime.datetime(2026, 12, 1, tzinfo=datetime.timezone.utc))
    assert early < late and early.startswith("20260101T000000Z-")
    assert mf.check_id(early) == early
    now = mf.utcnow()
    assert mf.parse_iso(mf.iso(now)) == now


def test_dump_is_0600_and_atomic(tmp_path: Path) -> None:
    path = tmp_path / mf.MANIFEST
    mf.dump(good_doc(), str(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not (tmp_path / (mf.MANIFEST + ".tmp")).exists()
    loaded = mf.load(str(path))
    assert loaded["id"] == "20261202T120000Z-1a2b3c4d" and loaded["schema"] == mf.SCHEMA_VERSION
