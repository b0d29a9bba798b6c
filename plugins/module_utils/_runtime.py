# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Container runtimes: a container name or id -> what a checkpoint or restore needs.

``Runtime.inspect`` is the whole interface: it returns a ContainerInfo (host
PID of the container's PID 1, cgroup path, rootfs and overlay upper dir as
host paths, image name and id). Podman is implemented; containerd and CRI-O
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


class Runtime:
    name = "?"

    def inspect(self, container: str) -> ContainerInfo:  # pragma: no cover - interface
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


RUNTIMES: Dict[str, Type[Runtime]] = {"podman": Podman}


def get_runtime(name: str) -> Runtime:
    try:
        return RUNTIMES[name]()
    except KeyError:
        raise TargetError(f"container runtime {name!r} is not supported (supported: {', '.join(sorted(RUNTIMES))})") from None
