# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Images for a lazy restore whose pages come from a page server (``_lazy.start(page_server=...)``).

CRIU reads some pages itself even in a lazy restore (those it cannot serve
lazily: entries of a pagemap without ``PE_LAZY``); the others the lazy-pages
daemon fetches from the page server on first touch. ``sparse_pages`` writes
each pages image locally as a sparse file of its full size that holds only
those eager ranges, read from the snapshot by the caller's ``read_range``
(``_pageranges`` checks each range against the manifest).
"""
from __future__ import annotations

import glob
import os
import struct
from typing import Any, Dict, List, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._lazy import LazyError

PAGE = 4096
PE_LAZY = 1 << 1
PE_PRESENT = 1 << 2


def entries(path: str) -> Tuple[int, List[Tuple[int, int, int]]]:
    """pages_id and (vaddr, nr_pages, flags) of each entry of a CRIU pagemap image."""
    try:
        from pycriu.images import pagemap_pb2  # pylint: disable=import-outside-toplevel
    except ImportError as exc:
        raise LazyError(f"pycriu cannot be imported ({exc}); prepare the node with warmstart.snapshot.node_prep") from None
    with open(path, "rb") as handle:
        data = handle.read()
    off, head, out = 8, None, []
    while off + 4 <= len(data):
        (size,) = struct.unpack_from("<I", data, off)
        off += 4
        msg = pagemap_pb2.pagemap_head() if head is None else pagemap_pb2.pagemap_entry()
        msg.ParseFromString(data[off:off + size])
        off += size
        if head is None:
            head = msg
        else:
            out.append((int(msg.vaddr), int(msg.nr_pages), int(msg.flags)))
    if head is None:
        raise LazyError(f"{path}: not a CRIU pagemap image")
    return int(head.pages_id), out


def eager_ranges(images: str) -> Dict[str, List[Tuple[int, int]]]:
    """Per pages image, the (offset, length) ranges a lazy restore reads itself (pages CRIU cannot serve lazily)."""
    out: Dict[str, List[Tuple[int, int]]] = {}
    for pagemap in sorted(glob.glob(os.path.join(images, "pagemap-*.img"))):
        pages_id, found = entries(pagemap)
        off = 0
        ranges: List[Tuple[int, int]] = []
        for _vaddr, nr, flags in found:
            if not flags & PE_PRESENT:
                continue
            length = nr * PAGE
            if not flags & PE_LAZY:
                if ranges and ranges[-1][0] + ranges[-1][1] == off:
                    ranges[-1] = (ranges[-1][0], ranges[-1][1] + length)
                else:
                    ranges.append((off, length))
            off += length
        out[f"pages-{pages_id}.img"] = ranges
    return out


def sparse_pages(images: str, sizes: Dict[str, int], read_range: Any) -> int:
    """Write each pages image as a sparse file of its full size holding only its eager ranges; bytes fetched.

    ``read_range(name, offset, length)`` returns those bytes of the snapshot's pages image ``name``.
    """
    fetched = 0
    for name, ranges in eager_ranges(images).items():
        if name not in sizes:
            raise LazyError(f"{name}: the snapshot has no such pages image (its pagemap names it)")
        path = os.path.join(images, name)
        safefs.remove(path)
        fd = safefs.create_file(path)
        try:
            os.ftruncate(fd, sizes[name])
            for off, length in ranges:
                data = read_range(name, off, length)
                if len(data) != length:
                    raise LazyError(f"{name}: short read at {off} ({len(data)} of {length} bytes)")
                os.pwrite(fd, data, off)
                fetched += length
        finally:
            os.close(fd)
    return fetched
