#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Synthetic "weights" server for bench/lazy.py: a big resident buffer, sparse reads per request.

  lazy_server.py MIB [--port P] [--host H] [--pages N]

Binds its port first, then builds its MIB MiB of "weights" (its weight
loading): 16 MiB of os.urandom tiled over the buffer, and a per-process salt
plus the page's offset stamped into the first 16 bytes of every 4 KiB page, so
every page is resident, none is zero and no two are alike (as
bench/mem_workload.py). Until then every request but /healthz answers 503.

HTTP/1.0, one connection per request, JSON answers:
  GET /healthz          {"ready": bool, "ready_at": epoch|null, "started_at": epoch, "pid", "size"}
  GET /answer?seed=S    the "inference": N pages (default 64) chosen by a PRNG seeded with S, one
                        from each of N equal slices of the buffer (so the reads are spread over all
                        of it), CRC32 over the full 4 KiB of each -> {"seed", "checksum", "pages",
                        "compute_s"}. The same seed gives the same answer from the same memory.
  GET /crc              CRC32 of the whole buffer (slow: about a second per GiB) and VmRSS.

Control directory (SNAPSHOT_CONTROL_DIR, when set): writes ready-for-snapshot (pid, port, size)
once the buffer is built. Holds no file open but stdin/stdout/stderr and the listening socket.
Standard library only.
"""
import argparse
import json
import os
import random
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, urlsplit

PAGE = 4096
TILE = 16 << 20


class State:
    def __init__(self, size: int, pages: int) -> None:
        self.size = size
        self.npages = size // PAGE
        self.pages = pages
        self.started_at = time.time()
        self.ready_at = None
        self.view = None

    def answer(self, seed: int) -> dict:
        t0 = time.perf_counter()
        rng = random.Random(seed)
        value = 0
        per = self.npages / self.pages
        for i in range(self.pages):
            page = int(i * per) + rng.randrange(max(1, int(per)))
            off = min(page, self.npages - 1) * PAGE
            value = zlib.crc32(self.view[off:off + PAGE], value)
        return {"seed": seed, "checksum": value, "pages": self.pages,
                "compute_s": round(time.perf_counter() - t0, 6)}

    def crc(self) -> dict:
        value = 0
        for off in range(0, self.size, 64 << 20):
            value = zlib.crc32(self.view[off:off + (64 << 20)], value)
        return {"crc": value, "rss_kib": rss_kib(), "size": self.size}


def rss_kib() -> int:
    with open("/proc/self/status", "r", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def build(size: int) -> memoryview:
    mem = bytearray(size)
    view = memoryview(mem)
    seed = os.urandom(TILE)
    for off in range(0, size, TILE):
        n = min(TILE, size - off)
        view[off:off + n] = seed[:n]
    salt = os.urandom(8)
    for off in range(0, size, PAGE):
        view[off:off + 16] = salt + off.to_bytes(8, "little")
    return view


def make_handler(state: State):
    class Handler(BaseHTTPRequestHandler):
        server_version = "warmstart-lazy-bench/1"
        timeout = 30

        def log_message(self, format, *args):  # pylint: disable=redefined-builtin
            pass

        def reply(self, code: int, body: dict) -> None:
            data = (json.dumps(body) + "\n").encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # pylint: disable=invalid-name
            url = urlsplit(self.path)
            ready = state.view is not None
            if url.path == "/healthz":
                self.reply(200 if ready else 503, {"ready": ready, "ready_at": state.ready_at,
                                                   "started_at": state.started_at, "pid": os.getpid(),
                                                   "size": state.size})
            elif not ready:
                self.reply(503, {"error": "loading"})
            elif url.path == "/answer":
                try:
                    seed = int(parse_qs(url.query).get("seed", ["0"])[0])
                except ValueError:
                    self.reply(400, {"error": "seed must be an integer"})
                    return
                self.reply(200, state.answer(seed))
            elif url.path == "/crc":
                self.reply(200, state.crc())
            else:
                self.reply(404, {"error": f"no such path {url.path}"})

    return Handler


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("mib", type=int)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--pages", type=int, default=64, help="pages read per answer (default 64)")
    args = parser.parse_args()
    state = State(args.mib << 20, args.pages)
    httpd = HTTPServer((args.host, args.port), make_handler(state))
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.5}, name="http", daemon=True).start()
    view = build(state.size)
    state.ready_at = time.time()
    state.view = view
    control = os.environ.get("SNAPSHOT_CONTROL_DIR")
    if control:
        path = os.path.join(control, "ready-for-snapshot")
        with open(path + ".tmp", "w", encoding="ascii") as handle:
            handle.write(f"pid={os.getpid()}\nport={httpd.server_address[1]}\nsize={state.size}\n")
        os.rename(path + ".tmp", path)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
