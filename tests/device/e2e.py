#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A warm GPU inference server, snapshotted and restored on a real GPU through the collection's modules, end to end.

One command on the device machine (``bash tests/device/e2e.sh --out DIR``, under 8 minutes):

1. brings what that machine lacks (``.device-bundle/``, carried with the checkout: CRIU's bundle with its
   cuda_plugin.so, pycriu's protobuf, ansible-core for running the module files) and prints ``criu check``;
2. starts tests/device/e2e_server.py (a Llama decoder built from its config with fixed-seed bf16 weights,
   a KV cache, a warm-up and a captured CUDA graph) through the ``workload`` module, cold, and times it to
   its first answered request;
3. checkpoints it with the ``checkpoint`` module (``accelerator: cuda``) and restores it with the ``restore``
   module, eagerly and lazily, each time checking the same answer (bit-equal logits, tokens, KV checksums)
   and timing every phase (CUDA lock and checkpoint, CRIU dump, checksums, publish; CRIU restore, CUDA
   restore, unlock, first answer) and the GPU bytes moved per second each way;
4. runs CRIU's own CUDA plugin (``criu dump`` / ``criu restore`` with the bundle's cuda_plugin.so, the same
   mount options) on the same server, side by side;
5. scales device memory (``--sizes``, GiB of device tensors) to show how checkpoint and restore grow with it;
6. writes ``e2e.json`` (everything) and ``e2e.md`` (the tables for docs/benchmarks.md) into ``--out``.

Each module runs as Ansible runs it on a node: its file executed with an arguments file (ansible-core's
module_utils from the bundle where the machine has no ansible-core). ``--dry-run`` (no GPU needed) assembles the
bundle, checks that it stays under 64 MiB and runs every step on the CPU (a tiny decoder, MiB instead of GiB,
no CUDA plugin), so that the device run is the same script already proven here. Prints PASS/FAIL/SKIP/INFO
lines and a SUMMARY line; exits 1 when a check failed.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_checkpoint as base  # noqa: E402  pylint: disable=wrong-import-position

REPO = Path(__file__).resolve().parents[2]
CARRY_LIMIT = 64 << 20
SERVER = Path(__file__).with_name("e2e_server.py")
SHIM = Path(__file__).with_name("cuda_checkpoint_shim.py")


class Report(base.Report):
    """PASS / FAIL / SKIP / INFO lines, and every measured number under ``data``."""

    def __init__(self) -> None:
        super().__init__()
        self.data: Dict[str, Any] = {}


# --- what travels with the checkout ------------------------------------------------------------------------------

def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"{name} is not importable by {sys.executable}: the bundle needs it")
    return Path(list(spec.submodule_search_locations)[0])


def assemble_bundle(criu_bundle: Path, dest: Path) -> Dict[str, Any]:
    """``dest``: the CRIU bundle (bin, libexec, lib with cuda_plugin.so, pycriu), protobuf and ansible-core (for the
    module files), without caches. Returns its size by part."""
    if dest.exists():
        shutil.rmtree(dest)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "tests", "testdata")
    shutil.copytree(criu_bundle.resolve(), dest / "criu", symlinks=True, ignore=ignore)
    for name in ("google.protobuf", "ansible"):
        src = _package_dir(name)
        shutil.copytree(src, dest / "python" / Path(*name.split(".")), symlinks=True, ignore=ignore)
    parts = {"criu": _tree_bytes(dest / "criu"), "protobuf": _tree_bytes(dest / "python" / "google"),
             "ansible": _tree_bytes(dest / "python" / "ansible")}
    (dest / "BUNDLE.json").write_text(json.dumps({"parts": parts, "python": sys.version.split()[0]}, indent=1))
    return {"bytes": sum(parts.values()), "parts": parts}


def install_criu(bundle: Path) -> Tuple[str, Path]:
    """The carried CRIU at the prefix it was built for (its plugin dir is compiled in); (criu binary, prefix)."""
    meta = json.loads((bundle / "criu" / "BUNDLE.json").read_text())
    prefix = Path(meta["prefix"])
    if not (prefix / "bin" / "criu").exists():
        prefix.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(bundle / "criu", prefix, symlinks=True)
    return str(prefix / "bin" / "criu"), prefix


# --- modules, as Ansible runs them on a node ----------------------------------------------------------------------

class Modules:
    def __init__(self, python: str, work: Path, pythonpath: List[str]) -> None:
        self.python = python
        self.work = work
        self.n = 0
        top = work / "collections"
        link = top / "ansible_collections" / "warmstart" / "snapshot"
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(REPO)
        self.collections = str(top)
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join([self.collections, *pythonpath]))
        self.env.pop("ANSIBLE_MODULE_ARGS", None)
        if "WARMSTART_KEYS_DIR" not in self.env:  # measure the restore, not the node's keys: unsigned snapshots
            keys = work / "keys"                  # (a prepared node signs by default, and the carried Python
            keys.mkdir(mode=0o700, exist_ok=True)  # may lack cryptography)
            self.env["WARMSTART_KEYS_DIR"] = str(keys)

    def run(self, name: str, params: Dict[str, Any], timeout: float = 400) -> Dict[str, Any]:
        self.n += 1
        args = self.work / f"args-{self.n}-{name}.json"
        args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": params}))
        done = subprocess.run([self.python, str(REPO / "plugins" / "modules" / f"{name}.py"), str(args)],
                              capture_output=True, text=True, timeout=timeout, env=self.env, check=False)
        for line in reversed(done.stdout.strip().splitlines()):
            if line.startswith("{"):
                try:
                    return dict(json.loads(line))
                except ValueError:
                    break
        return {"failed": True, "msg": f"module {name}: no result (rc {done.returncode}): "
                                       f"{(done.stdout + done.stderr).strip()[-1500:]}"}


# --- the server ------------------------------------------------------------------------------------------------

def get(port: int, path: str, timeout: float = 30) -> Dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
        return dict(json.loads(resp.read()))


def first_answer(port: int, since: float, timeout: float, alive: Optional[int] = None) -> Tuple[Dict[str, Any], float]:
    """The first /generate answer (polled), and the seconds from ``since`` to it."""
    end = time.monotonic() + timeout
    last: Exception = TimeoutError("no answer")
    while time.monotonic() < end:
        if alive is not None and not Path(f"/proc/{alive}").exists():
            raise RuntimeError(f"the server (pid {alive}) ended before it answered")
        try:
            answer = get(port, "/generate", timeout=60)
            return answer, time.monotonic() - since
        except OSError as exc:
            last = exc
            time.sleep(0.02)
    raise TimeoutError(f"no answer on port {port} within {timeout:g} s ({last})")


def same(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    keys = ("logits_sha256", "tokens", "kv_checksum")
    return all(a.get(k) == b.get(k) for k in keys)


def free_port() -> int:
    import socket  # pylint: disable=import-outside-toplevel
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def kill_tree(pid: Optional[int]) -> None:
    """A workload is the init of its PID namespace: killing it ends its tree."""
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# --- the run ---------------------------------------------------------------------------------------------------

class Run:
    def __init__(self, args: argparse.Namespace, report: Report, criu: str, prefix: Path, work: Path,
                 bundle: Path) -> None:
        self.args = args
        self.report = report
        self.criu = criu
        self.prefix = prefix
        self.work = work
        self.gpu = not args.dry_run
        self.accel = "cuda" if self.gpu else "off"
        pythonpath = [str(bundle / "python"), str(prefix / "python")]
        self.mods = Modules(args.python, work, pythonpath)
        self.roots = {"workloads_root": str(work / "workloads"), "store": str(work / "store")}
        self.deadline = time.monotonic() + args.budget

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def server_cmd(self, port: int, model_gib: float, kv: float) -> List[str]:
        cmd = [self.args.python, str(SERVER), "--port", str(port), "--device", "cuda" if self.gpu else "cpu",
               "--model-gib", str(model_gib)]
        cmd += ["--kv-gib", str(kv)] if self.gpu else ["--kv-mib", str(int(kv))]
        return cmd

    def start(self, name: str, port: int, model_gib: float, kv: float) -> Tuple[int, Dict[str, Any], float]:
        """The server started cold through the workload module; (host pid, first answer, seconds to it)."""
        t0 = time.monotonic()
        res = self.mods.run("workload", {"name": name, "root": self.roots["workloads_root"],
                                         "command": self.server_cmd(port, model_gib, kv),
                                         "env": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}})
        if res.get("failed"):
            raise RuntimeError(f"workload module: {res.get('msg')}")
        pid = int(res["workload"]["pid"])
        answer, seconds = first_answer(port, t0, 300, alive=pid)
        return pid, answer, seconds

    def checkpoint(self, name: str) -> Dict[str, Any]:
        res = self.mods.run("checkpoint", {"workload": name, "accelerator": self.accel, "leave_running": False,
                                           "criu_path": self.criu, **self.roots})
        if res.get("failed"):
            raise RuntimeError(f"checkpoint module: {res.get('msg')}")
        return dict(res["snapshot"])

    def restore(self, snapshot: str, port: int, lazy: bool = False) -> Tuple[Dict[str, Any], Dict[str, Any], float]:
        t0 = time.monotonic()
        res = self.mods.run("restore", {"snapshot": snapshot, "accelerator": self.accel, "lazy": lazy,
                                        "criu_path": self.criu, "restore_root": str(self.work / "restore"),
                                        **self.roots})
        if res.get("failed"):
            raise RuntimeError(f"restore module{' (lazy)' if lazy else ''}: {res.get('msg')} {res.get('reasons') or ''}")
        module_s = time.monotonic() - t0
        answer, seconds = first_answer(port, t0, 120, alive=int(res["restore"]["pid"]))
        restored = dict(res["restore"])
        restored["module_seconds"] = round(module_s, 3)
        return restored, answer, seconds

    def stop(self, name: str) -> None:
        self.mods.run("workload", {"name": name, "root": self.roots["workloads_root"], "state": "stopped"})

    # -- the steps ---------------------------------------------------------------------------------------------
    def server(self) -> None:
        rep, args = self.report, self.args
        port = free_port()
        pid, cold_answer, cold_s = self.start("e2e", port, args.model_gib, args.kv)
        stats = get(port, "/stats")
        again = get(port, "/generate")
        rep.data["server"] = {"stats": stats, "cold_start_s": round(cold_s, 3), "answer": cold_answer}
        rep.check(same(cold_answer, again), "server answers the same twice",
                  f"pid {pid}: cold start to first answer {cold_s:.2f} s; phases {stats['phases']}; "
                  f"{stats['params'] / 1e9:.2f} B parameters, device memory {stats['device_bytes'] / 2**30:.2f} GiB, "
                  f"CUDA graphs {stats['graphs']}")
        snap = self.checkpoint("e2e")
        gpu_bytes = stats["device_bytes"]
        rep.data["checkpoint"] = {"id": snap["id"], "size": snap.get("size"), "timings": snap.get("timings"),
                                  "cuda": snap.get("cuda"), "gpu_bytes": gpu_bytes}
        rep.check(True, "checkpoint (accelerator: %s)" % self.accel,
                  f"snapshot {snap['id']}, {snap.get('size', 0) / 2**30:.2f} GiB; timings {snap.get('timings')}"
                  + rate(gpu_bytes, (snap.get("timings") or {}).get("cuda_checkpoint"), "device -> host"))

        restored, answer, first_s = self.restore(snap["id"], port)
        rep.data["restore_eager"] = {"timings": restored.get("timings"), "first_answer_s": round(first_s, 3),
                                     "module_s": restored["module_seconds"], "cuda": restored.get("cuda")}
        rep.check(same(answer, cold_answer), "eager restore, same answer",
                  f"first answer {first_s:.2f} s after the restore began ({cold_s / first_s:.1f}x sooner than "
                  f"cold); timings {restored.get('timings')}"
                  + rate(gpu_bytes, (restored.get("timings") or {}).get("cuda_restore"), "host -> device"))

        self.raw_criu(int(restored["pid"]), port, cold_answer)

        restored, answer, first_s = self.restore(snap["id"], port, lazy=True)
        rep.data["restore_lazy"] = {"timings": restored.get("timings"), "first_answer_s": round(first_s, 3),
                                    "module_s": restored["module_seconds"], "lazy": restored.get("lazy")}
        lazy = restored.get("lazy") or {}
        rep.check(same(answer, cold_answer), "lazy restore, same answer",
                  f"first answer {first_s:.2f} s after the restore began ({cold_s / first_s:.1f}x sooner than cold); "
                  f"lazy used: {lazy.get('used')} ({lazy.get('reason')}); timings {restored.get('timings')}")
        self.stop("e2e")
        shutil.rmtree(Path(self.roots["store"]) / "snapshots" / snap["id"], ignore_errors=True)

    def raw_criu(self, pid: int, port: int, want: Dict[str, Any]) -> None:
        """CRIU's own CUDA plugin on the same server: ``criu dump`` / ``criu restore`` with the bundle's plugins and the
        mount options warmstart gives CRIU for a workload, and nothing of warmstart's."""
        rep = self.report
        plugins = self.prefix / "lib" / "criu"
        env = dict(os.environ)
        shim = ""
        if self.gpu and not shutil.which("cuda-checkpoint"):
            shim_dir = self.work / "shim"
            shim_dir.mkdir(exist_ok=True)
            wrapper = shim_dir / "cuda-checkpoint"
            wrapper.write_text(f"#!/bin/sh\nexec {self.args.python} {SHIM} \"$@\"\n")
            wrapper.chmod(0o755)
            env["PATH"] = f"{shim_dir}{os.pathsep}{env.get('PATH', '')}"
            env["WARMSTART_COLLECTIONS"] = self.mods.collections
            shim = " (cuda-checkpoint: warmstart's shim over the driver API; NVIDIA's utility is not installed)"
        sys.path.insert(0, self.mods.collections)
        from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _mountns as mns  # pylint: disable=import-outside-toplevel
        from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc  # pylint: disable=import-outside-toplevel
        plan = mns.plan(pid, proc.descendants(pid))
        common = ["--tcp-established", "--ext-unix-sk", "--file-locks", "--link-remap", "--network-lock", "nftables",
                  "-L", str(plugins), "-v4"]
        mounts = ["--external", "mnt[]", "--enable-external-masters"] if plan else []
        skips = [a for p in (plan.skipped if plan else []) for a in ("--skip-mnt", p)]
        images = self.work / "raw"
        shutil.rmtree(images, ignore_errors=True)
        images.mkdir(mode=0o700)
        t0 = time.monotonic()
        dump = subprocess.run([self.criu, "dump", "-t", str(pid), "-D", str(images), "-o", "dump.log",
                               *common, *mounts, *skips], capture_output=True, text=True, env=env, check=False)
        dump_s = time.monotonic() - t0
        if not rep.check(dump.returncode == 0, "criu dump with its cuda plugin" if self.gpu else "criu dump",
                         f"{dump_s:.2f} s{shim}" if dump.returncode == 0 else tail(images / "dump.log")):
            kill_tree(pid)
            return
        pidfile = self.work / "raw.pid"
        t0 = time.monotonic()
        rst = subprocess.run([self.criu, "restore", "-D", str(images), "-o", "restore.log", "-d", "--restore-sibling",
                              "--pidfile", str(pidfile), *common, *(["--root", "/"] + mounts if plan else [])],
                             capture_output=True, text=True, env=env, check=False)
        restore_s = time.monotonic() - t0
        if not rep.check(rst.returncode == 0, "criu restore with its cuda plugin" if self.gpu else "criu restore",
                         f"{restore_s:.2f} s" if rst.returncode == 0 else tail(images / "restore.log")):
            return
        copy = int(pidfile.read_text().strip())
        try:
            answer, first_s = first_answer(port, t0, 120, alive=copy)
            rep.data["raw_criu"] = {"dump_s": round(dump_s, 3), "restore_s": round(restore_s, 3),
                                    "first_answer_s": round(first_s, 3), "cuda_checkpoint": shim.strip() or
                                    (shutil.which("cuda-checkpoint") if self.gpu else None),
                                    "images_bytes": _tree_bytes(images)}
            rep.check(same(answer, want), "criu's own restore, same answer",
                      f"first answer {first_s:.2f} s after `criu restore` began (dump {dump_s:.2f} s, restore "
                      f"{restore_s:.2f} s; images {_tree_bytes(images) / 2**30:.2f} GiB)")
        finally:
            kill_tree(copy)
            time.sleep(0.5)
            shutil.rmtree(images, ignore_errors=True)

    def scaling(self) -> None:
        rep, args = self.report, self.args
        rows = []
        rate_seen = 0.0
        for size in args.sizes:
            unit = "GiB" if self.gpu else "MiB"
            need = 60 + (2 * size / rate_seen if rate_seen else 0)
            if self.left() < need:
                rep.add("SKIP", f"scaling {size} {unit}", f"{self.left():.0f} s left of the budget, about {need:.0f} "
                        "s needed")
                continue
            port = free_port()
            name = f"kv{size}".replace(".", "-")
            try:
                _pid, cold_answer, cold_s = self.start(name, port, 0, size)
                stats = get(port, "/stats")
                snap = self.checkpoint(name)
                restored, answer, first_s = self.restore(snap["id"], port)
            except (RuntimeError, OSError, TimeoutError) as exc:
                rep.check(False, f"scaling {size} {unit}", str(exc))
                self.stop(name)
                continue
            ck, rs = snap.get("timings") or {}, restored.get("timings") or {}
            row = {"size": size, "unit": unit, "device_bytes": stats["device_bytes"], "cold_start_s": round(cold_s, 3),
                   "checkpoint": ck, "restore": rs, "first_answer_s": round(first_s, 3),
                   "snapshot_bytes": snap.get("size")}
            rows.append(row)
            seconds = ck.get("total") or 0
            rate_seen = max(rate_seen, size / seconds if seconds else 0)
            rep.check(same(answer, cold_answer), f"scaling {size} {unit}",
                      f"checkpoint {ck.get('total')} s (cuda {ck.get('cuda_checkpoint')} s, dump {ck.get('dump')} s), "
                      f"restore to first answer {first_s:.2f} s (cuda {rs.get('cuda_restore')} s)"
                      + rate(stats["device_bytes"], ck.get("cuda_checkpoint"), "device -> host")
                      + rate(stats["device_bytes"], rs.get("cuda_restore"), "host -> device"))
            self.stop(name)
            shutil.rmtree(Path(self.roots["store"]) / "snapshots" / snap["id"], ignore_errors=True)
        rep.data["scaling"] = rows


def rate(nbytes: int, seconds: Optional[float], what: str) -> str:
    if not seconds or not what:
        return ""
    return f"; {what} {nbytes / seconds / 1e9:.1f} GB/s"


def tail(log: Path, lines: int = 6) -> str:
    try:
        return " | ".join(log.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return f"(no {log})"


def environment(report: Report, criu: str, python: str) -> bool:
    """The machine, the GPU and ``criu check``: a kernel that refuses CRIU is a finding, not a mystery."""
    smi = shutil.which("nvidia-smi")
    gpu = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False).stdout.strip() if smi else "no nvidia-smi"
    torch = subprocess.run([python, "-c", "import torch, transformers; print(torch.__version__, torch.version.cuda, "
                                          "transformers.__version__)"],
                           capture_output=True, text=True, check=False)
    report.data["machine"] = {"kernel": os.uname().release, "gpu": gpu, "python": python,
                              "torch": torch.stdout.strip() or torch.stderr.strip()[-300:]}
    report.add("INFO", "machine", f"kernel {os.uname().release}; {gpu}; torch/cuda/transformers {torch.stdout.strip()}")
    version = subprocess.run([criu, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    check = subprocess.run([criu, "check"], capture_output=True, text=True, timeout=60, check=False)
    text = (check.stdout + check.stderr).strip()
    report.data["criu_check"] = {"rc": check.returncode, "output": text, "version": version}
    print(f"---- criu check ({criu}, {' '.join(version.split())}) ----\n{text}\n----", flush=True)
    return report.check(check.returncode == 0, "criu check", text.splitlines()[-1] if text else str(check.returncode))


def markdown(report: Report) -> str:
    """The tables of this run, for docs/benchmarks.md."""
    d = report.data
    m = d.get("machine", {})
    out = [f"Machine: {m.get('gpu')}; kernel {m.get('kernel')}; torch/cuda/transformers {m.get('torch')}.", ""]
    s, ck = d.get("server"), d.get("checkpoint")
    if s and ck:
        st = s["stats"]
        out += ["| phase | seconds |", "|---|---:|",
                f"| cold start to first answer ({st['params'] / 1e9:.2f} B params, "
                f"{st['device_bytes'] / 2**30:.2f} GiB on the device) | {s['cold_start_s']} |"]
        out += [f"| checkpoint: {k} | {v} |" for k, v in (ck.get("timings") or {}).items()]
        for key, label in (("restore_eager", "eager restore"), ("restore_lazy", "lazy restore")):
            if key in d:
                out += [f"| {label}: {k} | {v} |" for k, v in (d[key].get("timings") or {}).items()]
                out.append(f"| {label}: first answer | {d[key]['first_answer_s']} |")
        raw = d.get("raw_criu")
        if raw:
            out += [f"| criu dump, its cuda plugin | {raw['dump_s']} |", f"| criu restore, its cuda plugin | "
                    f"{raw['restore_s']} |", f"| criu restore: first answer | {raw['first_answer_s']} |"]
        eager = d.get("restore_eager", {}).get("first_answer_s")
        if eager:
            out += ["", f"Cold start / warmstart eager restore to first answer: {s['cold_start_s'] / eager:.1f}x."]
            if raw:
                out.append(f"warmstart eager restore / CRIU with its plugin, to first answer: "
                           f"{eager / raw['first_answer_s']:.2f}x.")
    rows = d.get("scaling") or []
    if rows:
        out += ["", "| device memory | checkpoint s | CUDA checkpoint s | dump s | restore to first answer s | "
                "CUDA restore s | D2H GB/s | H2D GB/s |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            ck, rs, b = r["checkpoint"], r["restore"], r["device_bytes"]
            d2h = f"{b / ck['cuda_checkpoint'] / 1e9:.1f}" if ck.get("cuda_checkpoint") else "-"
            h2d = f"{b / rs['cuda_restore'] / 1e9:.1f}" if rs.get("cuda_restore") else "-"
            out.append(f"| {r['size']} {r['unit']} | {ck.get('total')} | {ck.get('cuda_checkpoint', '-')} | "
                       f"{ck.get('dump')} | {r['first_answer_s']} | {rs.get('cuda_restore', '-')} | {d2h} | {h2d} |")
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", required=True, help="folder for e2e.json, e2e.md and the logs")
    parser.add_argument("--python", default=os.environ.get("PYTHON", sys.executable), help="Python with PyTorch")
    parser.add_argument("--dry-run", action="store_true", help="no GPU: assemble the bundle, run every step on the CPU")
    parser.add_argument("--model-gib", type=float, default=None, help="decoder weights, GiB (default 2; dry run tiny)")
    parser.add_argument("--kv", type=float, default=None, help="KV cache: GiB (default 4; dry run: 32 MiB)")
    parser.add_argument("--sizes", default=None, help="device memory to scale over, GiB (default 1,8,32; dry run: "
                                                      "MiB 16,64)")
    parser.add_argument("--budget", type=float, default=420, help="seconds the run may take before it skips sizes")
    parser.add_argument("--criu-bundle", default="/opt/warmstart/criu/current", help="dry run: the bundle to carry")
    parser.add_argument("--bundle", default=str(REPO / ".device-bundle"),
                        help="what travels with the checkout (the dry run assembles it; git ignores .device-bundle)")
    parser.add_argument("--no-assemble", action="store_true", help="dry run: use the bundle as it is")
    args = parser.parse_args()
    dry = args.dry_run
    args.model_gib = args.model_gib if args.model_gib is not None else (1.0 if dry else 2.0)
    args.kv = args.kv if args.kv is not None else (32 if dry else 4.0)
    args.sizes = [float(x) if not dry else int(x) for x in (args.sizes or ("16,64" if dry else "1,8,32")).split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = Report()
    t_start = time.monotonic()
    bundle = Path(args.bundle)
    if dry and not args.no_assemble:
        size = assemble_bundle(Path(args.criu_bundle), bundle)
        report.data["bundle"] = size
        parts = ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in size["parts"].items())
        report.check(size["bytes"] < CARRY_LIMIT, "bundle under 64 MiB",
                     f"{bundle}: {size['bytes'] / 2**20:.1f} MiB ({parts})")
    if not (bundle / "criu" / "BUNDLE.json").exists():
        report.check(False, "bundle", f"{bundle} is missing: run the dry run on a prepared node first (it assembles it)")
        return finish(report, out, t_start)
    criu, prefix = install_criu(bundle)
    if not environment(report, criu, args.python):
        return finish(report, out, t_start)
    if os.geteuid() != 0:
        report.check(False, "root", "CRIU needs root")
        return finish(report, out, t_start)
    work = Path(tempfile.mkdtemp(prefix="warmstart-e2e-", dir="/var/tmp"))
    run = Run(args, report, criu, prefix, work, bundle)
    try:
        try:
            run.server()
        except (RuntimeError, OSError, TimeoutError) as exc:
            report.check(False, "inference server", f"{type(exc).__name__}: {exc}")
        run.scaling()
    finally:
        keep = out / "logs"
        keep.mkdir(exist_ok=True)
        for log in list(work.glob("workloads/*/std*.log")) + list(work.glob("restore/*/restore.log")):
            shutil.copy(log, keep / f"{log.parent.name}-{log.name}")
        for pidfile in work.glob("workloads/*/pid"):
            kill_tree(int(pidfile.read_text().strip() or 0))
        shutil.rmtree(work, ignore_errors=True)
    return finish(report, out, t_start)


def finish(report: Report, out: Path, t_start: float) -> int:
    elapsed = time.monotonic() - t_start
    ok = report.summary(elapsed)
    (out / "e2e.json").write_text(json.dumps({"ok": ok, "seconds": round(elapsed, 1), "results": report.results,
                                              "data": report.data}, indent=2))
    (out / "e2e.md").write_text(markdown(report))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
