# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a container runtime says about a container (ContainerInfo), and the CRI labels of a pod's containers.

Shared by ``_runtime`` (the Runtime protocol and its registry) and each runtime's own file, which import
this one and not each other.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

POD_NAMESPACE = "io.kubernetes.pod.namespace"
POD_NAME = "io.kubernetes.pod.name"
POD_CONTAINER = "io.kubernetes.container.name"


@dataclass
class ContainerInfo:
    """A container as its runtime's ``inspect`` saw it; every path is a host path."""

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
