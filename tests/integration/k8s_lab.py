"""A Kubernetes node for tests: pods as real containers (podman or a private containerd) and a fake kubelet that
starts a placeholder container for every container of every restore pod the fake API server gets
(tests/support/fake_apiserver.py). The pods have two containers: the server ``main`` and a ``metrics`` sidecar.

Each pod's ``emptyDir`` volumes (but snapshot-control, which the labs bind themselves) are host dirs
``emptydir-<pod>-<volume>`` under the node's tmp dir, bound read-write where its container mounts them: the source
pod has one, ``cache`` at /cache (``CACHE``), and so has the template its replicas are made from.

Used by the Kubernetes end-to-end tests (the k8s playbooks, and the node agent run by ansible-rulebook).
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc

from tests.support.fake_apiserver import FakeApiServer

from . import containerd_lab
from .container_lab import Pod, ask, wait_file

NS = "ml"
POD_LABELS = {"app": "embed", "model": "minilm"}
COMMAND = ("python3", "/app/app.py")
CACHE = ("cache", "/cache")  # the source pod's emptyDir volume (name, mountPath)
SIDECAR = "metrics"  # the pods' second container (not snapshotted)


def _stamp() -> str:
    """Now, as the API server writes times (RFC 3339, UTC, seconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def cri_labels(namespace: str, pod: str, container: str) -> Dict[str, str]:
    return {"io.kubernetes.pod.namespace": namespace, "io.kubernetes.pod.name": pod,
            "io.kubernetes.container.name": container}


class PodmanNode:
    """The node's pods as podman containers (the source's app under an init)."""

    scheme = "podman"

    def __init__(self, tmp: Any) -> None:
        self.lab = Pod(tmp)
        self.tmp = Path(tmp)
        self.store, self.image, self.env, self.control = self.lab.store, self.lab.image, self.lab.env, self.lab.control

    def start(self, name: str, command: List[str], labels: Dict[str, str], env: Dict[str, str], source: bool,
              writable: Optional[Dict[str, str]] = None) -> str:
        return self.lab.run(name, *command, init=source, env=env, labels=labels, writable=writable)

    def container_id(self, handle: str) -> str:
        return str(self.lab.inspect(handle)["Id"])

    def ip(self, handle: str) -> str:
        return self.lab.ip(handle)

    def ask(self, handle: str) -> Dict[str, Any]:
        return ask(self.lab.ip(handle))

    def cleanup(self) -> None:
        self.lab.cleanup()


class ContainerdNode:
    """The node's pods as containers of a private containerd (the source's app is PID 1, as in any pod)."""

    scheme = "containerd"

    def __init__(self, tmp: Any) -> None:
        self.daemon = containerd_lab.Daemon().start()
        self.lab = containerd_lab.Lab(tmp, self.daemon)
        self.tmp = Path(tmp)
        self.store, self.image, self.env, self.control = self.lab.store, self.lab.image, self.lab.env, self.lab.control

    def start(self, name: str, command: List[str], labels: Dict[str, str], env: Dict[str, str], source: bool,
              writable: Optional[Dict[str, str]] = None) -> str:
        cid = self.lab.run(name, *command, env=env, labels=labels, writable=writable)
        if source:  # it listens before it says so; ask() does not wait
            wait_file(self.control(name) / "ready-for-snapshot", 60)
        return cid

    def container_id(self, handle: str) -> str:
        return handle

    def ip(self, handle: str) -> str:
        return "127.0.0.1"  # loopback only: ask() talks to the app from inside the pod's network namespace

    def ask(self, handle: str) -> Dict[str, Any]:
        return containerd_lab.ask(self.lab.pid1(handle))

    def cleanup(self) -> None:
        try:
            self.lab.cleanup()
        finally:
            self.daemon.stop()


Node = Union[PodmanNode, ContainerdNode]


def emptydir(lab: Node, pod: str, volume: str) -> Path:
    """The host dir of ``pod``'s emptyDir ``volume`` (made, writable by the container's user, when missing)."""
    path = lab.tmp / f"emptydir-{pod}-{volume}"
    path.mkdir(exist_ok=True)
    path.chmod(0o777)
    return path


def emptydirs(lab: Node, pod: str, spec: Dict[str, Any], container: Dict[str, Any]) -> Dict[str, str]:
    """Host dir -> mountPath for each emptyDir volume of ``spec`` that ``container`` mounts (but snapshot-control)."""
    empty = {v["name"] for v in spec.get("volumes") or [] if "emptyDir" in v and v["name"] != podapi.CONTROL_VOLUME}
    return {str(emptydir(lab, pod, m["name"])): m["mountPath"] for m in container.get("volumeMounts") or []
            if m["name"] in empty}


class Kubelet(threading.Thread):
    """Starts a placeholder container for every restore pod that appears (pinned or selecting its snapshot), and reports it in the pod's status."""

    def __init__(self, api: FakeApiServer, lab: Node, node: str = "localhost") -> None:
        super().__init__(daemon=True, name="fake-kubelet")
        self.api, self.lab, self.node = api, lab, node
        self.started: Dict[str, str] = {}  # pod name -> its first container
        self.containers: Dict[str, Dict[str, str]] = {}  # pod name -> container name -> container
        self.running_at: Dict[str, float] = {}  # pod name -> when its status said Running (epoch s)
        self.stop = threading.Event()
        self.errors: List[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                for pod in self.api.store.list("pods", NS, group=""):
                    meta, mode = pod["metadata"], pc.restore_mode(pod)
                    if (mode["restore_from"] or mode["select"]) and meta["name"] not in self.started:
                        self.start_pod(pod)
            except Exception as exc:  # pylint: disable=broad-except
                self.errors.append(repr(exc))
            self.stop.wait(0.2)

    def start_pod(self, pod: Dict[str, Any]) -> None:
        """Every container of the pod, in order (the first one's handle in ``started``, all in ``containers``)."""
        name = pod["metadata"]["name"]
        statuses: List[Dict[str, Any]] = []
        for index, container in enumerate(pod["spec"]["containers"]):
            env = {e["name"]: e["value"] for e in container.get("env") or []}
            assert env.get("SNAPSHOT_CONTROL_DIR") == "/snapshot-control", env
            # the container's own inert command as PID 1; its snapshot-control emptyDir as a host dir per container
            own = {k: v for k, v in env.items() if k == "SNAPSHOT_RESTORE_STANDBY"}  # a standby entrypoint's switch
            handle = f"k8s-{name}" if index == 0 else f"k8s-{name}-{container['name']}"
            full = self.lab.start(handle, container["command"], cri_labels(NS, name, container["name"]),
                                  dict(own, ROLE=name), source=False,
                                  writable=emptydirs(self.lab, name, pod["spec"], container))
            self.containers.setdefault(name, {})[container["name"]] = full
            statuses.append(container_status(self.lab, container, full))
        self.started[name] = self.containers[name][pod["spec"]["containers"][0]["name"]]
        with self.api.store.lock:
            stored = self.api.store.get("pods", name, NS, group="")
            stored["spec"]["nodeName"] = self.node
            stored["status"] = {"phase": "Running", "podIP": self.lab.ip(self.started[name]),
                                "containerStatuses": statuses}
            self.api.store.put("pods", stored, group="")
            self.running_at[name] = time.time()


def container_status(lab: Node, container: Dict[str, Any], handle: str) -> Dict[str, Any]:
    """A running container's status as a kubelet reports it (``<scheme>://<id>``)."""
    return {"name": container["name"], "image": container["image"],
            "imageID": f"{container['image']}@sha256:{'cd' * 32}",
            "containerID": f"{lab.scheme}://{lab.container_id(handle)}",
            "ready": False, "restartCount": 0, "state": {"running": {"startedAt": _stamp()}}}


def source_pod(c: Dict[str, Any], name: str, node: str = "localhost") -> str:
    """A running source pod: the API object, and its container as a real podman container."""
    lab: Node = c["lab"]
    # two worker processes under the server, each holding a loopback TCP connection to it: the pod's workload is a
    # process tree whose processes talk over 127.0.0.1, as a tensor-parallel inference server's do
    spec = template(lab.image)["spec"]
    main, sidecar = spec["containers"]
    full = lab.start(f"src-{name}", list(COMMAND), cri_labels(NS, name, main["name"]), {"APP_WORKERS": "2", "APP_LOOP": "1"},
                     source=True, writable=emptydirs(lab, name, spec, main))
    side = lab.start(f"src-{name}-{sidecar['name']}", list(sidecar["command"]), cri_labels(NS, name, sidecar["name"]),
                     {}, source=False)
    c["api"].add_pod(name, NS, spec=spec, labels=dict(POD_LABELS, role="source"), node=node)
    with c["api"].store.lock:
        pod = c["api"].store.get("pods", name, NS, group="")
        pod["status"]["containerStatuses"] = [container_status(lab, main, full), container_status(lab, sidecar, side)]
        c["api"].store.put("pods", pod, group="")
    return full


def template(image: str) -> Dict[str, Any]:
    """The pod template of the source and its replicas: the server (``main``, first) and a sidecar, as inference
    pods often have (a metrics exporter, a proxy); only ``main`` is snapshotted."""
    return {"metadata": {"labels": dict(POD_LABELS)},
            "spec": {"containers": [{"name": "main", "image": image, "command": list(COMMAND),
                                     "volumeMounts": [{"name": CACHE[0], "mountPath": CACHE[1]}]},
                                    {"name": SIDECAR, "image": image, "command": ["sleep", "infinity"]}],
                     "volumes": [{"name": CACHE[0], "emptyDir": {}}]}}
