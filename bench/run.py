#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""warmstart benchmark: the engine (the modules' code path) against raw CRIU, side by side.

Run as root with the Python that has pycriu (the modules' interpreter):

    /usr/bin/python3 -m bench.run [--markdown docs/benchmarks.md]     (from the checkout root)

Two parts, both in one run (see bench/README.md):

synthetic  For each size (default 512 and 4096 MiB) and repetition, a fresh
           bench/mem_workload.py is started as a restorable workload (engine
           ``_workload.start``: own PID namespace, session leader) and
           - ours: checkpointed through ``_checkpoint.checkpoint`` (leave_running
             False) into an FsStore, then restored through ``_restore.restore``
             with verify on and with verify off (order alternates);
           - raw: an identical fresh workload dumped with ``criu dump`` and
             restored with ``criu restore -d``, with the CLI spelling of the
             engine's default CriuOptions.
           Every restored copy is checked (RSS and a CRC32 of its whole
           buffer, computed by the restored process itself), then killed.
demo       demo/embed_server.py: cold start to first answered /embed, then
           engine restore (verify on / off) and raw ``criu restore -d`` of the
           same snapshot images to first answered /embed; the embeddings of
           fixed texts must be identical to the cold process's.

Timings are wall clock (time.perf_counter / time.time). Results go to
<dir>/results/<timestamp>.json; a markdown table is printed; ``--markdown``
writes the full benchmark document. ``--from-json`` re-renders a previous run.
Standard library only.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import hashlib
import importlib.util
import io
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

from . import COLLECTIONS, HERE, REPO

DEFAULT_DIR = "/var/tmp/warmstart-bench"
DEMO_PYTHON = "/opt/warmstart/demo-venv/bin/python"
DEMO_TEXTS = ["warmstart restores warm inference processes.",
              "The quick brown fox jumps over the lazy dog.",
              "Checkpoint once, restore everywhere."]
FIRST_TEXT = "warmstart benchmark first request"
PR_SET_CHILD_SUBREAPER = 36
OVERHEAD_FLAG = 0.10   # ours/raw above 1 + this is reported as overhead

LIVE: set = set()      # host pids this run started or restored and has not killed yet


class BenchError(RuntimeError):
    pass


def log(msg: str) -> None:
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def command_line(module: str, argv: Optional[List[str]]) -> str:
    """How this run was started, as recorded in the results: ``/usr/bin/python3 -m MODULE ARGS``."""
    return " ".join(shlex.quote(a) for a in ["/usr/bin/python3", "-m", module]
                    + (argv if argv is not None else sys.argv[1:]))


# sections of docs/benchmarks.md that other benchmarks own: a rewrite of this one's keeps them
OTHER_SECTIONS = ("containers", "containerd", "fleet", "security", "fresh-node", "s3-cold", "compression",
                  "targets")


def write_section(path: str, text: str, begin: str, end: str, before: Optional[str] = None) -> None:
    """Put ``text`` (a section that starts with ``begin`` and ends with ``end``) into the markdown file
    ``path``: in place of the section already there, else just before the marker ``before`` when the file has
    it, else at the end. The rest of the file is kept as it is."""
    try:
        with open(path, "r", encoding="utf-8") as handle:
            doc = handle.read()
    except FileNotFoundError:
        doc = ""
    text = text.rstrip("\n")
    if begin in doc and end in doc:
        doc = doc[:doc.index(begin)] + text + doc[doc.index(end) + len(end):]
    elif before and before in doc:
        doc = doc[:doc.index(before)] + text + "\n\n" + doc[doc.index(before):]
    else:
        doc = doc.rstrip("\n") + ("\n\n" if doc else "") + text + "\n"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(doc)
    log(f"wrote {begin} ... {end} in {path}")


def prepare_run(args: argparse.Namespace, module: str, argv: Optional[List[str]]) -> Tuple[SimpleNamespace, Dict[str, Any]]:
    """For a benchmark run as root: ``args.dir`` made (0700, absolute), this node's record of hashed files kept
    there, the engine loaded, CRIU found, this process a subreaper; the engine and the results' header."""
    args.dir = os.path.abspath(args.dir)
    os.makedirs(args.dir, mode=0o700, exist_ok=True)
    os.environ.setdefault("WARMSTART_VERIFIED_DIR", os.path.join(args.dir, "verified"))
    E = load_engine()
    args.criu = E.find_criu(args.criu)
    become_subreaper()
    return E, {"started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "command": command_line(module, argv), "machine": machine(E, args)}


def save_results(args: argparse.Namespace, results: Dict[str, Any]) -> str:
    """``results`` as ``<args.dir>/results.json``; its path."""
    path = os.path.join(args.dir, "results.json")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1, default=str)
    log(f"results: {path}")
    return path


def load_results(path: str) -> Dict[str, Any]:
    with open(path, "r", encoding="utf-8") as handle:
        out: Dict[str, Any] = json.load(handle)
    return out


def bench_main(args: argparse.Namespace, module: str, measure: Any, table: Any, markdown: Any,
               begin: str, end: str) -> int:
    """A size-table benchmark's main: render ``--from-json`` or (as root) ``measure()``; print ``table``;
    put ``markdown`` between ``begin`` and ``end`` of ``--markdown``."""
    if args.from_json:
        results = load_results(args.from_json)
    else:
        if os.geteuid() != 0:
            sys.stderr.write(f"{module} needs root (CRIU does)\n")
            return 2
        results = measure()
    print(table(results))
    if args.markdown:
        write_section(args.markdown, markdown(results), begin, end)
    return 0


# --- the engine ---------------------------------------------------------------

def load_engine() -> SimpleNamespace:
    """The engine of this checkout, imported through .collections (``make link``; on sys.path by bench/__init__)."""
    if not os.path.isdir(os.path.join(COLLECTIONS, "ansible_collections", "warmstart", "snapshot", "plugins")):
        raise BenchError(f"the collection is not linked under {COLLECTIONS}: run `make link` in {REPO} first")
    # pylint: disable=import-outside-toplevel
    from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _checksums as cks
    from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _checkpoint as ckpt
    from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _control as ctl
    from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _mountns as mns
    from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc
    from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _restore as rs
    from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap
    from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
    from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _workload as wl
    from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu import criu_version, find_criu
    from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import CriuOptions, load_pycriu, read_stats
    load_pycriu()
    return SimpleNamespace(cks=cks, ctl=ctl, mns=mns, proc=proc, snap=snap, ckpt=ckpt, rs=rs, st=st, wl=wl, CriuOptions=CriuOptions,
                           read_stats=read_stats, find_criu=find_criu, criu_version=criu_version)


def cli_options(o: Any) -> List[str]:
    """The ``criu`` CLI spelling of a CriuOptions (what _criu_rpc._apply sets over RPC)."""
    out: List[str] = []
    if o.tcp == "established":
        out.append("--tcp-established")
    elif o.tcp == "close":
        out.append("--tcp-close")
    if o.ext_unix_sk:
        out.append("--ext-unix-sk")
    if o.file_locks:
        out.append("--file-locks")
    if o.link_remap:
        out.append("--link-remap")
    out += ["--ghost-limit", str(o.ghost_limit)]
    if o.root is not None:
        out += ["--root", o.root]
    for point in o.skip_mnt:
        out += ["--skip-mnt", point]
    if o.auto_ext_mnt:
        out += ["--ext-mount-map", "auto"]
    if o.ext_masters:
        out.append("--enable-external-masters")
    if o.shell_job:
        out.append("--shell-job")
    if o.timeout:
        out += ["--timeout", str(o.timeout)]
    out += ["--network-lock", o.network_lock, "-v4"]
    return out


# --- processes ------------------------------------------------------------------

def become_subreaper() -> None:
    """Orphans (workloads, raw restores) become our children, so we can reap them."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def reap() -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_tree(E: SimpleNamespace, pid: int) -> None:
    """SIGKILL the init of a workload's PID namespace (its whole namespace dies) and wait until it is gone."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        if not E.proc.wait_gone(pid, 60):
            raise BenchError(f"pid {pid} survived SIGKILL for 60 s") from None
    LIVE.discard(pid)
    reap()


def kill_all(E: SimpleNamespace) -> None:
    for pid in list(LIVE):
        try:
            kill_tree(E, pid)
        except BenchError as exc:
            log(f"cleanup: {exc}")


def settle(args: argparse.Namespace, before_restore: bool = False) -> None:
    """Untimed: write back dirty pages (so one step's writeback does not land in the next step's timing)."""
    if not args.no_sync:
        os.sync()
    if before_restore and args.drop_caches:
        with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as handle:
            handle.write("3\n")


def rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", "r", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_size(path: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for fname in files:
            full = os.path.join(dirpath, fname)
            if not os.path.islink(full):
                total += os.path.getsize(full)
    return total


# --- synthetic workloads --------------------------------------------------------

def start_mem_workload(E: SimpleNamespace, args: argparse.Namespace, name: str, mib: int) -> Dict[str, Any]:
    root = os.path.join(args.dir, "workloads")
    shutil.rmtree(E.wl.paths(root, name)["dir"], ignore_errors=True)
    info = E.wl.start(root, name, ["/usr/bin/python3", os.path.join(HERE, "mem_workload.py"), str(mib)])
    LIVE.add(info["pid"])
    E.ctl.wait_for(info["control"], E.ctl.READY, 600, alive=info["pid"])
    with open(os.path.join(info["control"], E.ctl.READY), "r", encoding="ascii") as handle:
        ready = E.ctl.parse_kv(handle.read())
    reap()
    return {"pid": info["pid"], "control": info["control"], "crc": ready["crc"], "rss_kib": int(ready["rss_kib"])}


def memcheck(E: SimpleNamespace, control: str, pid: int, want_crc: str, mib: int) -> Dict[str, Any]:
    """Ask the restored process for the CRC32 of its buffer; compare with the source's."""
    rss = rss_kib(pid)
    E.ctl.clear(control, "memcheck")
    os.kill(pid, signal.SIGUSR1)
    E.ctl.wait_for(control, "memcheck", 600, alive=pid, interval=0.05)
    with open(os.path.join(control, "memcheck"), "r", encoding="ascii") as handle:
        got = E.ctl.parse_kv(handle.read())
    ok = got.get("crc") == want_crc and rss >= (mib << 10) * 0.95
    if not ok:
        raise BenchError(f"restored pid {pid}: memory differs (crc {got.get('crc')} vs {want_crc}, rss {rss} KiB)")
    return {"ok": ok, "rss_kib_after_restore": rss}


def ours_cycle(E: SimpleNamespace, args: argparse.Namespace, mib: int, rep: int) -> Dict[str, Any]:
    name = f"bench-ours-{mib}"
    wroot = os.path.join(args.dir, "workloads")
    src = start_mem_workload(E, args, name, mib)
    store = E.st.FsStore(os.path.join(args.dir, "store"))
    target = E.snap.resolve_target(None, None, name, wroot)
    settle(args)
    t0 = time.perf_counter()
    ck = E.ckpt.checkpoint(store, target, f"bench-mem-{mib}", {"bench": "synthetic"}, E.CriuOptions(),
                           leave_running=False, criu_path=args.criu)
    wall = time.perf_counter() - t0
    LIVE.discard(src["pid"])
    reap()
    out: Dict[str, Any] = {"checkpoint": {"wall": wall, "timings": ck["timings"], "criu_stats": ck["criu_stats"],
                                          "image_bytes": ck["size"]}}
    for verify in ([True, False] if rep % 2 == 0 else [False, True]):
        settle(args, before_restore=True)
        t0 = time.perf_counter()
        rs = E.rs.restore(store, snapshot_id=ck["id"], verify=verify, criu_path=args.criu,
                          restore_root=os.path.join(args.dir, "restore"), workloads_root=wroot)
        wall = time.perf_counter() - t0
        LIVE.add(rs["pid"])
        check = memcheck(E, src["control"], rs["pid"], src["crc"], mib)
        kill_tree(E, rs["pid"])
        shutil.rmtree(rs["work_dir"], ignore_errors=True)
        out["restore_verify_on" if verify else "restore_verify_off"] = {
            "wall": wall, "timings": rs["timings"], "criu_stats": rs["criu_stats"], "check": check}
    store.delete(ck["id"])
    return out


def run_criu_cli(argv: List[str], what: str, log_path: str) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        tail = ""
        with contextlib.suppress(OSError), open(log_path, "r", encoding="utf-8", errors="replace") as handle:
            tail = "".join(handle.readlines()[-15:])
        raise BenchError(f"{what} failed (rc {res.returncode}): {res.stdout.decode(errors='replace')}\n{tail}")
    return wall


def raw_cycle(E: SimpleNamespace, args: argparse.Namespace, mib: int, rep: int) -> Dict[str, Any]:
    name = f"bench-raw-{mib}"
    src = start_mem_workload(E, args, name, mib)
    base = os.path.join(args.dir, "raw", f"{mib}-{rep}")
    shutil.rmtree(base, ignore_errors=True)
    imgs = os.path.join(base, "images")
    os.makedirs(imgs, mode=0o700)
    # The workload runs in a mount namespace of its own (_workload): raw CRIU gets the mount options the
    # engine would give it (_mountns), so both dump and restore the same namespace the same way.
    plan = E.mns.plan(src["pid"], E.proc.descendants(src["pid"]))
    plain = E.CriuOptions()
    dump_opts = cli_options(plan.criu_options(plain) if plan else plain)
    opts = cli_options(E.mns.restore_options(plan.record() if plan else None, plain))
    settle(args)
    dump_wall = run_criu_cli([args.criu, "dump", "-t", str(src["pid"]), "-D", imgs, "-o", "dump.log", *dump_opts],
                             "criu dump", os.path.join(imgs, "dump.log"))
    try:
        os.waitpid(src["pid"], 0)  # criu dump killed it; it was our child (subreaper)
    except ChildProcessError:
        E.proc.wait_gone(src["pid"], 60)
    LIVE.discard(src["pid"])
    reap()
    image_bytes = tree_size(imgs) - os.path.getsize(os.path.join(imgs, "dump.log"))
    settle(args, before_restore=True)
    pidfile = os.path.join(base, "restored.pid")
    restore_wall = run_criu_cli([args.criu, "restore", "-D", imgs, "-o", "restore.log", "-d", "--pidfile", pidfile,
                                 *opts], "criu restore", os.path.join(imgs, "restore.log"))
    with open(pidfile, "r", encoding="ascii") as handle:
        pid = int(handle.read().strip())
    LIVE.add(pid)
    check = memcheck(E, src["control"], pid, src["crc"], mib)
    kill_tree(E, pid)
    out = {"dump": {"wall": dump_wall, "criu_stats": E.read_stats(os.path.join(imgs, "stats-dump")),
                    "image_bytes": image_bytes},
           "restore": {"wall": restore_wall, "criu_stats": E.read_stats(os.path.join(imgs, "stats-restore")),
                       "check": check}}
    shutil.rmtree(base, ignore_errors=True)
    return out


def run_synthetic(E: SimpleNamespace, args: argparse.Namespace, mib: int, reps: int) -> Dict[str, Any]:
    rows = []
    for rep in range(reps):
        order = ["ours", "raw"] if rep % 2 == 0 else ["raw", "ours"]
        row: Dict[str, Any] = {"rep": rep + 1, "order": order}
        for which in order:
            log(f"synthetic {mib} MiB rep {rep + 1}/{reps}: {which}")
            row[which] = (ours_cycle if which == "ours" else raw_cycle)(E, args, mib, rep)
        log(f"  ours ckpt {row['ours']['checkpoint']['wall']:.2f}s restore(verify) "
            f"{row['ours']['restore_verify_on']['wall']:.2f}s restore(no verify) "
            f"{row['ours']['restore_verify_off']['wall']:.2f}s | raw dump {row['raw']['dump']['wall']:.2f}s "
            f"restore {row['raw']['restore']['wall']:.2f}s")
        rows.append(row)
    return {"mib": mib, "reps": rows}


# --- demo embedding server --------------------------------------------------------

def load_client() -> Any:
    spec = importlib.util.spec_from_file_location("warmstart_demo_client", os.path.join(REPO, "demo", "client.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def first_answer(client: Any, url: str, since: float, timeout: float, interval: float = 0.05) -> Dict[str, Any]:
    """demo/client.py wait-ready URL --since SINCE --embed TEXT, in this process (no interpreter start timed)."""
    ns = argparse.Namespace(url=url, timeout=timeout, interval=interval, since=since, embed=FIRST_TEXT)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = client.wait_ready(ns)
    doc = json.loads(buf.getvalue().strip().splitlines()[-1])
    if rc != 0 or not doc.get("first_answer"):
        raise BenchError(f"{url}: no answered /embed: {doc}")
    return doc


def embeddings(client: Any, url: str) -> List[List[float]]:
    status, doc = client.request(url + "/embed", {"texts": DEMO_TEXTS}, timeout=60)
    if status != 200 or not isinstance(doc, dict):
        raise BenchError(f"{url}/embed answered HTTP {status}: {doc}")
    return doc["embeddings"]


def run_demo(E: SimpleNamespace, args: argparse.Namespace) -> Dict[str, Any]:
    client = load_client()
    port = args.demo_port or free_port()
    url = f"http://127.0.0.1:{port}"
    name = "bench-demo"
    wroot = os.path.join(args.dir, "workloads")
    store = E.st.FsStore(os.path.join(args.dir, "store"))
    rows = []
    for rep in range(args.demo_reps):
        shutil.rmtree(E.wl.paths(wroot, name)["dir"], ignore_errors=True)
        settle(args)
        log(f"demo rep {rep + 1}/{args.demo_reps}: cold start")
        t0 = time.time()
        info = E.wl.start(wroot, name, [args.demo_python, os.path.join(REPO, "demo", "embed_server.py"),
                                        "--port", str(port)])
        LIVE.add(info["pid"])
        cold = first_answer(client, url, t0, args.demo_timeout)
        ref = embeddings(client, url)
        reap()
        target = E.snap.resolve_target(None, None, name, wroot)
        E.ctl.wait_for(info["control"], E.ctl.READY, 60, alive=info["pid"])
        settle(args)
        t1 = time.perf_counter()
        ck = E.ckpt.checkpoint(store, target, "bench-demo", {"bench": "demo"}, E.CriuOptions(),
                               leave_running=False, criu_path=args.criu)
        ck_wall = time.perf_counter() - t1
        LIVE.discard(info["pid"])
        reap()
        row: Dict[str, Any] = {"rep": rep + 1,
                               "cold": {"seconds_to_first_answer": cold["seconds_to_first_answer"],
                                        "seconds_to_ready": cold["seconds_to_ready"]},
                               "checkpoint": {"wall": ck_wall, "timings": ck["timings"], "image_bytes": ck["size"],
                                              "criu_stats": ck["criu_stats"]}}
        variants = ["ours_verify_on", "ours_verify_off", "raw"]
        variants = variants[rep % 3:] + variants[:rep % 3]
        row["order"] = variants
        for variant in variants:
            if getattr(args, "demo_fresh", False):
                E.cks.VerifiedFiles(ck["id"]).forget()  # as a node that never saw the snapshot
            settle(args, before_restore=True)
            log(f"demo rep {rep + 1}/{args.demo_reps}: restore {variant}")
            work = None
            t0 = time.time()
            if variant == "raw":
                tgt = store.load(ck["id"])["targets"][0]
                imgs = os.path.join(store.local_dir(ck["id"]), tgt["path"], "criu")
                raw_opts = cli_options(E.mns.restore_options(tgt.get("mount_namespace"), E.CriuOptions()))
                work = os.path.join(args.dir, "raw", f"demo-{rep}")
                shutil.rmtree(work, ignore_errors=True)
                os.makedirs(work, mode=0o700)
                pidfile = os.path.join(work, "restored.pid")
                wall = run_criu_cli([args.criu, "restore", "-D", imgs, "-W", work, "-o", "restore.log", "-d",
                                     "--pidfile", pidfile, *raw_opts],
                                    "criu restore (demo)", os.path.join(work, "restore.log"))
                with open(pidfile, "r", encoding="ascii") as handle:
                    pid = int(handle.read().strip())
                timings: Dict[str, float] = {}
                stats = E.read_stats(os.path.join(work, "stats-restore"))
            else:
                rs = E.rs.restore(store, snapshot_id=ck["id"], verify=variant == "ours_verify_on",
                                  criu_path=args.criu, restore_root=os.path.join(args.dir, "restore"),
                                  workloads_root=wroot)
                wall = time.time() - t0
                pid, timings, stats, work = rs["pid"], rs["timings"], rs["criu_stats"], rs["work_dir"]
            LIVE.add(pid)
            answer = first_answer(client, url, t0, args.demo_timeout)
            same = embeddings(client, url) == ref
            kill_tree(E, pid)
            if work:
                shutil.rmtree(work, ignore_errors=True)
            if not same:
                raise BenchError(f"demo {variant}: embeddings after restore differ from the cold process's")
            row[variant] = {"seconds_to_first_answer": answer["seconds_to_first_answer"],
                            "seconds_to_ready": answer["seconds_to_ready"], "restore_wall": wall,
                            "timings": timings, "criu_stats": stats, "embeddings_identical": same}
        store.delete(ck["id"])
        log(f"  cold {row['cold']['seconds_to_first_answer']:.2f}s; restore "
            + ", ".join(f"{v} {row[v]['seconds_to_first_answer']:.2f}s" for v in variants))
        rows.append(row)
    return {"reps": rows, "texts": DEMO_TEXTS, "first_text": FIRST_TEXT}


# --- machine ------------------------------------------------------------------------

def read_first(path: str, default: str = "") -> str:
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return default


def disk_of(path: str) -> Dict[str, Any]:
    """Filesystem, device and rotational flag of the filesystem holding ``path``."""
    best = None
    with open("/proc/self/mountinfo", "r", encoding="utf-8") as handle:
        for line in handle:
            parts = line.split()
            mnt = parts[4]
            sep = parts.index("-")
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and (best is None or len(mnt) > len(best[0])):
                best = (mnt, parts[2], parts[sep + 1], parts[sep + 2])
    if best is None:
        return {}
    mnt, majmin, fstype, source = best
    sysdev = f"/sys/dev/block/{majmin}"
    rot = read_first(os.path.join(sysdev, "queue", "rotational")) or read_first(os.path.join(sysdev, "..", "queue", "rotational"))
    dev = os.path.basename(os.path.realpath(sysdev)) if os.path.exists(sysdev) else source
    return {"mount": mnt, "fstype": fstype, "device": dev, "source": source,
            "rotational": None if rot == "" else rot == "1",
            "virtio": dev.startswith("vd")}


def machine(E: SimpleNamespace, args: argparse.Namespace) -> Dict[str, Any]:
    cpuinfo = read_first("/proc/cpuinfo")
    model = next((ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if ln.startswith("model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in cpuinfo.splitlines() if ln.startswith("flags")), [])
    mem_kib = next((int(ln.split()[1]) for ln in read_first("/proc/meminfo").splitlines() if ln.startswith("MemTotal")), 0)
    sha = bytes(64 << 20)
    t0 = time.perf_counter()
    for _round in range(4):
        hashlib.sha256(sha).digest()
    sha_mbs = 256 / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    hashlib.blake2b(sha).digest()
    blake_mbs = 64 / (time.perf_counter() - t0)
    return {
        "cpu_model": model, "cpus": os.cpu_count(), "virtualized": "hypervisor" in flags, "sha_ni": "sha_ni" in flags,
        "mem_gib": round(mem_kib / (1 << 20), 1), "kernel": platform.release(), "arch": platform.machine(),
        "os": dict(ln.split("=", 1) for ln in read_first("/etc/os-release").splitlines() if "=" in ln).get(
            "PRETTY_NAME", "").strip('"'),
        "python": platform.python_version(), "criu": E.criu_version(args.criu)["version"], "criu_path": args.criu,
        "disk": disk_of(os.path.realpath(args.dir)),
        "vm_dirty_ratio": read_first("/proc/sys/vm/dirty_ratio"),
        "vm_dirty_background_ratio": read_first("/proc/sys/vm/dirty_background_ratio"),
        "sha256_mb_per_s_in_memory": round(sha_mbs), "blake2b_mb_per_s_in_memory": round(blake_mbs),
        "loadavg_at_start": read_first("/proc/loadavg"),
    }


# --- summaries --------------------------------------------------------------------

def summ(values: List[float]) -> Dict[str, Any]:
    values = [float(v) for v in values if v is not None]
    if not values:
        return {"n": 0}
    return {"n": len(values), "median": statistics.median(values), "min": min(values), "max": max(values),
            "values": [round(v, 3) for v in values]}


def ratio(a: Dict[str, Any], b: Dict[str, Any]) -> Optional[float]:
    if a.get("n") and b.get("n") and b["median"] > 0:
        return a["median"] / b["median"]
    return None


def summarize(results: Dict[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {"synthetic": [], "demo": None}
    for part in results.get("synthetic", []):
        reps = part["reps"]
        ours = [r["ours"] for r in reps]
        raw = [r["raw"] for r in reps]
        s: Dict[str, Any] = {"mib": part["mib"], "n": len(reps)}
        s["checkpoint_ours"] = summ([o["checkpoint"]["wall"] for o in ours])
        s["dump_raw"] = summ([r["dump"]["wall"] for r in raw])
        s["restore_ours_verify_on"] = summ([o["restore_verify_on"]["wall"] for o in ours])
        s["restore_ours_verify_off"] = summ([o["restore_verify_off"]["wall"] for o in ours])
        s["restore_raw"] = summ([r["restore"]["wall"] for r in raw])
        s["ratio_checkpoint"] = ratio(s["checkpoint_ours"], s["dump_raw"])
        s["ratio_restore_verify_on"] = ratio(s["restore_ours_verify_on"], s["restore_raw"])
        s["ratio_restore_verify_off"] = ratio(s["restore_ours_verify_off"], s["restore_raw"])
        s["image_gib"] = statistics.median([o["checkpoint"]["image_bytes"] for o in ours]) / (1 << 30)
        phases: Dict[str, Any] = {}
        for key in ("dump", "checksum", "publish"):
            phases[f"checkpoint.{key}"] = summ([o["checkpoint"]["timings"].get(key) for o in ours])
        named = ("dump", "checksum", "publish")
        phases["checkpoint.other"] = summ([o["checkpoint"]["wall"] - sum(o["checkpoint"]["timings"].get(k, 0) for k in named)
                                           for o in ours])
        for v in ("verify_on", "verify_off"):
            rk = f"restore_{v}"
            phases[f"{rk}.preflight"] = summ([o[rk]["timings"].get("preflight") for o in ours])
            phases[f"{rk}.restore"] = summ([o[rk]["timings"].get("restore") for o in ours])
            phases[f"{rk}.other"] = summ([o[rk]["wall"] - o[rk]["timings"].get("preflight", 0)
                                          - o[rk]["timings"].get("restore", 0) for o in ours])
        s["phases"] = phases
        # What the engine adds around CRIU inside the same call: robust against run-to-run noise of the dump
        # itself, which dominates the ours-vs-raw ratio when writeback throttles the dump.
        added = {"checkpoint": summ([o["checkpoint"]["wall"] - o["checkpoint"]["timings"].get("dump", 0) for o in ours]),
                 "checkpoint.criu": phases["checkpoint.dump"]}
        for v in ("verify_on", "verify_off"):
            rk = f"restore_{v}"
            added[rk] = summ([o[rk]["wall"] - o[rk]["timings"].get("restore", 0) for o in ours])
            added[f"{rk}.criu"] = phases[f"{rk}.restore"]
        s["added"] = added
        s["verify_cost"] = summ([o["restore_verify_on"]["timings"].get("preflight", 0)
                                 - o["restore_verify_off"]["timings"].get("preflight", 0) for o in ours])
        stats: Dict[str, Any] = {}
        for key in ("frozen_time", "memdump_time", "memwrite_time"):
            stats[f"ours.dump.{key}"] = summ([o["checkpoint"]["criu_stats"].get(key, 0) for o in ours])
            stats[f"raw.dump.{key}"] = summ([r["dump"]["criu_stats"].get(key, 0) for r in raw])
        stats["ours.restore.restore_time"] = summ([o["restore_verify_on"]["criu_stats"].get("restore_time", 0)
                                                   for o in ours] + [o["restore_verify_off"]["criu_stats"].get(
                                                       "restore_time", 0) for o in ours])
        stats["raw.restore.restore_time"] = summ([r["restore"]["criu_stats"].get("restore_time", 0) for r in raw])
        s["criu_stats_s"] = stats
        size_mb = ours[0]["checkpoint"]["image_bytes"] / 1e6
        ck = phases["checkpoint.checksum"]
        s["checksum_mb_per_s"] = size_mb / ck["median"] if ck.get("n") and ck["median"] else None
        out["synthetic"].append(s)
    demo = results.get("demo")
    if demo:
        reps = demo["reps"]
        d: Dict[str, Any] = {"n": len(reps)}
        d["cold"] = summ([r["cold"]["seconds_to_first_answer"] for r in reps])
        for v in ("ours_verify_on", "ours_verify_off", "raw"):
            d[v] = summ([r[v]["seconds_to_first_answer"] for r in reps])
            d[f"{v}_restore_call"] = summ([r[v]["restore_wall"] for r in reps])
            d[f"ratio_cold_over_{v}"] = ratio(d["cold"], d[v])
        d["ours_verify_on_preflight"] = summ([r["ours_verify_on"]["timings"].get("preflight") for r in reps])
        d["ours_verify_off_preflight"] = summ([r["ours_verify_off"]["timings"].get("preflight") for r in reps])
        d["checkpoint"] = summ([r["checkpoint"]["wall"] for r in reps])
        for v in ("ours_verify_on", "ours_verify_off"):
            d[f"{v}_added"] = summ([r[v]["restore_wall"] - r[v]["timings"].get("restore", 0) for r in reps])
            d[f"{v}_criu"] = summ([r[v]["timings"].get("restore") for r in reps])
        d["checkpoint_checksum"] = summ([r["checkpoint"]["timings"].get("checksum") for r in reps])
        d["image_mib"] = statistics.median([r["checkpoint"]["image_bytes"] for r in reps]) / (1 << 20)
        d["embeddings_identical"] = all(r[v]["embeddings_identical"] for r in reps
                                        for v in ("ours_verify_on", "ours_verify_off", "raw"))
        out["demo"] = d
    out["overheads"] = overheads(out)
    return out


def overheads(summary: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Every comparison where ours costs more than OVERHEAD_FLAG over raw CRIU, with the phases that explain it."""
    found = []
    for s in summary["synthetic"]:
        ph = s["phases"]
        cases = [
            ("checkpoint", s["checkpoint_ours"], s["dump_raw"],
             [("CRIU dump (RPC)", ph["checkpoint.dump"]), ("SHA256 of the images (checksum)", ph["checkpoint.checksum"]),
              ("publish (manifest fsync, chmod, rename)", ph["checkpoint.publish"]),
              ("other (node facts, staging, guardian, kill)", ph["checkpoint.other"])]),
            ("restore, verify on", s["restore_ours_verify_on"], s["restore_raw"],
             [("preflight incl. SHA256 verify", ph["restore_verify_on.preflight"]),
              ("CRIU restore (RPC)", ph["restore_verify_on.restore"]),
              ("other (node facts, manifest, staging, files)", ph["restore_verify_on.other"])]),
            ("restore, verify off", s["restore_ours_verify_off"], s["restore_raw"],
             [("preflight (no verify)", ph["restore_verify_off.preflight"]),
              ("CRIU restore (RPC)", ph["restore_verify_off.restore"]),
              ("other (node facts, manifest, staging, files)", ph["restore_verify_off.other"])]),
        ]
        for what, ours, raw, parts in cases:
            r = ratio(ours, raw)
            if r is None or r <= 1 + OVERHEAD_FLAG:
                continue
            extra = ours["median"] - raw["median"]
            key = {"checkpoint": "checkpoint", "restore, verify on": "restore_verify_on",
                   "restore, verify off": "restore_verify_off"}[what]
            found.append({"kind": "vs_raw", "workload": f"{s['mib']} MiB", "op": what, "ours_s": ours["median"], "raw_s": raw["median"],
                          "ratio": r, "extra_s": extra, "engine_added_s": s["added"][key].get("median"),
                          "phases": [{"phase": n, "median_s": p.get("median")} for n, p in parts]})
    for s in summary["synthetic"]:
        ph, ad = s["phases"], s["added"]
        for key, what, parts in (
                ("checkpoint", "checkpoint", [("SHA256 of the images", ph["checkpoint.checksum"]),
                                              ("publish", ph["checkpoint.publish"]), ("other", ph["checkpoint.other"])]),
                ("restore_verify_on", "restore, verify on", [("preflight incl. SHA256 verify",
                                                              ph["restore_verify_on.preflight"]),
                                                             ("other", ph["restore_verify_on.other"])]),
                ("restore_verify_off", "restore, verify off", [("preflight", ph["restore_verify_off.preflight"]),
                                                               ("other", ph["restore_verify_off.other"])])):
            criu, extra = ad[f"{key}.criu"], ad[key]
            if not criu.get("n") or not extra.get("n") or criu["median"] <= 0:
                continue
            share = extra["median"] / criu["median"]
            if share > OVERHEAD_FLAG:
                found.append({"kind": "within_call", "workload": f"{s['mib']} MiB", "op": what,
                              "criu_s": criu["median"], "extra_s": extra["median"], "share": share,
                              "phases": [{"phase": n, "median_s": p.get("median")} for n, p in parts]})
    d = summary.get("demo")
    if d:
        for v, label in (("ours_verify_on", "restore to first answer, verify on"),
                         ("ours_verify_off", "restore to first answer, verify off")):
            r = ratio(d[v], d["raw"])
            if r is not None and r > 1 + OVERHEAD_FLAG:
                pre = d[f"{v}_preflight"]
                found.append({"kind": "vs_raw", "workload": "demo server", "op": label, "ours_s": d[v]["median"], "raw_s": d["raw"]["median"],
                              "ratio": r, "extra_s": d[v]["median"] - d["raw"]["median"],
                              "phases": [{"phase": "preflight" + (" incl. SHA256 verify" if v.endswith("on") else ""),
                                          "median_s": pre.get("median")}]})
    return found


# --- rendering ---------------------------------------------------------------------

def fmt(s: Dict[str, Any], unit: str = "s") -> str:
    if not s or not s.get("n"):
        return "-"
    if s["n"] == 1:
        return f"{s['median']:.2f} {unit}"
    return f"{s['median']:.2f} {unit} ({s['min']:.2f}–{s['max']:.2f})"


def fr(r: Optional[float]) -> str:
    return "-" if r is None else f"{r:.2f}×"


def results_tables(results: Dict[str, Any], summary: Dict[str, Any]) -> str:
    lines: List[str] = []
    if summary["synthetic"]:
        lines += ["| workload | operation | ours (engine) | raw CRIU | ours / raw |", "|---|---|---|---|---|"]
        for s in summary["synthetic"]:
            w = f"{s['mib']} MiB (images {s['image_gib']:.2f} GiB), n={s['n']}"
            lines.append(f"| {w} | checkpoint (ours) vs `criu dump` | {fmt(s['checkpoint_ours'])} | "
                         f"{fmt(s['dump_raw'])} | {fr(s['ratio_checkpoint'])} |")
            lines.append(f"| {w} | restore, verify on vs `criu restore -d` | {fmt(s['restore_ours_verify_on'])} | "
                         f"{fmt(s['restore_raw'])} | {fr(s['ratio_restore_verify_on'])} |")
            lines.append(f"| {w} | restore, verify off vs `criu restore -d` | {fmt(s['restore_ours_verify_off'])} | "
                         f"{fmt(s['restore_raw'])} | {fr(s['ratio_restore_verify_off'])} |")
        lines.append("")
        lines += ["Phase breakdown of the engine path (median, min–max; `other` = wall time minus the named phases):",
                  "", "| workload | phase | time |", "|---|---|---|"]
        names = {"checkpoint.dump": "checkpoint: CRIU dump (RPC, tree left stopped)",
                 "checkpoint.checksum": "checkpoint: SHA256 of every image file",
                 "checkpoint.publish": "checkpoint: publish (manifest + fsync, chmod, rename)",
                 "checkpoint.other": "checkpoint: other (node facts, staging, guardian, SIGKILL + wait)",
                 "restore_verify_on.preflight": "restore (verify on): preflight = compat + SHA256 verify",
                 "restore_verify_on.restore": "restore (verify on): CRIU restore (RPC)",
                 "restore_verify_on.other": "restore (verify on): other (node facts, manifest, staging)",
                 "restore_verify_off.preflight": "restore (verify off): preflight = compat only",
                 "restore_verify_off.restore": "restore (verify off): CRIU restore (RPC)",
                 "restore_verify_off.other": "restore (verify off): other (node facts, manifest, staging)"}
        for s in summary["synthetic"]:
            for key, label in names.items():
                lines.append(f"| {s['mib']} MiB | {label} | {fmt(s['phases'][key])} |")
        lines.append("")
        lines += ["What the engine adds around CRIU inside the same call (engine wall time minus its own CRIU phase;",
                  "immune to the run-to-run spread of the dump itself):", "",
                  "| workload | operation | CRIU phase | engine call | added by the engine | added / CRIU phase |",
                  "|---|---|---|---|---|---|"]
        for s in summary["synthetic"]:
            ad = s["added"]
            for key, label, total in (("checkpoint", "checkpoint", s["checkpoint_ours"]),
                                      ("restore_verify_on", "restore, verify on", s["restore_ours_verify_on"]),
                                      ("restore_verify_off", "restore, verify off", s["restore_ours_verify_off"])):
                criu, extra = ad[f"{key}.criu"], ad[key]
                share = extra["median"] / criu["median"] if criu.get("n") and criu["median"] else None
                lines.append(f"| {s['mib']} MiB | {label} | {fmt(criu)} | {fmt(total)} | {fmt(extra)} | "
                             f"{'-' if share is None else f'{share:.0%}'} |")
        lines.append("")
        lines += ["CRIU's own statistics (stats-dump / stats-restore), seconds:", "",
                  "| workload | stat | ours (RPC) | raw CLI |", "|---|---|---|---|"]
        for s in summary["synthetic"]:
            st = s["criu_stats_s"]
            for key in ("frozen_time", "memdump_time", "memwrite_time"):
                lines.append(f"| {s['mib']} MiB | dump {key} | {fmt(st['ours.dump.' + key])} | {fmt(st['raw.dump.' + key])} |")
            lines.append(f"| {s['mib']} MiB | restore restore_time | {fmt(st['ours.restore.restore_time'])} | "
                         f"{fmt(st['raw.restore.restore_time'])} |")
        lines.append("")
    d = summary.get("demo")
    if d:
        lines += [f"Demo embedding server (n={d['n']}, snapshot {d['image_mib']:.0f} MiB), time to first answered `/embed`:",
                  "", "| start | to first answer | cold / this | restore call alone |", "|---|---|---|---|",
                  f"| cold start | {fmt(d['cold'])} | 1.00× | - |"]
        for v, label in (("ours_verify_on", "engine restore, verify on"), ("ours_verify_off", "engine restore, verify off"),
                         ("raw", "raw `criu restore -d` (same images)")):
            lines.append(f"| {label} | {fmt(d[v])} | {fr(d['ratio_cold_over_' + v])} | {fmt(d[v + '_restore_call'])} |")
        lines += ["", f"Embeddings of {len(results['demo']['texts'])} fixed texts identical to the cold process's after "
                  f"every restore: **{'yes' if d['embeddings_identical'] else 'NO'}**. Engine checkpoint of the warm "
                  f"server: {fmt(d['checkpoint'])}, of which SHA256 {fmt(d['checkpoint_checksum'])}.", ""]
    return "\n".join(lines)


def overhead_text(summary: Dict[str, Any]) -> str:
    found = summary["overheads"]
    if not found:
        return "Nowhere does the engine path cost more than 10% over raw CRIU in this run.\n"
    lines: List[str] = []
    vs_raw = [f for f in found if f.get("kind") == "vs_raw"]
    within = [f for f in found if f.get("kind") == "within_call"]
    if vs_raw:
        lines += [f"Engine path more than {OVERHEAD_FLAG:.0%} slower than raw CRIU (medians, separate processes):", ""]
        for f in vs_raw:
            parts = ", ".join(f"{p['phase']} {p['median_s']:.2f} s" for p in f["phases"] if p["median_s"] is not None)
            added = (f" The engine's own work around CRIU: {f['engine_added_s']:.2f} s; the rest of the gap is the "
                     "CRIU phase differing between runs." if f.get("engine_added_s") is not None
                     and f["engine_added_s"] < 0.5 * f["extra_s"] else "")
            lines.append(f"- **{f['workload']}, {f['op']}**: {f['ours_s']:.2f} s vs {f['raw_s']:.2f} s "
                         f"(+{f['extra_s']:.2f} s, {f['ratio']:.2f}×). Engine phases: {parts}.{added}")
        lines.append("")
    if within:
        lines += [f"Engine work around CRIU above {OVERHEAD_FLAG:.0%} of the CRIU phase of the same call (medians):", ""]
        for f in within:
            parts = ", ".join(f"{p['phase']} {p['median_s']:.2f} s" for p in f["phases"] if p["median_s"] is not None)
            lines.append(f"- **{f['workload']}, {f['op']}**: +{f['extra_s']:.2f} s on a {f['criu_s']:.2f} s CRIU phase "
                         f"({f['share']:.0%}): {parts}.")
        lines.append("")
    return "\n".join(lines)


def overlap(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    return bool(a.get("n") and b.get("n")) and a["min"] <= b["max"] and b["min"] <= a["max"]


def discussion(sz: Dict[str, Any], m: Dict[str, Any]) -> List[str]:
    """Bullets, from the numbers, on where one size's engine time goes."""
    ph, ad = sz["phases"], sz["added"]
    ck, vc = ph["checkpoint.checksum"], sz["verify_cost"]
    dump_c, rest_c = ph["checkpoint.dump"], ph["restore_verify_off.restore"]

    def same(ours: Dict[str, Any], raw: Dict[str, Any]) -> str:
        if overlap(ours, raw):
            return "ranges overlap (same CRIU work; RPC through pycriu adds nothing measurable)"
        return f"a {ours['median'] - raw['median']:+.2f} s difference in medians, outside the overlap of the ranges"

    spread = (sz["dump_raw"]["max"] - sz["dump_raw"]["min"]) / sz["dump_raw"]["median"] if sz["dump_raw"].get("n") else 0
    lines = [
        f"**{sz['mib']} MiB** (images {sz['image_gib']:.2f} GiB):",
        "",
        f"- CRIU itself: the engine's dump phase {fmt(dump_c)} against `criu dump` {fmt(sz['dump_raw'])}, its",
        f"  restore phase {fmt(rest_c)} against `criu restore -d` {fmt(sz['restore_raw'])}. Dump: "
        f"{same(dump_c, sz['dump_raw'])}; restore: {same(rest_c, sz['restore_raw'])}.",
        f"- Checkpoint: **SHA256 of the images**, {fmt(ck)} ({sz['checksum_mb_per_s']:.0f} MB/s, against"
        f" {m['sha256_mb_per_s_in_memory']} MB/s for hashlib on a buffer in memory) = "
        f"{ck['median'] / dump_c['median']:.0%} of the dump phase. The page images are hashed by a thread that",
        "  follows them while CRIU writes them (on the other core); what is left after the dump is the small files.",
        f"  The rest: publish {fmt(ph['checkpoint.publish'])} (manifest write + fsync, chmod, rename) and `other`"
        f" {fmt(ph['checkpoint.other'])}: node facts (a `criu --version` run), staging, the guardian fork, the",
        "  files-in-use scan, and SIGKILL of the source plus waiting until it is gone (`criu dump` kills and waits",
        "  for the tree too, inside its own time).",
        f"- Restore, verify on: the **SHA256 verify pass** costs {fmt(vc)} (preflight with verify minus without),"
        f" {vc['median'] / rest_c['median']:.0%} of CRIU's restore phase, before CRIU starts.",
        f"- Restore, verify off: the engine adds {fmt(ad['restore_verify_off'])} to CRIU (node facts, manifest,",
        "  compatibility and files-in-use checks, a directory of symlinks to the images, control-dir sentinels).",
    ]
    if spread > 0.25:
        lines.append(f"- Noise: `criu dump` alone ranged {fmt(sz['dump_raw'])} ({spread:.0%} of its median): its speed "
                     "depends on page-cache writeback of the images it writes and on the machine's other work, so the "
                     "ours/raw ratio of the checkpoint is less reliable than the engine-added time above.")
    lines.append("")
    return lines


def headline(summary: Dict[str, Any]) -> List[str]:
    out: List[str] = []
    d = summary.get("demo")
    if d:
        out.append(f"- Demo embedding server, time to first answered `/embed`: cold start {d['cold']['median']:.2f} s;"
                   f" engine restore {d['ours_verify_on']['median']:.2f} s with verify"
                   f" ({d['ratio_cold_over_ours_verify_on']:.1f}× faster), {d['ours_verify_off']['median']:.2f} s without"
                   f" ({d['ratio_cold_over_ours_verify_off']:.1f}×); raw `criu restore` {d['raw']['median']:.2f} s."
                   f" Embeddings identical after restore: {'yes' if d['embeddings_identical'] else 'NO'}.")
    for sz in summary["synthetic"]:
        ad = sz["added"]
        out.append(f"- {sz['mib']} MiB: checkpoint {sz['checkpoint_ours']['median']:.2f} s vs `criu dump`"
                   f" {sz['dump_raw']['median']:.2f} s ({fr(sz['ratio_checkpoint'])}; the engine adds"
                   f" {ad['checkpoint']['median']:.2f} s); restore {sz['restore_ours_verify_on']['median']:.2f} s"
                   f" verified / {sz['restore_ours_verify_off']['median']:.2f} s unverified vs `criu restore`"
                   f" {sz['restore_raw']['median']:.2f} s ({fr(sz['ratio_restore_verify_on'])} /"
                   f" {fr(sz['ratio_restore_verify_off'])}).")
    if summary["synthetic"]:
        rest = max(sz["added"]["restore_verify_off"]["median"] for sz in summary["synthetic"])
        ck = max(sz["phases"]["checkpoint.other"]["median"] + sz["phases"]["checkpoint.publish"]["median"]
                 for sz in summary["synthetic"])
        out.append(f"- Outside the two SHA256 passes (checksum at checkpoint, verify at restore) the engine adds at most"
                   f" {rest:.2f} s to a restore and {ck:.2f} s to a checkpoint (medians, incl. killing the source);"
                   " the SHA256 passes are where it costs more than 10% over raw CRIU, see below.")
    return out


def markdown(results: Dict[str, Any], summary: Dict[str, Any]) -> str:
    m = results["machine"]
    disk = m.get("disk") or {}
    rot = {True: "rotational flag 1", False: "non-rotational", None: "rotational flag unknown"}[disk.get("rotational")]
    if disk.get("virtio"):
        rot += " (a virtio disk: the flag says nothing about the host's storage)"
    o = results["options"]
    syn = summary["synthetic"]
    d = summary.get("demo")
    out = [
        "# Benchmarks",
        "",
        "Checkpoint and restore through warmstart's engine (the code the `checkpoint` and `restore` modules run)",
        "against raw CRIU on the same machine, in the same run, side by side. Generated by `bench/run.py` from",
        f"the run of {results['started_at']} (results JSON: `{results['results_path']}`); every number below is",
        "measured, none is asserted by a test. See `bench/README.md` for how to rerun it.",
        "",
        "## Summary",
        "",
        *headline(summary),
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        f"| CPU | {m['cpu_model']}, {m['cpus']} vCPUs{' (virtual machine)' if m['virtualized'] else ''}; "
        f"SHA extensions: {'yes' if m['sha_ni'] else 'no'}; hashlib SHA256 in memory: {m['sha256_mb_per_s_in_memory']} MB/s |",
        f"| memory | {m['mem_gib']} GiB |",
        f"| kernel | {m['kernel']} ({m['arch']}), {m['os']} |",
        f"| disk | `{disk.get('device', '?')}` ({disk.get('fstype', '?')} on {disk.get('mount', '?')}), {rot}; "
        f"vm.dirty_ratio {m['vm_dirty_ratio']}, dirty_background_ratio {m['vm_dirty_background_ratio']} |",
        f"| CRIU | {m['criu']} (`{m['criu_path']}`) |",
        f"| Python | {m['python']} (`/usr/bin/python3`, pycriu over `criu swrk` RPC) |",
        f"| load at start | load average {m['loadavg_at_start'].split()[0]} on {m['cpus']} vCPUs: the machine is shared"
        " with other work, timings are noisy, hence medians and min–max |",
        "",
        "Command:",
        "",
        "```sh",
        results["command"],
        "```",
        "",
        "## Method",
        "",
        f"- **Synthetic workloads** ({', '.join(str(s['mib']) + ' MiB' for s in syn) or 'none'}): `bench/mem_workload.py`,",
        "  a `/usr/bin/python3` process that tiles 16 MiB of `os.urandom` over its buffer and stamps a salt and the",
        "  offset into every 4 KiB page (all pages resident, none zero, no two alike). Each is started as a restorable",
        "  workload (engine `_workload.start`: init of its own PID namespace, session leader).",
        "- **ours**: `_checkpoint.checkpoint(..., leave_running=False)` into an `FsStore` on the local disk",
        f"  (`{o['dir']}/store`), then `_restore.restore(..., verify=True)` and `verify=False` of that snapshot",
        "  (order alternates by repetition). The wall time is the whole engine call.",
        "- **raw CRIU**: an identical, fresh workload; `criu dump -t PID -D DIR` and `criu restore -D DIR -d --pidfile F`,",
        "  both with the CLI spelling of the engine's default `CriuOptions`:",
        f"  `{' '.join(o['criu_cli_options'])}`. The raw dump kills the tree, as `leave_running=False` does.",
        "  ours and raw alternate which goes first.",
        "- Every restored copy is checked after the timing: its RSS and a CRC32 of its whole buffer, computed by",
        "  the restored process, must match the source's. Then it is killed, and the snapshot / image dir removed.",
        "- **Page cache**: " + ("dropped (`echo 3 > /proc/sys/vm/drop_caches`) before every restore, so restores read"
                                " the images from disk." if o["drop_caches"] else
                                "**not** dropped: restores (and the checksum pass) read images that are still in the"
                                " page cache, as on a node restoring what it just checkpointed. A cold-cache restore"
                                " from disk or NFS adds read time to both sides, and to the verify pass."),
        "- " + ("`sync` (untimed) before every timed operation, so writeback of one step's images does not land in"
                " the next step's timing; the dump itself still competes with its own writeback."
                if not o["no_sync"] else "No `sync` between steps (`--no-sync`)."),
        f"- Repetitions: {o['reps']} per size ({o['reps_large']} for sizes ≥ {o['large_mib']} MiB); demo {o['demo_reps']}.",
        "- **Demo**: `demo/embed_server.py` (sentence-transformers all-MiniLM-L6-v2) started cold as a workload; time",
        "  from just before the start (or the restore call) to the first answered `/embed`, measured with",
        "  `demo/client.py`'s `wait_ready` (`--since`, `--embed`) in-process. The warm server is checkpointed by the",
        "  engine; its snapshot is restored by the engine (verify on, off) and by `criu restore -d` from the same",
        "  image files; the embeddings of fixed texts must be bit-identical to the cold process's.",
        "",
        "## Results",
        "",
        results_tables(results, summary),
        "## Where the overhead comes from",
        "",
        overhead_text(summary),
    ]
    for sz in syn:
        out += discussion(sz, m)
    if d:
        out += [
            f"For the demo server the snapshot is small ({d['image_mib']:.0f} MiB), so verify costs "
            f"{d['ours_verify_on_preflight']['median'] - d['ours_verify_off_preflight']['median']:.2f} s; the restored"
            " server's first answer comes"
            f" {d['ratio_cold_over_ours_verify_on']:.1f}× (verify on) / {d['ratio_cold_over_ours_verify_off']:.1f}×"
            " (verify off) sooner than a cold start's.",
            "",
        ]
    out += [
        "## Reducing the overhead",
        "",
        "Done: **hash while the images are written, not after.** A thread follows each `pages-*.img` as CRIU",
        "writes it (`_checksums.StreamingHasher`), so the checkpoint costs about max(dump, hash) instead of dump + hash;",
        "the first version re-read every byte after the dump (+0.77 s at 512 MiB, +4.19 s at 4 GiB).",
        "",
        "Still open, from cheapest to most work:",
        "",
        "2. **Hash in parallel.** hashlib releases the GIL: hashing the image files (and fixed-size chunks of the",
        "   big `pages-*.img`, recorded as a list of chunk digests in the manifest) on N threads scales with cores:",
        "   at best half the time on this 2-vCPU machine, far less on a 16–64-core inference node. The same",
        "   chunked manifest lets the verify pass run on N threads.",
        "3. **Overlap verify with the restore.** Restore with CRIU's `--leave-stopped` while the verify pass runs",
        "   in parallel, and SIGCONT the tree only when every checksum matched (SIGKILL it otherwise): no restored",
        "   code runs on unverified pages, and the restore costs about max(verify, restore). (CRIU then parses",
        "   images not yet verified; a corrupt one fails the restore or is caught before SIGCONT.)",
        "4. **Skip re-verification of what this node wrote or already verified.** Verify is there for stores that",
        "   other nodes write (NFS, object-store caches); a node-local cache can record `verified` with the",
        "   file's inode, size and mtime after the first verify and skip the next. `verify: false` is already the",
        "   switch for trusted local stores.",
        "5. **A faster digest.** SHA256 with SHA-NI runs at about 1–2 GB/s per core; BLAKE3 or xxh3 run several",
        "   times faster but are not in the standard library (module_utils stay stdlib-only), and blake2b is",
        f"   slower than SHA-NI SHA256 here ({m.get('blake2b_mb_per_s_in_memory', '?')} vs"
        f" {m['sha256_mb_per_s_in_memory']} MB/s in memory).",
        "",
    ]
    if syn:
        big = max(syn, key=lambda x: x["mib"])
        ph = big["phases"]
        rest_m, ver_m = ph["restore_verify_off.restore"]["median"], big["verify_cost"]["median"]
        out += [
            f"Rough effect for the {big['mib']} MiB case (an estimate from the medians above, not measured):"
            f" overlapping verify with the restore (3) takes a verified restore from {ver_m:.1f} + {rest_m:.1f} s"
            f" towards max({ver_m:.1f}, {rest_m:.1f}) s.",
            "",
        ]
    out += [
        "## Reproduce",
        "",
        "```sh",
        "sudo /usr/bin/python3 -m bench.run --markdown docs/benchmarks.md     # defaults: 512 and 4096 MiB, demo",
        "sudo /usr/bin/python3 -m bench.run --sizes 512 --reps 5 --no-demo    # quicker",
        "sudo /usr/bin/python3 -m bench.run --drop-caches                      # restores from disk, not page cache",
        "```",
        "",
    ]
    return "\n".join(out)


# --- main -----------------------------------------------------------------------------

def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m bench.run", description=__doc__.split("\n", 1)[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=DEFAULT_DIR, help=f"work dir: store, workloads, raw images, results (default {DEFAULT_DIR})")
    p.add_argument("--sizes", default="512,4096", help="synthetic workload sizes in MiB, comma separated (default 512,4096)")
    p.add_argument("--reps", type=int, default=3, help="repetitions per size (default 3)")
    p.add_argument("--reps-large", type=int, default=2, help="repetitions for sizes >= --large-mib (default 2)")
    p.add_argument("--large-mib", type=int, default=2048, help="what counts as large (default 2048)")
    p.add_argument("--demo-reps", type=int, default=3, help="demo repetitions (default 3)")
    p.add_argument("--no-synthetic", action="store_true", help="skip the synthetic workloads")
    p.add_argument("--no-demo", action="store_true", help="skip the demo embedding server")
    p.add_argument("--demo-python", default=DEMO_PYTHON, help=f"the demo venv's python (default {DEMO_PYTHON})")
    p.add_argument("--demo-port", type=int, default=0, help="demo server port (default: a free one)")
    p.add_argument("--demo-timeout", type=float, default=300.0, help="seconds to wait for a first answer (default 300)")
    p.add_argument("--drop-caches", action="store_true", help="drop the page cache before every restore")
    p.add_argument("--no-sync", action="store_true", help="no untimed sync before timed operations")
    p.add_argument("--criu", default=None, help="CRIU binary (default: the engine's find_criu)")
    p.add_argument("--results", default=None, help="results JSON path (default <dir>/results/<timestamp>.json)")
    p.add_argument("--markdown", default=None, metavar="PATH", help="write the benchmark document here")
    p.add_argument("--from-json", default=None, metavar="PATH", help="render a previous results JSON; run nothing")
    return p.parse_args(argv)


def render(results: Dict[str, Any], md_path: Optional[str]) -> None:
    summary = summarize(results)
    results["summary"] = summary
    print(results_tables(results, summary))
    print(overhead_text(summary))
    if md_path:
        kept = ""
        try:
            with open(md_path, "r", encoding="utf-8") as handle:
                old = handle.read()
            for part in OTHER_SECTIONS:  # sections other benchmarks own survive a rewrite
                begin, end = f"<!-- {part}:begin -->", f"<!-- {part}:end -->"
                if begin in old and end in old:
                    kept += "\n" + old[old.index(begin):old.index(end) + len(end)] + "\n"
        except FileNotFoundError:
            pass
        with open(md_path, "w", encoding="utf-8") as handle:
            handle.write(markdown(results, summary) + kept)
        log(f"wrote {md_path}")


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        with open(args.from_json, "r", encoding="utf-8") as handle:
            results = json.load(handle)
        render(results, args.markdown)
        return 0
    if os.geteuid() != 0:
        sys.stderr.write("bench.run needs root (CRIU does)\n")
        return 2
    args.dir = os.path.abspath(args.dir)
    os.makedirs(args.dir, mode=0o700, exist_ok=True)
    E = load_engine()
    args.criu = E.find_criu(args.criu)
    if not args.criu:
        sys.stderr.write("no CRIU found\n")
        return 2
    if not args.no_demo and not os.access(args.demo_python, os.X_OK):
        sys.stderr.write(f"{args.demo_python} missing: run demo/setup.sh, or pass --no-demo\n")
        return 2
    become_subreaper()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    results_path = args.results or os.path.join(args.dir, "results", f"{stamp}.json")
    os.makedirs(os.path.dirname(results_path), exist_ok=True)
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()] if not args.no_synthetic else []
    cmd = command_line("bench.run", argv)
    results: Dict[str, Any] = {
        "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": cmd, "results_path": results_path, "machine": machine(E, args),
        "options": {"dir": args.dir, "sizes_mib": sizes, "reps": args.reps, "reps_large": args.reps_large,
                    "large_mib": args.large_mib, "demo_reps": 0 if args.no_demo else args.demo_reps,
                    "drop_caches": args.drop_caches, "no_sync": args.no_sync,
                    "criu_cli_options": cli_options(E.CriuOptions()),
                    "engine_options": E.CriuOptions().as_dict()},
        "synthetic": [], "demo": None,
    }
    t_all = time.perf_counter()
    try:
        for mib in sizes:
            reps = args.reps_large if mib >= args.large_mib else args.reps
            results["synthetic"].append(run_synthetic(E, args, mib, reps))
        if not args.no_demo:
            results["demo"] = run_demo(E, args)
    finally:
        kill_all(E)
        for sub in ("store", "raw", "restore", "workloads"):
            shutil.rmtree(os.path.join(args.dir, sub), ignore_errors=True)
        results["elapsed_s"] = round(time.perf_counter() - t_all, 1)
        with open(results_path, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1, sort_keys=True, default=str)
        log(f"results: {results_path} ({results['elapsed_s']} s)")
    render(results, args.markdown)
    with open(results_path, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1, sort_keys=True, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
