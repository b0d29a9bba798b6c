"""The process workload and one test's world for the process-snapshot integration tests.

SERVER is the workload (written into each test's tmp_path): it holds the kinds of state an inference
server holds: a counter that keeps ticking, random memory whose SHA256 it reports, a journal file in its
workload dir that it appends to (opened O_RDWR|O_APPEND, so CRIU records its size and checks it at
restore), a listening TCP socket on 127.0.0.1 (SO_REUSEADDR) that answers with its state, and a unix
socketpair whose far end a thread echoes through.

``Lab`` is one test's store, workloads root and restore root under its tmp dir; its ``cleanup`` kills every
process running that test's copy of the script (sources and restored copies alike) and unmounts what the
test mounted. The ``lab`` fixture (conftest.py) builds one per test. Shared by the integration test modules,
none of which imports from another.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from .ansible_run import Run, playbook

SERVER = r'''
"""warmstart test workload: memory, an open journal, a TCP listener, a socketpair."""
import argparse, ctypes, errno, hashlib, json, os, platform, select, socket, threading

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--mb", type=int, default=50)
ap.add_argument("--pattern", action="store_true", help="fill memory with a pattern (fast; no hashing)")
ap.add_argument("--outside", help="also append to this file, outside the workload dir")
ap.add_argument("--perf", action="store_true", help="hold a perf_event fd, which CRIU cannot dump")
ap.add_argument("--io-uring", action="store_true", help="set up an io_uring instance (CRIU cannot dump one) and "
                "hold it when the kernel gives it; report the outcome, and try again at each query")
args = ap.parse_args()


def io_uring_setup():
    """An io_uring instance's fd, or the errno name of the refusal (ENOSYS under warmstart's filter)."""
    params = ctypes.create_string_buffer(120)
    fd = ctypes.CDLL(None, use_errno=True).syscall(425, 4, params)
    return fd if fd >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")


ring = io_uring_setup() if args.io_uring else None

ctl = os.environ["SNAPSHOT_CONTROL_DIR"]
wdir = os.path.dirname(ctl)
token = os.urandom(8).hex()
size = args.mb << 20
mem = bytearray(b"\xa5") * size if args.pattern else bytearray(os.urandom(size))
hashing = not args.pattern
digest = hashlib.sha256(mem).hexdigest() if hashing else None
# O_RDWR|O_APPEND: CRIU records this file's size and checks it at restore
# (it does not for O_WRONLY|O_APPEND files such as stdout.log).
journal = open(os.path.join(wdir, "journal.log"), "a+", buffering=1)
outside = open(args.outside, "a+", buffering=1) if args.outside else None
perf_fd = None
if args.perf:
    nr = {"x86_64": 298, "aarch64": 241}.get(platform.machine())
    attr = ctypes.create_string_buffer(128)
    attr[0:8] = (1).to_bytes(4, "little") + (128).to_bytes(4, "little")  # PERF_TYPE_SOFTWARE, size; CPU clock
    perf_fd = ctypes.CDLL(None, use_errno=True).syscall(nr, attr, 0, -1, -1, 0) if nr else -1
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


def echo():
    while True:
        data = b.recv(4096)
        if not data:
            return
        b.sendall(data[::-1])


threading.Thread(target=echo, daemon=True).start()
srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", args.port))
srv.listen(16)
print(f"token={token} port={args.port} perf_fd={perf_fd}", flush=True)
ready = os.path.join(ctl, "ready-for-snapshot")
with open(ready + ".tmp", "w") as handle:
    handle.write(token + "\n")
os.rename(ready + ".tmp", ready)
counter = 0
while True:
    readable, _, _ = select.select([srv], [], [], 0.05)
    counter += 1
    journal.write(f"tick {counter}\n")
    if outside:
        outside.write(f"tick {counter}\n")
    if not readable:
        continue
    conn, _ = srv.accept()
    with conn:
        conn.settimeout(5)
        conn.recv(64)
        probe = os.urandom(16)
        a.sendall(probe)
        echoed = a.recv(4096)
        state = {"counter": counter, "token": token, "pid": os.getpid(), "digest_at_start": digest,
                 "sha256": hashlib.sha256(mem).hexdigest() if hashing else None,
                 "pair_ok": echoed == probe[::-1], "journal_size": os.fstat(journal.fileno()).st_size}
        if args.io_uring:
            again = io_uring_setup()
            if isinstance(again, int):
                os.close(again)
            state.update(io_uring=ring, io_uring_now=again)
        conn.sendall((json.dumps(state) + "\n").encode())
'''


def needs_root_and_criu() -> None:
    if os.geteuid() != 0:
        pytest.fail("checkpoints need root")
    if not os.access("/usr/local/bin/criu", os.X_OK) and not os.access("/opt/warmstart/criu/current/bin/criu", os.X_OK):
        pytest.fail("no CRIU on this node although prepare_nodes ran")
    probe = subprocess.run(["/usr/bin/python3", "-c", "import pycriu"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.fail("/usr/bin/python3 cannot import pycriu although prepare_nodes ran")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def query(port: int, timeout: float = 10.0) -> Dict[str, Any]:
    """The workload's state, over its TCP socket (retried briefly: a restore may still be settling)."""
    return json_line(("127.0.0.1", port), b"state\n", timeout)


def json_line(address: Tuple[str, int], request: bytes = b"", timeout: float = 10.0) -> Dict[str, Any]:
    """The JSON line a server at ``address`` answers (after ``request``), retried until ``timeout``."""
    end = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(address, timeout=5) as sock:
                if request:
                    sock.sendall(request)
                data = read_line(sock)
            return json.loads(data)
        except (OSError, ValueError):
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


def read_line(sock: socket.socket) -> bytes:
    """What ``sock`` receives up to and including a newline (less when the other end closes first)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def proc_state(pid: int) -> str:
    """One-letter state from /proc/<pid>/stat ('-' when gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return "-"


def tracer_pid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("TracerPid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def running_free(pid: int) -> bool:
    """Alive, not stopped ('T') nor held by a tracer (CRIU)."""
    return proc_state(pid) in ("R", "S", "D") and tracer_pid(pid) == 0


def pids_running(needle: str) -> List[int]:
    """PIDs whose command line contains ``needle``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmd = handle.read()
        except OSError:
            continue
        if needle.encode() in cmd and proc_state(int(entry)) not in ("Z", "X", "-"):
            out.append(int(entry))
    return out


def slow_criu(where: Path, seconds: float) -> Path:
    """A CRIU wrapper, ``where``/criu-slow, whose RPC worker (``criu swrk``) starts ``seconds`` late: a window to
    act in, between the restore's checks and CRIU's reads (for a task's ``criu_path``)."""
    real = shutil.which("criu") or "/usr/local/bin/criu"
    wrapper = where / "criu-slow"
    wrapper.write_text(f"#!/bin/sh\nif [ \"$1\" = swrk ]; then sleep {seconds}; fi\nexec {os.path.realpath(real)} \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper


def swrk_running(wrapper: Optional[Path] = None) -> bool:
    """Whether a CRIU RPC worker (``criu swrk``, as the engine runs CRIU) runs now: any CRIU binary's or, with
    ``wrapper``, one started through that wrapper script (see ``slow_criu``)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        if wrapper is not None:
            if str(wrapper).encode() in argv and b"swrk" in argv:
                return True
        elif len(argv) > 1 and argv[0].endswith(b"criu") and argv[1] == b"swrk":
            return True
    return False


def wait_for_swrk(wrapper: Optional[Path] = None, timeout: Optional[float] = 120.0, poll: float = 0.005,
                  stop: Optional[threading.Event] = None) -> bool:
    """Wait until ``swrk_running(wrapper)`` (True), polling every ``poll`` s; False once ``timeout`` s have passed
    (None: no limit) or ``stop`` is set, whichever comes first."""
    end = None if timeout is None else time.monotonic() + timeout
    while not (stop is not None and stop.is_set()) and (end is None or time.monotonic() < end):
        if swrk_running(wrapper):
            return True
        time.sleep(poll)
    return False


def gone(pid: int, timeout: float) -> bool:
    """``pid`` no longer runs (gone, or a zombie that can run no code), within ``timeout``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc_state(pid) in ("-", "Z", "X"):
            return True
        time.sleep(0.05)
    return False


class Lab:
    """One test's world: script, store, workloads root and restore root under its tmp dir."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.script = tmp / "server.py"
        self.script.write_text(SERVER)
        self.store = tmp / "store"
        self.workloads = tmp / "workloads"
        self.restore_root = tmp / "restore"
        self.mounts: List[Path] = []
        self.runs = 0
        self.last: Optional[Run] = None

    # -- playbooks ---------------------------------------------------------
    def play(self, tasks: List[Dict[str, Any]], timeout: int = 300,
             prefix: Tuple[str, ...] = ()) -> Dict[str, Dict[str, Any]]:
        """Run ``tasks`` (each named) on localhost (under the command ``prefix``); each task's result by name.

        A task that fails without ``ignore_errors`` fails the test; those with it are the expected failures.
        """
        self.runs += 1
        path = self.tmp / f"play{self.runs}.yml"
        path.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}], indent=1))
        run = playbook(str(path), timeout=timeout, prefix=prefix)
        self.last = run
        try:
            plays = run.result["plays"]
        except (ValueError, KeyError):
            pytest.fail(f"no JSON from ansible-playbook (rc={run.rc}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
        results = {t["task"]["name"]: t["hosts"]["localhost"] for t in plays[0]["tasks"]}
        for task in tasks:
            res = results.get(task["name"])
            assert res is not None, f"task {task['name']!r} did not run:\n{json.dumps(results, indent=1)[-4000:]}"
            if res.get("failed") and not task.get("ignore_errors"):
                pytest.fail(f"task {task['name']!r} failed: {res.get('msg')}\n{json.dumps(res, indent=1)[-3000:]}")
        return results

    # -- task builders -------------------------------------------------------
    def start(self, name: str, port: int, mb: int, *extra: str) -> Dict[str, Any]:
        return {"name": f"start {name}", "warmstart.snapshot.workload": {
            "name": name, "root": str(self.workloads), "wait_ready": True, "ready_timeout": 120,
            "command": ["/usr/bin/python3", str(self.script), "--port", str(port), "--mb", str(mb), *extra]}}

    def stop(self, name: str) -> Dict[str, Any]:
        return {"name": f"stop {name}", "warmstart.snapshot.workload": {
            "name": name, "root": str(self.workloads), "state": "stopped"}}

    def checkpoint(self, task: str, store: Optional[Path] = None, expect_fail: bool = False,
                   check: bool = False, **args: Any) -> Dict[str, Any]:
        args.setdefault("workloads_root", str(self.workloads))
        out: Dict[str, Any] = {"name": task, "warmstart.snapshot.checkpoint": {"store": str(store or self.store), **args}}
        if expect_fail:
            out["ignore_errors"] = True
        if check:
            out["check_mode"] = True
        return out

    def restore(self, task: str, store: Optional[Path] = None, restore_root: Optional[Path] = None,
                expect_fail: bool = False, check: bool = False, **args: Any) -> Dict[str, Any]:
        if "into" not in args:
            args.setdefault("workloads_root", str(self.workloads))
        out: Dict[str, Any] = {"name": task, "warmstart.snapshot.restore": {
            "store": str(store or self.store), "restore_root": str(restore_root or self.restore_root), **args}}
        if expect_fail:
            out["ignore_errors"] = True
        if check:
            out["check_mode"] = True
        return out

    # -- state ----------------------------------------------------------------
    def wdir(self, name: str) -> Path:
        return self.workloads / name

    def pidfile_pid(self, name: str) -> Optional[int]:
        path = self.wdir(name) / "pid"
        return int(path.read_text()) if path.exists() else None

    def token(self, name: str) -> str:
        """The token the workload printed at start (in the stdout.log it alone holds)."""
        found = re.findall(r"token=([0-9a-f]+)", (self.wdir(name) / "stdout.log").read_text())
        assert found, f"{name} printed no token"
        return found[-1]

    def published(self, store: Optional[Path] = None) -> List[str]:
        snaps = (store or self.store) / "snapshots"
        return sorted(os.listdir(snaps)) if snaps.is_dir() else []

    def staging(self, store: Optional[Path] = None) -> List[str]:
        tmp = (store or self.store) / "tmp"
        return sorted(os.listdir(tmp)) if tmp.is_dir() else []

    def ours(self) -> List[int]:
        """Every live process running this test's copy of the workload script."""
        return pids_running(str(self.script))

    def mount_tmpfs(self, path: Path, options: str) -> None:
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            pytest.fail(f"cannot mount a tmpfs (tests run as root): {done.stderr.strip()}")
        self.mounts.append(path)

    def remount_ro(self, path: Path) -> None:
        subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True, capture_output=True)

    def cleanup(self) -> None:
        for pid in self.ours():
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        end = time.monotonic() + 10
        while self.ours() and time.monotonic() < end:
            time.sleep(0.05)
        for path in reversed(self.mounts):
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def checkpointed(lab: "Lab", name: str, mb: int, *extra: str) -> Dict[str, Any]:
    """A workload of ``mb`` MiB started and checkpointed (source stopped): its snapshot id, port and name."""
    port = free_port()
    res = lab.play([lab.start(name, port, mb, *extra),
                    lab.checkpoint("checkpoint", workload=name, leave_running=False)])
    return {"id": res["checkpoint"]["snapshot"]["id"], "port": port, "name": name}


def snapshot_of_a_fresh_node(lab: "Lab", monkeypatch: pytest.MonkeyPatch, mb: int) -> Dict[str, Any]:
    """A checkpoint of an ``mb`` MiB workload ``big`` (stopped), this node's record of hashed files in a dir of the
    test's (``forget_hashed`` then makes a restore see the snapshot as another node would): its id, port, the
    answer before, the snapshot dir, manifest and largest pages image entry."""
    monkeypatch.setenv("WARMSTART_VERIFIED_DIR", str(lab.tmp / "verified"))
    port = free_port()
    lab.play([lab.start("big", port, mb)])
    before = query(port)
    info = lab.play([lab.checkpoint("checkpoint", workload="big", leave_running=False)])["checkpoint"]["snapshot"]
    top = lab.store / "snapshots" / info["id"]
    doc = json.loads((top / "manifest.json").read_text())
    pages = [e for e in doc["files"] if "/criu/pages-" in e["path"]]
    return {"id": info["id"], "port": port, "before": before, "top": top, "doc": doc,
            "pages": max(pages, key=lambda e: e["size"])}


def forget_hashed(lab: "Lab") -> None:
    """Forget what this node hashed (``snapshot_of_a_fresh_node``): the restore sees the snapshot as another node."""
    shutil.rmtree(lab.tmp / "verified", ignore_errors=True)


def flip_byte(path: Path, offset: int) -> None:
    """Change one byte of ``path`` in place (every bit of it)."""
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))
