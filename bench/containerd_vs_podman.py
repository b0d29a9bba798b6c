#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Container checkpoint and restore-into-placeholder through warmstart, on containerd and on podman, same run.

  sudo /usr/bin/python3 -m bench.containerd_vs_podman [--sizes 256,1024] [--reps 3] [--json PATH]

Per size and repetition, on each runtime (the order alternates), with fresh containers of the local node image
running bench/mem_workload.py under an init (podman: ``--init``; containerd: this node's catatonit bound in at
/run/podman-init, as podman does; MIB MiB of distinct, resident pages):

- checkpoint: ``_checkpoint.checkpoint`` of the container (leave_running=False) into a store under --dir;
- restore: ``_restoreinto.restore_into`` a placeholder (``sleep infinity``, started beforehand and timed on its own),
  checksums not verified (the same file reads on both runtimes; see bench.containers for the verified cost);
- inspect: one ``Runtime.inspect`` of the running source (what each lookup costs: podman's CLI vs ``ctr`` calls).

Every restore is checked: the restored workload recomputes the CRC32 of its memory (SIGUSR1), which must equal the
one it reported when ready. containerd is a private daemon of this run (its own config, socket and state under
--dir, namespace ``warmstart-bench``, the CRI plugin off), started and stopped here; the image is imported from
podman's storage. Podman needs the test containers.conf here: ``eval "$(tests/support/podman-env.sh)"`` first.
Nothing is asserted; the results are printed as a markdown table and written as JSON.
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

from . import HERE
from . import run as base
from .containers import image, podman, remove

NAMESPACE = "warmstart-bench"
INITS = ("/usr/bin/catatonit", "/usr/libexec/podman/catatonit")
CONFIG = """version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{d}/state/containerd.sock"
[ttrpc]
  address = "{d}/state/containerd.sock.ttrpc"
"""


class Containerd:
    """A private containerd for this run."""

    def __init__(self, path: str) -> None:
        self.dir = path
        self.socket = os.path.join(path, "state", "containerd.sock")
        self.proc: Optional[subprocess.Popen] = None

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        res = subprocess.run(["ctr", "--address", self.socket, "--namespace", NAMESPACE, *args], capture_output=True,
                             text=True, check=False, timeout=1800)
        if check and res.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)}: exit {res.returncode}: {res.stderr.strip()[-800:]}")
        return res

    def start(self, img: str) -> None:
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        with open(os.path.join(self.dir, "config.toml"), "w", encoding="ascii") as handle:
            handle.write(CONFIG.format(d=self.dir))
        log = open(os.path.join(self.dir, "containerd.log"), "wb")  # pylint: disable=consider-using-with
        self.proc = subprocess.Popen(["containerd", "--config", os.path.join(self.dir, "config.toml")], stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        end = time.monotonic() + 30
        while self.ctr("version", check=False).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"containerd did not start; see {self.dir}/containerd.log")
            time.sleep(0.2)
        archive = os.path.join(self.dir, "image.tar")
        podman("save", "-q", "--format", "docker-archive", "-o", archive, img)
        self.ctr("images", "import", archive)
        os.unlink(archive)

    def pid1(self, cid: str) -> int:
        path = os.path.join(self.dir, "state", "io.containerd.runtime.v2.task", NAMESPACE, cid, "init.pid")
        with open(path, encoding="ascii") as handle:
            return int(handle.read())

    def remove(self, cid: str) -> None:
        self.ctr("tasks", "kill", "-s", "SIGKILL", cid, check=False)
        for _attempt in range(50):
            if self.ctr("tasks", "rm", "-f", cid, check=False).returncode != 0:
                break
            time.sleep(0.1)
        self.ctr("containers", "rm", cid, check=False)

    def stop(self) -> None:
        if self.proc is None:
            return
        for cid in self.ctr("containers", "ls", "-q", check=False).stdout.split():
            self.remove(cid)
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.dir = args.dir
        self.image = image()
        self.n = 0
        self.live: List[tuple] = []
        self.E = base.load_engine()
        # pylint: disable=import-outside-toplevel
        from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _container as ctr
        from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _restoreinto as rinto
        from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._runtime import get_runtime
        self.ctr, self.rinto, self.get_runtime = ctr, rinto, get_runtime
        self.containerd = Containerd(os.path.join(self.dir, "containerd"))
        init = [p for p in INITS if os.path.isfile(p)]
        if not init:
            raise RuntimeError(f"no catatonit on this node ({', '.join(INITS)})")
        self.init = os.path.realpath(init[0])

    def control(self, name: str) -> str:
        path = os.path.join(self.dir, "control", name)
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path, mode=0o700)
        return path

    def run(self, runtime: str, kind: str, cmd: List[str], init: bool) -> Dict[str, Any]:
        self.n += 1
        name = f"wsbench-{kind}-{os.getpid()}-{self.n}"
        ctl = self.control(name)
        t0 = time.monotonic()
        if runtime == "podman":
            podman("run", "-d", *(["--init"] if init else []), "--name", name, "-v", f"{HERE}:/bench:ro",
                   "-v", f"{ctl}:/snapshot-control", "-e", "SNAPSHOT_CONTROL_DIR=/snapshot-control", self.image, *cmd)
        else:
            mounts = [f"type=bind,src={HERE},dst=/bench,options=rbind:ro",
                      f"type=bind,src={ctl},dst=/snapshot-control,options=rbind:rw"]
            if init:
                mounts.append(f"type=bind,src={self.init},dst=/run/podman-init,options=rbind:ro")
                cmd = ["/run/podman-init", "--", *cmd]
            self.containerd.ctr("run", "-d", "--log-uri", f"file://{self.dir}/{name}.log",
                                *[a for m in mounts for a in ("--mount", m)],
                                "--env", "SNAPSHOT_CONTROL_DIR=/snapshot-control", self.image, name, *cmd)
        self.live.append((runtime, name))
        return {"name": name, "control": ctl, "start": time.monotonic() - t0}

    def drop(self, runtime: str, name: str, restored: int = 0) -> None:
        """Remove a container; ``restored``: the host PID of a tree restored into it, which is a child of this
        process (CRIU's caller): killed and reaped first, or the placeholder's PID 1 could not finish exiting."""
        if restored:
            try:
                os.kill(restored, signal.SIGKILL)
                os.waitpid(restored, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        if runtime == "podman":
            remove(name)
        else:
            self.containerd.remove(name)
        self.live.remove((runtime, name))

    def memcheck(self, host_pid: int, ctl: str, want: Optional[str]) -> bool:
        try:
            os.unlink(os.path.join(ctl, "memcheck"))
        except FileNotFoundError:
            pass
        os.kill(host_pid, signal.SIGUSR1)
        self.E.ctl.wait_for(ctl, "memcheck", 300)
        with open(os.path.join(ctl, "memcheck"), encoding="ascii") as handle:
            return self.E.ctl.parse_kv(handle.read()).get("crc") == want

    def cycle(self, runtime: str, mib: int) -> Dict[str, Any]:
        store = self.E.st.FsStore(os.path.join(self.dir, "store"))
        src = self.run(runtime, "src", ["python3", "/bench/mem_workload.py", str(mib)], init=True)
        self.E.ctl.wait_for(src["control"], "ready-for-snapshot", 600)
        with open(os.path.join(src["control"], "ready-for-snapshot"), encoding="ascii") as handle:
            crc = self.E.ctl.parse_kv(handle.read()).get("crc")
        t0 = time.monotonic()
        self.get_runtime(runtime).inspect(src["name"])
        out: Dict[str, Any] = {"inspect": time.monotonic() - t0}
        target = self.ctr.resolve(runtime, src["name"])
        t0 = time.monotonic()
        snap = self.E.ckpt.checkpoint(store, target, "bench", {}, self.E.CriuOptions(), leave_running=False)
        out.update(checkpoint=time.monotonic() - t0, size=snap["size"])
        self.drop(runtime, src["name"])
        ph = self.run(runtime, "ph", ["sleep", "infinity"], init=False)
        out["placeholder_start"] = ph["start"]
        t0 = time.monotonic()
        res = self.rinto.restore_into(store, ph["name"], snapshot_id=snap["id"], verify=False, runtime_name=runtime,
                                      restore_root=os.path.join(self.dir, "restore"))
        out["restore"] = time.monotonic() - t0
        dest = res["destinations"][0]
        if dest["result"] != "succeeded":
            raise RuntimeError(f"{runtime}: restore failed: {dest.get('error')}")
        out["restore_ok"] = self.memcheck(dest["pid"], ph["control"], crc)
        shutil.rmtree(dest["work_dir"], ignore_errors=True)
        self.drop(runtime, ph["name"], restored=dest["pid"])
        store.delete(snap["id"])
        return out

    def cleanup(self) -> None:
        for runtime, name in list(self.live):
            self.drop(runtime, name)
        self.containerd.stop()


def summ(values: List[float]) -> Dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def markdown(results: Dict[str, Any]) -> str:
    lines = [f"Run {results['started']} on {results['cpus']} vCPUs, kernel {results['kernel']}, containerd "
             f"{results['containerd']}, podman {results['podman']}; medians of {results['reps']} repetitions "
             "(every restore's memory CRC matched: " + ("yes" if results["all_ok"] else "NO") + ").", "",
             "| MiB | runtime | inspect | checkpoint | placeholder start | restore into placeholder | snapshot |",
             "|---|---|---|---|---|---|---|"]
    for mib, sides in results["summary"].items():
        for runtime, row in sides.items():
            lines.append(f"| {mib} | {runtime} | {row['inspect']['median'] * 1000:.0f} ms | "
                         f"{row['checkpoint']['median']:.2f} s | {row['placeholder_start']['median']:.2f} s | "
                         f"{row['restore']['median']:.2f} s | {row['size']['median'] / 2**20:.0f} MiB |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench.containerd_vs_podman", description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--sizes", default="256,1024")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp/warmstart-bench-containerd")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (CRIU, podman, containerd)", file=sys.stderr)
        return 2
    os.makedirs(args.dir, mode=0o700, exist_ok=True)
    bench = Bench(args)
    os.environ.update(CONTAINERD_ADDRESS=bench.containerd.socket, CONTAINERD_NAMESPACE=NAMESPACE)
    raw: Dict[str, List[Dict[str, Any]]] = {}
    try:
        bench.containerd.start(bench.image)
        for mib in [int(s) for s in args.sizes.split(",")]:
            raw[str(mib)] = []
            for rep in range(args.reps):
                one = {}
                for runtime in (["containerd", "podman"] if rep % 2 == 0 else ["podman", "containerd"]):
                    base.log(f"{mib} MiB rep {rep + 1}/{args.reps}: {runtime}")
                    one[runtime] = bench.cycle(runtime, mib)
                raw[str(mib)].append(one)
    finally:
        bench.cleanup()
    keys = ("inspect", "checkpoint", "placeholder_start", "restore", "size")
    results = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "reps": args.reps,
               "cpus": os.cpu_count(), "kernel": os.uname().release,
               "containerd": subprocess.run(["containerd", "--version"], capture_output=True, text=True,
                                            check=False).stdout.split()[2:3],
               "podman": podman("--version").stdout.split()[-1], "raw": raw,
               "all_ok": all(r[rt]["restore_ok"] for reps in raw.values() for r in reps for rt in r),
               "summary": {mib: {rt: {k: summ([r[rt][k] for r in reps]) for k in keys} for rt in reps[0]}
                           for mib, reps in raw.items()}}
    results["containerd"] = (results["containerd"] or ["?"])[0]
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
