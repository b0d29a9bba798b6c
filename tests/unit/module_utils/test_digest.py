# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Chunk digests: one read gives both digests, every chunk is checked, corruption anywhere is found."""
from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _checksums as ck
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _digest as dg
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _schema as schema

MIB = 1 << 20


def _file(tmp_path: Path, size: int, name: str = "pages-1.img") -> Path:
    path = tmp_path / name
    path.write_bytes(os.urandom(size))
    return path


@pytest.mark.parametrize("size", [0, 1, MIB - 1, MIB, MIB + 1, 3 * MIB + 12345, 4 * MIB])
def test_an_entry_has_the_whole_digest_and_covering_chunks(tmp_path: Path, size: int) -> None:
    data = _file(tmp_path, size).read_bytes()
    entry = dg.hash_file(str(tmp_path / "pages-1.img"), "pages-1.img", chunk_size=MIB)
    assert entry["size"] == size and entry["sha256"] == hashlib.sha256(data).hexdigest()
    if size <= MIB:
        assert "chunks" not in entry  # one chunk would only repeat the whole digest
        return
    want = [hashlib.sha256(data[i:i + MIB]).hexdigest() for i in range(0, size, MIB)]
    assert entry["chunks"] == {"size": MIB, "sha256": want}
    out: list = []
    schema._files([entry], out)  # pylint: disable=protected-access
    assert out == []


def test_the_streaming_hasher_gives_the_same_entry_from_uneven_writes(tmp_path: Path) -> None:
    data = os.urandom(5 * MIB + 7)
    hasher = dg.ChunkedHasher(MIB)
    for start, end in [(0, 3), (3, MIB - 1), (MIB - 1, 2 * MIB + 5), (2 * MIB + 5, len(data))]:
        hasher.update(data[start:end])
    (tmp_path / "f").write_bytes(data)
    assert hasher.entry("f") == dg.hash_file(str(tmp_path / "f"), "f", chunk_size=MIB)


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_corrupted_chunk_anywhere_is_found(tmp_path: Path, where: str) -> None:
    path = _file(tmp_path, 5 * MIB + 100)
    entry = dg.hash_file(str(path), "pages-1.img", chunk_size=MIB)
    offset = {"first": 10, "middle": 2 * MIB + 17, "last": 5 * MIB + 99}[where]
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 1]))
    other = _file(tmp_path, 2 * MIB, "pages-2.img")
    good = dg.hash_file(str(other), "pages-2.img", chunk_size=MIB)
    assert dg.check_files([(str(path), entry), (str(other), good)], threads=3) == {str(path): False, str(other): True}


def test_an_old_entry_without_chunks_is_checked_whole(tmp_path: Path) -> None:
    path = _file(tmp_path, 3 * MIB)
    entry = {"path": "pages-1.img", "size": 3 * MIB, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    assert dg.pieces(entry) == [(0, 3 * MIB, entry["sha256"])]
    assert dg.check_files([(str(path), entry)]) == {str(path): True}
    assert dg.check_files([(str(path), dict(entry, sha256="0" * 64))]) == {str(path): False}


def test_hashing_uses_every_core_and_stops_when_cancelled(tmp_path: Path) -> None:
    path = _file(tmp_path, 4 * MIB)
    entry = dg.hash_file(str(path), "pages-1.img", chunk_size=MIB)
    assert len(dg.pieces(entry)) == 4 and dg.workers() >= 1
    cancel = threading.Event()
    cancel.set()
    assert dg.check_files([(str(path), entry)], cancel=cancel) == {str(path): False}


def test_a_symlink_or_missing_file_is_not_intact(tmp_path: Path) -> None:
    path = _file(tmp_path, 10)
    entry = dg.hash_file(str(path), "pages-1.img")
    os.symlink(path, tmp_path / "link")
    assert dg.check_files([(str(tmp_path / "link"), entry), (str(tmp_path / "gone"), entry)]) == {
        str(tmp_path / "link"): False, str(tmp_path / "gone"): False}


@pytest.mark.parametrize("chunks, why", [
    ({"size": MIB, "sha256": ["0" * 64]}, "1 digests for 3 chunks"),
    ({"size": 3 * MIB, "sha256": ["0" * 64]}, "not a power of two"),
    ({"size": 1024, "sha256": ["0" * 64] * 3072}, "not a power of two from"),
    ({"size": MIB, "sha256": ["0" * 64, "x", "0" * 64]}, "not a list of 64 lowercase hex"),
    ([], "not a mapping"),
])
def test_the_schema_refuses_chunks_that_do_not_cover_the_file(chunks: object, why: str) -> None:
    out: list = []
    schema._files([{"path": "pages-1.img", "size": 3 * MIB, "sha256": "0" * 64, "chunks": chunks}], out)  # pylint: disable=protected-access
    assert len(out) == 1 and why in out[0], out


def test_verify_files_finds_a_corrupt_chunk_and_defers_what_it_is_asked_to(tmp_path: Path) -> None:
    top = tmp_path / "snap"
    top.mkdir()
    for name, size in (("core-1.img", 100), ("pages-1.img", 3 * MIB + 5)):
        (top / name).write_bytes(os.urandom(size))
    doc = {"files": ck.record_files(str(top))}
    deferred: list = []
    assert ck.verify_files(str(top), doc, phase=False, defer={"pages-1.img"}, deferred=deferred) == []
    assert [e["path"] for _p, e in deferred] == ["pages-1.img"]
    with open(top / "pages-1.img", "r+b") as handle:
        handle.seek(3 * MIB)
        handle.write(b"\0" * 5)
    assert ck.hash_problems(deferred) == ["pages-1.img: SHA256 mismatch (corrupted)"]
    assert ck.verify_files(str(top), doc, phase=False) == ["pages-1.img: SHA256 mismatch (corrupted)"]
