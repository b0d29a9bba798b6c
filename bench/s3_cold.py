#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""warmstart benchmark: a restore from S3 with the node's cache empty, against the same restore with it warm.

Run as root with the Python that has pycriu, from the checkout root (moto's server comes from .venv):

    /usr/bin/python3 -m bench.s3_cold [--sizes 1024,4096] [--reps 2] [--markdown docs/benchmarks.md]

moto's S3 server runs on loopback. For each size and repetition a fresh bench/mem_workload.py is
checkpointed into the bucket through ``_checkpoint.checkpoint`` (an S3 store with its own cache: the writing
node), then restored on a "new node" (another cache directory, this node's record of hashed files
forgotten, page cache dropped), side by side:

- cold: the new node's cache empty - every 64 MiB range is downloaded (several at once) and checked against
  its chunk digest as it arrives, then CRIU restores from the cache;
- warm: the same node again, its cache holding the snapshot - every cached file is hashed (chunks on every
  core) before CRIU restores, as a restore does for a cache it did not fill in this run.

It also times the bare download (``S3Store.local_dir`` alone, cache empty) and reports its rate: what the
S3 server on this machine delivers bounds the cold restore. Every restored process's memory is checked.
The table goes into ``--markdown`` between ``<!-- s3-cold:begin -->`` and ``<!-- s3-cold:end -->``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

from bench import REPO
from bench import run as br

BEGIN, END = "<!-- s3-cold:begin -->", "<!-- s3-cold:end -->"
BUCKET = "bench"


def moto(args: argparse.Namespace) -> subprocess.Popen:
    """moto's S3 server on loopback, with the bench bucket."""
    port = br.free_port()
    proc = subprocess.Popen([os.path.join(REPO, ".venv", "bin", "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    args.endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench-secret", AWS_DEFAULT_REGION="us-east-1")
    import boto3  # pylint: disable=import-outside-toplevel
    for _attempt in range(100):
        try:
            boto3.client("s3", endpoint_url=args.endpoint).create_bucket(Bucket=BUCKET)
            return proc
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.1)
    proc.kill()
    raise br.BenchError("moto's S3 server did not come up")


def s3_store(args: argparse.Namespace, cache: str) -> Any:
    from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _stores  # pylint: disable=import-outside-toplevel
    options = {"endpoint_url": args.endpoint, "cache_dir": cache, "concurrency": 8}
    return _stores.open_store(f"s3://{BUCKET}/cold", options)


def restore(E: SimpleNamespace, args: argparse.Namespace, sid: str, cache: str, src: Dict[str, Any],
            mib: int) -> Dict[str, Any]:
    E.cks.VerifiedFiles(sid).forget()
    br.settle(args, before_restore=True)
    store = s3_store(args, cache)
    t0 = time.perf_counter()
    rs = E.rs.restore(store, snapshot_id=sid, verify=True, criu_path=args.criu,
                      restore_root=os.path.join(args.dir, "restore"), workloads_root=os.path.join(args.dir, "workloads"))
    wall = time.perf_counter() - t0
    br.LIVE.add(rs["pid"])
    check = br.memcheck(E, src["control"], rs["pid"], src["crc"], mib)
    br.kill_tree(E, rs["pid"])
    shutil.rmtree(rs["work_dir"], ignore_errors=True)
    return {"wall": wall, "timings": rs["timings"], "transfer": rs.get("transfer"), "check": check}


def cycle(E: SimpleNamespace, args: argparse.Namespace, mib: int) -> Dict[str, Any]:
    name = f"bench-s3cold-{mib}"
    src = br.start_mem_workload(E, args, name, mib)
    writer = s3_store(args, os.path.join(args.dir, "cache-writer"))
    target = E.snap.resolve_target(None, None, name, os.path.join(args.dir, "workloads"))
    br.settle(args)
    ck = E.ckpt.checkpoint(writer, target, name, {"bench": "s3-cold"}, E.CriuOptions(), leave_running=False,
                           criu_path=args.criu)
    br.LIVE.discard(src["pid"])
    br.reap()
    node = os.path.join(args.dir, "cache-node")
    out: Dict[str, Any] = {"image_bytes": ck["size"]}
    shutil.rmtree(node, ignore_errors=True)
    br.settle(args, before_restore=True)
    t0 = time.perf_counter()
    s3_store(args, node).local_dir(ck["id"])
    out["download"] = {"wall": time.perf_counter() - t0}
    shutil.rmtree(node, ignore_errors=True)
    out["cold"] = restore(E, args, ck["id"], node, src, mib)
    out["warm"] = restore(E, args, ck["id"], node, src, mib)
    writer.delete(ck["id"])
    shutil.rmtree(node, ignore_errors=True)
    shutil.rmtree(os.path.join(args.dir, "cache-writer"), ignore_errors=True)
    br.log(f"{mib} MiB: download {out['download']['wall']:.2f} s, cold {out['cold']['wall']:.2f} s, "
           f"warm {out['warm']['wall']:.2f} s")
    return out


def _med(values: List[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(results: Dict[str, Any]) -> str:
    lines = ["| workload | image | download alone | restore, cache empty | restore, cache warm | ratio |",
             "|---|---|---|---|---|---|"]
    for size in results["sizes"]:
        reps = size["reps"]
        img = reps[0]["image_bytes"]
        down = _med([r["download"]["wall"] for r in reps])
        cold, warm = _med([r["cold"]["wall"] for r in reps]), _med([r["warm"]["wall"] for r in reps])
        lines.append(f"| {size['mib']} MiB synthetic, n={len(reps)} | {img / 2**30:.2f} GiB | {down:.2f} s "
                     f"({img / down / 1e6:.0f} MB/s) | {cold:.2f} s | {warm:.2f} s | **{cold / warm:.2f}×** |")
    return "\n".join(lines)


def markdown(results: Dict[str, Any]) -> str:
    m = results["machine"]
    return "\n".join([
        BEGIN, "## S3: a restore with the node's cache empty (`python3 -m bench.s3_cold`)", "",
        f"Run {results['started_at']} on {m.get('cpu_model')} ({m.get('cpus')} vCPUs), kernel {m.get('kernel')}; "
        f"moto's S3 server on loopback; page cache dropped before every restore; medians. Command: "
        f"`{results['command']}`.", "", table(results), "",
        "Cache empty: each 64 MiB range is downloaded (eight at once) and checked against its chunk digest as it "
        "arrives; nothing is hashed again before CRIU. Cache warm: every cached file is hashed on all cores "
        "first. Target: cache empty ≤ 1.3× cache warm. The download column is `S3Store.local_dir` alone: "
        "the rate the S3 server on this machine delivers, which bounds the cold restore - moto is a Python "
        "server sharing the machine's two cores with the client that hashes and writes what it receives.",
        END]) + "\n"


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m bench.s3_cold", description=__doc__.split("\n", 1)[0])
    p.add_argument("--dir", default=br.DEFAULT_DIR + "-s3cold", help="work dir (default %(default)s)")
    p.add_argument("--sizes", default="1024,4096", help="workload sizes in MiB (default %(default)s)")
    p.add_argument("--reps", type=int, default=2, help="repetitions per size (default %(default)s)")
    p.add_argument("--criu", default=None, help="CRIU binary (default: the engine's find_criu)")
    p.add_argument("--markdown", default=None, metavar="PATH", help="put the table into this document")
    p.add_argument("--from-json", default=None, metavar="PATH", help="render a previous results JSON; run nothing")
    args = p.parse_args(argv)
    args.drop_caches, args.no_sync = True, False
    return args


def measure(args: argparse.Namespace, argv: Optional[List[str]]) -> Dict[str, Any]:
    E, results = br.prepare_run(args, "bench.s3_cold", argv)
    results["sizes"] = []
    server = moto(args)
    try:
        for mib in [int(x) for x in args.sizes.split(",") if x.strip()]:
            results["sizes"].append({"mib": mib, "reps": [cycle(E, args, mib) for _rep in range(args.reps)]})
    finally:
        br.kill_all(E)
        server.kill()
        server.wait()
        for sub in ("restore", "workloads", "cache-node", "cache-writer"):
            shutil.rmtree(os.path.join(args.dir, sub), ignore_errors=True)
    br.save_results(args, results)
    return results


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    return br.bench_main(args, "bench.s3_cold", lambda: measure(args, argv), table, markdown, BEGIN, END)


if __name__ == "__main__":
    sys.exit(main())
