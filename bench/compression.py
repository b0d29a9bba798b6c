#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""warmstart benchmark: does zstd make a snapshot's transfer faster, and over which links?

Run as root with the Python that has pycriu and python3-zstandard, from the checkout root:

    /usr/bin/python3 -m bench.compression [--mib 4096] [--links loopback,10gbit,1gbit] [--markdown docs/benchmarks.md]

It takes real snapshot images - a checkpoint of bench/mem_workload.py (``--mib``) and, when the demo venv
exists, of the demo embedding server (torch, MiniLM weights, a Python heap) - and moves each one from a
"store" network namespace to a "node" network namespace over a veth pair throttled with ``tc`` (tbf), and
over loopback, side by side in one run:

- ``none``: the bytes as they are;
- ``zstd-1`` / ``zstd-3``: compressed on the fly by the sender (zstd on every core), decompressed by the
  receiver (transfer-only compression: what a store node or a peer serving chunks would do);
- ``zstd-3 at rest``: compressed once when the snapshot is written (that time reported separately), sent
  as stored, decompressed by the receiver.

The receiver writes what it receives to a file and hashes it (as a restore's download does); every run's
SHA256 is checked against the source's. Both ends share this machine's cores: compression, decompression and
the transfer contend for them, which favours "none" on a 2-vCPU machine. The table goes into ``--markdown``
between ``<!-- compression:begin -->`` and ``<!-- compression:end -->``.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any, Dict, Iterator, List, Optional, Tuple

from bench import run as br

BEGIN, END = "<!-- compression:begin -->", "<!-- compression:end -->"
NS_STORE, NS_NODE = "wsbench-store", "wsbench-node"
VETH_STORE, VETH_NODE = "wsb-store0", "wsb-node0"
ADDR_STORE, ADDR_NODE = "10.231.0.1", "10.231.0.2"
MODES = ("none", "zstd-1", "zstd-3", "zstd-3 at rest")
READ = 1 << 20


# --- the two ends (run as ``python3 -m bench.compression send|receive``, inside a namespace) ---------------

def send(args: argparse.Namespace) -> int:
    """Accept one connection and stream the files (compressed with ``--level`` unless 0)."""
    import zstandard  # pylint: disable=import-outside-toplevel
    srv = socket.create_server((args.address, args.port))
    print("listening", flush=True)
    conn, _peer = srv.accept()
    with conn, conn.makefile("wb", buffering=READ) as out:
        sink: Any = zstandard.ZstdCompressor(level=args.level, threads=-1).stream_writer(out, closefd=False) \
            if args.level else out
        for path in args.files:
            with open(path, "rb") as handle:
                while True:
                    data = handle.read(READ)
                    if not data:
                        break
                    sink.write(data)
        if args.level:
            sink.flush(zstandard.FLUSH_FRAME)
        out.flush()
    return 0


def receive(args: argparse.Namespace) -> int:
    """Connect, decompress unless ``--level 0``, write to ``--out`` and hash; print seconds, bytes and SHA256."""
    import zstandard  # pylint: disable=import-outside-toplevel
    t0 = time.perf_counter()
    sock = socket.create_connection((args.address, args.port), timeout=600)
    digest, total, wire = hashlib.sha256(), 0, 0
    with sock, sock.makefile("rb", buffering=READ) as raw, open(args.out, "wb") as out:
        counted = _Counting(raw)
        source: Any = zstandard.ZstdDecompressor().stream_reader(counted, read_across_frames=True) \
            if args.compressed else counted
        while True:
            data = source.read(READ)
            if not data:
                break
            digest.update(data)
            out.write(data)
            total += len(data)
        wire = counted.n
    print(json.dumps({"seconds": time.perf_counter() - t0, "bytes": total, "wire_bytes": wire,
                      "sha256": digest.hexdigest()}), flush=True)
    return 0


class _Counting:
    """A reader that counts the bytes read through it (what crossed the link)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.n = 0

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(size)
        self.n += len(data)
        return data


# --- the link -------------------------------------------------------------------------------------------

def sh(*argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True)


@contextlib.contextmanager
def veth() -> Iterator[None]:
    """Two network namespaces joined by a veth pair (the store's end and the node's end)."""
    teardown()
    try:
        sh("ip", "netns", "add", NS_STORE)
        sh("ip", "netns", "add", NS_NODE)
        sh("ip", "link", "add", VETH_STORE, "netns", NS_STORE, "type", "veth", "peer", "name", VETH_NODE,
           "netns", NS_NODE)
        for ns, dev, addr in ((NS_STORE, VETH_STORE, ADDR_STORE), (NS_NODE, VETH_NODE, ADDR_NODE)):
            sh("ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield
    finally:
        teardown()


def teardown() -> None:
    for ns in (NS_STORE, NS_NODE):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def throttle(rate: str) -> None:
    """The store's egress limited to ``rate`` (tbf; burst sized for the rate)."""
    mbit = {"gbit": 1000, "mbit": 1}[rate[-4:]] * float(rate[:-4])
    burst = max(64 << 10, int(mbit * 1e6 / 8 / 250))  # 4 ms worth
    sh("ip", "netns", "exec", NS_STORE, "tc", "qdisc", "replace", "dev", VETH_STORE, "root", "tbf", "rate", rate,
       "burst", str(burst), "latency", "100ms")


# --- one transfer ---------------------------------------------------------------------------------------

def transfer(files: List[str], mode: str, link: str, out: str, port: int) -> Dict[str, Any]:
    """One transfer of ``files`` in ``mode`` over ``link``; the receiver's report."""
    level = {"none": 0, "zstd-1": 1, "zstd-3": 3, "zstd-3 at rest": 0}[mode]
    address = "127.0.0.1" if link == "loopback" else ADDR_STORE
    wrap = [] if link == "loopback" else ["ip", "netns", "exec", NS_STORE]
    wrap_node = [] if link == "loopback" else ["ip", "netns", "exec", NS_NODE]
    py = [sys.executable, "-m", "bench.compression"]
    argv = wrap + py + ["send", "--address", address, "--port", str(port), "--level", str(level), *files]
    sender = subprocess.Popen(argv, cwd=br.REPO, stdout=subprocess.PIPE, text=True)
    try:
        if sender.stdout is None or sender.stdout.readline().strip() != "listening":
            raise br.BenchError(f"{mode} over {link}: the sender did not start")
        got = subprocess.run(wrap_node + py + ["receive", "--address", address, "--port", str(port), "--out", out]
                             + (["--compressed"] if mode != "none" else []),
                             cwd=br.REPO, capture_output=True, text=True, check=True, timeout=1800)
    finally:
        sender.wait(timeout=60)
        with contextlib.suppress(OSError):
            os.unlink(out)
    return dict(json.loads(got.stdout.strip().splitlines()[-1]))


# --- data -------------------------------------------------------------------------------------------------

def images(E: SimpleNamespace, args: argparse.Namespace) -> List[Tuple[str, List[str], int]]:
    """(name, page and other image files, bytes) of each workload's checkpoint, in a store of this run."""
    store = E.st.FsStore(os.path.join(args.dir, "store"))
    wroot = os.path.join(args.dir, "workloads")
    out = []
    if args.mib > 0:
        src = br.start_mem_workload(E, args, "bench-zstd", args.mib)
        ck = E.ckpt.checkpoint(store, E.snap.resolve_target(None, None, "bench-zstd", wroot), "bench-zstd", {},
                               E.CriuOptions(), leave_running=False, criu_path=args.criu)
        br.LIVE.discard(src["pid"])
        br.reap()
        out.append((f"synthetic {args.mib} MiB (bench/mem_workload.py)", _files(store, ck["id"]), ck["size"]))
    if os.access(args.demo_python, os.X_OK):
        out.append(demo_images(E, args, store, wroot))
    else:
        br.log(f"{args.demo_python} missing: the demo server's snapshot is left out (demo/setup.sh makes it)")
    return out


def demo_images(E: SimpleNamespace, args: argparse.Namespace, store: Any, wroot: str) -> Tuple[str, List[str], int]:
    client = br.load_client()
    port = br.free_port()
    t0 = time.time()
    info = E.wl.start(wroot, "bench-zstd-demo", [args.demo_python, os.path.join(br.REPO, "demo", "embed_server.py"),
                                                 "--port", str(port)])
    br.LIVE.add(info["pid"])
    br.first_answer(client, f"http://127.0.0.1:{port}", t0, 600)
    E.ctl.wait_for(info["control"], E.ctl.READY, 60, alive=info["pid"])
    ck = E.ckpt.checkpoint(store, E.snap.resolve_target(None, None, "bench-zstd-demo", wroot), "bench-zstd-demo", {},
                           E.CriuOptions(), leave_running=False, criu_path=args.criu)
    br.LIVE.discard(info["pid"])
    br.reap()
    return "demo embedding server (torch, all-MiniLM-L6-v2)", _files(store, ck["id"]), ck["size"]


def _files(store: Any, snapshot_id: str) -> List[str]:
    doc = store.load(snapshot_id)
    top = store.snapshot_dir(snapshot_id)
    return [os.path.join(top, e["path"]) for e in doc["files"]]


def compress_at_rest(files: List[str], work: str) -> Tuple[List[str], float]:
    """The files compressed once (zstd -3 on every core), as a store would hold them; (paths, seconds)."""
    import zstandard  # pylint: disable=import-outside-toplevel
    os.makedirs(work, exist_ok=True)
    t0 = time.perf_counter()
    out = os.path.join(work, "all.zst")
    with open(out, "wb") as handle, zstandard.ZstdCompressor(level=3, threads=-1).stream_writer(handle) as sink:
        for path in files:
            with open(path, "rb") as src:
                shutil.copyfileobj(src, sink, READ)
    return [out], time.perf_counter() - t0


# --- the run ---------------------------------------------------------------------------------------------

def measure(E: SimpleNamespace, args: argparse.Namespace, header: Dict[str, Any]) -> Dict[str, Any]:
    results = dict(header, data=[])
    out = os.path.join(args.dir, "received.bin")
    for name, files, size in images(E, args):
        want = hashlib.sha256()
        for path in files:
            with open(path, "rb") as handle:
                for block in iter(lambda h=handle: h.read(READ), b""):
                    want.update(block)
        rest, rest_s = compress_at_rest(files, os.path.join(args.dir, "at-rest"))
        row: Dict[str, Any] = {"name": name, "bytes": size, "at_rest": {"seconds": rest_s,
                                                                        "bytes": os.path.getsize(rest[0])},
                               "links": {}}
        for link in args.links:
            row["links"][link] = one_link(link, files, rest, out, want.hexdigest(), args)
        results["data"].append(row)
        shutil.rmtree(os.path.join(args.dir, "at-rest"), ignore_errors=True)
    return results


def one_link(link: str, files: List[str], rest: List[str], out: str, want: str,
             args: argparse.Namespace) -> Dict[str, Any]:
    ctx = contextlib.nullcontext() if link == "loopback" else veth()
    got: Dict[str, Any] = {}
    with ctx:
        if link != "loopback":
            throttle(link)
        for rep in range(args.reps):
            order = list(MODES[rep % len(MODES):] + MODES[:rep % len(MODES)])
            for mode in order:
                br.settle(args, before_restore=True)
                res = transfer(rest if mode.endswith("at rest") else files, mode, link, out, br.free_port())
                if res["sha256"] != want:
                    raise br.BenchError(f"{mode} over {link}: received bytes differ from the source's")
                got.setdefault(mode, []).append(res)
                br.log(f"{link} {mode}: {res['seconds']:.2f} s, {res['wire_bytes'] / (1 << 20):.0f} MiB on the wire")
    return got


def _med(values: List[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2] if len(values) % 2 else (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2


def table(results: Dict[str, Any]) -> str:
    rows = ["| data | link | " + " | ".join(MODES) + " | on the wire, zstd-3 | best |",
            "|---|---|" + "---|" * len(MODES) + "---|---|"]
    for row in results["data"]:
        for link, runs in row["links"].items():
            secs = {m: _med([r["seconds"] for r in runs[m]]) for m in MODES}
            base = secs["none"]
            cells = [f"{secs[m]:.2f} s" + ("" if m == "none" else f" ({secs[m] / base:.2f}×)") for m in MODES]
            wire = _med([r["wire_bytes"] for r in runs["zstd-3"]]) / row["bytes"]
            best = min(MODES, key=lambda m: secs[m])
            rows.append(f"| {row['name']} | {link} | " + " | ".join(cells) + f" | {wire:.0%} | {best} |")
    return "\n".join(rows)


def markdown(results: Dict[str, Any]) -> str:
    m = results["machine"]
    rest = "; ".join(f"{r['name']}: {r['at_rest']['seconds']:.1f} s to {r['at_rest']['bytes'] / r['bytes']:.0%}"
                     for r in results["data"])
    return "\n".join([
        BEGIN, "## Compression: zstd over throttled links (`python3 -m bench.compression`)", "",
        f"Run {results['started_at']} on {m.get('cpu_model', '?')} ({m.get('cpus', '?')} vCPUs), kernel "
        f"{m.get('kernel', '?')}; command `{results['command']}`. A snapshot's images sent from one network "
        "namespace to another over a veth pair throttled with tc (tbf), and over loopback; the receiver writes "
        "and hashes what it gets, as a restore's download does. Medians; ratios to `none`.", "",
        table(results), "",
        f"Compressing at rest (zstd -3, every core) once, at checkpoint: {rest}.", "",
        "Sender and receiver share this machine's cores, so compression and decompression take CPU from each "
        "other and from the transfer; on separate nodes both ends have their own.",
        END])


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m bench.compression", description=__doc__.split("\n", 1)[0])
    sub = p.add_subparsers(dest="cmd")
    s = sub.add_parser("send")
    s.add_argument("--address", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--level", type=int, default=0)
    s.add_argument("files", nargs="+")
    r = sub.add_parser("receive")
    r.add_argument("--address", required=True)
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--compressed", action="store_true")
    p.add_argument("--dir", default=br.DEFAULT_DIR + "-zstd", help="work dir (default %(default)s)")
    p.add_argument("--mib", type=int, default=4096, help="synthetic workload size in MiB, 0: none (default %(default)s)")
    p.add_argument("--links", default="loopback,10gbit,1gbit", help="links (default %(default)s)")
    p.add_argument("--reps", type=int, default=2, help="repetitions per mode and link (default %(default)s)")
    p.add_argument("--demo-python", default=br.DEMO_PYTHON, help="the demo venv's python (default %(default)s)")
    p.add_argument("--criu", default=None, help="CRIU binary (default: the engine's find_criu)")
    p.add_argument("--markdown", default=None, metavar="PATH", help="put the table into this document")
    p.add_argument("--from-json", default=None, metavar="PATH", action="append",
                   help="render previous results JSONs (their rows together); run nothing")
    args = p.parse_args(argv)
    args.argv = argv if argv is not None else sys.argv[1:]
    args.links = [x for x in str(args.links).split(",") if x]
    args.drop_caches, args.no_sync = True, False
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.cmd == "send":
        return send(args)
    if args.cmd == "receive":
        return receive(args)
    if args.from_json:
        runs = [br.load_results(path) for path in args.from_json]
        results = dict(runs[0], data=[row for run in runs for row in run["data"]],
                       command=" ; ".join(run["command"] for run in runs))
    else:
        if os.geteuid() != 0:
            sys.stderr.write("bench.compression needs root (CRIU, network namespaces)\n")
            return 2
        E, header = br.prepare_run(args, "bench.compression", args.argv)
        try:
            results = measure(E, args, header)
        finally:
            br.kill_all(E)
            teardown()
            for sub in ("store", "workloads", "at-rest", "restore"):
                shutil.rmtree(os.path.join(args.dir, sub), ignore_errors=True)
        br.save_results(args, results)
    print(table(results))
    if args.markdown:
        br.write_section(args.markdown, markdown(results), BEGIN, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
