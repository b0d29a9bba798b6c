# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A dump's ``files.img``: its entries, and the regular files CRIU recorded with their size.

CRIU records the size of each regular file a process holds open for writing and refuses a restore where the
file has another size (``File ... has bad size``). The checkpoint compares the workload files it copies with
these sizes (``regular_files``); the TCP rewrite of a placeholder restore walks the same entries (``entries``).
"""
from __future__ import annotations

import os
import struct
from typing import Any, Dict, Iterator, NamedTuple, Tuple

HEADER = 8  # u32 IMG_COMMON magic, u32 FILES magic


class Recorded(NamedTuple):
    """A regular file as the dump saw it: its size and its open flags (``O_APPEND`` ...)."""

    size: int
    flags: int


def entries(data: bytes, where: str) -> Iterator[Tuple[bytes, Any]]:
    """Each entry of a ``files.img`` (its bytes, and the decoded ``file_entry``), after the image's header."""
    from pycriu.images import fdinfo_pb2  # pylint: disable=import-outside-toplevel  # present wherever CRIU runs
    off = HEADER
    while off + 4 <= len(data):
        (size,) = struct.unpack_from("<I", data, off)
        raw = data[off + 4:off + 4 + size]
        off += 4 + size
        entry = fdinfo_pb2.file_entry()
        entry.ParseFromString(raw)
        yield raw, entry
    if off != len(data):
        raise ValueError(f"{where}: {len(data) - off} bytes after its last entry")


def read(images_dir: str) -> Tuple[bytes, str]:
    """The bytes of ``images_dir``'s ``files.img`` and its path (FileNotFoundError when the dump has none)."""
    path = os.path.join(images_dir, "files.img")
    with open(path, "rb") as handle:
        return handle.read(), path


def regular_files(images_dir: str) -> Dict[str, Recorded]:
    """The regular files whose size the dump recorded, by path as the dumped processes saw it."""
    try:
        data, path = read(images_dir)
    except FileNotFoundError:
        return {}
    return {entry.reg.name: Recorded(entry.reg.size, entry.reg.flags) for _raw, entry in entries(data, path)
            if entry.HasField("reg") and entry.reg.HasField("size")}
