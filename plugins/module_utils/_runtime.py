# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Container runtimes: a container name or id -> what a checkpoint or restore needs.

``Runtime.inspect`` is the main interface: it returns a ContainerInfo (host
PID of the container's PID 1, cgroup path, rootfs and overlay upper dir as
host paths, image name and id). ``Runtime.pod_containers`` finds the
containers of a Kubernetes pod on this node by the labels the kubelet's CRI
runtimes put on them (``io.kubernetes.pod.namespace``, ``.pod.name``,
``.container.name``), so a pod target needs no API access on the node. Podman is implemented; containerd and CRI-O
plug in as further ``Runtime`` subclasses (``crictl inspect`` /
``ctr task ls`` give the same facts) registered in RUNTIMES.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Type

from ansible_collections.warmstart.snapshot.plugins.module_utils._proc import TargetError


@dataclass
class ContainerInfo:
    id: str
    name: str
    runtime: str
    image: str
    image_id: str
    running: bool
    status: str
    pid: int                      # host PID of the container's PID 1 (0 when not running)
    cgroup_path: str
    rootfs: str                   # host path of the mounted root file system
    upper_dir: Optional[str]      # overlay upper dir (the container's changes), if overlay
    hostname: str
    mounts: List[Dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> Dict[str, Any]:
        return {"id": self.id, "name": self.name, "runtime": self.runtime, "image": self.image,
                "image_id": self.image_id, "running": self.running, "status": self.status, "pid": self.pid,
                "cgroup_path": self.cgroup_path, "rootfs": self.rootfs, "upper_dir": self.upper_dir,
                "hostname": self.hostname}


POD_NAMESPACE = "io.kubernetes.pod.namespace"
POD_NAME = "io.kubernetes.pod.name"
POD_CONTAINER = "io.kubernetes.container.name"


class Runtime:
    name = "?"

    def inspect(self, container: str) -> ContainerInfo:  # pragma: no cover - interface
        raise NotImplementedError

    def pod_containers(self, namespace: str, pod: str, container: str) -> List[str]:  # pragma: no cover - interface
        """Ids of this node's containers labelled as container ``container`` of pod ``namespace/pod``."""
        raise NotImplementedError

    def running(self, container: str) -> ContainerInfo:
        info = self.inspect(container)
        if not info.running or info.pid <= 0:
            raise TargetError(f"container {container} ({self.name}) is not running (status: {info.status})")
        return info


class Podman(Runtime):
    name = "podman"

    def __init__(self, binary: Optional[str] = None) -> None:
        self.binary = binary or shutil.which("podman") or ""

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        if not self.binary:
            raise TargetError("podman is not installed on this node (no podman in PATH)")
        return subprocess.run([self.binary, *args], capture_output=True, text=True, check=False, timeout=120)

    def inspect(self, container: str) -> ContainerInfo:
        if not container or container.startswith("-"):
            raise TargetError(f"container name {container!r} is not valid")
        res = self._run("container", "inspect", container)
        if res.returncode != 0:
            err = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}"
            if "no such container" in err.lower():
                raise TargetError(f"container {container} not found in podman on this node")
            raise TargetError(f"podman inspect {container} failed: {err}")
        try:
            doc = json.loads(res.stdout)[0]
        except (ValueError, IndexError):
            raise TargetError(f"podman inspect {container}: unreadable output") from None
        state = doc.get("State") or {}
        graph = (doc.get("GraphDriver") or {}).get("Data") or {}
        cfg = doc.get("Config") or {}
        mounts = [{"destination": m.get("Destination"), "source": m.get("Source"), "type": m.get("Type"),
                   "rw": bool(m.get("RW"))} for m in doc.get("Mounts") or []]
        return ContainerInfo(
            id=doc.get("Id", ""), name=(doc.get("Name") or container).lstrip("/"), runtime=self.name,
            image=doc.get("ImageName") or cfg.get("Image") or "", image_id=doc.get("Image") or "",
            running=bool(state.get("Running")), status=str(state.get("Status") or "unknown"),
            pid=int(state.get("Pid") or 0), cgroup_path=str(state.get("CgroupPath") or ""),
            rootfs=str(graph.get("MergedDir") or doc.get("Rootfs") or ""), upper_dir=graph.get("UpperDir"),
            hostname=str(cfg.get("Hostname") or ""), mounts=mounts)

    def pod_containers(self, namespace: str, pod: str, container: str) -> List[str]:
        res = self._run("ps", "--all", "--no-trunc", "--format", "{{.ID}}",
                        "--filter", f"label={POD_NAMESPACE}={namespace}", "--filter", f"label={POD_NAME}={pod}",
                        "--filter", f"label={POD_CONTAINER}={container}")
        if res.returncode != 0:
            err = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}"
            raise TargetError(f"podman ps (pod {namespace}/{pod}) failed: {err}")
        return [line.strip() for line in res.stdout.splitlines() if line.strip()]


RUNTIMES: Dict[str, Type[Runtime]] = {"podman": Podman}


def pod_container(runtime: Runtime, pod: Dict[str, Any]) -> str:
    """The id of the running container ``pod['container']`` of pod ``pod['namespace']/pod['name']`` on this node.

    ``pod['container_id']`` (from the pod's status, ``<runtime>://<id>``), when given, must be that container:
    a pod deleted and re-created under the same name has new containers.
    """
    namespace = pod.get("namespace") or "default"
    name, container = pod.get("name") or "", pod.get("container") or ""
    what = f"pod {namespace}/{name} container {container}"
    if not name or not container:
        raise TargetError(f"pod target needs a name and a container (got {what})")
    wanted = pod.get("container_id") or ""
    scheme, sep, bare = wanted.partition("://")
    if sep and scheme != runtime.name:
        raise TargetError(f"{what}: its status names container {wanted}, a {scheme} container; "
                          f"this node was asked to use {runtime.name}")
    bare = bare if sep else wanted
    found = runtime.pod_containers(namespace, name, container)
    if bare:
        match = [cid for cid in found if cid == bare or cid.startswith(bare)]
        if not match:
            raise TargetError(f"{what}: container {bare[:12]} from the pod's status is not on this node "
                              f"({runtime.name} has {', '.join(c[:12] for c in found) or 'none'} with the pod's labels)")
        found = match
    if not found:
        raise TargetError(f"{what}: no {runtime.name} container on this node carries the labels "
                          f"{POD_NAMESPACE}={namespace}, {POD_NAME}={name}, {POD_CONTAINER}={container} "
                          "(is the pod scheduled on this node?)")
    infos = [runtime.inspect(cid) for cid in found]
    running = [i.id for i in infos if i.running]
    if not running:
        states = ", ".join(f"{i.id[:12]} {i.status}" for i in infos)
        raise TargetError(f"{what}: not running on this node (container {states})")
    if len(running) > 1:
        raise TargetError(f"{what}: {len(running)} containers on this node carry its labels and run "
                          f"({', '.join(c[:12] for c in running)}); expected exactly one")
    return running[0]


def get_runtime(name: str) -> Runtime:
    try:
        return RUNTIMES[name]()
    except KeyError:
        raise TargetError(f"container runtime {name!r} is not supported (supported: {', '.join(sorted(RUNTIMES))})") from None
