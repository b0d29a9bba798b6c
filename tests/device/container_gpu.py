# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The GPU side of restoring GPU containers into placeholders, against the real driver (one command, < 5 minutes).

Drives ``_gpuplace`` and ``_cuda`` / ``_cudabackends`` / ``_cudaabi`` (loaded from this checkout, standard library only) with real PyTorch processes:

- placeholder GPUs: a process started as a placeholder would be (``NVIDIA_VISIBLE_DEVICES`` = a GPU's UUID)
  is read back as given that GPU (with its ``/dev/nvidia<N>`` node), and the snapshot's GPUs map onto it;
- multi-process: two spawned PyTorch processes (the workers of one tree) fill GPU memory, are checked for
  shared CUDA memory (none), locked together, checkpointed together, restored onto the placeholder's GPUs
  and unlocked together; both read back the same tensors;
- shared CUDA memory: a PyTorch process forked after CUDA was initialised shares the NVIDIA device files of
  its parent, and ``shared_memory_problems`` finds it; a CUDA IPC export to a spawned process is reported
  as what the heuristic sees (INFO: legacy IPC handles leave no shared file).

The CRIU part of the container path (podman, placeholders) runs in tests/integration/test_container_gpu.py.
Prints PASS/FAIL/INFO per check and ``SUMMARY: PASS|FAIL``; exit status 1 when a check failed.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import select
import subprocess
import tempfile
import sys
import time
from pathlib import Path
from typing import Any, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_checkpoint as base  # noqa: E402  pylint: disable=wrong-import-position

FORKED = r'''
import json, os, sys, time
import torch
x = torch.ones(1024, device="cuda:0")
torch.cuda.synchronize()
pid = os.fork()
if pid == 0:
    time.sleep(120)
    os._exit(0)
print(json.dumps({"parent": os.getpid(), "child": pid}), flush=True)
sys.stdin.readline()
os.kill(pid, 9)
'''

IPC = r'''
import json, os, sys, time
import torch
import torch.multiprocessing as mp


def hold(q):
    t = q.get()
    print(json.dumps({"importer": os.getpid(), "sum": float(t.sum().item())}), flush=True)
    time.sleep(120)


if __name__ == "__main__":
    mp.set_start_method("spawn")
    q = mp.Queue()
    p = mp.Process(target=hold, args=(q,))
    p.start()
    t = torch.ones(1 << 20, device="cuda:0")
    q.put(t)
    print(json.dumps({"exporter": os.getpid(), "importer_pid": p.pid}), flush=True)
    sys.stdin.readline()
    p.kill()
'''


def load(name: str) -> Any:
    base.load_cuda_binding()
    return importlib.import_module(f"ansible_collections.warmstart.snapshot.plugins.module_utils.{name}")


def lines(proc: "subprocess.Popen[str]", count: int, timeout: float = 60) -> List[dict]:
    out: List[dict] = []
    end = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < end:
        if not proc.stdout or not select.select([proc.stdout], [], [], max(0.0, end - time.monotonic()))[0]:
            break
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def placeholder_step(report: base.Report, gpl: Any, gpus: List[dict]) -> Any:
    node = [dict(g, index=i) for i, g in enumerate(gpus)]
    env = dict(os.environ, NVIDIA_VISIBLE_DEVICES=node[0]["uuid"])
    holder = subprocess.Popen(["sleep", "120"], env=env)
    try:
        end = time.monotonic() + 10
        while "NVIDIA_VISIBLE_DEVICES" not in gpl.environ(holder.pid) and time.monotonic() < end:
            time.sleep(0.05)  # until it has exec'd: before, /proc/<pid>/environ is still ours
        given, how, problems = gpl.visible_gpus(gpl.environ(holder.pid), gpl.device_nodes(holder.pid), node)
        report.check([g["uuid"] for g in given] == [node[0]["uuid"]] and not problems, "placeholder gpus",
                     f"{how} -> {[g['uuid'] for g in given]} {problems or ''}")
        pairs, problems = gpl.placeholder_pairs(holder.pid, "placeholder", {"gpus": [node[0]]}, node)
        report.check(pairs == [(node[0]["uuid"], node[0]["uuid"])] and not problems, "placeholder device map",
                     f"{pairs} {problems or ''}")
        return pairs
    finally:
        holder.kill()
        holder.wait()


def multi_step(report: base.Report, cuda: Any, abi: Any, bk: Any, gpl: Any, python: str, mib: int, pairs: Any) -> None:
    kids = [base.Child(python, mib, None) for _n in range(2)]
    try:
        before = [k.read() for k in kids]
        pids = [k.pid for k in kids]
        report.check(cuda.find_cuda_pids(pids) == pids, "two CUDA processes", f"{pids}")
        shared = gpl.shared_memory_problems(pids)
        report.check(shared == [], "spawned workers share nothing", "; ".join(shared) or "no shared device file")
        timings = cuda.lock_and_checkpoint(pids, 10000)
        states = [bk.availability()[0].state(p) for p in pids]
        report.check(states == [abi.CHECKPOINTED] * 2, "lock + checkpoint together", f"{states} {timings}")
        timings = cuda.restore_and_unlock(pids, pairs)
        after = [k.ask() for k in kids]
        same = all(a["sha256"] == b["sha256"] for a, b in zip(after, before))
        report.check(same, "restore + unlock together, tensors intact", f"{timings}")
    except Exception as exc:  # pylint: disable=broad-except
        report.check(False, "multi-process", f"{type(exc).__name__}: {exc}")
    finally:
        for k in kids:
            k.stop()


def shared_step(report: base.Report, gpl: Any, python: str) -> None:
    forked = subprocess.Popen([python, "-c", FORKED], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    pids: List[int] = []
    try:
        got = lines(forked, 1)
        pids = [got[0]["parent"], got[0]["child"]] if got else []
        found = gpl.shared_memory_problems(pids) if pids else []
        report.check(bool(found), "fork after CUDA init is refused", "; ".join(found)[:300] or f"nothing found {pids}")
    finally:
        forked.kill()
        forked.wait()
        for pid in pids[1:]:  # the forked child holds our stdout and stderr
            try:
                os.kill(int(pid), 9)
            except OSError:
                pass
    script = Path(tempfile.mkdtemp(prefix="warmstart-ipc-")) / "ipc.py"  # spawn re-imports __main__ by path
    script.write_text(IPC, encoding="utf-8")
    ipc = subprocess.Popen([python, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    got: dict = {}
    try:
        got = {k: v for d in lines(ipc, 2) for k, v in d.items()}
        if "importer" in got:
            found = gpl.shared_memory_problems([got["exporter"], got["importer"]])
            report.add("INFO", "cuda ipc between spawned processes", "; ".join(found)[:300] or
                       "no shared device file: a legacy IPC handle is not seen by this check")
        else:
            report.add("INFO", "cuda ipc between spawned processes", f"did not start: {got}")
    finally:
        ipc.kill()
        ipc.wait()
        if "importer" in got:
            try:
                os.kill(int(got["importer"]), 9)
            except OSError:
                pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--python", default=os.environ.get("PYTHON", sys.executable))
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    t0 = time.monotonic()
    report = base.Report()
    abi, bk, cuda, gpl = load("accel._cudaabi"), load("accel._cudabackends"), load("accel._cuda"), load("accel._gpuplace")
    backend, why = bk.availability()
    gpus = base.node_gpus()
    if backend is None or not gpus:
        report.check(False, "backend", f"{why}; GPUs {gpus}")
    else:
        report.check(True, "backend", backend.describe())
        pairs = placeholder_step(report, gpl, gpus)
        multi_step(report, cuda, abi, bk, gpl, args.python, args.mib, pairs)
        shared_step(report, gpl, args.python)
    return report.finish(t0, args.json)


if __name__ == "__main__":
    sys.exit(main())
