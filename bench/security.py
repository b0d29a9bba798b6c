#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""warmstart benchmark: what signing and encryption at rest cost, side by side with a plain store.

Run as root with the Python that has pycriu (the modules' interpreter), from the checkout root:

    sudo /usr/bin/python3 -m bench.security [--sizes 512,4096] [--reps 2] [--reps-large 1] \
        [--markdown docs/benchmarks.md]

For each size and repetition, one fresh bench/mem_workload.py per variant (order rotates per
repetition), checkpointed through the engine (``_checkpoint.checkpoint``, leave_running False) into a
filesystem store opened as the modules open it (``_stores.open_store``), then restored twice with
verify on:

- plain       no keys at all (the backend alone);
- signed      this node signs with an Ed25519 key and trusts its public key (skipped, and said so, when
              the checkout has no signing: ``_signing``);
- encrypted   store_options.encryption with one KEK (AES-256-GCM in 4 MiB chunks), no signing;

``restore, same node`` right after the checkpoint (the node's record of hashed files, and for
encrypted its decrypted copy, are reused); ``restore, other node`` with both removed first, as on a
node that never saw the snapshot (plain and signed hash every file, encrypted hashes, authenticates
and decrypts every file into the node cache in one pass). Every restored copy's memory is checked
(CRC32 by the restored process itself). Keys live in a keys dir under --dir (WARMSTART_KEYS_DIR).
Results go to <dir>/results/security-<timestamp>.json; ``--markdown`` replaces the section between
``<!-- security:begin -->`` and ``<!-- security:end -->`` of that file (or appends it).
"""
from __future__ import annotations

import argparse
import base64
import datetime
import importlib.util
import json
import os
import shutil
import statistics
import sys
import time
from typing import Any, Dict, List, Optional

from . import run as base
from .run import write_section

BEGIN, END = "<!-- security:begin -->", "<!-- security:end -->"
DEFAULT_DIR = "/var/tmp/warmstart-bench-security"
VARIANTS = ("plain", "signed", "encrypted")
MODULE_UTILS = "ansible_collections.warmstart.snapshot.plugins.module_utils"


def has_signing() -> bool:
    return importlib.util.find_spec(f"{MODULE_UTILS}.store.security._signing") is not None


def make_keys(top: str) -> Dict[str, str]:
    """A keys dir per variant (as node_prep lays them out): plain has none, signed a signing key and its
    public key as the trust set, encrypted one KEK."""
    dirs = {v: os.path.join(top, v) for v in VARIANTS}
    for path in dirs.values():
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path, mode=0o700)
    os.makedirs(os.path.join(dirs["encrypted"], "kek"), mode=0o700)
    with open(os.open(os.path.join(dirs["encrypted"], "kek", "bench.key"), os.O_WRONLY | os.O_CREAT, 0o600), "w",
              encoding="ascii") as handle:
        handle.write(base64.b64encode(os.urandom(32)).decode() + "\n")
    if has_signing():
        # pylint: disable=import-outside-toplevel
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        with open(os.open(os.path.join(dirs["signed"], "signing.key"), os.O_WRONLY | os.O_CREAT, 0o600), "wb") as out:
            out.write(pem)
        os.makedirs(os.path.join(dirs["signed"], "trusted"), mode=0o700)
        with open(os.path.join(dirs["signed"], "trusted", "bench.pub"), "wb") as out:
            out.write(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                    serialization.PublicFormat.SubjectPublicKeyInfo))
    return dirs


def open_store(args: argparse.Namespace, variant: str) -> Any:
    """The store as the modules open it, with this variant's keys dir."""
    from ansible_collections.warmstart.snapshot.plugins.module_utils.store._stores import \
        open_store as _open  # pylint: disable=import-outside-toplevel
    os.environ["WARMSTART_KEYS_DIR"] = args.keys[variant]
    options = {"cache_dir": os.path.join(args.dir, "cache"), "encryption": variant == "encrypted"}
    return _open(os.path.join(args.dir, "store"), options)


def forget_node(E: Any, store: Any, sid: str) -> None:
    """What another node would not have: the record of hashed files and the decrypted copy."""
    E.cks.VerifiedFiles(sid).forget()
    root = store.cache_root()
    if root:
        shutil.rmtree(os.path.join(root, sid), ignore_errors=True)


def cycle(E: Any, args: argparse.Namespace, variant: str, mib: int) -> Dict[str, Any]:
    """Checkpoint, restore on this node, restore as another node; every copy's memory checked."""
    name = f"bench-sec-{mib}"
    wroot = os.path.join(args.dir, "workloads")
    src = base.start_mem_workload(E, args, name, mib)
    store = open_store(args, variant)
    target = E.snap.resolve_target(None, None, name, wroot)
    base.settle(args)
    t0 = time.perf_counter()
    ck = E.ckpt.checkpoint(store, target, f"bench-sec-{mib}", {"bench": "security"}, E.CriuOptions(),
                           leave_running=False, criu_path=args.criu)
    out: Dict[str, Any] = {"checkpoint": {"wall": time.perf_counter() - t0, "timings": ck["timings"],
                                          "stored_bytes": ck["size"]}}
    base.LIVE.discard(src["pid"])
    base.reap()
    for where in ("same_node", "other_node"):
        store = open_store(args, variant)  # a new module run
        if where == "other_node":
            forget_node(E, store, ck["id"])
        base.settle(args, before_restore=True)
        t0 = time.perf_counter()
        rs = E.rs.restore(store, snapshot_id=ck["id"], verify=True, criu_path=args.criu,
                          restore_root=os.path.join(args.dir, "restore"), workloads_root=wroot)
        wall = time.perf_counter() - t0
        base.LIVE.add(rs["pid"])
        check = base.memcheck(E, src["control"], rs["pid"], src["crc"], mib)
        base.kill_tree(E, rs["pid"])
        shutil.rmtree(rs["work_dir"], ignore_errors=True)
        out[f"restore_{where}"] = {"wall": wall, "timings": rs["timings"], "check": check}
    store.delete(ck["id"])
    return out


def med(values: List[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def summarize(results: Dict[str, Any]) -> List[Dict[str, Any]]:
    rows = []
    for size in results["sizes"]:
        plain: Dict[str, Optional[float]] = {}
        for variant in VARIANTS:
            reps = [r[variant] for r in size["reps"] if variant in r]
            if not reps:
                rows.append({"mib": size["mib"], "variant": variant, "n": 0})
                continue
            row: Dict[str, Any] = {"mib": size["mib"], "variant": variant, "n": len(reps),
                                   "stored_bytes": reps[0]["checkpoint"]["stored_bytes"]}
            for key, pick in (("checkpoint", lambda r: r["checkpoint"]["wall"]),
                              ("restore_same_node", lambda r: r["restore_same_node"]["wall"]),
                              ("restore_other_node", lambda r: r["restore_other_node"]["wall"])):
                row[key] = med([pick(r) for r in reps])
                if variant == "plain":
                    plain[key] = row[key]
                base_value = plain.get(key)
                row[f"{key}_ratio"] = row[key] / base_value if base_value and row[key] else None
            rows.append(row)
    return rows


def fmt(value: Optional[float], ratio: Optional[float]) -> str:
    if value is None:
        return "n/a"
    return f"{value:.2f} s" + (f" ({ratio:.2f}x)" if ratio is not None else "")


def section(results: Dict[str, Any]) -> str:
    rows = summarize(results)
    m = results["machine"]
    lines = [BEGIN, "## Security: signing and encryption at rest", "",
             f"`{results['command']}` on {results['started_at']} ({m.get('cpu_model', '?')}, {m.get('cpus', '?')} "
             f"CPUs, {m.get('mem_gib', '?')} GiB, CRIU {m.get('criu', '?')}; filesystem store on "
             f"{m.get('disk', {}).get('fstype', '?')}). "
             "Median wall seconds, ratio to plain in brackets. The same synthetic workload (bench/mem_workload.py) "
             "per variant; every restored copy's memory checked.", "",
             "| size | variant | n | checkpoint | restore, same node | restore, other node | stored |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        if not row["n"]:
            why = "signing is not in this checkout" if row["variant"] == "signed" else "not run"
            lines.append(f"| {row['mib']} MiB | {row['variant']} | 0 | n/a ({why}) | n/a | n/a | n/a |")
            continue
        lines.append(f"| {row['mib']} MiB | {row['variant']} | {row['n']} | "
                     f"{fmt(row['checkpoint'], row['checkpoint_ratio'])} | "
                     f"{fmt(row['restore_same_node'], row['restore_same_node_ratio'])} | "
                     f"{fmt(row['restore_other_node'], row['restore_other_node_ratio'])} | "
                     f"{row['stored_bytes'] / (1 << 20):.0f} MiB |")
    lines += ["", "- *checkpoint*: dump, checksums and publish; encrypted adds one pass that encrypts every file "
              "into the store (AES-256-GCM, 4 MiB chunks) while hashing what it writes; signed adds one Ed25519 "
              "signature over the manifest.",
              "- *restore, same node*: right after the checkpoint, on the node that took it: its record of hashed "
              "files (and, encrypted, the decrypted copy it kept in the node cache) is reused.",
              "- *restore, other node*: both removed first: plain and signed hash every file in the store (the page "
              "images while CRIU restores the tree stopped, `_overlap`); encrypted "
              "reads every stored byte once, hashing it against the manifest and authenticating and decrypting it "
              "into the node cache (0700/0600), then restores from there.",
              "- stored: the snapshot's bytes in the store (GCM adds 16 bytes per 4 MiB chunk)."]
    lines += where_time_goes(results) + [END, ""]
    return "\n".join(lines)


def where_time_goes(results: Dict[str, Any]) -> List[str]:
    """The encrypted variant's own phases (median): the encrypting publish and the decrypting preflight."""
    out = []
    for size in results["sizes"]:
        reps = [r["encrypted"] for r in size["reps"] if "encrypted" in r]
        publish = med([r["checkpoint"]["timings"].get("publish", 0.0) for r in reps])
        preflight = med([r["restore_other_node"]["timings"].get("preflight", 0.0) for r in reps])
        if publish and preflight:
            mb = size["mib"] * 1.048576
            out.append(f"- encrypted, {size['mib']} MiB: publish (encrypt and hash) {publish:.2f} s "
                       f"({mb / publish:.0f} MB/s), restore preflight on another node (hash, authenticate, decrypt) "
                       f"{preflight:.2f} s ({mb / preflight:.0f} MB/s).")
    m = results["machine"]
    if out and m.get("sha256_mb_per_s_in_memory"):
        out.append(f"- this machine hashes SHA256 at {m['sha256_mb_per_s_in_memory']} MB/s in memory (one core). "
                   "Publish seals 4 MiB at a time (AES-256-GCM) while a second thread hashes what was sealed (whole "
                   "file and 64 MiB chunk digests); the other node's pass hashes, authenticates and decrypts in turn "
                   "on one core (spreading it over cores is the next step).")
    return out


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m bench.security", description=__doc__.split("\n", 1)[0])
    p.add_argument("--dir", default=DEFAULT_DIR, help=f"work dir (default {DEFAULT_DIR})")
    p.add_argument("--sizes", default="512,4096", help="workload sizes in MiB (default 512,4096)")
    p.add_argument("--reps", type=int, default=2, help="repetitions per size (default 2)")
    p.add_argument("--reps-large", type=int, default=1, help="repetitions for sizes >= 2048 MiB (default 1)")
    p.add_argument("--drop-caches", action="store_true", help="drop the page cache before every restore")
    p.add_argument("--no-sync", action="store_true", help="no untimed sync before timed operations")
    p.add_argument("--criu", default=None, help="CRIU binary (default: the engine's find_criu)")
    p.add_argument("--markdown", default=None, metavar="PATH", help="write the section into this document")
    p.add_argument("--from-json", default=None, metavar="PATH", help="render a previous results JSON; run nothing")
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        with open(args.from_json, "r", encoding="utf-8") as handle:
            results = json.load(handle)
    else:
        if os.geteuid() != 0:
            sys.stderr.write("bench.security needs root (CRIU does)\n")
            return 2
        args.dir = os.path.abspath(args.dir)
        os.makedirs(args.dir, mode=0o700, exist_ok=True)
        E = base.load_engine()
        args.criu = E.find_criu(args.criu)
        args.keys = make_keys(os.path.join(args.dir, "keys"))
        os.environ[E.cks.VERIFIED_DIR_ENV] = os.path.join(args.dir, "verified")
        base.become_subreaper()
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        variants = [v for v in VARIANTS if v != "signed" or has_signing()]
        results = {"started_at": stamp, "command": base.command_line("bench.security", argv),
                   "machine": base.machine(E, args), "variants": variants, "sizes": []}
        try:
            for mib in [int(x) for x in args.sizes.split(",") if x.strip()]:
                size: Dict[str, Any] = {"mib": mib, "reps": []}
                for rep in range(args.reps_large if mib >= 2048 else args.reps):
                    order = variants[rep % len(variants):] + variants[:rep % len(variants)]
                    row: Dict[str, Any] = {"order": order}
                    for variant in order:
                        base.log(f"security {mib} MiB rep {rep + 1}: {variant}")
                        row[variant] = cycle(E, args, variant, mib)
                        base.log(f"  checkpoint {row[variant]['checkpoint']['wall']:.2f}s restore same node "
                                 f"{row[variant]['restore_same_node']['wall']:.2f}s other node "
                                 f"{row[variant]['restore_other_node']['wall']:.2f}s")
                    size["reps"].append(row)
                results["sizes"].append(size)
        finally:
            base.kill_all(E)
        path = os.path.join(args.dir, "results", f"security-{stamp}.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
        base.log(f"results: {path}")
    text = section(results)
    print(text)
    if args.markdown:
        write_section(args.markdown, text, BEGIN, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
