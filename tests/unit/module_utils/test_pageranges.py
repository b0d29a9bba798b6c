"""_pageranges: the ranges of a pages image a page-server restore fetches itself come only from pieces whose SHA256
matched the manifest; a compressed file through a checked fetch; an encrypted one as the store decrypts it. The
whole path with real CRIU runs in tests/integration/test_lazy.py (an eager page corrupted in the restoring node's
store)."""
from __future__ import annotations

import hashlib
import stat
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _pageranges as pgr
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._store import StoreError

PREFIX = "proc/criu/"
REL = PREFIX + "pages-1.img"
CHUNK = 64


class FakeStore:
    """read_range and fetch_file over in-memory files; what was asked is recorded."""

    def __init__(self, files: Dict[str, bytes]) -> None:
        self.files = files
        self.reads: List[Tuple[str, int, int]] = []
        self.fetched: List[str] = []

    def read_range(self, sid: str, rel: str, offset: int, length: int) -> bytes:
        assert sid == "s1"
        self.reads.append((rel, offset, length))
        return self.files[rel][offset:offset + length]

    def fetch_file(self, sid: str, entry: Dict[str, Any], path: str, verify: bool = True) -> None:
        assert sid == "s1" and verify
        self.fetched.append(entry["path"])
        with open(path, "wb") as handle:
            handle.write(self.files[entry["path"]])


def entry(data: bytes, rel: str = REL) -> Dict[str, Any]:
    chunks = [hashlib.sha256(data[i:i + CHUNK]).hexdigest() for i in range(0, len(data), CHUNK)]
    return {"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "chunks": {"size": CHUNK, "sha256": chunks}}


def make(tmp_path: Path, data: bytes, stored: bytes = b"", **doc: Any) -> Tuple[pgr.PageRanges, FakeStore]:
    store = FakeStore({REL: stored or data})
    manifest = {"id": "s1", "files": [entry(data)], **doc}
    return pgr.PageRanges(store, manifest, PREFIX, str(tmp_path / "scratch")), store  # type: ignore[arg-type]


DATA = bytes(range(256)) * 2  # 512 bytes: 8 chunks of 64


def test_a_range_across_chunks_is_read_from_whole_checked_chunks(tmp_path: Path) -> None:
    ranges, store = make(tmp_path, DATA)
    assert ranges.read("pages-1.img", 60, 10) == DATA[60:70]
    assert store.reads == [(REL, 0, 64), (REL, 64, 64)]
    assert ranges.read("pages-1.img", 70, 4) == DATA[70:74]
    assert len(store.reads) == 2, "the chunk just checked was read again"
    assert ranges.read("pages-1.img", 500, 12) == DATA[500:512]
    assert store.reads[-1] == (REL, 448, 64) and ranges.read_bytes == 3 * 64


@pytest.mark.parametrize("where", [0, 200, 511])
def test_a_corrupted_chunk_is_refused_naming_file_and_chunk(tmp_path: Path, where: int) -> None:
    bad = bytearray(DATA)
    bad[where] ^= 1
    ranges, _store = make(tmp_path, DATA, bytes(bad))
    index = where // CHUNK
    with pytest.raises(StoreError, match=rf"{REL}: chunk {index} \(bytes {index * CHUNK}-{index * CHUNK + 63}\): "
                                         r"SHA256 mismatch"):
        ranges.read("pages-1.img", where, 1)
    assert ranges.read("pages-1.img", (index + 1) % 8 * CHUNK, 4)  # another, intact chunk is still served


def test_a_short_answer_is_refused(tmp_path: Path) -> None:
    ranges, _store = make(tmp_path, DATA, DATA[:300])
    with pytest.raises(StoreError, match=rf"{REL}: bytes 256-319: the store returned 44 of 64 bytes"):
        ranges.read("pages-1.img", 290, 20)


def test_a_small_file_without_chunks_is_checked_whole(tmp_path: Path) -> None:
    data = b"x" * 40
    item = {"path": REL, "size": 40, "sha256": hashlib.sha256(data).hexdigest()}
    store = FakeStore({REL: b"x" * 39 + b"y"})
    ranges = pgr.PageRanges(store, {"id": "s1", "files": [item]}, PREFIX, str(tmp_path / "s"))  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="chunk 0 \\(bytes 0-39\\): SHA256 mismatch"):
        ranges.read("pages-1.img", 0, 4)
    store.files[REL] = data
    assert ranges.read("pages-1.img", 4, 8) == data[4:12]


def test_a_file_not_in_the_manifest_is_refused(tmp_path: Path) -> None:
    ranges, store = make(tmp_path, DATA)
    with pytest.raises(StoreError, match="pages-9.img is not listed in its manifest"):
        ranges.read("pages-9.img", 0, 4)
    assert not store.reads


def test_without_verify_or_when_encrypted_the_store_answers_directly(tmp_path: Path) -> None:
    bad = b"\0" * len(DATA)
    ranges, store = make(tmp_path, DATA, bad, encryption={"chunk": 64})
    assert ranges.read("pages-1.img", 10, 5) == bad[10:15] and store.reads == [(REL, 10, 5)]
    store = FakeStore({REL: bad})
    plain = pgr.PageRanges(store, {"id": "s1", "files": [entry(DATA)]}, PREFIX, str(tmp_path / "v"),  # type: ignore[arg-type]
                           verify=False)
    assert plain.read("pages-1.img", 3, 2) == bad[3:5]


def test_a_compressed_file_is_fetched_whole_checked_then_read_and_removed(tmp_path: Path) -> None:
    ranges, store = make(tmp_path, DATA, compression={"files": {REL: {"size": len(DATA)}}})
    assert ranges.read("pages-1.img", 100, 50) == DATA[100:150]
    assert ranges.read("pages-1.img", 400, 10) == DATA[400:410]
    assert store.fetched == [REL] and not store.reads
    scratch = tmp_path / "scratch"
    assert stat.S_IMODE(scratch.stat().st_mode) == 0o700
    ranges.close()
    assert not scratch.exists()


def test_keep_checked_reads_and_hashes_each_piece_once_and_close_removes_the_copy(tmp_path: Path) -> None:
    store = FakeStore({REL: DATA})
    ranges = pgr.PageRanges(store, {"id": "s1", "files": [entry(DATA)]}, PREFIX,  # type: ignore[arg-type]
                            str(tmp_path / "scratch"), keep=1, keep_checked=True)
    for offset in (0, 300, 10, 310, 0, 500, 20):  # back and forth over three pieces, one held in memory
        assert ranges.read("pages-1.img", offset, 8) == DATA[offset:offset + 8]
    assert store.reads == [(REL, 0, 64), (REL, 256, 64), (REL, 448, 64)]  # each piece read once
    (copy,) = (tmp_path / "scratch").iterdir()
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600 and stat.S_IMODE((tmp_path / "scratch").stat().st_mode) == 0o700
    assert copy.read_bytes()[256:320] == DATA[256:320]  # the checked piece, at its place
    ranges.close()
    assert not (tmp_path / "scratch").exists()


def test_without_keep_checked_a_piece_asked_again_after_it_went_is_checked_again(tmp_path: Path) -> None:
    ranges, store = make(tmp_path, DATA)  # keep=1
    for offset in (0, 300, 10):
        ranges.read("pages-1.img", offset, 8)
    assert store.reads == [(REL, 0, 64), (REL, 256, 64), (REL, 0, 64)]
