#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Container checkpoint/restore: warmstart's engine vs podman, same workload, same run.

  sudo /usr/bin/python3 -m bench.containers [--sizes 512,2048] [--reps 3] [--markdown docs/benchmarks.md]

Per size and repetition, with fresh containers of the local node image running
bench/mem_workload.py under ``--init`` (MIB MiB of distinct, resident pages):

- ours: ``_checkpoint.checkpoint`` of the container (leave_running=False) into
  a store under --dir; ``_restoreinto.restore_into`` a placeholder
  (``sleep infinity``, started beforehand - the scheduler's job - and timed
  separately), once with checksums verified, once without, and once lazily
  (verified; timed until the copy runs, and until its memory is complete);
- podman: ``podman container checkpoint --export F --compress none`` and
  ``podman container restore --import F`` (a new container).

Every restore is checked: the restored workload recomputes the CRC32 of its
memory (SIGUSR1) and it must equal the one it reported when ready. Results:
``--dir/results/containers-<ts>.json``; ``--markdown`` replaces the section
between the ``containers`` markers of that file. Nothing is asserted.

On this VM podman's restore needs CRIU's mntns-compat-mode (CRIU's mount-v2
fails to remount a runc mount private), an option CRIU refuses on dump: the
script writes it to /etc/criu/runc.conf around each ``podman container
restore`` when that file does not exist, and removes it right after. Podman
here needs the test containers.conf: ``eval "$(tests/support/podman-env.sh)"``
first.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

from . import HERE, REPO
from . import run as base

BEGIN, END = "<!-- containers:begin -->", "<!-- containers:end -->"
RUNC_CONF = "/etc/criu/runc.conf"


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(["podman", *args], capture_output=True, text=True, check=False, timeout=1800)
    if check and res.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)}: exit {res.returncode}: {res.stderr.strip()[-800:]}")
    return res


def remove(name: str) -> None:
    """podman rm -f, retried: right after a kill podman may still be cleaning the container up."""
    for _attempt in range(5):
        podman("rm", "-f", "-t", "0", name, check=False)
        if podman("container", "exists", name, check=False).returncode != 0:
            return
        time.sleep(1)
    raise RuntimeError(f"container {name} could not be removed")


def image() -> str:
    """The local node image, built first (tests/support/build_node_image.sh) when this container storage lacks it."""
    script = os.path.join(REPO, "tests", "support", "build_node_image.sh")
    out = subprocess.run([script, "--print-image"], capture_output=True, text=True, check=True).stdout
    name = out.strip().splitlines()[-1]
    if subprocess.run(["podman", "image", "exists", name], check=False).returncode != 0:
        print(f"bench: building {name} (not in this container storage)", file=sys.stderr)
        subprocess.run([script], check=True, stdout=subprocess.DEVNULL)
    return name


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dir = args.dir
        self.image = image()
        self.n = 0
        self.names: List[str] = []
        self.E = base.load_engine()
        # pylint: disable=import-outside-toplevel
        from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _container as ctr
        from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _restoreinto as rinto
        self.ctr, self.rinto = ctr, rinto

    def control(self, name: str) -> str:
        path = os.path.join(self.dir, "control", name)
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path, mode=0o700)
        return path

    def start(self, kind: str, mib: int) -> Dict[str, Any]:
        self.n += 1
        name = f"wsbench-{kind}-{os.getpid()}-{self.n}"
        ctl = self.control(name)
        podman("run", "-d", "--init", "--name", name, "-v", f"{HERE}:/bench:ro", "-v", f"{ctl}:/snapshot-control",
               "-e", "SNAPSHOT_CONTROL_DIR=/snapshot-control", self.image, "python3", "/bench/mem_workload.py", str(mib))
        self.names.append(name)
        ready = self.E.ctl.wait_for(ctl, "ready-for-snapshot", 600)
        fields = self.E.ctl.parse_kv(open(os.path.join(ctl, "ready-for-snapshot"), encoding="ascii").read())
        return {"name": name, "control": ctl, "crc": fields.get("crc"), "startup": ready}

    def placeholder(self) -> Dict[str, Any]:
        self.n += 1
        name = f"wsbench-ph-{os.getpid()}-{self.n}"
        ctl = self.control(name)
        t0 = time.monotonic()
        podman("run", "-d", "--name", name, "-v", f"{HERE}:/bench:ro", "-v", f"{ctl}:/snapshot-control",
               "-e", "SNAPSHOT_CONTROL_DIR=/snapshot-control", self.image, "sleep", "infinity")
        self.names.append(name)
        return {"name": name, "control": ctl, "start": time.monotonic() - t0}

    def memcheck(self, host_pid: int, ctl: str, want: Optional[str]) -> bool:
        try:
            os.unlink(os.path.join(ctl, "memcheck"))
        except FileNotFoundError:
            pass
        os.kill(host_pid, signal.SIGUSR1)
        self.E.ctl.wait_for(ctl, "memcheck", 300)
        got = self.E.ctl.parse_kv(open(os.path.join(ctl, "memcheck"), encoding="ascii").read()).get("crc")
        return got == want

    def workload_pid(self, container: str) -> int:
        pid1 = int(podman("inspect", container, "--format", "{{.State.Pid}}").stdout)
        with open(f"/proc/{pid1}/task/{pid1}/children", encoding="ascii") as handle:
            return int(handle.read().split()[0])

    def remove_all(self) -> None:
        for name in self.names:
            remove(name)
        self.names = []

    def ours(self, mib: int) -> Dict[str, Any]:
        store = self.E.st.FsStore(os.path.join(self.dir, "store"))
        src = self.start("ours", mib)
        target = self.ctr.resolve("podman", src["name"])
        t0 = time.monotonic()
        snap = self.E.ckpt.checkpoint(store, target, "bench", {}, self.E.CriuOptions(), leave_running=False)
        out: Dict[str, Any] = {"checkpoint": time.monotonic() - t0, "size": snap["size"], "phases": snap["timings"]}
        for key, verify, lazy in (("restore_verified", True, False), ("restore", False, False),
                                  ("restore_lazy", True, True)):
            ph = self.placeholder()
            t0, w0 = time.monotonic(), time.time()
            res = self.rinto.restore_into(store, ph["name"], snapshot_id=snap["id"], verify=verify, lazy=lazy,
                                          restore_root=os.path.join(self.dir, "restore"))
            out[key] = time.monotonic() - t0  # lazy: the copy runs (restore-complete written), memory loading
            dest = res["destinations"][0]
            if dest["result"] != "succeeded":
                raise RuntimeError(f"restore failed: {dest.get('error')}")
            if lazy:
                if not dest["lazy"]["used"]:
                    raise RuntimeError(f"lazy restore not used: {dest['lazy']['reason']}")
                state = self.E.rs.lz.wait(dest["work_dir"], 600)
                if state.get("state") != "complete":
                    raise RuntimeError(f"lazy restore did not complete: {state}")
                out["restore_lazy_complete"] = state["complete_at"] - w0
            out[f"{key}_ok"] = self.memcheck(dest["pid"], ph["control"], src["crc"])
            out["placeholder_start"] = ph["start"]
            shutil.rmtree(dest["work_dir"], ignore_errors=True)
            remove(ph["name"])  # the next restore runs without this copy's memory around
            self.names.remove(ph["name"])
        store.delete(snap["id"])
        self.remove_all()
        return out

    def podman_cycle(self, mib: int) -> Dict[str, Any]:
        src = self.start("podman", mib)
        archive = os.path.join(self.dir, "podman-export.tar")
        t0 = time.monotonic()
        podman("container", "checkpoint", "--export", archive, "--compress", "none", src["name"])
        out: Dict[str, Any] = {"checkpoint": time.monotonic() - t0, "size": os.path.getsize(archive)}
        self.n += 1
        name = f"wsbench-podrst-{os.getpid()}-{self.n}"
        remove(src["name"])
        self.names.remove(src["name"])
        wrote_conf = compat_conf()
        try:
            t0 = time.monotonic()
            podman("container", "restore", "--import", archive, "--name", name)
            out["restore"] = time.monotonic() - t0
        finally:
            if wrote_conf:
                os.unlink(RUNC_CONF)
        self.names.append(name)
        out["restore_ok"] = self.memcheck(self.workload_pid(name), src["control"], src["crc"])
        os.unlink(archive)
        self.remove_all()
        return out


def compat_conf() -> bool:
    """Write /etc/criu/runc.conf (mntns-compat-mode) unless it exists; True when written."""
    if os.path.exists(RUNC_CONF):
        return False
    os.makedirs(os.path.dirname(RUNC_CONF), exist_ok=True)
    with open(RUNC_CONF, "w", encoding="ascii") as handle:
        handle.write("mntns-compat-mode\n")
    return True


def summ(values: List[float]) -> Dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(results: Dict[str, Any]) -> Dict[str, Any]:
    out = {}
    for size, reps in results["sizes"].items():
        row = {}
        for side in ("ours", "podman"):
            for key in ("checkpoint", "restore", "restore_verified", "restore_lazy", "restore_lazy_complete",
                        "placeholder_start", "size"):
                vals = [r[side][key] for r in reps if key in r[side]]
                if vals:
                    row[f"{side}_{key}"] = summ(vals)
            row[f"{side}_ok"] = all(v for r in reps for k, v in r[side].items() if k.endswith("_ok"))
        out[size] = row
    return out


def markdown(results: Dict[str, Any], summary: Dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        BEGIN,
        "## Containers: warmstart vs podman checkpoint/restore",
        "",
        f"Run {results['started']} on {m.get('cpus')} vCPUs, kernel {m.get('kernel')}, CRIU {m.get('criu')}, "
        f"podman {results['podman']}; `sudo /usr/bin/python3 -m bench.containers --sizes "
        f"{','.join(summary)} --reps {results['reps']}`. Same workload in both (`bench/mem_workload.py` under "
        "`podman run --init`, N MiB of distinct resident pages), same node image, same disk; every restore "
        "recomputed the CRC32 of its memory and it matched the one taken at capture "
        f"({'all matched' if all(r['ours_ok'] and r['podman_ok'] for r in summary.values()) else 'SOME DID NOT'}).",
        "",
        "podman: `container checkpoint --export F --compress none` (stops the source), `container restore "
        "--import F` (creates a new container). warmstart: `checkpoint` (leave_running=false) into a store, "
        "`restore into:` a placeholder already running `sleep infinity` (its start is the scheduler's job; "
        "its time is shown in its own column, so the full cost of a fresh replica is restore + placeholder).",
        "",
        "| MiB | checkpoint podman | checkpoint ours | ratio ours/podman | restore podman | restore ours (verified) "
        "| ratio | restore ours (no verify) | ratio | lazy (verified): runs | ratio | lazy: memory complete "
        "| placeholder start | snapshot size podman / ours |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def med(row: Dict[str, Any], key: str) -> Optional[float]:
        return row[key]["median"] if key in row else None

    def f(v: Optional[float]) -> str:
        return "-" if v is None else f"{v:.2f} s"

    def r(a: Optional[float], b: Optional[float]) -> str:
        return "-" if not a or not b else f"{a / b:.2f}x"

    for size, row in summary.items():
        pc, oc = med(row, "podman_checkpoint"), med(row, "ours_checkpoint")
        pr, orv, orr = med(row, "podman_restore"), med(row, "ours_restore_verified"), med(row, "ours_restore")
        ps, os_ = med(row, "podman_size"), med(row, "ours_size")
        lz_runs = med(row, "ours_restore_lazy")
        lines.append(f"| {size} | {f(pc)} | {f(oc)} | {r(oc, pc)} | {f(pr)} | {f(orv)} | {r(orv, pr)} | {f(orr)} | "
                     f"{r(orr, pr)} | {f(lz_runs)} | {r(lz_runs, pr)} | {f(med(row, 'ours_restore_lazy_complete'))} | "
                     f"{f(med(row, 'ours_placeholder_start'))} | "
                     f"{(ps or 0) / 2**20:.0f} / {(os_ or 0) / 2**20:.0f} MiB |")
    lines += ["", "Medians of the repetitions; min and max are in the JSON results. A ratio below 1 means warmstart "
              "is faster.", "",
              "Where the difference comes from: `podman container checkpoint --export` has runc dump the images "
              "into the container's directory and then writes them again into the export tar, and `restore "
              "--import` unpacks the tar before CRIU reads it and creates a container and its network first; "
              "warmstart writes the images once, into the store, and CRIU restores them in place into a "
              "container that already exists. The verified restore reads every byte once more for its SHA256 "
              "check before CRIU starts (see the overhead discussion above).", "",
              "Lazy (`restore into:` with `lazy: true`, verified): *runs* is when the call returned - the copy "
              "runs in its placeholder (restore-complete written) while the lazy-pages daemon streams its memory "
              "in from the same verified copy of the images; *memory complete* is when the daemon had every page "
              "in (`lazy-state.json`), both from the call's start. The copy's CRC32 was checked after that. Lazy "
              "gains little here: before CRIU starts, a verified restore from a store read in place copies every "
              "image into its work dir and hashes it on the way (nothing may read unverified bytes), and that "
              "copy is most of the time; serving pages from blocks verified as they arrive (issue 37) is what "
              "would let the copy run before its page images are all read.", END]
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench.containers", description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--sizes", default="512,2048")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp/warmstart-bench-containers")
    ap.add_argument("--markdown")
    ap.add_argument("--from-json")
    args = ap.parse_args(argv)
    if args.from_json:
        with open(args.from_json, "r", encoding="utf-8") as handle:
            results = json.load(handle)
    else:
        if os.geteuid() != 0:
            print("needs root (CRIU, podman)", file=sys.stderr)
            return 2
        os.makedirs(args.dir, mode=0o700, exist_ok=True)
        bench = Bench(args)
        E = bench.E
        results = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "reps": args.reps,
                   "podman": podman("--version").stdout.split()[-1],
                   "machine": {"cpus": os.cpu_count(), "kernel": os.uname().release,
                               "criu": (E.criu_version(E.find_criu()) or {}).get("version")}, "sizes": {}}
        try:
            for mib in [int(s) for s in args.sizes.split(",")]:
                reps = []
                for rep in range(args.reps):
                    order = ["ours", "podman"] if rep % 2 == 0 else ["podman", "ours"]
                    one: Dict[str, Any] = {}
                    for side in order:
                        base.log(f"{mib} MiB rep {rep + 1}/{args.reps}: {side}")
                        one[side] = bench.ours(mib) if side == "ours" else bench.podman_cycle(mib)
                    reps.append(one)
                results["sizes"][str(mib)] = reps
        finally:
            bench.remove_all()
        os.makedirs(os.path.join(args.dir, "results"), exist_ok=True)
        out = os.path.join(args.dir, "results", f"containers-{results['started'].replace(':', '')}.json")
        with open(out, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
        base.log(f"results: {out}")
    text = markdown(results, summarize(results))
    print(text)
    if args.markdown:
        base.write_section(args.markdown, text, BEGIN, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
