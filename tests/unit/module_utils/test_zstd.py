"""_zstd (the compressed file format) and the manifest's compression block (_schema).

Round trip on every core, range reads across frame boundaries, a corrupted frame, a frame inflating past
its declared size, truncated or extra frames, and blocks whose counts do not match their sizes.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Dict, List

import pytest
import zstandard

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _schema as sc
from ansible_collections.warmstart.snapshot.plugins.module_utils.store.compression import _zstd as zs

F = 1 << 16  # the smallest frame the schema accepts: several frames from little data


def data(size: int) -> bytes:
    """Compressible but not trivial: random 64-byte words repeated, with random runs between."""
    word = os.urandom(64)
    out = bytearray()
    while len(out) < size:
        out += word * 50 + os.urandom(100)
    return bytes(out[:size])


def packed(tmp_path: Path, plain: bytes, frame: int = F) -> Any:
    src, dst = tmp_path / "plain", tmp_path / "stored"
    src.write_bytes(plain)
    block, stored = zs.compress_file(str(src), str(dst), 3, frame, threads=3)
    return block, stored, dst.read_bytes()


def unpacked(block: Dict[str, Any], stored: bytes, frame: int = F) -> bytes:
    out: List[bytes] = []
    zs.decompress_stream(zs.stored_frames(lambda off, n: stored[off:off + n], block["frames"]), block, frame,
                         out.append, threads=3)
    return b"".join(out)


@pytest.mark.parametrize("size", [0, 1, F - 1, F, F + 1, 5 * F + 123])
def test_round_trip(tmp_path: Path, size: int) -> None:
    plain = data(size)
    block, stored, blob = packed(tmp_path, plain)
    assert block["size"] == size and block["sha256"] == hashlib.sha256(plain).hexdigest()
    assert len(block["frames"]) == -(-size // F) and sum(block["frames"]) == len(blob) == stored["size"]
    assert stored["sha256"] == hashlib.sha256(blob).hexdigest()
    assert unpacked(block, blob) == plain
    assert (tmp_path / "stored").stat().st_mode & 0o777 == 0o600


def test_it_compresses_and_frames_are_independent(tmp_path: Path) -> None:
    plain = data(6 * F)
    block, _stored, blob = packed(tmp_path, plain)
    assert len(blob) < len(plain) // 4
    starts = zs.offsets(block["frames"])
    third = blob[starts[2]:starts[3]]
    assert zstandard.ZstdDecompressor().decompress(third) == plain[2 * F:3 * F]


@pytest.mark.parametrize("offset,length", [(0, 10), (F - 5, 10), (F, F), (2 * F - 1, 2 * F + 2), (0, 7 * F),
                                           (5 * F + 100, 1000), (6 * F, 10), (3, 0)])
def test_range_reads_across_frame_boundaries(tmp_path: Path, offset: int, length: int) -> None:
    plain = data(5 * F + 123 + F)
    block, _stored, blob = packed(tmp_path, plain)
    reads: List[Any] = []

    def read(off: int, n: int) -> bytes:
        reads.append((off, n))
        return blob[off:off + n]

    assert zs.read_plain(read, block, F, offset, length) == plain[offset:offset + length]
    wanted = (min(len(plain), offset + length) - 1) // F - offset // F + 1 if length and offset < len(plain) else 0
    starts = zs.offsets(block["frames"])
    read_bytes = sum(n for _off, n in reads)
    assert read_bytes == (starts[offset // F + wanted] - starts[offset // F] if wanted else 0), "only covering frames"


def test_a_corrupted_frame_is_refused(tmp_path: Path) -> None:
    plain = data(3 * F)
    block, _stored, blob = packed(tmp_path, plain)
    at = zs.offsets(block["frames"])[1] + block["frames"][1] // 2
    bad = blob[:at] + bytes([blob[at] ^ 0x40]) + blob[at + 1:]
    with pytest.raises(zs.CompressionError, match="corrupt"):
        unpacked(block, bad)
    with pytest.raises(zs.CompressionError, match="corrupt"):
        zs.read_plain(lambda off, n: bad[off:off + n], block, F, F + 10, 10)


def test_a_wrong_plaintext_digest_is_refused(tmp_path: Path) -> None:
    block, _stored, blob = packed(tmp_path, data(2 * F))
    with pytest.raises(zs.CompressionError, match="SHA256 mismatch"):
        unpacked(dict(block, sha256="0" * 64), blob)


def test_a_frame_inflating_past_its_declared_size_is_refused() -> None:
    """A bomb: a tiny frame of 64 MiB of zeros where the manifest declares F bytes; and one whose header hides
    its size. Neither is decompressed (nothing of 64 MiB is ever allocated)."""
    bomb = zstandard.ZstdCompressor(level=19).compress(bytes(64 << 20))
    assert len(bomb) < 4 << 10
    block = {"size": F, "sha256": "0" * 64, "frames": [len(bomb)]}
    with pytest.raises(zs.CompressionError, match="declares 67108864 plaintext bytes, the manifest 65536"):
        unpacked(block, bomb)
    hidden = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(64 << 20))
    with pytest.raises(zs.CompressionError, match="declares -1 plaintext bytes"):
        zs.read_plain(lambda off, n: hidden[off:off + n], dict(block, frames=[len(hidden)]), F, 0, 10)
    two = zstandard.ZstdCompressor().compress(bytes(F)) * 2  # two frames where one is declared
    with pytest.raises(zs.CompressionError, match="corrupt"):
        unpacked({"size": F, "sha256": "0" * 64, "frames": [len(two)]}, two)


def test_missing_or_extra_frames_are_refused(tmp_path: Path) -> None:
    block, _stored, blob = packed(tmp_path, data(3 * F))
    with pytest.raises(zs.CompressionError, match="2 frames, the manifest says 3"):
        unpacked(dict(block, frames=block["frames"][:2]), blob)
    short = blob[:-10]
    with pytest.raises(zs.CompressionError, match="short read"):
        unpacked(block, short)


def test_which_files_are_compressed() -> None:
    assert zs.worth("containers/w/criu/pages-1.img", 10)
    assert zs.worth("containers/w/criu/core-1.img", 1 << 20)
    assert not zs.worth("containers/w/criu/core-1.img", (1 << 20) - 1)
    assert zs.default("fs") in zs.CHOICES and zs.default("s3") in zs.CHOICES


def test_zstandard_missing_names_node_prep(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins  # pylint: disable=import-outside-toplevel
    real = builtins.__import__

    def fake(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "zstandard":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(zs.CompressionError, match="node_prep"):
        zs.require()


# --- the manifest's compression block (_schema) ----------------------------------------------------------

def manifest(block: Any, stored: int = 300, encrypted: bool = False) -> Dict[str, Any]:
    doc: Dict[str, Any] = {"schema": 1, "id": "20261204T120000Z-1a2b3c4d", "name": "w", "created_at":
                           "2026-12-04T12:00:00Z", "targets": [],
                           "files": [{"path": "containers/w/criu/pages-1.img", "size": stored, "sha256": "a" * 64}],
                           "compression": block}
    if encrypted:
        doc["encryption"] = {"alg": "x"}
    return doc


def good() -> Dict[str, Any]:
    return {"alg": zs.ALG, "level": 3, "frame": F,
            "files": {"containers/w/criu/pages-1.img": {"size": 2 * F + 1, "sha256": "b" * 64,
                                                        "frames": [100, 150, 50]}}}


def block_problems(doc: Dict[str, Any]) -> List[str]:
    return [p for p in sc.problems(doc, 99) if p.startswith("compression")]


def test_a_consistent_block_passes() -> None:
    assert block_problems(manifest(good())) == []
    assert block_problems(manifest(good(), stored=999, encrypted=True)) == []  # with encryption: checked at read


@pytest.mark.parametrize("change,why", [
    (lambda b: b["files"]["containers/w/criu/pages-1.img"].update(frames=[100, 200]), "not a list of 3"),
    (lambda b: b["files"]["containers/w/criu/pages-1.img"].update(size=10 * F), "not a list of 10"),
    (lambda b: b["files"]["containers/w/criu/pages-1.img"].update(frames=[100, 150, 51]), "add up to 301"),
    (lambda b: b["files"]["containers/w/criu/pages-1.img"].update(frames=[100, 0, 200]), "within zstd's bound"),
    (lambda b: b["files"]["containers/w/criu/pages-1.img"].update(frames=[10, 10, 280]), "within zstd's bound"),
    (lambda b: b["files"]["containers/w/criu/pages-1.img"].update(size=-1), "size: not an integer"),
    (lambda b: b["files"]["containers/w/criu/pages-1.img"].update(size=1 << 50), "size: not an integer"),
    (lambda b: b["files"]["containers/w/criu/pages-1.img"].update(sha256="x"), "sha256"),
    (lambda b: b["files"].update({"other.img": {"size": 1, "sha256": "b" * 64, "frames": [9]}}), "more than files"),
    (lambda b: b.update(frame=1 << 30), "compression.frame"),
    (lambda b: b.update(alg="gzip"), "compression.alg"),
    (lambda b: b.update(files=[]), "not a mapping"),
])
def test_an_inconsistent_block_is_refused(change: Any, why: str) -> None:
    block = good()
    change(block)
    found = block_problems(manifest(block))
    assert found and any(why in p for p in found), found


def test_a_block_naming_an_unlisted_file_is_refused() -> None:
    block = good()
    block["files"]["containers/w/criu/pages-2.img"] = block["files"].pop("containers/w/criu/pages-1.img")
    assert any("not listed in files" in p for p in block_problems(manifest(block)))
