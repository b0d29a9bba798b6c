"""containerd for the integration tests: a private daemon, the local node image imported, containers and fake pods.

``Daemon`` starts Debian's ``containerd`` with its own config (root, state and socket in a fresh temporary dir, the
CRI plugin disabled), so it never meets a containerd the machine may run, and stops it at the end: every task
killed and deleted, every container removed, nothing left mounted. Its namespace is ``warmstart-test`` (the
shim's runc state lives under /run/containerd/runc/<namespace>). ``env()`` is what a module needs to find it
(CONTAINERD_ADDRESS, CONTAINERD_NAMESPACE).

``Lab`` is one test module's containers on it, like container_lab.Pod for podman (and, like it, a
container_lab.Workspace: app dir, control dirs, store, restore root and module tasks): sources running
container_lab.APP under an init (containerd has no ``--init``: this node's catatonit is bound in as podman does),
inert placeholders (``sleep infinity`` as PID 1), and ``fake_pod``: a pause container (PID 1 of the pod's PID and
network namespaces, as with ``shareProcessNamespace``) plus containers joining its namespaces, each carrying the
CRI labels the kubelet sets. Containers have no network but loopback: ``ask`` talks to the app from inside the
container's network namespace.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

from .container_lab import Workspace, wait_file
from .podman_lab import node_image, podman_env

NAMESPACE = "warmstart-test"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
POD_NAME = "io.kubernetes.pod.name"
POD_UID = "io.kubernetes.pod.uid"
POD_CONTAINER = "io.kubernetes.container.name"
CONFIG = """version = 2
root = "{base}/root"
state = "{base}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{base}/state/containerd.sock"
[ttrpc]
  address = "{base}/state/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
"""
ASK = ("import socket, sys\n"
       "conn = socket.create_connection(('127.0.0.1', 8080), timeout=float(sys.argv[1]))\n"
       "sys.stdout.write(conn.makefile().readline())\n")


INIT_MOUNT = "/run/podman-init"
INITS = ("/usr/bin/catatonit", "/usr/libexec/podman/catatonit")


def init_binary() -> str:
    """This node's container init (catatonit, installed with podman)."""
    found = [path for path in INITS if os.path.isfile(path)]
    assert found, f"no container init on this node (looked for {', '.join(INITS)}): run tests/support/install-system-deps.sh"
    return os.path.realpath(found[0])


class Daemon:
    """A containerd of the tests' own, started in ``start`` and stopped (with all it ran) in ``stop``."""

    def __init__(self, namespace: str = NAMESPACE) -> None:
        self.namespace = namespace
        # a short path: the socket's must fit a sockaddr_un
        self.base = Path(tempfile.mkdtemp(prefix="ws-ctd-", dir="/tmp"))
        self.state = self.base / "state"
        self.socket = self.state / "containerd.sock"
        self.proc: Optional[subprocess.Popen] = None
        self.images: Dict[str, str] = {}

    def start(self) -> "Daemon":
        config = self.base / "config.toml"
        config.write_text(CONFIG.format(base=self.base))
        log = open(self.base / "containerd.log", "wb")  # pylint: disable=consider-using-with
        self.proc = subprocess.Popen(["containerd", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        end = time.monotonic() + 30
        while self.ctr("version", check=False).returncode != 0:
            assert self.proc.poll() is None, f"containerd exited: {(self.base / 'containerd.log').read_text()[-2000:]}"
            assert time.monotonic() < end, "containerd did not answer within 30 s"
            time.sleep(0.2)
        return self

    def env(self, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        env = dict(base if base is not None else os.environ)
        env.update(CONTAINERD_ADDRESS=str(self.socket), CONTAINERD_NAMESPACE=self.namespace)
        return env

    def ctr(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(["ctr", "--address", str(self.socket), "--namespace", self.namespace, *args],
                              capture_output=True, text=True, check=check, timeout=timeout)

    def import_podman_image(self, image: str) -> str:
        """``image`` from podman's storage into this containerd (same name); returns the name."""
        if image not in self.images:
            archive = self.base / f"image-{len(self.images)}.tar"
            subprocess.run(["podman", "save", "-q", "--format", "docker-archive", "-o", str(archive), image],
                           env=podman_env(), check=True, capture_output=True, timeout=600)
            self.ctr("images", "import", str(archive), timeout=600)
            archive.unlink()
            names = self.ctr("images", "ls", "-q").stdout.split()
            assert image in names, f"imported {image}, containerd has {names}"
            self.images[image] = image
        return image

    def info(self, cid: str) -> Dict[str, Any]:
        return json.loads(self.ctr("containers", "info", cid).stdout)

    def pid1(self, cid: str) -> int:
        return int((self.state / "io.containerd.runtime.v2.task" / self.namespace / cid / "init.pid").read_text())

    def remove(self, cid: str) -> None:
        self.ctr("tasks", "kill", "-s", "SIGKILL", cid, check=False)
        for _try in range(50):
            if self.ctr("tasks", "rm", "-f", cid, check=False).returncode != 0:
                break
            if cid not in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
                break
            time.sleep(0.1)
        self.ctr("containers", "rm", cid, check=False)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            for cid in self.ctr("containers", "ls", "-q", check=False).stdout.split():
                self.remove(cid)
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        for mountpoint in sorted(mounted_under(str(self.base)), reverse=True):
            subprocess.run(["umount", "-l", mountpoint], check=False)
        shutil.rmtree(self.base, ignore_errors=True)


def mounted_under(prefix: str) -> List[str]:
    """Host mountpoints at or under ``prefix``."""
    with open("/proc/self/mountinfo", "r", encoding="utf-8") as handle:
        points = [line.split()[4] for line in handle]
    return [p for p in points if p == prefix or p.startswith(prefix.rstrip("/") + "/")]


def ask(pid: int, timeout: float = 15.0) -> Dict[str, Any]:
    """The test app's state line, asked on 127.0.0.1:8080 inside the network namespace of host PID ``pid``."""
    res = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "python3", "-c", ASK, str(timeout)],
                         capture_output=True, text=True, timeout=timeout + 10, check=False)
    assert res.returncode == 0 and res.stdout, f"no answer in the network of pid {pid}: {res.stderr[-500:]}"
    return json.loads(res.stdout)


class Lab(Workspace):
    """Containers for one test module on ``daemon``; ``cleanup`` removes every one it started."""

    def __init__(self, tmp: Path, daemon: Daemon) -> None:
        self.daemon = daemon
        self.image = daemon.import_podman_image(node_image())
        super().__init__(tmp, daemon.env(podman_env()))
        self.ids: List[str] = []

    def run(self, name: str, *cmd: str, env: Optional[Dict[str, str]] = None, image: Optional[str] = None,
            labels: Optional[Dict[str, str]] = None, join: Optional[int] = None, init: bool = False,
            writable: Optional[Dict[str, str]] = None) -> str:
        """Start container ``name-<tag>`` running ``cmd``; ``join``: share the PID and network namespaces of that
        host PID (a pod's containers share its pause container's); ``writable``: host path -> container path,
        bound read-write (as a pod's emptyDir)."""
        cid = f"{name}-{self.tag}"
        args = ["run", "-d", "--log-uri", f"file://{self.tmp}/{name}.log"]  # stdio: the shim's pipes, as with CRI
        for key, value in (labels or {}).items():
            args += ["--label", f"{key}={value}"]
        args += ["--mount", f"type=bind,src={self.app},dst=/app,options=rbind:ro",
                 "--mount", f"type=bind,src={self.control(name)},dst=/snapshot-control,options=rbind:rw",
                 "--env", "SNAPSHOT_CONTROL_DIR=/snapshot-control"]
        for host, inside in (writable or {}).items():
            args += ["--mount", f"type=bind,src={host},dst={inside},options=rbind:rw"]
        for key, value in (env or {}).items():
            args += ["--env", f"{key}={value}"]
        if init:
            args += ["--mount", f"type=bind,src={init_binary()},dst={INIT_MOUNT},options=rbind:ro"]
        if join:
            args += ["--with-ns", f"pid:/proc/{join}/ns/pid", "--with-ns", f"network:/proc/{join}/ns/net"]
        self.daemon.ctr(*args, image or self.image, cid, *cmd)
        self.ids.append(cid)
        return cid

    def source(self, name: str, labels: Optional[Dict[str, str]] = None, **env: str) -> str:
        """The app under an init: this node's catatonit bound in at /run/podman-init, as ``podman run --init``
        does (containerd has no such option)."""
        cid = self.run(name, INIT_MOUNT, "--", "python3", "/app/app.py", env=env, labels=labels, init=True)
        wait_file(self.control(name) / "ready-for-snapshot", 60)
        return cid

    def placeholder(self, name: str, image: Optional[str] = None, labels: Optional[Dict[str, str]] = None) -> str:
        return self.run(name, "sleep", "infinity", env={"ROLE": name}, image=image, labels=labels)

    def fake_pod(self, namespace: str, pod: str, containers: Dict[str, List[str]]) -> Dict[str, str]:
        """A pod as the kubelet would run it with ``shareProcessNamespace``: a pause container (``sleep infinity``,
        PID 1 of the pod's PID and network namespaces) and ``containers`` (name -> command) joining them, each with
        the pod's CRI labels. Returns container name -> id (the pause container as ``POD``)."""
        uid = str(uuid.uuid4())
        base = {POD_NAMESPACE: namespace, POD_NAME: pod, POD_UID: uid}
        ids = {"POD": self.run(f"{pod}-pause", "sleep", "infinity", labels=dict(base, **{POD_CONTAINER: "POD"}))}
        pause = self.daemon.pid1(ids["POD"])
        for cname, cmd in containers.items():
            ids[cname] = self.run(f"{pod}-{cname}", *cmd, labels=dict(base, **{POD_CONTAINER: cname}), join=pause)
        return ids

    def pid1(self, cid: str) -> int:
        return self.daemon.pid1(cid)

    def checkpoint(self, title: str, expect_fail: bool = False, **args: Any) -> Dict[str, Any]:
        args.setdefault("runtime", "containerd")
        return super().checkpoint(title, expect_fail, **args)

    def restore(self, title: str, expect_fail: bool = False, **args: Any) -> Dict[str, Any]:
        args.get("into", {}).setdefault("runtime", "containerd")
        return super().restore(title, expect_fail, **args)

    def cleanup(self) -> None:
        for cid in reversed(self.ids):
            self.daemon.remove(cid)
