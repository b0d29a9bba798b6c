#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Standard-library client for demo/embed_server.py; prints JSON on stdout.

  client.py wait-ready URL [--timeout S] [--since EPOCH] [--embed TEXT]
      Poll URL/healthz until it answers ready. Prints seconds to ready and,
      with --embed, to the first answered /embed request: the "time to first
      answered request" the demo and the benchmarks report. --since measures
      from a wall-clock instant (e.g. `date +%s.%N` taken just before the start
      or restore) instead of from this client's own start. Exit 1 on timeout.
  client.py embed URL TEXT [TEXT ...]
      POST the texts to URL/embed and print the answer.
  client.py health URL
      Print URL/healthz (exit 0 when ready, 1 when not, 2 when unreachable).

URL is the server's base URL, e.g. http://127.0.0.1:8765 (a trailing
/healthz or /embed is accepted too). Proxy settings in the environment are
ignored: the server is local.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def base_url(url: str) -> str:
    url = url.rstrip("/")
    for suffix in ("/healthz", "/embed"):
        if url.endswith(suffix):
            url = url[: -len(suffix)]
    if "://" not in url:
        url = "http://" + url
    return url


def request(url: str, body=None, timeout: float = 10.0):
    """(status, parsed JSON or None); raises OSError when nothing answers."""
    data = None if body is None else json.dumps(body).encode("utf-8")
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with OPENER.open(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, None


def emit(doc: dict) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def wait_ready(args) -> int:
    t0_wall = args.since if args.since is not None else time.time()
    # Elapsed = wall clock now - t0; monotonic for the deadline.
    deadline = time.monotonic() + args.timeout
    url = base_url(args.url)
    polls, last = 0, None
    health = None
    while True:
        polls += 1
        try:
            status, health = request(url + "/healthz", timeout=min(5.0, args.timeout))
            if status == 200 and isinstance(health, dict) and health.get("ready"):
                break
            last = f"HTTP {status}" + (f" phase={health.get('phase')}" if isinstance(health, dict) else "")
        except (OSError, ValueError) as exc:
            last = str(getattr(exc, "reason", exc))
        if time.monotonic() >= deadline:
            emit({"ready": False, "url": url, "timeout": args.timeout, "polls": polls, "last": last,
                  "seconds": round(time.time() - t0_wall, 3)})
            return 1
        time.sleep(args.interval)
    out = {"ready": True, "url": url, "seconds_to_ready": round(time.time() - t0_wall, 3), "polls": polls,
           "pid": health.get("pid"), "restored": health.get("restored"), "instance": health.get("instance")}
    if args.embed is not None:
        status, doc = request(url + "/embed", {"texts": [args.embed]}, timeout=max(1.0, deadline - time.monotonic()))
        if status != 200 or not isinstance(doc, dict):
            out.update(first_answer=False, error=f"/embed answered HTTP {status}: {doc}")
            emit(out)
            return 1
        now = time.time()
        out.update(first_answer=True, seconds_to_first_answer=round(now - t0_wall, 3), first_answer_at=round(now, 3),
                   server_started_at=health.get("started_at"), dim=doc.get("dim"))
    out["seconds"] = out.get("seconds_to_first_answer", out["seconds_to_ready"])
    emit(out)
    return 0


def embed(args) -> int:
    try:
        status, doc = request(base_url(args.url) + "/embed", {"texts": args.texts}, timeout=args.timeout)
    except OSError as exc:
        emit({"error": str(getattr(exc, "reason", exc))})
        return 2
    emit(doc if isinstance(doc, dict) else {"status": status, "error": "answer is not JSON"})
    return 0 if status == 200 else 1


def health(args) -> int:
    try:
        status, doc = request(base_url(args.url) + "/healthz", timeout=args.timeout)
    except OSError as exc:
        emit({"ready": False, "error": str(getattr(exc, "reason", exc))})
        return 2
    emit(doc if isinstance(doc, dict) else {"ready": False, "status": status})
    return 0 if status == 200 else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("wait-ready", help="poll /healthz until ready; print seconds to ready")
    p.add_argument("url")
    p.add_argument("--timeout", type=float, default=300.0, help="give up after S seconds (default 300)")
    p.add_argument("--interval", type=float, default=0.05, help="poll interval in seconds (default 0.05)")
    p.add_argument("--since", type=float, default=None, help="measure from this Unix time instead of now")
    p.add_argument("--embed", default=None, metavar="TEXT", help="then embed TEXT; report time to first answer")
    p.set_defaults(func=wait_ready)

    p = sub.add_parser("embed", help="embed texts and print the answer")
    p.add_argument("url")
    p.add_argument("texts", nargs="+")
    p.add_argument("--timeout", type=float, default=60.0)
    p.set_defaults(func=embed)

    p = sub.add_parser("health", help="print /healthz")
    p.add_argument("url")
    p.add_argument("--timeout", type=float, default=5.0)
    p.set_defaults(func=health)

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
