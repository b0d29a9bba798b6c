#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""warmstart benchmark: cold start vs eager restore vs lazy restore, and the machine's own bandwidth.

Run as root with the Python that has pycriu (the modules' interpreter):

    /usr/bin/python3 -m bench.lazy [--markdown docs/benchmarks.md] [--plot docs/benchmarks-lazy.png]   (from the checkout root)

In one run (see bench/README.md):

bandwidth  memcpy, disk write (buffered + fdatasync), page-cache read and disk read with the page
           cache dropped, on the filesystem of --dir.
synthetic  bench/lazy_server.py holding --weights-mib MiB of distinct, non-zero pages; every request
           reads 64 pages spread over the buffer and answers their CRC32. Per repetition: cold start
           (to first answer; "full memory" = the buffer built), engine checkpoint, then an eager and
           a lazy engine restore of that snapshot (order alternates). Each restored copy must give
           the cold process's answers for the same seeds and, once its memory is complete, the
           same CRC32 of the whole buffer.
demo       demo/embed_server.py (MiniLM): cold start to first answered /embed, checkpoint, eager
           and lazy restore to first answered /embed; embeddings must be identical to the cold ones.

Time to first answer: from just before the start / the restore call to the first answered request.
Time to full memory: cold = the server's own "loaded" instant; eager = the restore call returned;
lazy = the lazy-pages daemon reported the memory complete (``_lazy.wait``).

Results go to <dir>/results/<timestamp>.json; ``--markdown`` replaces the section between
``<!-- lazy:begin -->`` and ``<!-- lazy:end -->`` of that file (added when missing); ``--plot``
draws the bar chart with bench/plot.py under a Python that has matplotlib (``--plot-python``).
Standard library and the engine only.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import inspect
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

from . import HERE, REPO
from . import run as R  # engine loading, process helpers, machine facts

DEFAULT_DIR = "/var/tmp/warmstart-bench-lazy"
DEFAULT_PLOT_PYTHON = "/var/tmp/warmstart-bench-venv/bin/python"
FIRST_SEED = 1
CHECK_SEEDS = [1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233]
BEGIN, END = "<!-- lazy:begin -->", "<!-- lazy:end -->"
VERIFIED_ENV = "WARMSTART_VERIFIED_DIR"  # _checksums.VERIFIED_DIR_ENV


log = R.log
BenchError = R.BenchError


# --- the engine ---------------------------------------------------------------------

def load_engine() -> SimpleNamespace:
    E = R.load_engine()
    E.lazy = None
    E.lazy_problem = None
    try:
        E.lazy = importlib.import_module("ansible_collections.warmstart.snapshot.plugins.module_utils.criu._lazy")
    except ImportError as exc:
        E.lazy_problem = f"module_utils/criu/_lazy.py not importable: {exc}"
    params = inspect.signature(E.rs.restore).parameters
    if "lazy" not in params or "lazy_wait" not in params:
        E.lazy_problem = (E.lazy_problem + "; " if E.lazy_problem else "") + \
            "_restore.restore has no lazy / lazy_wait parameters"
    return E


# --- HTTP ---------------------------------------------------------------------------

CLIENT = R.load_client()  # demo/client.py: its request() (proxies off) serves the synthetic server too


def get(url: str, timeout: float = 60.0):
    """(status, parsed JSON or None); raises OSError when nothing answers."""
    return CLIENT.request(url, timeout=timeout)


def synth_first_answer(url: str, since: float, timeout: float, interval: float) -> Dict[str, Any]:
    """Poll /answer?seed=FIRST_SEED until it answers 200; seconds from ``since`` (epoch)."""
    deadline = time.monotonic() + timeout
    polls, last = 0, None
    while True:
        polls += 1
        try:
            status, doc = get(f"{url}/answer?seed={FIRST_SEED}", timeout=max(1.0, deadline - time.monotonic()))
            if status == 200 and isinstance(doc, dict):
                return {"seconds_to_first_answer": time.time() - since, "polls": polls, "answer": doc}
            last = f"HTTP {status} {doc}"
        except OSError as exc:
            last = str(getattr(exc, "reason", exc))
        if time.monotonic() >= deadline:
            raise BenchError(f"{url}: no answer within {timeout} s (last: {last})")
        time.sleep(interval)


def demo_first_answer(client: Any, url: str, since: float, timeout: float, interval: float) -> Dict[str, Any]:
    """demo/client.py wait-ready URL --since SINCE --embed TEXT, in this process."""
    return R.first_answer(client, url, since, timeout, interval)


# --- bandwidth ----------------------------------------------------------------------

def drop_caches() -> Optional[str]:
    """Drop the page cache; None when done, else why not."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as handle:
            handle.write("3\n")
        return None
    except OSError as exc:
        return f"echo 3 > /proc/sys/vm/drop_caches failed: {exc}"


def read_file(path: str, bufsize: int = 4 << 20) -> float:
    """Read the whole file into one reused buffer; seconds."""
    buf = bytearray(bufsize)
    view = memoryview(buf)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as handle:
        while handle.readinto(view):
            pass
    return time.perf_counter() - t0


def dd_read(path: str) -> Optional[float]:
    dd = shutil.which("dd")
    if not dd:
        return None
    t0 = time.perf_counter()
    res = subprocess.run([dd, f"if={path}", "of=/dev/null", "bs=4M"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, check=False)
    wall = time.perf_counter() - t0
    return wall if res.returncode == 0 else None


def measure_bandwidth(args: argparse.Namespace) -> Dict[str, Any]:
    """GB/s (1e9 bytes) of memcpy, disk write, page-cache read and cold disk read, on --dir's filesystem."""
    size = args.bandwidth_mib << 20
    out: Dict[str, Any] = {"file_bytes": size, "dir": args.dir}
    # memcpy: bytes(...) slice assignment is one memcpy; both buffers faulted in before timing
    mc = 512 << 20
    src = bytearray(os.urandom(16 << 20)) * (mc // (16 << 20))
    dst = bytearray(mc)
    dst[:] = src
    times = []
    for _pass in range(4):
        t0 = time.perf_counter()
        dst[:] = src
        times.append(time.perf_counter() - t0)
    out["memcpy"] = {"gb_per_s": mc / 1e9 / min(times), "bytes": mc, "passes": 4, "how": "best of 4 copies of 512 MiB (one memcpy each)"}
    del src, dst
    path = os.path.join(args.dir, "bandwidth.dat")
    tile = os.urandom(64 << 20)
    os.sync()
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        left = size
        while left > 0:
            left -= os.write(fd, tile[:min(len(tile), left)])
        os.fdatasync(fd)
    finally:
        os.close(fd)
    wall = time.perf_counter() - t0
    out["disk_write"] = {"gb_per_s": size / 1e9 / wall, "seconds": wall,
                         "how": f"{args.bandwidth_mib} MiB of random data, write() in 64 MiB blocks, then fdatasync; timed to the end of fdatasync"}
    # page cache: the file was just written through it; read it once untimed, then time two reads
    read_file(path)
    warm = [read_file(path) for _pass in range(2)]
    dd_warm = dd_read(path)
    out["page_cache_read"] = {"gb_per_s": size / 1e9 / min(warm), "seconds": min(warm),
                              "dd_gb_per_s": size / 1e9 / dd_warm if dd_warm else None,
                              "how": "read() into a reused 4 MiB buffer, file in the page cache, best of 2; dd bs=4M of=/dev/null alongside"}
    problem = drop_caches()
    if problem:
        out["disk_read_cold"] = {"gb_per_s": None, "problem": problem}
    else:
        cold = read_file(path)
        drop_caches()
        dd_cold = dd_read(path)
        out["disk_read_cold"] = {"gb_per_s": size / 1e9 / cold, "seconds": cold,
                                 "dd_gb_per_s": size / 1e9 / dd_cold if dd_cold else None,
                                 "how": "echo 3 > /proc/sys/vm/drop_caches, then read() into a reused 4 MiB buffer"
                                        " (kernel readahead); dd bs=4M after another drop alongside"}
    with contextlib.suppress(OSError):
        os.unlink(path)
    log("bandwidth: " + ", ".join(f"{k} {v['gb_per_s']:.2f} GB/s" for k, v in out.items()
                                  if isinstance(v, dict) and v.get("gb_per_s")))
    return out


# --- restores -----------------------------------------------------------------------

# variant -> (lazy, fresh node). Every restore verifies (the default); the plain variants on this node, which
# recorded its digests when it took the snapshot (_checksums.VerifiedFiles), the *_verify ones as a node that has
# not hashed these files yet: the eager restore hashes the page images while CRIU restores the tree stopped
# (_overlap), the lazy one serves each page from a piece checked when first read (_ondemand).
VARIANTS = {"eager": (False, False), "lazy": (True, False), "eager_verify": (False, True), "lazy_verify": (True, True),
            "lazy_ondemand": (True, True)}
ON_DEMAND = {"lazy_ondemand"}  # restore(lazy_verify="on_demand"): pages checked as they are served (_ondemand)
STARTS = ["cold", "eager", "lazy", "eager_verify", "lazy_verify", "lazy_ondemand"]
START_LABELS = {"cold": "cold start", "eager": "eager restore", "lazy": "lazy restore",
                "eager_verify": "eager restore, fresh node", "lazy_verify": "lazy restore, fresh node",
                "lazy_ondemand": "lazy restore, fresh node, pages checked on demand"}


def do_restore(E: SimpleNamespace, args: argparse.Namespace, store: Any, snap_id: str, variant: str) -> Dict[str, Any]:
    lazy, full = VARIANTS[variant]
    kwargs: Dict[str, Any] = {}
    if not E.lazy_problem:
        kwargs.update(lazy=lazy, lazy_wait=False, lazy_timeout=args.lazy_timeout)
    if variant in ON_DEMAND:
        kwargs.update(lazy_verify="on_demand")
    recorded = os.environ.get(VERIFIED_ENV)
    if full:  # an empty record: as on a node that has never hashed these files
        os.environ[VERIFIED_ENV] = os.path.join(args.dir, f"verified-none-{os.getpid()}-{time.monotonic_ns()}")
    try:
        return E.rs.restore(store, snapshot_id=snap_id, verify=True, criu_path=args.criu,
                            restore_root=os.path.join(args.dir, "restore"),
                            workloads_root=os.path.join(args.dir, "workloads"), **kwargs)
    finally:
        if full:
            shutil.rmtree(os.environ[VERIFIED_ENV], ignore_errors=True)
            os.environ[VERIFIED_ENV] = recorded or ""


def lazy_complete(E: SimpleNamespace, args: argparse.Namespace, rs: Dict[str, Any], t0: float) -> Dict[str, Any]:
    """Wait for the lazy-pages daemon's verdict; seconds from t0 (epoch) to memory complete."""
    info = dict(rs.get("lazy") or {})
    if not info.get("used"):
        raise BenchError(f"lazy restore requested but not used: {info.get('reason')!r}")
    state = E.lazy.wait(rs["work_dir"], args.lazy_timeout)
    if state.get("state") != "complete" or not state.get("complete_at"):
        raise BenchError(f"lazy pages did not complete: {state}")
    return {"lazy": info, "lazy_state": state, "full_memory_s": state["complete_at"] - t0,
            "fill_s_after_start": state["complete_at"] - state["started_at"] if state.get("started_at") else None}


def kill_restored(E: SimpleNamespace, rs: Dict[str, Any]) -> None:
    R.kill_tree(E, rs["pid"])
    daemon = (rs.get("lazy") or {}).get("daemon_pid")
    if daemon and E.proc.alive(daemon):
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(daemon, 0)
        E.proc.wait_gone(daemon, 30)
    R.reap()
    shutil.rmtree(rs["work_dir"], ignore_errors=True)


def variants_for(E: SimpleNamespace, args: argparse.Namespace, rep: int) -> List[str]:
    """The restores of one repetition, in the order they run (rotating by repetition)."""
    names = [v for v in VARIANTS if (args.verify == "both" or VARIANTS[v][1] == (args.verify == "full"))
             and not (E.lazy_problem and VARIANTS[v][0])]
    k = rep % len(names)
    return names[k:] + names[:k]


# --- synthetic server ---------------------------------------------------------------

def synth_rep(E: SimpleNamespace, args: argparse.Namespace, rep: int, port: int) -> Dict[str, Any]:
    url = f"http://127.0.0.1:{port}"
    name = "bench-lazy-synth"
    wroot = os.path.join(args.dir, "workloads")
    store = E.st.FsStore(os.path.join(args.dir, "store"))
    shutil.rmtree(E.wl.paths(wroot, name)["dir"], ignore_errors=True)
    R.settle(args)
    log(f"synthetic {args.weights_mib} MiB rep {rep + 1}/{args.reps}: cold start")
    t0 = time.time()
    info = E.wl.start(wroot, name, ["/usr/bin/python3", os.path.join(HERE, "lazy_server.py"), str(args.weights_mib),
                                    "--port", str(port), "--pages", str(args.pages)])
    R.LIVE.add(info["pid"])
    fa = synth_first_answer(url, t0, args.timeout, args.interval)
    _st, health = get(url + "/healthz")
    cold = {"first_answer_s": fa["seconds_to_first_answer"], "full_memory_s": health["ready_at"] - t0,
            "load_s": health["ready_at"] - health["started_at"], "answer_compute_s": fa["answer"]["compute_s"]}
    E.ctl.wait_for(info["control"], E.ctl.READY, 60, alive=info["pid"])
    ref = {s: get(f"{url}/answer?seed={s}")[1]["checksum"] for s in CHECK_SEEDS}
    if ref[FIRST_SEED] != fa["answer"]["checksum"]:
        raise BenchError("the cold server answers the same seed differently twice")
    _st, ref_crc = get(url + "/crc", timeout=600)
    R.reap()
    target = E.snap.resolve_target(None, None, name, wroot)
    R.settle(args)
    t1 = time.perf_counter()
    ck = E.ckpt.checkpoint(store, target, "bench-lazy-synth", {"bench": "lazy"}, E.CriuOptions(),
                           leave_running=False, criu_path=args.criu)
    ck_wall = time.perf_counter() - t1
    R.LIVE.discard(info["pid"])
    R.reap()
    row: Dict[str, Any] = {"rep": rep + 1, "cold": cold, "reference_crc": ref_crc,
                           "checkpoint": {"wall": ck_wall, "timings": ck["timings"], "image_bytes": ck["size"],
                                          "criu_stats": ck["criu_stats"]}}
    row["order"] = variants_for(E, args, rep)
    for variant in row["order"]:
        R.settle(args, before_restore=True)
        log(f"synthetic rep {rep + 1}/{args.reps}: {variant} restore")
        t0 = time.time()
        rs = do_restore(E, args, store, ck["id"], variant)
        returned = time.time() - t0
        R.LIVE.add(rs["pid"])
        try:
            fa = synth_first_answer(url, t0, args.timeout, args.interval)
            if fa["answer"]["checksum"] != ref[FIRST_SEED]:
                raise BenchError(f"synthetic {variant}: first answer {fa['answer']['checksum']} != cold {ref[FIRST_SEED]}")
            # the other seeds right away: for lazy, while memory is still being filled
            got = {s: get(f"{url}/answer?seed={s}")[1]["checksum"] for s in CHECK_SEEDS}
            answers_ok = got == ref
            out: Dict[str, Any] = {"returned_s": returned, "first_answer_s": fa["seconds_to_first_answer"],
                                   "answer_compute_s": fa["answer"]["compute_s"], "timings": rs["timings"],
                                   "criu_stats": rs.get("criu_stats"), "answers_identical": answers_ok}
            if VARIANTS[variant][0]:
                out.update(lazy_complete(E, args, rs, t0))
            else:
                out["full_memory_s"] = returned
                out["lazy"] = rs.get("lazy")
            _st, crc = get(url + "/crc", timeout=600)
            out["crc_identical"] = crc.get("crc") == ref_crc["crc"]
            out["rss_kib"] = crc.get("rss_kib")
        finally:
            kill_restored(E, rs)
        if not answers_ok:
            raise BenchError(f"synthetic {variant}: answers after restore differ from the cold process's: {got} vs {ref}")
        if not out["crc_identical"]:
            raise BenchError(f"synthetic {variant}: CRC32 of the buffer {crc} != cold {ref_crc}")
        row[variant] = out
    store.delete(ck["id"])
    log(f"  cold {cold['first_answer_s']:.2f}s / {cold['full_memory_s']:.2f}s; ckpt {ck_wall:.2f}s; "
        + ", ".join(f"{v} {row[v]['first_answer_s']:.2f}s / {row[v]['full_memory_s']:.2f}s" for v in row["order"]))
    return row


# --- demo ---------------------------------------------------------------------------

def demo_rep(E: SimpleNamespace, args: argparse.Namespace, rep: int, port: int, client: Any) -> Dict[str, Any]:
    url = f"http://127.0.0.1:{port}"
    name = "bench-lazy-demo"
    wroot = os.path.join(args.dir, "workloads")
    store = E.st.FsStore(os.path.join(args.dir, "store"))
    shutil.rmtree(E.wl.paths(wroot, name)["dir"], ignore_errors=True)
    R.settle(args)
    log(f"demo rep {rep + 1}/{args.demo_reps}: cold start")
    t0 = time.time()
    info = E.wl.start(wroot, name, [args.demo_python, os.path.join(REPO, "demo", "embed_server.py"), "--port", str(port)])
    R.LIVE.add(info["pid"])
    fa = demo_first_answer(client, url, t0, args.demo_timeout, args.interval)
    _st, health = get(url + "/healthz")
    cold = {"first_answer_s": fa["seconds_to_first_answer"], "full_memory_s": health["ready_at"] - t0,
            "ready_s": fa["seconds_to_ready"]}
    ref = R.embeddings(client, url)
    R.reap()
    E.ctl.wait_for(info["control"], E.ctl.READY, 60, alive=info["pid"])
    target = E.snap.resolve_target(None, None, name, wroot)
    R.settle(args)
    t1 = time.perf_counter()
    ck = E.ckpt.checkpoint(store, target, "bench-lazy-demo", {"bench": "lazy"}, E.CriuOptions(),
                           leave_running=False, criu_path=args.criu)
    ck_wall = time.perf_counter() - t1
    R.LIVE.discard(info["pid"])
    R.reap()
    row: Dict[str, Any] = {"rep": rep + 1, "cold": cold,
                           "checkpoint": {"wall": ck_wall, "timings": ck["timings"], "image_bytes": ck["size"],
                                          "criu_stats": ck["criu_stats"]}}
    row["order"] = variants_for(E, args, rep)
    for variant in row["order"]:
        R.settle(args, before_restore=True)
        log(f"demo rep {rep + 1}/{args.demo_reps}: {variant} restore")
        t0 = time.time()
        rs = do_restore(E, args, store, ck["id"], variant)
        returned = time.time() - t0
        R.LIVE.add(rs["pid"])
        try:
            fa = demo_first_answer(client, url, t0, args.demo_timeout, args.interval)
            same = R.embeddings(client, url) == ref
            out: Dict[str, Any] = {"returned_s": returned, "first_answer_s": fa["seconds_to_first_answer"],
                                   "ready_s": fa["seconds_to_ready"], "timings": rs["timings"],
                                   "criu_stats": rs.get("criu_stats"), "embeddings_identical": same}
            if VARIANTS[variant][0]:
                out.update(lazy_complete(E, args, rs, t0))
                out["embeddings_identical_after_complete"] = R.embeddings(client, url) == ref
            else:
                out["full_memory_s"] = returned
                out["lazy"] = rs.get("lazy")
        finally:
            kill_restored(E, rs)
        if not same or not out.get("embeddings_identical_after_complete", True):
            raise BenchError(f"demo {variant}: embeddings after restore differ from the cold process's")
        row[variant] = out
    store.delete(ck["id"])
    log(f"  cold {cold['first_answer_s']:.2f}s / {cold['full_memory_s']:.2f}s; ckpt {ck_wall:.2f}s; "
        + ", ".join(f"{v} {row[v]['first_answer_s']:.2f}s / {row[v]['full_memory_s']:.2f}s" for v in row["order"]))
    return row


# --- summary ------------------------------------------------------------------------

def summ(values: List[Optional[float]]) -> Dict[str, Any]:
    return R.summ([v for v in values if v is not None])


def summarize(results: Dict[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for part in ("synthetic", "demo"):
        reps = (results.get(part) or {}).get("reps") or []
        if not reps:
            continue
        s: Dict[str, Any] = {"n": len(reps)}
        for start in STARTS:
            rows = [r[start] for r in reps if start in r]
            if not rows:
                continue
            s[start] = {"first_answer_s": summ([x["first_answer_s"] for x in rows]),
                        "full_memory_s": summ([x["full_memory_s"] for x in rows]),
                        "answer_compute_s": summ([x.get("answer_compute_s") for x in rows])}
            if start != "cold":
                s[start]["returned_s"] = summ([x["returned_s"] for x in rows])
                s[start]["criu_restore_s"] = summ([x["timings"].get("restore") for x in rows])
                s[start]["preflight_s"] = summ([x["timings"].get("preflight") for x in rows])
        image = [r["checkpoint"]["image_bytes"] for r in reps]
        s["image_bytes"] = statistics.median(image)
        s["checkpoint_s"] = summ([r["checkpoint"]["wall"] for r in reps])
        s["checkpoint_dump_s"] = summ([r["checkpoint"]["timings"].get("dump") for r in reps])
        s["checkpoint_gb_per_s"] = summ([r["checkpoint"]["image_bytes"] / 1e9 / r["checkpoint"]["wall"] for r in reps])
        s["checkpoint_dump_gb_per_s"] = summ([r["checkpoint"]["image_bytes"] / 1e9 / r["checkpoint"]["timings"]["dump"]
                                              for r in reps if r["checkpoint"]["timings"].get("dump")])
        gbps: Dict[str, Any] = {}
        for start in STARTS[1:]:
            rows = [(r["checkpoint"]["image_bytes"], r[start]) for r in reps if start in r]
            if not rows:
                continue
            if VARIANTS[start][0]:
                gbps[start] = {"to_full_memory": summ([b / 1e9 / x["full_memory_s"] for b, x in rows])}
            else:
                gbps[start] = {"call": summ([b / 1e9 / x["returned_s"] for b, x in rows]),
                               "criu_phase": summ([b / 1e9 / x["timings"]["restore"] for b, x in rows
                                                   if x["timings"].get("restore")])}
        s["restore_gb_per_s"] = gbps

        fa = {k: (s.get(k) or {}).get("first_answer_s", {}) for k in STARTS}
        s["ratios"] = {"cold_over_lazy": R.ratio(fa["cold"], fa["lazy"]),
                       "eager_over_lazy": R.ratio(fa["eager"], fa["lazy"]),
                       "cold_over_eager": R.ratio(fa["cold"], fa["eager"]),
                       "cold_over_lazy_verify": R.ratio(fa["cold"], fa["lazy_verify"]),
                       "eager_verify_over_lazy_verify": R.ratio(fa["eager_verify"], fa["lazy_verify"]),
                       "lazy_verify_over_lazy": R.ratio(fa["lazy_verify"], fa["lazy"]),
                       "lazy_ondemand_over_lazy": R.ratio(fa["lazy_ondemand"], fa["lazy"]),
                       "lazy_ondemand_over_lazy_verify": R.ratio(fa["lazy_ondemand"], fa["lazy_verify"])}
        out[part] = s
    return out


def fmt(s: Optional[Dict[str, Any]], unit: str = "s", digits: int = 2) -> str:
    if not s or not s.get("n"):
        return "–"
    text = f"{s['median']:.{digits}f} {unit}"
    if s["n"] > 1:
        text += f" ({s['min']:.{digits}f}–{s['max']:.{digits}f})"
    return text


def xr(value: Optional[float], digits: int = 1) -> str:
    return f"{value:.{digits}f}×" if value else "–"


def med(s: Dict[str, Any], start: str, key: str) -> Optional[float]:
    v = (s.get(start) or {}).get(key) or {}
    return v.get("median") if v.get("n") else None


def headline(label: str, s: Dict[str, Any]) -> List[str]:
    lazy = "lazy" if "lazy" in s else ("lazy_verify" if "lazy_verify" in s else None)
    eager = "eager" if lazy == "lazy" else "eager_verify"
    if not lazy or eager not in s:
        return []
    fl, fe, fc = med(s, lazy, "first_answer_s"), med(s, eager, "first_answer_s"), med(s, "cold", "first_answer_s")
    ml, me = med(s, lazy, "full_memory_s"), med(s, eager, "full_memory_s")
    text = (f"- **{label}**: the lazy restore answers first after {fl:.2f} s: {fe / fl:.1f}× sooner than the eager"
            f" restore ({fe:.2f} s) and {fc / fl:.1f}× sooner than a cold start ({fc:.2f} s). Its memory is complete"
            f" after {ml:.2f} s, {'later' if ml > me else 'sooner'} than the eager restore's {me:.2f} s"
            f" ({ml / me:.1f}×).")
    if lazy == "lazy" and "lazy_verify" in s and "eager_verify" in s:
        fresh = med(s, 'lazy_verify', 'first_answer_s')
        text += (f" On a node that has not verified the images yet they take {fresh:.2f} s lazy (page images hashed"
                 f" first) / {med(s, 'eager_verify', 'first_answer_s'):.2f} s eager (hashed while CRIU restores)")
        demand = med(s, 'lazy_ondemand', 'first_answer_s')
        if demand:
            text += (f", and {demand:.2f} s lazy with the pages checked on demand"
                     f" (resumed after {med(s, 'lazy_ondemand', 'returned_s') or 0:.2f} s)")
        text += "."
    return [text]


def section(results: Dict[str, Any]) -> str:
    s = results["summary"]
    m = results["machine"]
    o = results["options"]
    bw = results.get("bandwidth") or {}
    labels = {"synthetic": f"synthetic, {o['weights_mib']} MiB of weights", "demo": "demo embedding server (MiniLM)"}
    lines = [BEGIN, "## Lazy restore: time to first answer vs time to full memory", "",
             f"Generated by `bench/lazy.py` from the run of {results['started_at']} (results JSON:"
             f" `{results['results_path']}`) on {m['cpus']} vCPUs ({m['cpu_model']}), {m['mem_gib']} GiB,"
             f" kernel {m['kernel']}, CRIU {m['criu']}; load average at start {m['loadavg_at_start'].split()[0]}."
             " Measured, not asserted by any test.", ""]
    if results.get("lazy_problem"):
        lines += [f"**Lazy restore was not measured:** {results['lazy_problem']}.", ""]
    for part in ("synthetic", "demo"):
        if part in s:
            lines += headline(labels[part], s[part])
    lines += ["", "| server | start | time to first answer | time to full memory | restore call returned | n |",
              "|---|---|---|---|---|---|"]
    for part in ("synthetic", "demo"):
        if part not in s:
            continue
        for start in STARTS:
            if start in s[part]:
                p = s[part][start]
                lines.append(f"| {labels[part]} | {START_LABELS[start]} | {fmt(p['first_answer_s'])} |"
                             f" {fmt(p['full_memory_s'])} | {fmt(p.get('returned_s'))} | {p['first_answer_s']['n']} |")
    lines += ["", "Medians (min–max). Ratios of the medians, time to first answer:", "",
              "| server | cold / lazy | eager / lazy | cold / eager | fresh node: cold / lazy | fresh node: eager / lazy |"
              " fresh-node lazy / lazy (target ≤ 1.5×) | … on demand / lazy |",
              "|---|---|---|---|---|---|---|---|"]
    for part in ("synthetic", "demo"):
        if part in s:
            r = s[part]["ratios"]
            lines.append(f"| {labels[part]} | {xr(r['cold_over_lazy'])} | {xr(r['eager_over_lazy'])} |"
                         f" {xr(r['cold_over_eager'])} | {xr(r['cold_over_lazy_verify'])} |"
                         f" {xr(r['eager_verify_over_lazy_verify'])} | {xr(r.get('lazy_verify_over_lazy'), 2)} |"
                         f" {xr(r.get('lazy_ondemand_over_lazy'), 2)} |")
    if "synthetic" in s:
        p = s["synthetic"]
        ms = [f"{START_LABELS[k]} {med(p, k, 'answer_compute_s') * 1000:.1f} ms" for k in STARTS
              if med(p, k, "answer_compute_s") is not None]
        lines += ["", f"The synthetic server's own compute time for the first request ({o['pages']} page reads):"
                  f" {'; '.join(ms)}. After a lazy restore most of those pages are not there yet: each first touch"
                  " is a userfault the lazy-pages daemon serves.", ""]
    lines += ["![time to first answer and to full memory: cold start, eager restore, lazy restore]"
              "(benchmarks-lazy.png)", ""]
    lines += ["Throughput (snapshot bytes / seconds; GB = 10⁹ bytes) next to this machine's own bandwidth,"
              " measured in the same run:", "",
              "| what | GB/s |", "|---|---|"]
    for part in ("synthetic", "demo"):
        if part not in s:
            continue
        p = s[part]
        gib = p["image_bytes"] / (1 << 30)
        g = p["restore_gb_per_s"]
        lines.append(f"| {labels[part]} ({gib:.2f} GiB of images): checkpoint, whole engine call |"
                     f" {fmt(p['checkpoint_gb_per_s'], 'GB/s')} |")
        lines.append(f"| … checkpoint, CRIU dump phase only | {fmt(p['checkpoint_dump_gb_per_s'], 'GB/s')} |")
        if "eager" in g:
            lines.append(f"| … eager restore, whole engine call | {fmt(g['eager']['call'], 'GB/s')} |")
            lines.append(f"| … eager restore, CRIU restore phase only | {fmt(g['eager']['criu_phase'], 'GB/s')} |")
        if "eager_verify" in g:
            lines.append(f"| … eager restore on a fresh node, whole engine call | {fmt(g['eager_verify']['call'], 'GB/s')} |")
        if "lazy" in g:
            lines.append(f"| … lazy restore, restore call to memory complete | {fmt(g['lazy']['to_full_memory'], 'GB/s')} |")
    names = [("memcpy", "machine: memcpy (in memory)"), ("page_cache_read", "machine: read() from the page cache"),
             ("disk_write", "machine: disk write (buffered + fdatasync)"),
             ("disk_read_cold", "machine: disk read, page cache dropped")]
    for key, label in names:
        v = bw.get(key)
        if not v:
            continue
        if v.get("gb_per_s") is None:
            lines.append(f"| {label} | not measured: {v.get('problem')} |")
            continue
        extra = f" (dd: {v['dd_gb_per_s']:.2f})" if v.get("dd_gb_per_s") else ""
        lines.append(f"| {label} | {v['gb_per_s']:.2f} GB/s{extra} |")
    lines += ["", "Method:", "",
              f"- **Synthetic server** (`bench/lazy_server.py`, `/usr/bin/python3`): binds its port, then builds"
              f" {o['weights_mib']} MiB of \"weights\" (16 MiB of `os.urandom` tiled, a salt and the offset stamped"
              f" into every 4 KiB page: all resident, none zero, no two alike); that build is its weight loading."
              f" Each request `GET /answer?seed=S` reads {o['pages']} pages chosen by a PRNG seeded with S, one in each"
              f" of {o['pages']} equal slices of the buffer, and answers the CRC32 over them. After every restore the"
              f" answers for {len(CHECK_SEEDS)} seeds (asked at once, for a lazy restore while its memory is still"
              " being filled) must equal the cold process's, and, once the memory is complete, the CRC32 of the"
              " whole buffer too.",
              "- **Demo server**: `demo/embed_server.py` (all-MiniLM-L6-v2, demo venv); first answer = first answered"
              " `/embed` (`demo/client.py`'s `wait_ready`, in-process); embeddings of fixed texts after the restore"
              " (and for a lazy one again after its memory is complete) must be bit-identical to the cold ones.",
              "- **Cold start**: started as a restorable workload (`_workload.start`); timed from just before the"
              " start. Full memory = the server's own \"loaded\" instant (`ready_at` in `/healthz`).",
              "- **Eager / lazy restore**: `_restore.restore(lazy=False|True, lazy_wait=False, verify=...)` of the"
              " snapshot `_checkpoint.checkpoint(leave_running=False)` took from that cold process, into the same"
              " node-local `FsStore`; the restores of one repetition rotate their order. Timed from just before the"
              " call. Full memory: eager = when the call returned (every page is in place then); lazy ="
              " `complete_at` of `_lazy.wait(work_dir)` (the lazy-pages daemon exited with every page in)."
              " Every restore verifies (the default): the plain rows on this node, which recorded the digests when"
              " it took the snapshot and so re-hashes nothing unchanged (`_checksums.VerifiedFiles`); the \"fresh"
              " node\" rows with an empty record, as on a node that has not hashed the images yet: the eager restore"
              " hashes the page images while CRIU restores the tree stopped, the lazy one (`lazy_verify: before`)"
              " before the tree runs; \"pages checked on demand\" (`lazy_verify: on_demand`) serves each page to"
              " CRIU's lazy-pages daemon from a 64 MiB piece checked when first read (`restore.lazy.pages`:"
              " `checked_on_demand`).",
              f"- First answers are polled every {o['interval'] * 1000:.0f} ms. Page cache "
              + ("dropped before every restore." if o["drop_caches"] else "not dropped: restores read images the"
                                                                          " checkpoint just wrote, as on the node that took it.")
              + " An untimed `sync` runs before every timed step.",
              f"- Bandwidth: memcpy = best of 4 copies of 512 MiB in memory; disk write = {o['bandwidth_mib']} MiB of"
              " random data written to the filesystem of the store, timed to the end of `fdatasync`; page-cache read"
              " = `read()` of that file into a reused 4 MiB buffer while it is cached (best of 2; `dd bs=4M` alongside);"
              " cold read = the same after `echo 3 > /proc/sys/vm/drop_caches`.",
              f"- Repetitions: synthetic {o['reps']}, demo {o['demo_reps']}.", "",
              "Command (plot: `bench/plot.py` under a venv with matplotlib, see `bench/README.md`):", "",
              "```sh", results["command"], "```", "", END]
    return "\n".join(lines)


def plot(args: argparse.Namespace, results_path: str) -> None:
    py = args.plot_python
    if not os.access(py, os.X_OK):
        log(f"no plot: {py} missing (python3 -m venv {os.path.dirname(os.path.dirname(py))} && "
            f"{os.path.dirname(py)}/pip install matplotlib; or pass --plot-python)")
        return
    res = subprocess.run([py, "-m", "bench.plot", os.path.abspath(results_path), "--out", os.path.abspath(args.plot)],
                         cwd=REPO, check=False)
    if res.returncode != 0:
        log(f"bench.plot failed (rc {res.returncode})")


# --- main ---------------------------------------------------------------------------

def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m bench.lazy", description=__doc__.split("\n", 1)[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=DEFAULT_DIR, help=f"work dir: store, workloads, results (default {DEFAULT_DIR})")
    p.add_argument("--weights-mib", type=int, default=4096, help="synthetic server's weights in MiB (default 4096)")
    p.add_argument("--pages", type=int, default=64, help="pages the synthetic server reads per answer (default 64)")
    p.add_argument("--reps", type=int, default=3, help="synthetic repetitions (default 3)")
    p.add_argument("--demo-reps", type=int, default=3, help="demo repetitions (default 3)")
    p.add_argument("--no-synthetic", action="store_true")
    p.add_argument("--no-demo", action="store_true")
    p.add_argument("--no-bandwidth", action="store_true")
    p.add_argument("--bandwidth-mib", type=int, default=2048, help="file size for the disk / page-cache bandwidth (default 2048)")
    p.add_argument("--verify", choices=("recorded", "full", "both"), default="both",
                   help="restores trusting this node's recorded digests, as a fresh node (nothing recorded), or both"
                        " (each eager and lazy; default both)")
    p.add_argument("--interval", type=float, default=0.01, help="first-answer poll interval in seconds (default 0.01)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for a synthetic first answer (default 300)")
    p.add_argument("--lazy-timeout", type=float, default=600.0, help="seconds to wait for lazy pages to complete (default 600)")
    p.add_argument("--demo-python", default=R.DEMO_PYTHON, help=f"the demo venv's python (default {R.DEMO_PYTHON})")
    p.add_argument("--demo-port", type=int, default=0, help="demo server port (default: a free one)")
    p.add_argument("--port", type=int, default=0, help="synthetic server port (default: a free one)")
    p.add_argument("--demo-timeout", type=float, default=300.0)
    p.add_argument("--drop-caches", action="store_true", help="drop the page cache before every restore")
    p.add_argument("--no-sync", action="store_true", help="no untimed sync before timed steps")
    p.add_argument("--criu", default=None, help="CRIU binary (default: the engine's find_criu)")
    p.add_argument("--results", default=None, help="results JSON path (default <dir>/results/<timestamp>.json)")
    p.add_argument("--markdown", default=None, metavar="PATH", help="replace (or add) the lazy section of this file")
    p.add_argument("--plot", default=None, metavar="PNG", help="draw the bar chart here (bench/plot.py)")
    p.add_argument("--plot-python", default=DEFAULT_PLOT_PYTHON,
                   help=f"a Python with matplotlib for bench/plot.py (default {DEFAULT_PLOT_PYTHON})")
    p.add_argument("--from-json", default=None, metavar="PATH", help="render a previous results JSON; run nothing")
    return p.parse_args(argv)


def render(args: argparse.Namespace, results: Dict[str, Any], results_path: str) -> None:
    results["summary"] = summarize(results)
    with open(results_path, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1, sort_keys=True, default=str)
    text = section(results)
    print(text)
    if args.markdown:
        R.write_section(args.markdown, text, BEGIN, END, before="<!-- containers:begin -->")
    if args.plot:
        plot(args, results_path)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        with open(args.from_json, "r", encoding="utf-8") as handle:
            results = json.load(handle)
        render(args, results, args.from_json)
        return 0
    if os.geteuid() != 0:
        sys.stderr.write("bench.lazy needs root (CRIU does)\n")
        return 2
    args.dir = os.path.abspath(args.dir)
    os.makedirs(args.dir, mode=0o700, exist_ok=True)
    os.environ[VERIFIED_ENV] = os.path.join(args.dir, "verified")  # the bench's own records, not the node's
    E = load_engine()
    args.criu = E.find_criu(args.criu)
    if not args.criu:
        sys.stderr.write("no CRIU found\n")
        return 2
    if not args.no_demo and not os.access(args.demo_python, os.X_OK):
        sys.stderr.write(f"{args.demo_python} missing: run demo/setup.sh, or pass --no-demo\n")
        return 2
    if E.lazy_problem:
        log(f"lazy restore unavailable, measuring cold and eager only: {E.lazy_problem}")
    R.become_subreaper()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    results_path = args.results or os.path.join(args.dir, "results", f"{stamp}.json")
    os.makedirs(os.path.dirname(results_path), exist_ok=True)
    cmd = R.command_line("bench.lazy", argv)
    results: Dict[str, Any] = {
        "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": cmd, "results_path": results_path, "machine": R.machine(E, args),
        "lazy_problem": E.lazy_problem,
        "options": {"dir": args.dir, "weights_mib": args.weights_mib, "pages": args.pages,
                    "reps": 0 if args.no_synthetic else args.reps, "demo_reps": 0 if args.no_demo else args.demo_reps,
                    "verify": args.verify, "interval": args.interval, "drop_caches": args.drop_caches,
                    "no_sync": args.no_sync, "bandwidth_mib": args.bandwidth_mib,
                    "engine_options": E.CriuOptions().as_dict()},
        "bandwidth": None, "synthetic": None, "demo": None,
    }
    t_all = time.perf_counter()
    try:
        if not args.no_bandwidth:
            results["bandwidth"] = measure_bandwidth(args)
        if not args.no_synthetic:
            port = args.port or R.free_port()
            results["synthetic"] = {"reps": []}
            for rep in range(args.reps):
                results["synthetic"]["reps"].append(synth_rep(E, args, rep, port))
        if not args.no_demo:
            client = R.load_client()
            port = args.demo_port or R.free_port()
            results["demo"] = {"reps": [], "texts": R.DEMO_TEXTS, "first_text": R.FIRST_TEXT}
            for rep in range(args.demo_reps):
                results["demo"]["reps"].append(demo_rep(E, args, rep, port, client))
    except BaseException as exc:
        results["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        R.kill_all(E)
        for sub in ("store", "restore", "workloads"):
            shutil.rmtree(os.path.join(args.dir, sub), ignore_errors=True)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(args.dir, "bandwidth.dat"))
        results["elapsed_s"] = round(time.perf_counter() - t_all, 1)
        with open(results_path, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1, sort_keys=True, default=str)
        log(f"results: {results_path} ({results['elapsed_s']} s)")
    render(args, results, results_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
