#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Device check for the CUDA checkpoint binding (plugins/module_utils/accel/_cuda*.py) on a real NVIDIA GPU.

Run it with ``bash tests/device/run.sh`` (one command, under 5 minutes) on a
machine with an NVIDIA driver >= 570 and PyTorch with CUDA. It:

1. starts a PyTorch process that fills GPU tensors with known data (1 GiB by
   default) and reports their checksum and its GPU memory;
2. finds it as a CUDA process (restore-thread query, NVML);
3. refuses an illegal transition (checkpoint before lock) without harm;
4. locks + checkpoints it through OUR binding and checks that NVML no longer
   shows GPU memory held by it (and that its host RSS grew);
5. restores (with the identity GPU device map) + unlocks it and checks the
   tensors are intact (same checksum) and kernels still run;
6. checks the rollback: lock_and_checkpoint([it, a non-CUDA pid]) fails and
   leaves it RUNNING, still computing;
7. the full CRIU + CUDA snapshot of a PyTorch workload through the
   collection's checkpoint / restore modules with ``cuda: required``: CRIU
   dump, the source ended, CRIU restore, GPU state restored and unlocked,
   the same tensors read back (SKIP where CRIU cannot run: no CRIU, not
   root, no pycriu, ``criu check`` failing).

It prints one PASS/FAIL/SKIP line per check and a SUMMARY line; the exit
status is 1 when any check failed. ``--json FILE`` also writes the results.
Standard library + PyTorch (+ pynvml or nvidia-smi for the memory checks).
"""
from __future__ import annotations

import argparse
import glob
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[2]

CHILD = r'''
import hashlib, json, os, sys, time
import torch

mib = int(sys.argv[1])
dev = torch.device("cuda:0")
gen = torch.Generator(device=dev)
gen.manual_seed(20251202)
chunk = 64  # MiB per tensor
tensors = [torch.rand(chunk * 1024 * 1024 // 4, device=dev, generator=gen) for i in range(max(1, mib // chunk))]
torch.cuda.synchronize()


def digest():
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.cpu().numpy().tobytes())
    kernel = float(sum((t * 2.0 + 1.0).double().sum().item() for t in tensors))  # a kernel launch per tensor
    torch.cuda.synchronize()
    return {"sha256": h.hexdigest(), "kernel_sum": kernel}


print(json.dumps({"pid": os.getpid(), "tensors": len(tensors), "bytes": sum(t.numel() * 4 for t in tensors), **digest()}),
      flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "check":
        t0 = time.monotonic()
        out = digest()
        out["seconds"] = round(time.monotonic() - t0, 3)
        print(json.dumps(out), flush=True)
    elif cmd == "exit":
        break
'''


def load_cuda_binding() -> Tuple[Any, Any, Any]:
    """plugins/module_utils/accel/_cudaabi.py, _cudabackends.py and _cuda.py, imported by their collection names from
    this checkout (standard library only, no Ansible needed): a temporary ``ansible_collections/warmstart/snapshot``
    link to the checkout goes on sys.path."""
    top = str(collection_path(Path(tempfile.mkdtemp(prefix="warmstart-device-binding-"))))
    if top not in sys.path:
        sys.path.insert(0, top)
    accel = "ansible_collections.warmstart.snapshot.plugins.module_utils.accel"
    abi, backends, cuda = (importlib.import_module(f"{accel}.{name}") for name in ("_cudaabi", "_cudabackends", "_cuda"))
    return abi, backends, cuda


class Report:
    """PASS / FAIL / SKIP / INFO lines, as each check ends, and the SUMMARY line; shared by the device scripts
    (container_gpu.py and e2e.py import this file from their own directory)."""

    def __init__(self) -> None:
        self.results: List[Dict[str, str]] = []

    def add(self, status: str, name: str, detail: str = "") -> bool:
        self.results.append({"status": status, "check": name, "detail": detail})
        print(f"{status:4} {name}: {detail}", flush=True)
        return status != "FAIL"

    def check(self, ok: bool, name: str, detail: str = "") -> bool:
        return self.add("PASS" if ok else "FAIL", name, detail)

    def failed(self) -> List[str]:
        return [r["check"] for r in self.results if r["status"] == "FAIL"]

    def summary(self, seconds: float) -> bool:
        """Print the SUMMARY line (the PASS and FAIL checks counted, the failed ones named, ``seconds`` taken);
        whether no check failed."""
        failed = self.failed()
        checks = [r for r in self.results if r["status"] in ("PASS", "FAIL")]
        summary = (f"SUMMARY: PASS ({len(checks)} checks" if not failed else
                   f"SUMMARY: FAIL ({len(failed)} of {len(checks)} checks failed: {', '.join(failed)}")
        print(f"{summary}; {seconds:.1f} s)", flush=True)
        return not failed

    def finish(self, t0: float, json_path: Optional[str]) -> int:
        """The end of a run that began at ``t0``: the SUMMARY line, the results written to ``json_path`` (when
        given) as ``{"ok", "results"}``; the exit status (1 when a check failed)."""
        ok = self.summary(time.monotonic() - t0)
        if json_path:
            Path(json_path).write_text(json.dumps({"ok": ok, "results": self.results}, indent=2), encoding="utf-8")
        return 0 if ok else 1


def _nvml() -> Any:
    try:
        import pynvml  # pylint: disable=import-outside-toplevel
        pynvml.nvmlInit()
        return pynvml
    except Exception:  # pylint: disable=broad-except
        return None


def process_gpu_memory(pid: int) -> Optional[int]:
    """Bytes NVML shows for pid (1 when listed without an amount, 0 when not listed); None when NVML is unusable."""
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        total, listed = 0, False
        for index in range(nvml.nvmlDeviceGetCount()):
            for proc in nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByIndex(index)):
                if proc.pid == pid:
                    listed = True
                    total += int(proc.usedGpuMemory or 0)
        return max(total, 1) if listed else 0
    except Exception:  # pylint: disable=broad-except
        return None
    finally:
        nvml.nvmlShutdown()


def device_used_memory() -> Optional[int]:
    """Bytes used on all GPUs (NVML, else nvidia-smi); None when neither answers."""
    nvml = _nvml()
    if nvml is not None:
        try:
            return sum(int(nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(i)).used)
                       for i in range(nvml.nvmlDeviceGetCount()))
        except Exception:  # pylint: disable=broad-except
            pass
        finally:
            nvml.nvmlShutdown()
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=False)
    try:
        return sum(int(float(line)) for line in out.stdout.split()) * 1024 * 1024 if out.returncode == 0 else None
    except ValueError:
        return None


class Memory:
    """GPU memory of the PyTorch process: per process where NVML sees its pid, else the device's used memory."""

    def __init__(self, pid: int, size: int) -> None:
        self.pid = pid
        self.size = size
        self.process = process_gpu_memory(pid)
        self.device = device_used_memory()

    def text(self) -> str:
        proc = "not visible" if not self.process else f"{self.process >> 20} MiB"
        dev = "unknown" if self.device is None else f"{self.device >> 20} MiB"
        return f"process {proc}, device used {dev}"

    def released(self, before: "Memory") -> Optional[bool]:
        if before.process:
            return self.process == 0
        if before.device is not None and self.device is not None:
            return before.device - self.device >= 0.8 * self.size
        return None

    def back(self, released: "Memory") -> Optional[bool]:
        if self.process is not None and released.process is not None and self.process > 0:
            return True
        if self.device is not None and released.device is not None:
            return self.device - released.device >= 0.8 * self.size
        return None


def rss_of(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def node_gpus() -> List[Dict[str, str]]:
    if shutil.which("nvidia-smi") is None:
        return []
    out = subprocess.run(["nvidia-smi", "--query-gpu=uuid,name", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False)
    gpus = []
    for line in out.stdout.splitlines():
        fields = [part.strip() for part in line.split(",", 1)]
        if len(fields) == 2 and fields[0].startswith("GPU-"):
            gpus.append({"uuid": fields[0], "name": fields[1]})
    return gpus


class Child:
    def __init__(self, python: str, mib: int, visible: Optional[str]) -> None:
        env = dict(os.environ)
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        self.proc = subprocess.Popen([python, "-c", CHILD, str(mib)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        self.pid = self.proc.pid

    def read(self, timeout: float = 120) -> Dict[str, Any]:
        assert self.proc.stdout is not None
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the PyTorch process exited (status {self.proc.poll()})")
            line = line.strip()
            if line.startswith("{"):
                return json.loads(line)
        raise TimeoutError("the PyTorch process did not answer")

    def ask(self) -> Dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("check\n")
        self.proc.stdin.flush()
        return self.read()

    def stop(self) -> None:
        try:
            if self.proc.poll() is None and self.proc.stdin is not None:
                self.proc.stdin.write("exit\n")
                self.proc.stdin.flush()
                self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def find_criu() -> Optional[str]:
    for candidate in [os.environ.get("CRIU", "")] + sorted(glob.glob("/opt/warmstart/criu/*/bin/criu")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("criu")


WORKER = r'''
import hashlib, json, os, sys, time
import torch

ctl = os.environ["SNAPSHOT_CONTROL_DIR"]
mib = int(sys.argv[1])
dev = torch.device("cuda:0")
gen = torch.Generator(device=dev)
gen.manual_seed(20251203)
tensors = [torch.rand(64 * 1024 * 1024 // 4, device=dev, generator=gen) for i in range(max(1, mib // 64))]
torch.cuda.synchronize()


def answer():
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.cpu().numpy().tobytes())
    kernel = float(sum((t * 2.0 + 1.0).double().sum().item() for t in tensors))
    out = {"pid": os.getpid(), "sha256": h.hexdigest(), "kernel_sum": kernel}
    with open(os.path.join(ctl, "answer.json.tmp"), "w") as handle:
        json.dump(out, handle)
    os.rename(os.path.join(ctl, "answer.json.tmp"), os.path.join(ctl, "answer.json"))


answer()
open(os.path.join(ctl, "ready-for-snapshot"), "w").close()
while True:  # talks over files only: CRIU cannot restore a pipe to a process outside the tree
    if os.path.exists(os.path.join(ctl, "ask")):
        os.unlink(os.path.join(ctl, "ask"))
        answer()
    time.sleep(0.05)
'''


class ModuleExit(Exception):
    def __init__(self, result: Dict[str, Any]) -> None:
        super().__init__(result.get("msg", ""))
        self.result = result


class FakeModule:
    """What the module adapter (_adapter.run_module) uses of AnsibleModule."""

    def __init__(self, params: Dict[str, Any]) -> None:
        self.params = params
        self.check_mode = False

    def exit_json(self, **result: Any) -> None:
        raise ModuleExit(dict(result, failed=False))

    def fail_json(self, **result: Any) -> None:
        raise ModuleExit(dict(result, failed=True))

    def warn(self, text: str) -> None:
        print(f"WARN {text}", flush=True)


def run_module(name: str, params: Dict[str, Any], work: Path) -> Dict[str, Any]:
    """Run plugins/modules/<name>.py as Ansible would (its argument spec and defaults) when ansible-core is
    importable, else its glue in _module with the same parameters filled in; the module's result."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    probe = subprocess.run([sys.executable, "-c", "import ansible.module_utils.basic"], capture_output=True, env=env, check=False)
    if probe.returncode == 0:
        args = work / f"{name}-args.json"
        args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": params}), encoding="utf-8")
        done = subprocess.run([sys.executable, str(REPO / "plugins" / "modules" / f"{name}.py"), str(args)],
                              capture_output=True, text=True, env=env, timeout=240, check=False)
        for line in reversed(done.stdout.splitlines()):
            if line.startswith("{"):
                return json.loads(line)
        return {"failed": True, "msg": f"module {name} printed no result: {done.stdout[-800:]} {done.stderr[-800:]}"}
    from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _adapter  # pylint: disable=import-outside-toplevel
    from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _checkpoint  # pylint: disable=import-outside-toplevel
    from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _restore  # pylint: disable=import-outside-toplevel
    defaults = {
        "checkpoint": dict(pid=None, pidfile=None, workload=None, container=None, pod=None, runtime="podman",
                           workloads_root="/var/lib/warmstart/workloads", name=None, labels={}, leave_running=True,
                           tcp="established", ext_unix_sk=True, file_locks=True, link_remap=True, ghost_limit=512 << 20,
                           timeout=0, wait_ready=False, ready_timeout=300, cuda="auto", cuda_lock_timeout=30),
        "restore": dict(snapshot=None, name=None, labels=None, verify=True, skip_compat_check=False,
                        restore_root="/var/lib/warmstart/restore", into=None, cuda="auto"),
    }[name]
    full = dict(defaults, store="/var/lib/warmstart/store", store_options={}, criu_path=None, progress_file=None,
                progress_interval=0)
    full.update(params)
    try:
        _adapter.run_module(FakeModule(full), _checkpoint.run if name == "checkpoint" else _restore.run, progress=True)
    except ModuleExit as done:
        return done.result
    return {"failed": True, "msg": f"module {name} ended without a result"}


def collection_path(work: Path) -> Path:
    """A directory where ``ansible_collections.warmstart.snapshot`` is this checkout."""
    top = work / "collections"
    link = top / "ansible_collections" / "warmstart" / "snapshot"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(REPO)
    return top


def ask(control: Path, timeout: float = 120) -> Dict[str, Any]:
    answer = control / "answer.json"
    if answer.exists():
        answer.unlink()
    (control / "ask").touch()
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if answer.exists():
            return json.loads(answer.read_text(encoding="utf-8"))
        time.sleep(0.05)
    raise TimeoutError(f"no answer in {answer} within {timeout:g} s")


def criu_step(report: Report, python: str, mib: int) -> None:
    """Step 7: the full CRIU + CUDA snapshot through the checkpoint / restore modules with ``cuda: required``.

    A PyTorch workload (own PID namespace, stdio to files, talking over its control dir) fills GPU tensors;
    ``checkpoint`` (``cuda: required``, ``leave_running: false``) locks + checkpoints it, CRIU dumps it and it
    is ended; ``restore`` (``cuda: required``) restores it with CRIU, then its GPU state, then unlocks it. The
    restored copy must show the same tensors (sha256, kernel sum). SKIP where CRIU cannot run here (no CRIU,
    not root, pycriu or the kernel missing); FAIL when anything after that goes wrong.
    """
    criu = find_criu()
    if criu is None:
        report.add("SKIP", "criu+cuda snapshot", "no CRIU binary ($CRIU, /opt/warmstart/criu/*/bin/criu, PATH)")
        return
    if os.geteuid() != 0:
        report.add("SKIP", "criu+cuda snapshot", f"CRIU at {criu} needs root")
        return
    bundle_python = Path(criu).resolve().parents[1] / "python"
    for extra in (str(bundle_python), os.environ.get("WARMSTART_PYTHONPATH", "")):
        for part in extra.split(os.pathsep):
            if part and Path(part).is_dir() and part not in sys.path:
                sys.path.insert(0, part)
    try:
        import pycriu  # pylint: disable=import-outside-toplevel,unused-import
    except ImportError as exc:
        report.add("SKIP", "criu+cuda snapshot", f"pycriu cannot be imported ({exc}): set WARMSTART_PYTHONPATH")
        return
    check = subprocess.run([criu, "check"], capture_output=True, text=True, timeout=60, check=False)
    if check.returncode != 0:
        lines = (check.stdout + check.stderr).strip().splitlines()
        report.add("SKIP", "criu+cuda snapshot", f"`criu check` fails here: {lines[-1] if lines else check.returncode}")
        return
    work = Path(tempfile.mkdtemp(prefix="warmstart-device-"))
    sys.path.insert(0, str(collection_path(work)))
    from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _workload  # pylint: disable=import-outside-toplevel
    roots = {"workloads_root": str(work / "workloads"), "store": str(work / "store")}
    script = work / "worker.py"
    script.write_text(WORKER, encoding="utf-8")
    try:
        _changed, info = _workload.ensure(roots["workloads_root"], "gpu", "started", [python, str(script), str(mib)],
                                          wait_ready=True, ready_timeout=180)
        control = Path(info["control"])
        before = json.loads((control / "answer.json").read_text(encoding="utf-8"))
        t0 = time.monotonic()
        snap = run_module("checkpoint", dict(workload="gpu", cuda="required", leave_running=False, criu_path=criu,
                                             **roots), work)
        if not report.check(not snap.get("failed"), "criu+cuda checkpoint",
                            snap.get("msg") or json.dumps({k: snap["snapshot"][k] for k in ("id", "size", "timings", "cuda")})):
            return
        report.add("INFO", "criu+cuda checkpoint took", f"{time.monotonic() - t0:.1f} s, gpu section "
                   f"{json.dumps(snap['snapshot'].get('gpu'))}")
        t0 = time.monotonic()
        out = run_module("restore", dict(snapshot=snap["snapshot"]["id"], cuda="required", criu_path=criu,
                                         store=roots["store"], restore_root=str(work / "restore")), work)
        if not report.check(not out.get("failed"), "criu+cuda restore",
                            out.get("msg") or json.dumps({k: out["restore"][k] for k in ("pid", "timings", "cuda")})):
            return
        report.add("INFO", "criu+cuda restore took", f"{time.monotonic() - t0:.1f} s")
        after = ask(control)
        same_sum = abs(after["kernel_sum"] - before["kernel_sum"]) <= 1e-9 * max(1.0, abs(before["kernel_sum"]))
        report.check(after["sha256"] == before["sha256"] and same_sum and after["pid"] == before["pid"],
                     "criu+cuda tensors intact",
                     f"restored host pid {out['restore']['pid']}: sha256 {after['sha256'][:16]} (before "
                     f"{before['sha256'][:16]}), kernel sum {after['kernel_sum']:.9g}, pid in its namespace {after['pid']}")
    except Exception as exc:  # pylint: disable=broad-except
        logs = sorted(Path(roots["workloads_root"]).glob("*/std*.log"))
        tails = "; ".join(f"{p.name}: " + " | ".join(p.read_text(errors="replace").strip().splitlines()[-8:])
                          for p in logs if p.stat().st_size)
        report.check(False, "criu+cuda snapshot", f"{type(exc).__name__}: {exc}" + (f" [{tails}]" if tails else ""))
    finally:
        try:
            _workload.ensure(roots["workloads_root"], "gpu", "stopped", [])
        except Exception:  # pylint: disable=broad-except
            pass
        shutil.rmtree(work, ignore_errors=True)


def cli_step(report: Report, abi: Any, bk: Any, cuda: Any, child: Child, before: Dict[str, Any]) -> None:
    """The same cycle through the cuda-checkpoint utility, when it is on PATH."""
    try:
        cli = bk.CliBackend()
    except abi.CudaUnavailable as exc:
        report.add("SKIP", "cuda-checkpoint backend", str(exc))
        return
    timings = cuda.lock_and_checkpoint([child.pid], 10000, cli)
    timings.update(cuda.restore_and_unlock([child.pid], None, cli))
    after = child.ask()
    report.check(after["sha256"] == before["sha256"] and cli.state(child.pid) == abi.RUNNING, "cuda-checkpoint backend",
                 f"{cli.describe()}: " + ", ".join(f"{k} {v:.3f} s" for k, v in timings.items()))


def run(args: argparse.Namespace) -> Report:
    report = Report()
    abi, bk, cuda = load_cuda_binding()
    backend, reason = bk.availability()
    if not report.check(backend is not None, "backend", reason):
        return report
    version = backend.driver_version()
    report.add("INFO", "driver", f"CUDA driver API version {version}" if version else "version unknown")

    child = Child(args.python, args.mib, args.visible)
    bystander = subprocess.Popen(["sleep", "600"])  # a pid that is not a CUDA process
    try:
        try:
            before = child.read(timeout=180)
        except (RuntimeError, TimeoutError) as exc:
            report.check(False, "pytorch process", f"{exc} (is PyTorch with CUDA installed for {args.python}?)")
            return report
        pid = child.pid
        report.check(before["pid"] == pid, "pytorch process",
                     f"pid {pid}, {before['tensors']} tensors, {before['bytes'] >> 20} MiB, sha256 {before['sha256'][:16]}")
        mem_before = Memory(pid, before["bytes"])
        report.add("INFO", "gpu memory before", mem_before.text())

        found = cuda.find_cuda_pids([bystander.pid, pid], backend)
        report.check(found == [pid], "find_cuda_pids", f"{found} of [{bystander.pid} (sleep), {pid} (pytorch)]")
        report.check(backend.state(pid) == abi.RUNNING, "state RUNNING", abi.state_name(backend.state(pid)))

        try:
            backend.checkpoint(pid)
            report.check(False, "refuse checkpoint before lock", "the binding let it through")
        except abi.CudaStateError as exc:
            report.check("lock it first" in str(exc) and backend.state(pid) == abi.RUNNING, "refuse checkpoint before lock", str(exc))

        rss_before = rss_of(pid)
        timings = cuda.lock_and_checkpoint([pid], args.lock_timeout_ms, backend)
        state = backend.state(pid)
        report.check(state == abi.CHECKPOINTED, "lock + checkpoint",
                     f"state {abi.state_name(state)}; lock {timings['cuda_lock']:.3f} s, checkpoint {timings['cuda_checkpoint']:.3f} s")
        mem_after = Memory(pid, before["bytes"])
        released = mem_after.released(mem_before)
        if released is None:
            report.add("SKIP", "gpu memory released", "neither pynvml nor nvidia-smi answered")
        else:
            report.check(released, "gpu memory released", f"{mem_after.text()} (before: {mem_before.text()})")
        rss_after = rss_of(pid)
        report.add("INFO", "host rss", f"{rss_before >> 20} MiB -> {rss_after >> 20} MiB (device memory now in host memory)")

        gpus = node_gpus()
        pairs = cuda.device_map(gpus, gpus) if gpus and (version or 0) >= abi.REMAP_CUDA_VERSION else None
        timings = cuda.restore_and_unlock([pid], pairs, backend)
        state = backend.state(pid)
        report.check(state == abi.RUNNING, "restore + unlock",
                     f"state {abi.state_name(state)}; gpu pairs {len(pairs or [])}; restore {timings['cuda_restore']:.3f} s, "
                     f"unlock {timings['cuda_unlock']:.3f} s")
        after = child.ask()
        same_sum = abs(after["kernel_sum"] - before["kernel_sum"]) <= 1e-9 * max(1.0, abs(before["kernel_sum"]))
        report.check(after["sha256"] == before["sha256"] and same_sum, "tensors intact",
                     f"sha256 {after['sha256'][:16]} (before {before['sha256'][:16]}), kernel sum {after['kernel_sum']:.9g} "
                     f"(before {before['kernel_sum']:.9g}), read back in {after['seconds']} s")
        mem_back = Memory(pid, before["bytes"])
        back = mem_back.back(mem_after)
        if back is not None:
            report.check(back, "gpu memory back", mem_back.text())

        try:
            cuda.lock_and_checkpoint([pid, bystander.pid], args.lock_timeout_ms, backend)
            report.check(False, "rollback", "lock_and_checkpoint of a non-CUDA pid succeeded")
        except abi.CudaError as exc:
            state = backend.state(pid)
            again = child.ask()
            report.check(state == abi.RUNNING and "rolled back" in str(exc) and again["sha256"] == before["sha256"], "rollback",
                         f"{exc} -> pid {pid} {abi.state_name(state)}, still computing")

        cli_step(report, abi, bk, cuda, child, before)
        child.stop()  # frees its GPU memory before the CRIU step fills its own
        criu_step(report, args.python, args.mib)
    except Exception as exc:  # pylint: disable=broad-except
        report.check(False, "unexpected error", f"{type(exc).__name__}: {exc}")
        try:
            state = backend.state(child.pid)
            if state in (abi.LOCKED, abi.CHECKPOINTED):
                if state == abi.CHECKPOINTED:
                    backend.restore(child.pid)
                backend.unlock(child.pid)
        except Exception:  # pylint: disable=broad-except
            pass
    finally:
        child.stop()
        bystander.kill()
        bystander.wait()
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--python", default=os.environ.get("PYTHON", sys.executable), help="Python with PyTorch (default: this one)")
    parser.add_argument("--mib", type=int, default=1024, help="GPU memory the PyTorch process fills (MiB)")
    parser.add_argument("--lock-timeout-ms", type=int, default=10000)
    parser.add_argument("--visible", default=None, help="CUDA_VISIBLE_DEVICES for the PyTorch process")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args()
    t0 = time.monotonic()
    return run(args).finish(t0, args.json)


if __name__ == "__main__":
    sys.exit(main())
