# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""CRIU's page-server protocol, the side that serves a lazy restore, spoken by us: pages go to
``criu lazy-pages --page-server`` only as bytes the caller's reader returned (``_restorework`` gives a reader that
checks each piece of the store's page images against the manifest before it returns any of it).

The protocol (criu/page-xfer.c, CRIU 3.x to 4.2): every message starts with a ``page_server_iov`` - u32 cmd,
u64 nr_pages, u64 vaddr, u64 dst_id in native order and alignment (32 bytes on x86-64 and arm64). The low 16
bits of cmd are the command, the high ones its flags. ``PS_IOV_GET`` asks for ``nr_pages`` pages at ``vaddr`` of
the task whose images are ``pagemap-<dst_id>.img``; the answer is the header again, cmd ``PS_IOV_ADD_F`` with
flag ``PE_PRESENT``, nr_pages at most the asked (CRIU's client takes fewer), then the pages' bytes.
``PS_IOV_CLOSE`` and ``PS_IOV_FORCE_CLOSE`` end the session; each is answered with an int32 0.

Invariants:

- a page is sent only from bytes ``read`` returned for exactly its place in its pages image; ``read`` raising
  ends the session before any byte of that answer is sent (the lazy-pages daemon then fails, and the supervisor
  of the restore kills the tree before it runs on a page it never got: ``_lazy``);
- a request outside every present pagemap entry of its task, of a task the images do not hold, or a command
  this side does not serve ends the session with a ``WireError`` naming it;
- the index is built from the restore's own (verified) pagemap images; nothing here writes a file.
"""
from __future__ import annotations

import bisect
import glob
import os
import re
import socket
import struct
from typing import Callable, Dict, List, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _lazyimages as lzi
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

HEADER = struct.Struct("@IQQQ")  # struct page_server_iov, native alignment: 32 bytes
STATUS = struct.Struct("@i")
PS_IOV_ADD_F = 6
PS_IOV_GET = 7
PS_IOV_CLOSE = 0x1023
PS_IOV_FORCE_CLOSE = 0x1024
PS_CMD_BITS = 16
PAGE = lzi.PAGE
MAX_PAGES = 1024  # pages per answer at most (4 MiB; the client takes fewer than it asked): memory stays bounded

Reader = Callable[[str, int, int], bytes]  # (pages image name, offset, length) -> exactly those bytes, checked


class WireError(WarmstartError):
    """A session with the lazy-pages daemon that cannot go on (the message says why)."""


class PageIndex:
    """Where each present page of each task lies: (task id, vaddr) -> (pages image, offset)."""

    def __init__(self, entries: Dict[int, Tuple[str, List[Tuple[int, int, int]]]]) -> None:
        # task id -> (pages image name, sorted [(start vaddr, end vaddr, offset in the image)])
        self.tasks: Dict[int, Tuple[str, List[Tuple[int, int, int]]]] = entries
        self._starts = {pid: [r[0] for r in ranges] for pid, (_name, ranges) in entries.items()}

    @classmethod
    def from_images(cls, images: str) -> "PageIndex":
        """The index of the task pagemaps (``pagemap-<id>.img``) in ``images``."""
        tasks: Dict[int, Tuple[str, List[Tuple[int, int, int]]]] = {}
        for path in glob.glob(os.path.join(images, "pagemap-*.img")):
            found = re.fullmatch(r"pagemap-(\d+)\.img", os.path.basename(path))
            if not found:
                continue  # pagemap-shmem-*: shared memory is restored by CRIU itself
            pages_id, entries = lzi.entries(path)
            off, ranges = 0, []
            for vaddr, nr, flags in sorted(entries):
                if flags & lzi.PE_PRESENT:
                    ranges.append((vaddr, vaddr + nr * PAGE, off))
                    off += nr * PAGE
            tasks[int(found.group(1))] = (f"pages-{pages_id}.img", ranges)
        return cls(tasks)

    def locate(self, task: int, vaddr: int, nr_pages: int) -> Tuple[str, int, int]:
        """(pages image, offset, pages) of the run of ``nr_pages`` at ``vaddr``, cut at the end of its entry."""
        if task not in self.tasks:
            raise WireError(f"pages asked for task {task}, which the images do not hold")
        name, ranges = self.tasks[task]
        at = bisect.bisect_right(self._starts[task], vaddr) - 1
        if at < 0 or vaddr >= ranges[at][1] or vaddr % PAGE or nr_pages <= 0:
            raise WireError(f"task {task}: {nr_pages} page(s) at {vaddr:#x} are not in its pagemap")
        start, end, off = ranges[at]
        return name, off + (vaddr - start), min(nr_pages, (end - vaddr) // PAGE)


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        part = conn.recv(size - len(data))
        if not part:
            break
        data += part
    return data


def serve(conn: socket.socket, index: PageIndex, read: Reader, served: Optional[List[int]] = None) -> None:
    """Answer the daemon on ``conn`` until it closes the session (or goes away); ``served`` (if given) is
    [requests, bytes] as they are answered. Raises ``WireError`` (or what ``read`` raised) on the first request
    that cannot be answered - before sending any of its answer."""
    while True:
        head = _recv_exact(conn, HEADER.size)
        if not head:
            return  # the daemon went away: its exit code tells the supervisor how it ended
        if len(head) != HEADER.size:
            raise WireError(f"a request cut short ({len(head)} of {HEADER.size} bytes)")
        cmd, nr_pages, vaddr, task = HEADER.unpack(head)
        command = cmd & ((1 << PS_CMD_BITS) - 1)
        if command in (PS_IOV_CLOSE, PS_IOV_FORCE_CLOSE):
            conn.sendall(STATUS.pack(0))
            return
        if command != PS_IOV_GET:
            raise WireError(f"command {command:#x} is not one a lazy restore sends")
        name, offset, count = index.locate(task, vaddr, nr_pages)
        count = min(count, MAX_PAGES)
        data = read(name, offset, count * PAGE)
        if len(data) != count * PAGE:
            raise WireError(f"{name}: {len(data)} of {count * PAGE} bytes at {offset}")
        conn.sendall(HEADER.pack(PS_IOV_ADD_F | lzi.PE_PRESENT << PS_CMD_BITS, count, vaddr, task) + data)
        if served is not None:
            served[0] += 1
            served[1] += count * PAGE
