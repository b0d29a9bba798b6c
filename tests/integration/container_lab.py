"""Podman containers for the container integration tests: the workload APP and one module's ``Pod``.

APP runs in the source container (local node image, ``podman run --init``): random memory whose SHA256 it
reports, a TCP listener on all addresses (port 8080, read with ``ask``), a file it wrote into its root file
system and one it deleted from the image, optional worker processes (APP_WORKERS; with APP_LOOP each holds a
loopback TCP connection to the server, a round over each on every ask) and the workload helper
(workload/warmstart_workload.py) that says ``ready-for-snapshot`` and, in a restored copy, re-reads its
instance (hostname, IPs, env.json). ``Pod`` starts sources and inert placeholders (``sleep infinity`` as
PID 1) and removes everything it started in ``cleanup``; what does not depend on the runtime (the app dir,
control dirs, store, restore root and module tasks) is its base ``Workspace``, shared with
containerd_lab.Lab. Shared by the integration test modules, none of which imports from another.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

from .ansible_run import REPO
from .podman_lab import node_image, play as _play, podman_env
from .process_lab import json_line

APP = r'''
import hashlib, json, os, select, socket, sys, threading, time
sys.path.insert(0, "/app")
import warmstart_workload as ws

ws.Control().standby()  # in a standby restore pod: wait for the restore's outcome (a cold start goes on here)
mib = int(os.environ.get("APP_MIB", "32"))
token = os.urandom(8).hex()
mem = bytearray(b"\x5a") * (mib << 20) if os.environ.get("APP_PATTERN") else bytearray(os.urandom(mib << 20))
digest = hashlib.sha256(mem).hexdigest()
if os.environ.get("APP_GHOST"):  # an open, deleted 1 MiB file: beyond a small ghost_limit CRIU refuses the dump
    ghost = open("/tmp/ghost", "w+b")
    ghost.write(os.urandom(1 << 20))
    ghost.flush()
    os.unlink("/tmp/ghost")
workers = []  # APP_WORKERS=N: N child processes ticking a counter each (the server is then a process tree)
loop = socket.socket() if os.environ.get("APP_LOOP") else None  # APP_LOOP=1: each worker also holds a loopback
if loop is not None:  # TCP connection to the server, which it answers (as tensor-parallel workers their store)
    loop.bind(("127.0.0.1", 0))
    loop.listen(8)
for n in range(int(os.environ.get("APP_WORKERS", "0"))):
    pid = os.fork()
    if pid == 0:
        link = socket.create_connection(loop.getsockname()) if loop is not None else None
        tick = 0
        while True:
            tick += 1
            with open(f"/tmp/worker-{n}.tmp", "w") as out:
                out.write(str(tick))
            os.replace(f"/tmp/worker-{n}.tmp", f"/tmp/worker-{n}")
            if link is None:
                time.sleep(0.1)
            elif select.select([link], [], [], 0.1)[0]:
                data = link.recv(16)
                if data:
                    link.sendall(data.upper())
                else:
                    link = None
    workers.append(pid)
links = [loop.accept()[0] for _ in workers] if loop is not None else []

def loop_round():  # a round over every worker's loopback connection: {rounds: answered, broken: not}
    for link in links:
        try:
            link.settimeout(5)
            link.sendall(b"ping")
            ok = link.recv(4) == b"PING"
        except OSError:
            ok = False
        state["loop"]["rounds" if ok else "broken"] += 1
    return state["loop"]

def worker_state():
    alive = sum(1 for pid in workers if os.waitpid(pid, os.WNOHANG) == (0, 0))
    ticks = []
    for n in range(len(workers)):
        try:
            ticks.append(int(open(f"/tmp/worker-{n}").read()))
        except (OSError, ValueError):
            ticks.append(-1)
    return {"alive": alive, "ticks": ticks}
with open("/tmp/state.txt", "w") as handle:
    handle.write(token)
if os.path.exists("/etc/issue.net"):
    os.unlink("/etc/issue.net")
state = {"counter": 0, "restores": [], "loop": {"rounds": 0, "broken": 0}}
control = ws.Control()

def refreshed(info):
    me = ws.instance(control)
    state["restores"].append({"pid": info.pid, "snapshot": info.snapshot, "hostname": me.hostname,
                              "ips": me.ips, "role": me.env.get("ROLE")})

control.on_restore(refreshed)
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", 8080))
srv.listen(16)
control.ready()
while True:
    conn, _ = srv.accept()
    with conn:
        state["counter"] += 1
        try:
            on_disk = open("/tmp/state.txt").read()
        except OSError as exc:
            on_disk = str(exc)
        conn.sendall((json.dumps({
            "token": token, "counter": state["counter"], "digest": digest,
            "sha256": hashlib.sha256(mem).hexdigest(), "pid": os.getpid(), "hostname": socket.gethostname(),
            "restores": state["restores"], "state_file": on_disk,
            "issue_net": os.path.exists("/etc/issue.net"), "env_role": os.environ.get("ROLE"),
            "workers": worker_state(), "loop": loop_round(),
        }) + "\n").encode())
'''


class Workspace:
    """One test module's containers' working dir under ``tmp``, whatever runs them: the app dir bound in at /app
    (APP and the workload helper), a control dir per container, the store and restore root, and the module tasks
    and playbook runs (with ``env``) on them. A runtime's lab adds its containers and their cleanup."""

    def __init__(self, tmp: Path, env: Dict[str, str]) -> None:
        self.tmp = tmp
        self.env = env
        self.tag = uuid.uuid4().hex[:6]
        self.app = tmp / "app"
        self.app.mkdir()
        (self.app / "app.py").write_text(APP)
        shutil.copy(REPO / "workload" / "warmstart_workload.py", self.app / "warmstart_workload.py")
        self.store = tmp / "store"
        self.restore_root = tmp / "restore"

    def control(self, name: str) -> Path:
        path = self.tmp / f"control-{name}"
        path.mkdir(exist_ok=True)
        return path

    def play(self, tasks: List[Dict[str, Any]], name: str, ok: bool = True) -> Dict[str, Any]:
        return _play(self.tmp, self.env, "localhost,", "local", tasks, f"{name}-{uuid.uuid4().hex[:6]}", ok=ok)

    def checkpoint(self, title: str, expect_fail: bool = False, **args: Any) -> Dict[str, Any]:
        args.setdefault("store", str(self.store))
        task: Dict[str, Any] = {"name": title, "warmstart.snapshot.checkpoint": args}
        if expect_fail:
            task["ignore_errors"] = True
        return task

    def restore(self, title: str, expect_fail: bool = False, **args: Any) -> Dict[str, Any]:
        args.setdefault("store", str(self.store))
        args.setdefault("restore_root", str(self.restore_root))
        task: Dict[str, Any] = {"name": title, "warmstart.snapshot.restore": args}
        if expect_fail:
            task["ignore_errors"] = True
        return task


class Pod(Workspace):
    """Podman containers for one test module; everything it starts is removed at the end."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp, podman_env())
        self.image = node_image()
        self.names: List[str] = []
        self.images: List[str] = []

    def podman(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, check=check, timeout=300)

    def run(self, name: str, *cmd: str, init: bool = True, env: Optional[Dict[str, str]] = None,
            image: Optional[str] = None, create_only: bool = False, labels: Optional[Dict[str, str]] = None,
            volumes: Optional[Dict[str, str]] = None, writable: Optional[Dict[str, str]] = None) -> str:
        """Start (or create) container ``name`` running ``cmd``; ``volumes``: host path -> container path, read
        only, besides /app and its control dir; ``writable``: the same, read-write (as a pod's emptyDir)."""
        full = f"{name}-{self.tag}"
        args = ["create" if create_only else "run"] + ([] if create_only else ["-d"]) + ["--name", full]
        args += ["--init"] if init else []
        for key, value in (labels or {}).items():
            args += ["--label", f"{key}={value}"]
        args += ["-v", f"{self.app}:/app:ro", "-v", f"{self.control(name)}:/snapshot-control",
                 "-e", "SNAPSHOT_CONTROL_DIR=/snapshot-control"]
        for host, inside in (volumes or {}).items():
            args += ["-v", f"{host}:{inside}:ro"]
        for host, inside in (writable or {}).items():
            args += ["-v", f"{host}:{inside}:rw"]
        for key, value in (env or {}).items():
            args += ["-e", f"{key}={value}"]
        self.podman(*args, image or self.image, *cmd)
        self.names.append(full)
        return full

    def source(self, name: str, **env: str) -> str:
        full = self.run(name, "python3", "/app/app.py", env=env)
        wait_file(self.control(name) / "ready-for-snapshot", 60)
        return full

    def placeholder(self, name: str, image: Optional[str] = None) -> str:
        return self.run(name, "sleep", "infinity", init=False, env={"ROLE": name}, image=image)

    def inspect(self, full: str) -> Dict[str, Any]:
        return json.loads(self.podman("container", "inspect", full).stdout)[0]

    def ip(self, full: str) -> str:
        return self.inspect(full)["NetworkSettings"]["IPAddress"]

    def pid1(self, full: str) -> int:
        return int(self.inspect(full)["State"]["Pid"])

    def running(self, full: str) -> bool:
        return bool(self.inspect(full)["State"]["Running"])

    def ps(self, full: str) -> List[str]:
        return self.podman("top", full, "pid", "args").stdout.splitlines()[1:]

    def cleanup(self) -> None:
        for full in reversed(self.names):
            self.podman("rm", "-f", "-t", "0", full, check=False)
        for image in self.images:
            self.podman("rmi", "-f", image, check=False)


def pod_for(tmp: Path, apps: Optional[Dict[str, str]] = None) -> Iterator[Pod]:
    """A ``Pod`` under ``tmp`` for a fixture to ``yield from``, with ``apps`` (file name -> source) written into
    its /app beside APP; everything it started is removed when the fixture ends, however its tests went."""
    world = Pod(tmp)
    for name, text in (apps or {}).items():
        (world.app / name).write_text(text)
    try:
        yield world
    finally:
        world.cleanup()


def mounts_of(pid: int) -> List[str]:
    """Mount table of a namespace, without the mount ids (which change when anything is remounted)."""
    with open(f"/proc/{pid}/mountinfo", "r", encoding="utf-8") as handle:
        return sorted(" ".join(line.split()[2:]) for line in handle)


def wait_file(path: Path, timeout: float) -> str:
    end = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < end, f"{path} did not appear within {timeout} s"
        time.sleep(0.05)
    return path.read_text()


def ask(ip: str, timeout: float = 15.0) -> Dict[str, Any]:
    """The test app's state line from its server in the container at ``ip``."""
    return json_line((ip, 8080), timeout=timeout)
