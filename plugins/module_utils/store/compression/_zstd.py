# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Compression at rest: the format of a compressed snapshot file (``store_options.compression: zstd``).

A compressed file is a run of independent zstd frames, one per ``frame`` bytes of plaintext (4 MiB; the
last one shorter), each with its content size and checksum in its header. The manifest's ``compression``
block (signed with the rest of the manifest; shape checked by ``_schema``) says, per compressed file::

    "compression": {"alg": "zstd-frames-v1", "level": 3, "frame": 4194304,
                    "files": {"<files[].path>": {"size": <plaintext bytes>, "sha256": "<plaintext SHA256>",
                                                 "frames": [<stored bytes of frame 0>, ...]}}}

``files[]`` keeps describing the stored (compressed) bytes. Invariants:

- frame ``i`` holds plaintext bytes ``[i * frame, min((i + 1) * frame, size))`` and starts at the sum of the
  stored sizes before it: any plaintext range is read from the frames covering it alone, and frames are
  decompressed on every core;
- no frame is inflated past its declared plaintext length: its header must declare exactly that content size
  before it is decompressed (with that bound as the output limit, and no bytes after the frame), so a hostile
  frame cannot make a node allocate or write more than the manifest says (a decompression bomb);
- a whole file is accepted only when its plaintext SHA256 matches the manifest's.

Which files are compressed: page images (``pages-*.img``) and any file of at least ``WORTH`` bytes; smaller
images are stored as they are (compressing them saves little and costs a frame each).

Pure apart from file I/O; ``zstandard`` is imported on first use (``require``).
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import os
import threading
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._digest import ChunkedHasher, workers
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._schema import ZSTD_ALG

ALG = ZSTD_ALG
CHOICES = ("none", "zstd")
# The default of store_options.compression, per store kind: the one place it is set (docs say "per store kind").
# From docs/benchmarks.md (Compression, issue 24): "none" for both. A filesystem store is read in place and keeps
# the overlapped verify; an object store at 10 Gbit/s moved the demo server 1.55x slower compressed, incompressible
# memory gains nothing anywhere and costs ~9 s of compression per 4 GiB at checkpoint on 2 cores, and a compressed
# snapshot restores through a decompressed copy. Users on 1 Gbit/s-class links turn zstd on (demo: 5x faster).
DEFAULT: Dict[str, str] = {"fs": "none", "s3": "none"}
LEVEL = 3                  # store_options.compression_level's default
MIN_LEVEL, MAX_LEVEL = 1, 19
FRAME = 4 << 20            # plaintext bytes per frame
WORTH = 1 << 20            # files this large (and every pages-*.img) are compressed

Progress = Optional[Callable[[int], Any]]


class CompressionError(WarmstartError):
    """A compressed file that cannot be read back as the manifest says, or zstandard missing."""


def require() -> Any:
    """The ``zstandard`` module, or CompressionError saying how to get it."""
    try:
        import zstandard  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise CompressionError("the Python zstandard library is not installed for the module interpreter: "
                               "compressed snapshots need it (roles/node_prep installs it: python3-zstandard, "
                               "node_prep_zstandard)") from None
    return zstandard


def default(kind: str) -> str:
    """``store_options.compression`` when it is not given, for a store of ``kind``."""
    return DEFAULT.get(kind, "none")


def plain_size(doc: Dict[str, Any], entry: Dict[str, Any]) -> int:
    """The plaintext size of ``doc``'s file ``entry``: its compression block entry's, else the stored size."""
    block = doc.get("compression")
    meta = block["files"].get(entry["path"]) if isinstance(block, dict) else None
    return int(meta["size"]) if meta is not None else int(entry["size"])


def worth(rel: str, size: int) -> bool:
    """Whether the file ``rel`` of ``size`` bytes is stored compressed."""
    name = os.path.basename(rel)
    return (name.startswith("pages-") and name.endswith(".img")) or size >= WORTH


def frame_count(size: int, frame: int) -> int:
    return -(-size // frame)


def offsets(frames: List[int]) -> List[int]:
    """Where each stored frame starts, and (last) the stored size."""
    out, at = [0], 0
    for n in frames:
        at += n
        out.append(at)
    return out


def _window(items: Iterable[Any], fn: Callable[[Any], Any], threads: int) -> Iterator[Any]:
    """``fn`` over ``items`` on ``threads`` threads, results in order, at most 2 x ``threads`` in flight."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as pool:
        pending: List[Any] = []
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= 2 * threads:
                yield pending.pop(0).result()
        for future in pending:
            yield future.result()


def _reads(handle: Any, frame: int) -> Iterator[bytes]:
    while True:
        data = handle.read(frame)
        if not data:
            return
        yield data


def compress_file(src: str, dst: str, level: int = LEVEL, frame: int = FRAME, progress: Progress = None,
                  threads: Optional[int] = None) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """``src`` compressed into ``dst`` (0600), frames on every core: (block entry, stored ``files[]`` entry
    without its path) - the plaintext size, SHA256 and frame sizes; the stored size, SHA256 and chunk digests."""
    zstd = require()
    local = threading.local()

    def pack(data: bytes) -> Tuple[int, bytes]:
        if not hasattr(local, "cctx"):
            local.cctx = zstd.ZstdCompressor(level=level, write_checksum=True, write_content_size=True)
        return len(data), local.cctx.compress(data)

    plain, stored, frames, size = hashlib.sha256(), ChunkedHasher(), [], 0
    safefs.remove(dst)
    fd = safefs.create_file(dst)
    with open(src, "rb") as handle, os.fdopen(fd, "wb") as out:
        for length, packed in _window(_hashed(_reads(handle, frame), plain), pack, threads or workers()):
            stored.update(packed)
            out.write(packed)
            frames.append(len(packed))
            size += length
            if progress:
                progress(length)
    entry = stored.entry("")
    entry.pop("path")
    return {"size": size, "sha256": plain.hexdigest(), "frames": frames}, entry


def _hashed(reads: Iterator[bytes], digest: Any) -> Iterator[bytes]:
    """``reads`` in order, each hashed into ``digest`` as it is handed out."""
    for data in reads:
        digest.update(data)
        yield data


def unpack(zstd: Any, data: bytes, expected: int) -> bytes:
    """One stored frame decompressed: refused unless its header declares exactly ``expected`` bytes and it
    holds one frame only; never more than ``expected`` bytes are produced."""
    try:
        declared = zstd.frame_content_size(data)
    except zstd.ZstdError as exc:
        raise CompressionError(f"not a zstd frame ({exc})") from None
    if declared != expected:
        raise CompressionError(f"a frame declares {declared} plaintext bytes, the manifest {expected} "
                               "(corrupted, or inflating past its declared size)")
    dctx = zstd.ZstdDecompressor()
    try:
        try:
            out = dctx.decompress(data, max_output_size=expected, allow_extra_data=False)
        except TypeError:  # zstandard < 0.20 (Debian 12): bytes after the frame are ignored, never output
            out = dctx.decompress(data, max_output_size=expected)
    except zstd.ZstdError as exc:
        raise CompressionError(f"a frame does not decompress ({exc}; corrupted)") from None
    if len(out) != expected:
        raise CompressionError(f"a frame gave {len(out)} bytes, the manifest says {expected} (corrupted)")
    return bytes(out)


def plain_lengths(entry: Dict[str, Any], frame: int) -> List[int]:
    size = int(entry["size"])
    return [min(frame, size - i * frame) for i in range(frame_count(size, frame))]


def decompress_stream(stored: Iterable[bytes], entry: Dict[str, Any], frame: int, write: Callable[[bytes], Any],
                      progress: Progress = None, threads: Optional[int] = None) -> None:
    """The stored frames (in order, one item each) decompressed on every core and written in order; raises
    CompressionError unless they give exactly the manifest's plaintext (size and SHA256)."""
    zstd = require()
    lengths = plain_lengths(entry, frame)
    digest, seen = hashlib.sha256(), 0

    def one(item: Tuple[bytes, int]) -> bytes:
        return unpack(zstd, item[0], item[1])

    pairs = _paired(stored, lengths)
    for data in _window(pairs, one, threads or workers()):
        digest.update(data)
        write(data)
        seen += len(data)
        if progress:
            progress(len(data))
    if seen != int(entry["size"]) or digest.hexdigest() != entry["sha256"]:
        raise CompressionError("plaintext SHA256 mismatch (corrupted)")


def _paired(stored: Iterable[bytes], lengths: List[int]) -> Iterator[Tuple[bytes, int]]:
    count = 0
    for data in stored:
        if count >= len(lengths):
            raise CompressionError(f"more frames than the manifest's {len(lengths)}")
        yield data, lengths[count]
        count += 1
    if count != len(lengths):
        raise CompressionError(f"{count} frames, the manifest says {len(lengths)} (truncated)")


def stored_frames(read: Callable[[int, int], bytes], frames: List[int], first: int = 0,
                  last: Optional[int] = None, batch: int = 4 << 20) -> Iterator[bytes]:
    """Stored frames ``first``..``last`` (inclusive) read with ``read(offset, length)``, several frames per read
    up to ``batch`` bytes; a short read is an error."""
    last = len(frames) - 1 if last is None else last
    starts = offsets(frames)
    index = first
    while index <= last:
        end = index
        while end < last and starts[end + 2] - starts[index] <= batch:
            end += 1
        data = read(starts[index], starts[end + 1] - starts[index])
        if len(data) != starts[end + 1] - starts[index]:
            raise CompressionError(f"short read of the stored frames ({len(data)} of "
                                   f"{starts[end + 1] - starts[index]} bytes at {starts[index]})")
        for i in range(index, end + 1):
            yield data[starts[i] - starts[index]:starts[i + 1] - starts[index]]
        index = end + 1


def read_plain(read: Callable[[int, int], bytes], entry: Dict[str, Any], frame: int, offset: int,
               length: int) -> bytes:
    """``length`` plaintext bytes at ``offset`` (fewer past the end), decompressing only the frames covering them;
    each frame is bounded by its declared size (no whole-file digest: the frames' checksums catch corruption)."""
    zstd = require()
    size = int(entry["size"])
    end = min(size, offset + max(0, length))
    if offset < 0 or offset >= end:
        return b""
    first, last = offset // frame, (end - 1) // frame
    lengths = plain_lengths(entry, frame)
    parts = [unpack(zstd, data, lengths[first + i])
             for i, data in enumerate(stored_frames(read, list(entry["frames"]), first, last))]
    joined = b"".join(parts)
    return joined[offset - first * frame:end - first * frame]
