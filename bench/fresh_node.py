#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""warmstart benchmark: a verified restore on a node that never saw the snapshot, against raw ``criu restore``.

Run as root with the Python that has pycriu, from the checkout root:

    /usr/bin/python3 -m bench.fresh_node [--sizes 512,4096] [--reps 2] [--markdown docs/benchmarks.md]

For each size and repetition, side by side in one run (page cache dropped before every restore, as on a
node reading a shared store for the first time):

- raw: a fresh bench/mem_workload.py dumped with ``criu dump`` and restored with ``criu restore -d``;
- ours: an identical workload checkpointed through ``_checkpoint.checkpoint`` into an FsStore, then restored
  through ``_restore.restore`` with this node's record of hashed files forgotten (a fresh node): verified
  with the page images pinned in the store and hashed while CRIU restores the tree stopped (``_overlap``),
  verified with the page images copied first (a store on another file system: the pin turned off), and
  unverified;
- hash: the page images hashed alone, by chunk on every core (``_digest.check_files``) and as one
  whole-file SHA256 on one core (what a verify cost before chunk digests).

- demo: the demo embedding server (when demo/setup.sh made its venv) checkpointed, then restored raw (``criu
  restore`` of the snapshot's own images), verified as a fresh node and unverified (``bench.run.run_demo``).

Every restored process's memory is checked (CRC32 of its buffer against the source's; the demo server's
embeddings against the cold process's).
The table goes into ``--markdown`` between ``<!-- fresh-node:begin -->`` and ``<!-- fresh-node:end -->``.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import time
from types import SimpleNamespace
from typing import Any, Dict, Iterator, List, Optional

from bench import run as br

BEGIN, END = "<!-- fresh-node:begin -->", "<!-- fresh-node:end -->"


def ours_cycle(E: SimpleNamespace, args: argparse.Namespace, mib: int, rep: int) -> Dict[str, Any]:
    """Checkpoint once; restore as a fresh node verified (pinned), verified (copied) and unverified (order rotates)."""
    from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _digest as dg  # pylint: disable=import-outside-toplevel
    name = f"bench-fresh-{mib}"
    wroot = os.path.join(args.dir, "workloads")
    src = br.start_mem_workload(E, args, name, mib)
    store = E.st.FsStore(os.path.join(args.dir, "store"))
    target = E.snap.resolve_target(None, None, name, wroot)
    br.settle(args)
    ck = E.ckpt.checkpoint(store, target, f"bench-fresh-{mib}", {"bench": "fresh-node"}, E.CriuOptions(),
                           leave_running=False, criu_path=args.criu)
    br.LIVE.discard(src["pid"])
    br.reap()
    out: Dict[str, Any] = {"image_bytes": ck["size"]}
    variants = ["verified", "copied", "unverified"]
    for variant in variants[rep % 3:] + variants[:rep % 3]:
        E.cks.VerifiedFiles(ck["id"]).forget()
        br.settle(args, before_restore=True)
        t0 = time.perf_counter()
        with copied_not_pinned(variant == "copied"):
            rs = E.rs.restore(store, snapshot_id=ck["id"], verify=variant != "unverified", criu_path=args.criu,
                              restore_root=os.path.join(args.dir, "restore"), workloads_root=wroot)
        wall = time.perf_counter() - t0
        br.LIVE.add(rs["pid"])
        check = br.memcheck(E, src["control"], rs["pid"], src["crc"], mib)
        br.kill_tree(E, rs["pid"])
        shutil.rmtree(rs["work_dir"], ignore_errors=True)
        out[variant] = {"wall": wall, "timings": rs["timings"], "verify": rs.get("verify"), "check": check}
    doc = store.load(ck["id"])
    top = store.snapshot_dir(ck["id"])
    pages = [(os.path.join(top, e["path"]), e) for e in doc["files"] if "/criu/pages-" in e["path"]]
    br.settle(args, before_restore=True)
    t0 = time.perf_counter()
    ok = dg.check_files(pages)
    out["hash_chunks"] = {"wall": time.perf_counter() - t0, "ok": all(ok.values()), "threads": dg.workers()}
    br.settle(args, before_restore=True)
    t0 = time.perf_counter()
    whole = [E.cks.sha256_file(path) == e["sha256"] for path, e in pages]
    out["hash_whole"] = {"wall": time.perf_counter() - t0, "ok": all(whole)}
    store.delete(ck["id"])
    return out


@contextlib.contextmanager
def copied_not_pinned(on: bool) -> Iterator[None]:
    """Within (``on``): the page images are copied into the work dir, as from a store on another file system
    (NFS, a FUSE mount), instead of pinned in place under a read lease (``_storecopy.pin``)."""
    from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _storecopy as sc  # pylint: disable=import-outside-toplevel
    if not on:
        yield
        return
    real = sc.pin
    sc.pin = lambda _top, items, _defer: (sc.Pins(), list(items))
    try:
        yield
    finally:
        sc.pin = real


def raw_cycle(E: SimpleNamespace, args: argparse.Namespace, mib: int, rep: int) -> Dict[str, Any]:
    got = br.raw_cycle(E, args, mib, rep)
    return {"wall": got["restore"]["wall"], "check": got["restore"]["check"]}


def run(E: SimpleNamespace, args: argparse.Namespace, mib: int) -> Dict[str, Any]:
    reps: List[Dict[str, Any]] = []
    for rep in range(args.reps):
        first, second = (ours_cycle, raw_cycle) if rep % 2 == 0 else (raw_cycle, ours_cycle)
        a, b = first(E, args, mib, rep), second(E, args, mib, rep)
        ours, raw = (a, b) if first is ours_cycle else (b, a)
        reps.append({"ours": ours, "raw": raw})
        br.log(f"{mib} MiB rep {rep}: raw {raw['wall']:.2f} s, verified {ours['verified']['wall']:.2f} s "
               f"(overlapped {ours['verified']['verify']['overlapped']}), copied {ours['copied']['wall']:.2f} s, "
               f"unverified {ours['unverified']['wall']:.2f} s")
    return {"mib": mib, "reps": reps}


def _median(values: List[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(results: Dict[str, Any]) -> str:
    rows = ["| workload | image | raw `criu restore` | verified, fresh node (pinned) | ratio | verified, copied | "
            "ratio | unverified | hash pages: chunks, all cores | hash pages: one SHA256 |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for size in results["sizes"]:
        reps = size["reps"]
        raw = _median([r["raw"]["wall"] for r in reps])
        ver = _median([r["ours"]["verified"]["wall"] for r in reps])
        cop = _median([r["ours"]["copied"]["wall"] for r in reps if "copied" in r["ours"]])
        unv = _median([r["ours"]["unverified"]["wall"] for r in reps])
        chunks = _median([r["ours"]["hash_chunks"]["wall"] for r in reps])
        whole = _median([r["ours"]["hash_whole"]["wall"] for r in reps])
        gib = reps[0]["ours"]["image_bytes"] / (1 << 30)
        rows.append(f"| {size['mib']} MiB synthetic, n={len(reps)} | {gib:.2f} GiB | {raw:.2f} s | {ver:.2f} s | "
                    f"**{ver / raw:.2f}×** | {cop:.2f} s | {cop / raw:.2f}× | {unv:.2f} s | {chunks:.2f} s | "
                    f"{whole:.2f} s |")
    demo = (results.get("demo") or {}).get("reps") or []
    if demo:
        raw, ver, unv = (_median([r[k]["restore_wall"] for r in demo])
                         for k in ("raw", "ours_verify_on", "ours_verify_off"))
        gib = demo[0]["checkpoint"]["image_bytes"] / (1 << 30)
        rows.append(f"| demo embedding server (restore call; embeddings checked), n={len(demo)} | {gib:.2f} GiB | "
                    f"{raw:.2f} s | {ver:.2f} s | **{ver / raw:.2f}×** | – | – | {unv:.2f} s | – | – |")
    return "\n".join(rows)


def markdown(results: Dict[str, Any]) -> str:
    m = results["machine"]
    return "\n".join([
        BEGIN,
        "## A verified restore on a fresh node (`python3 -m bench.fresh_node`)",
        "",
        f"Run {results['started_at']} on {m.get('cpu_model', '?')} ({m.get('cpus', '?')} vCPUs), kernel "
        f"{m.get('kernel', '?')}; page cache dropped before every restore; medians. Command: `{results['command']}`.",
        "",
        table(results),
        "",
        "A fresh node has no record of having hashed the snapshot, so every byte is checked, and CRIU may read",
        "only bytes that were checked: a store writer can rename or rewrite files during the restore. The",
        "small images and the workload's files are copied into the restore's own work dir and hashed as they",
        "pass, before anything is touched. The page images are hashed while CRIU restores the tree stopped",
        "(`_overlap`, a SHA256 per 64 MiB chunk on every core but CRIU's, `_digest`); the tree runs only once every digest",
        "matched, and is killed otherwise. Where the store is on the restore root's local file system (ext4,",
        "XFS, Btrfs, tmpfs) the page images are not copied: each is pinned under a read lease and hard-linked",
        "into the work dir (`_storecopy.pin`), and a writer's open breaks the lease and refuses the restore",
        "(\"verified, fresh node (pinned)\"). A store on another file system (NFS, a FUSE mount) has its page",
        "images copied into the work dir first (\"verified, copied\", measured here by turning the pin off):",
        "that copy is the price of reading only verified bytes from a store nobody on this node controls.",
        "Target: verified ≤ 1.15× raw `criu restore`. The hash columns are the page images alone, page cache",
        "dropped. The demo row times the restore call (the server's embeddings are compared after each",
        "restore); its raw restore is `criu restore` of the very images warmstart restores, and its verified",
        "restore pins the page images (the store is local here).",
        END,
    ])


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m bench.fresh_node", description=__doc__.split("\n", 1)[0])
    p.add_argument("--dir", default=br.DEFAULT_DIR + "-fresh", help="work dir (default %(default)s)")
    p.add_argument("--sizes", default="512,4096", help="workload sizes in MiB (default %(default)s)")
    p.add_argument("--reps", type=int, default=2, help="repetitions per size (default %(default)s)")
    p.add_argument("--demo-reps", type=int, default=3,
                   help="repetitions of the demo server (its venv: demo/setup.sh; 0: none; default %(default)s)")
    p.add_argument("--demo-python", default=br.DEMO_PYTHON, help="the demo venv's python (default %(default)s)")
    p.add_argument("--criu", default=None, help="CRIU binary (default: the engine's find_criu)")
    p.add_argument("--markdown", default=None, metavar="PATH", help="put the table into this document")
    p.add_argument("--from-json", default=None, metavar="PATH", help="render a previous results JSON; run nothing")
    args = p.parse_args(argv)
    args.drop_caches, args.no_sync = True, False
    args.demo_port, args.demo_timeout, args.demo_fresh = 0, 600.0, True
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    return br.bench_main(args, "bench.fresh_node", lambda: measure(args, argv), table, markdown, BEGIN, END)


def measure(args: argparse.Namespace, argv: Optional[List[str]]) -> Dict[str, Any]:
    E, results = br.prepare_run(args, "bench.fresh_node", argv)
    results["sizes"] = []
    try:
        for mib in [int(x) for x in args.sizes.split(",") if x.strip()]:
            results["sizes"].append(run(E, args, mib))
        if args.demo_reps > 0 and os.access(args.demo_python, os.X_OK):
            results["demo"] = br.run_demo(E, args)  # verified restores with this node's record forgotten
    finally:
        br.kill_all(E)
        for sub in ("store", "raw", "restore", "workloads"):
            shutil.rmtree(os.path.join(args.dir, sub), ignore_errors=True)
    br.save_results(args, results)
    return results


if __name__ == "__main__":
    sys.exit(main())
