"""_crypt: the KEK ring, wrapping data keys, and the chunked file format (tamper, truncate, move, swap)."""
from __future__ import annotations

import base64
import hashlib
import io
import os
from pathlib import Path
from typing import List, Tuple

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store.security import _crypt as cr

SID, OTHER = "20261204T120000Z-0a1b2c3d", "20261204T120001Z-0a1b2c3e"
C = 4096  # a small chunk: files of a few chunks


def write_kek(top: Path, name: str, key: bytes = b"", mode: int = 0o600) -> bytes:
    key = key or os.urandom(32)
    top.mkdir(mode=0o700, exist_ok=True)
    path = top / f"{name}.key"
    path.write_text(base64.b64encode(key).decode() + "\n")
    path.chmod(mode)
    return key


def sealed(plain: bytes, key: bytes, rel: str = "a/pages-1.img", sid: str = SID) -> Tuple[bytes, str]:
    """(stored bytes, their sha256) of ``plain`` as encrypt_file writes them."""
    cipher = cr.FileCipher(key, sid, rel)
    out = io.BytesIO()
    for index, (chunk, last) in enumerate(cr._chunks_of(io.BytesIO(plain), C)):
        out.write(cipher.seal(index, last, chunk))
    return out.getvalue(), hashlib.sha256(out.getvalue()).hexdigest()


def chunks_of(stored: bytes) -> List[bytes]:
    return [stored[off:off + n] for _i, off, n in cr.spans(len(stored), C)]


def decrypt(stored: bytes, key: bytes, rel: str = "a/pages-1.img", sid: str = SID) -> bytes:
    out = io.BytesIO()
    cr.decrypt_stream(chunks_of(stored), cr.FileCipher(key, sid, rel), cr.chunk_count(len(stored), C), out.write)
    return out.getvalue()


# --- the ring -------------------------------------------------------------------------------------

def test_kek_id_is_the_documented_digest(tmp_path: Path) -> None:
    key = write_kek(tmp_path / "kek", "fleet")
    ring = cr.load_ring(str(tmp_path / "kek"))
    assert [(k.name, k.kid) for k in ring] == [("fleet", hashlib.sha256(b"warmstart-kek\0" + key).hexdigest()[:16])]
    assert key.hex() not in repr(ring) and "key=" not in repr(ring)


def test_writing_kek_choice(tmp_path: Path) -> None:
    top = tmp_path / "kek"
    with pytest.raises(cr.CryptError, match="cannot read .*node_prep_keks"):
        cr.writing_kek(str(top), None)
    top.mkdir(mode=0o700)
    with pytest.raises(cr.CryptError, match="no key-encryption key in"):
        cr.writing_kek(str(top), None)
    write_kek(top, "old")
    assert cr.writing_kek(str(top), None).name == "old"
    write_kek(top, "new")
    with pytest.raises(cr.CryptError, match=r"several key-encryption keys .*\(new, old\).*store_options.kek"):
        cr.writing_kek(str(top), None)
    assert cr.writing_kek(str(top), "new").name == "new"
    assert cr.writing_kek(str(top), "new.key").name == "new"
    with pytest.raises(cr.CryptError, match="'gone' .* is not in .*there: new, old"):
        cr.writing_kek(str(top), "gone")


# Fixed key bytes: the test ids are built from the parameters, and pytest-xdist's workers must collect the same ids.
@pytest.mark.parametrize("content,mode,why", [
    (base64.b64encode(bytes(range(32))), 0o640, "mode 0640 lets group or others read it"),
    (base64.b64encode(bytes(range(32))), 0o604, "mode 0604"),
    (b"not base64 !!", 0o600, "not base64 text"),
    (base64.b64encode(bytes(range(16))), 0o600, "16 bytes, expected 32"),
])
def test_bad_key_files_are_refused(tmp_path: Path, content: bytes, mode: int, why: str) -> None:
    top = tmp_path / "kek"
    top.mkdir()
    (top / "k.key").write_bytes(content)
    (top / "k.key").chmod(mode)
    with pytest.raises(cr.CryptError, match=why):
        cr.load_ring(str(top))


def test_symlinked_key_is_refused(tmp_path: Path) -> None:
    write_kek(tmp_path / "elsewhere", "real")
    (tmp_path / "kek").mkdir()
    (tmp_path / "kek" / "k.key").symlink_to(tmp_path / "elsewhere" / "real.key")
    with pytest.raises(cr.CryptError, match="cannot be read"):
        cr.load_ring(str(tmp_path / "kek"))


# --- data keys ------------------------------------------------------------------------------------

def test_wrap_unwrap_and_wrong_kek(tmp_path: Path) -> None:
    write_kek(tmp_path / "a", "a")
    write_kek(tmp_path / "b", "b")
    kek_a, kek_b = cr.load_ring(str(tmp_path / "a"))[0], cr.load_ring(str(tmp_path / "b"))[0]
    data_key = cr.new_data_key()
    block = cr.wrap(data_key, kek_a, SID)
    assert cr.check_block(block) == [] and block["kek_id"] == kek_a.kid and block["chunk"] == cr.CHUNK
    assert data_key.hex() not in str(block)
    assert cr.unwrap(block, kek_a, SID) == data_key
    with pytest.raises(cr.CryptError, match="does not unwrap with key-encryption key b"):
        cr.unwrap(block, kek_b, SID)
    with pytest.raises(cr.CryptError, match="copied from another snapshot"):
        cr.unwrap(block, kek_a, OTHER)  # the block bound to its snapshot id
    with pytest.raises(cr.CryptError, match="which is not in"):
        cr.find_kek(str(tmp_path / "b"), kek_a.kid)
    assert cr.find_kek(str(tmp_path / "a"), kek_a.kid).name == "a"


def test_check_block_lists_every_problem() -> None:
    assert cr.check_block("x") == ["encryption: not a mapping"]
    problems = cr.check_block({"alg": "rot13", "chunk": 1, "kek_id": "XYZ", "wrapped_key": "!!", "nonce": "AAAA"})
    assert [p.partition(" ")[0].partition(":")[0] for p in problems] == [
        "encryption.alg", "encryption.chunk", "encryption.kek_id", "encryption.wrapped_key", "encryption.nonce"]


# --- the file format ------------------------------------------------------------------------------

@pytest.mark.parametrize("plain", [0, 1, C - 1, C, C + 1, 3 * C, 3 * C + 17])
def test_sizes_round_trip(plain: int) -> None:
    stored = cr.stored_size(plain, C)
    assert cr.plain_size(stored, C) == plain
    assert cr.chunk_count(stored, C) == max(1, -(-plain // C))
    key = os.urandom(32)
    data = os.urandom(plain)
    blob, _digest = sealed(data, key)
    assert len(blob) == stored and decrypt(blob, key) == data


@pytest.mark.parametrize("stored", [0, 1, 15, C + 16 + 16, C + 16 + 5])
def test_impossible_stored_sizes_are_refused(stored: int) -> None:
    with pytest.raises(cr.CryptError, match="cannot be an encrypted file"):
        cr.plain_size(stored, C)


def test_empty_file_is_one_authenticated_chunk() -> None:
    key = os.urandom(32)
    blob, _digest = sealed(b"", key)
    assert len(blob) == 16 and decrypt(blob, key) == b""
    with pytest.raises(cr.CryptError, match="chunk 0 does not authenticate"):
        decrypt(blob, key, rel="another")


def test_tamper_truncate_move_and_swap_are_refused() -> None:
    key = os.urandom(32)
    data = os.urandom(3 * C + 100)
    blob, _digest = sealed(data, key)
    flipped = bytearray(blob)
    flipped[C + 16 + 5] ^= 1
    with pytest.raises(cr.CryptError, match="chunk 1 does not authenticate"):
        decrypt(bytes(flipped), key)
    parts = chunks_of(blob)
    with pytest.raises(cr.CryptError, match="chunk 1 does not authenticate"):  # truncated at a chunk border
        decrypt(b"".join(parts[:2]), key)
    with pytest.raises(cr.CryptError, match="chunk 1 does not authenticate"):  # a chunk dropped
        decrypt(parts[0] + parts[2] + parts[3], key)
    with pytest.raises(cr.CryptError, match="chunk 0 does not authenticate"):  # two chunks swapped
        decrypt(parts[1] + parts[0] + parts[2] + parts[3], key)
    with pytest.raises(cr.CryptError, match="chunk 0 does not authenticate"):  # another file's chunks
        decrypt(blob, key, rel="a/pages-2.img")
    with pytest.raises(cr.CryptError, match="chunk 0 does not authenticate"):  # the same file of another snapshot
        decrypt(blob, key, sid=OTHER)
    with pytest.raises(cr.CryptError, match="chunk 0 does not authenticate"):  # another snapshot's data key
        decrypt(blob, os.urandom(32))


def test_decrypt_stream_counts_chunks() -> None:
    key = os.urandom(32)
    blob, digest = sealed(os.urandom(2 * C), key)
    cipher = cr.FileCipher(key, SID, "a/pages-1.img")
    out: List[bytes] = []
    assert cr.decrypt_stream(chunks_of(blob), cipher, 2, out.append) == digest
    with pytest.raises(cr.CryptError, match="1 of 2 chunks read"):
        cr.decrypt_stream(chunks_of(blob)[:1], cipher, 2, out.append)
    with pytest.raises(cr.CryptError, match="more chunks than its size allows"):
        cr.decrypt_stream(chunks_of(blob) + [b"x" * 32], cipher, 2, out.append)


def test_encrypt_file_matches_the_format(tmp_path: Path) -> None:
    key = os.urandom(32)
    data = os.urandom(2 * C + 7)
    (tmp_path / "plain").write_bytes(data)
    seen: List[int] = []
    entry = cr.encrypt_file(str(tmp_path / "plain"), str(tmp_path / "stored"),
                            cr.FileCipher(key, SID, "a/pages-1.img"), C, seen.append)
    stored = (tmp_path / "stored").read_bytes()
    assert entry == {"path": "a/pages-1.img", "size": len(stored), "sha256": hashlib.sha256(stored).hexdigest()}
    assert sum(seen) == len(data) and (tmp_path / "stored").stat().st_mode & 0o777 == 0o600
    assert decrypt(stored, key) == data and data[:64] not in stored


def test_encrypt_file_records_chunk_digests_of_the_stored_bytes_of_a_large_file(tmp_path: Path) -> None:
    (tmp_path / "plain").write_bytes(os.urandom(3 * C))
    entry = cr.encrypt_file(str(tmp_path / "plain"), str(tmp_path / "stored"), cr.FileCipher(os.urandom(32), SID, "p"), C,
                            digest_chunk=1000)
    stored = (tmp_path / "stored").read_bytes()
    assert entry["chunks"]["size"] == 1000 and entry["size"] == len(stored) > 1000
    assert entry["chunks"]["sha256"] == [hashlib.sha256(stored[i:i + 1000]).hexdigest()
                                         for i in range(0, len(stored), 1000)]


@pytest.mark.parametrize("offset,length", [(0, 1), (C - 3, 6), (C, C), (C - 1, 2 * C + 2), (3 * C, 200),
                                           (3 * C + 40, 1000), (5 * C, 10), (0, 0)])
def test_range_reads_across_chunk_borders(offset: int, length: int) -> None:
    key = os.urandom(32)
    data = os.urandom(3 * C + 50)
    blob, _digest = sealed(data, key)
    reads: List[Tuple[int, int]] = []

    def read(off: int, n: int) -> bytes:
        reads.append((off, n))
        return blob[off:off + n]

    got = cr.read_plain(read, cr.FileCipher(key, SID, "a/pages-1.img"), len(blob), C, offset, length)
    assert got == data[offset:offset + length]
    assert all(off % (C + 16) == 0 for off, _n in reads), "only whole chunks are read"
    assert len(reads) == (0 if not got else (min(len(data), offset + length) - 1) // C - offset // C + 1)
    with pytest.raises(cr.CryptError, match="short read"):
        if got:
            cr.read_plain(lambda off, n: blob[off:off + n - 1], cr.FileCipher(key, SID, "a/pages-1.img"),
                          len(blob), C, offset, length)
        else:
            raise cr.CryptError("short read")
