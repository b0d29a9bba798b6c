"""The checksums of a snapshot's files (_checksums) with real files: verify_files, this node's record of hashed
files (VerifiedFiles), sha256_file, and the StreamingHasher."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _checksums as ck
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
from tests.support.store_fixtures import make_snapshot


@pytest.fixture()
def store(tmp_path: Path) -> st.FsStore:
    return st.FsStore(str(tmp_path / "store"))


# --- verify_files --------------------------------------------------------------

def test_verify_intact(store: st.FsStore) -> None:
    doc = make_snapshot(store)
    assert ck.verify_files(store.snapshot_dir(doc["id"]), doc) == []


def test_verify_detects_corruption_truncation_and_loss(store: st.FsStore) -> None:
    doc = make_snapshot(store)
    top = store.snapshot_dir(doc["id"])
    pages = os.path.join(top, "containers/embed/criu/pages-1.img")
    with open(pages, "r+b") as handle:  # same size, one byte flipped
        handle.seek(100)
        byte = handle.read(1)
        handle.seek(100)
        handle.write(bytes([byte[0] ^ 0xFF]))
    assert ck.verify_files(top, doc) == ["containers/embed/criu/pages-1.img: SHA256 mismatch (corrupted)"]
    os.truncate(pages, 10)
    assert ck.verify_files(top, doc) == [
        f"containers/embed/criu/pages-1.img: size 10 bytes, manifest says {len(b'memory pages ') * 1000} "
        "(truncated or replaced)"]
    os.unlink(os.path.join(top, "containers/embed/criu/core-1.img"))
    problems = ck.verify_files(top, doc)
    assert "containers/embed/criu/core-1.img: missing" in problems and len(problems) == 2


def _pages(store: st.FsStore, doc: Dict[str, Any]) -> str:
    return os.path.join(store.snapshot_dir(doc["id"]), "containers/embed/criu/pages-1.img")


def test_publish_records_its_digests_and_a_cached_verify_uses_them(store: st.FsStore,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    doc = make_snapshot(store)
    top = store.snapshot_dir(doc["id"])
    cache = ck.VerifiedFiles(doc["id"])
    assert cache.path == os.path.join(os.environ[ck.VERIFIED_DIR_ENV], f"{doc['id']}.json")
    assert oct(os.stat(cache.path).st_mode & 0o777) == "0o600"
    assert all(cache.known(os.path.join(top, f["path"]), f["sha256"]) for f in doc["files"])
    assert not cache.known(_pages(store, doc), "0" * 64)  # the record is of this digest only
    hashed = []
    monkeypatch.setattr(ck.dg, "check_files",
                        lambda items, progress=None, threads=None, cancel=None: {p: hashed.append(p) or False for p, _e in items})
    assert ck.verify_local(store, doc, cached=True) == [] and hashed == []
    assert ck.verify_local(store, doc) == [f"{f['path']}: SHA256 mismatch (corrupted)" for f in doc["files"]]


@pytest.mark.parametrize("change", ["rewrite", "chmod", "utime"])
def test_a_changed_file_is_hashed_again(store: st.FsStore, change: str) -> None:
    doc = make_snapshot(store)
    pages = _pages(store, doc)
    before = os.stat(pages)
    if change == "rewrite":  # same size, same bytes but one, mtime put back: the ctime still moves
        with open(pages, "r+b") as handle:
            handle.seek(5)
            handle.write(b"X")
        os.utime(pages, ns=(before.st_atime_ns, before.st_mtime_ns))
    elif change == "chmod":
        os.chmod(pages, 0o644)
    else:
        os.utime(pages, ns=(before.st_atime_ns, before.st_mtime_ns + 1))
    assert not ck.VerifiedFiles(doc["id"]).known(pages, next(f["sha256"] for f in doc["files"] if f["path"].endswith("pages-1.img")))
    problems = ck.verify_local(store, doc, cached=True)
    assert problems == (["containers/embed/criu/pages-1.img: SHA256 mismatch (corrupted)"] if change == "rewrite" else [])


def test_a_cached_verify_records_what_it_hashed(store: st.FsStore, tmp_path: Path) -> None:
    doc = make_snapshot(store)
    os.unlink(ck.VerifiedFiles(doc["id"]).path)  # as on another node sharing the store
    assert not ck.VerifiedFiles(doc["id"]).known(_pages(store, doc), doc["files"][1]["sha256"])
    assert ck.verify_local(store, doc, cached=True) == []
    assert all(ck.VerifiedFiles(doc["id"]).known(os.path.join(store.snapshot_dir(doc["id"]), f["path"]), f["sha256"])
               for f in doc["files"])
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cache = ck.VerifiedFiles(doc["id"], str(blocker / "verified"))  # cannot be written (even by root): nothing kept
    cache.add(_pages(store, doc), "y")
    cache.save()
    assert cache.added and not cache.known(_pages(store, doc), "y")


def test_records_are_per_snapshot_forgotten_with_it_and_pruned_by_age(store: st.FsStore) -> None:
    doc, other = make_snapshot(store), make_snapshot(store, name="other")
    root = os.environ[ck.VERIFIED_DIR_ENV]
    assert sorted(os.listdir(root)) == sorted([f"{doc['id']}.json", f"{other['id']}.json"])
    assert not ck.VerifiedFiles(other["id"]).known(_pages(store, doc), doc["files"][1]["sha256"])  # not its file
    store.delete(doc["id"])
    assert os.listdir(root) == [f"{other['id']}.json"]
    stale = os.path.join(root, f"{other['id']}.json")
    os.utime(stale, (0, 0))  # not written for decades
    make_snapshot(store, name="third")
    assert not os.path.exists(stale) and len(os.listdir(root)) == 1


def test_sha256_progress_counts_bytes(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"a" * 10000)
    seen = []
    digest = ck.sha256_file(str(path), seen.append)
    assert sum(seen) == 10000
    assert digest == "27dd1f61b867b6a0f6e9d8a41c43231de52107e53ae424de8f847b821db4b711"


def test_streaming_hasher_follows_growing_page_files(tmp_path: Path) -> None:
    """Hashes written while the file grows equal a full hash afterwards; other files are left alone."""
    import hashlib
    import threading
    import time as _time

    from ansible_collections.warmstart.snapshot.plugins.module_utils.store._checksums import StreamingHasher, record_files

    images = tmp_path / "containers" / "t" / "criu"
    images.mkdir(parents=True)
    hasher = StreamingHasher(str(images), "containers/t/criu")
    hasher.start()
    data = os.urandom(3 << 20)

    def writer() -> None:
        with open(images / "pages-1.img", "wb") as handle:
            for i in range(0, len(data), 64 << 10):
                handle.write(data[i:i + (64 << 10)])
                handle.flush()
                _time.sleep(0.001)
        (images / "core-1.img").write_bytes(b"core")

    thread = threading.Thread(target=writer)
    thread.start()
    thread.join()
    known = hasher.finish()
    assert known == {"containers/t/criu/pages-1.img": {"path": "containers/t/criu/pages-1.img", "size": len(data),
                                                       "sha256": hashlib.sha256(data).hexdigest()}}
    entries = {e["path"]: e for e in record_files(str(tmp_path), known=known)}
    assert entries["containers/t/criu/pages-1.img"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert entries["containers/t/criu/core-1.img"]["sha256"] == hashlib.sha256(b"core").hexdigest()
    # a stale pre-computed digest (size changed since) is not trusted
    stale = {"containers/t/criu/core-1.img": {"path": "containers/t/criu/core-1.img", "size": 3, "sha256": "0" * 64}}
    again = {e["path"]: e for e in record_files(str(tmp_path), known=stale)}
    assert again["containers/t/criu/core-1.img"]["sha256"] == hashlib.sha256(b"core").hexdigest()
