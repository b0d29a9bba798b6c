#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Synthetic benchmark workload: holds MIB MiB of resident, non-trivial memory.

  mem_workload.py MIB

Allocation is fast: 16 MiB of os.urandom is tiled over the buffer, then the
first 16 bytes of every 4 KiB page get a per-process salt and the page's
offset, so every page is written (resident), none is zero, and no two pages
are identical (nothing a zero-page or dedup shortcut could skip).

Talks to the benchmark through SNAPSHOT_CONTROL_DIR:
  ready-for-snapshot   written once the memory is in place: pid, rss_kib, crc
  memcheck             written on SIGUSR1: the CRC32 of the whole buffer, now
                       (the benchmark compares it with the one in the ready
                       file after a restore)

Standard library only; holds no file open but stdin/stdout/stderr.
"""
import os
import signal
import sys
import time
import zlib

PAGE = 4096
TILE = 16 << 20


def crc(view: memoryview) -> int:
    value = 0
    for off in range(0, len(view), 64 << 20):
        value = zlib.crc32(view[off:off + (64 << 20)], value)
    return value


def rss_kib() -> int:
    with open("/proc/self/status", "r", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def write_atomic(directory: str, name: str, text: str) -> None:
    path = os.path.join(directory, name)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="ascii") as handle:
        handle.write(text)
    os.rename(tmp, path)


def main() -> int:
    size = int(sys.argv[1]) << 20
    control = os.environ["SNAPSHOT_CONTROL_DIR"]
    mem = bytearray(size)
    view = memoryview(mem)
    seed = os.urandom(TILE)
    for off in range(0, size, TILE):
        n = min(TILE, size - off)
        view[off:off + n] = seed[:n]
    salt = os.urandom(8)
    for off in range(0, size, PAGE):
        view[off:off + 16] = salt + off.to_bytes(8, "little")
    del seed
    wanted = [False]

    def on_usr1(_signum, _frame):
        wanted[0] = True

    signal.signal(signal.SIGUSR1, on_usr1)
    write_atomic(control, "ready-for-snapshot",
                 f"pid={os.getpid()}\nrss_kib={rss_kib()}\ncrc={crc(view)}\nsize={size}\n")
    while True:
        time.sleep(0.05)
        if wanted[0]:
            wanted[0] = False
            write_atomic(control, "memcheck", f"crc={crc(view)}\nrss_kib={rss_kib()}\n")


if __name__ == "__main__":
    sys.exit(main())
