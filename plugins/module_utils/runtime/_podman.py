# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Podman as a ``_runtime.Runtime`` (structurally: this file does not import ``_runtime``): ``podman container inspect`` and ``podman ps`` by CRI labels.

Every failure (no podman, a name that is not valid, podman's own error) is a
TargetError naming the container; nothing here changes a container.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any, Dict, List, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._containerinfo import (
    POD_CONTAINER, POD_NAME, POD_NAMESPACE, ContainerInfo)
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._proc import TargetError

TIMEOUT = 120


def _last_error(res: "subprocess.CompletedProcess[str]") -> str:
    return res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}"


class Podman:
    """The podman CLI of this node (``binary``, default: podman on PATH)."""

    name = "podman"

    def __init__(self, binary: Optional[str] = None) -> None:
        self.binary = binary or shutil.which("podman") or ""

    def _run(self, *args: str) -> "subprocess.CompletedProcess[str]":
        if not self.binary:
            raise TargetError("podman is not installed on this node (no podman in PATH)")
        return subprocess.run([self.binary, *args], capture_output=True, text=True, check=False, timeout=TIMEOUT)

    def inspect(self, container: str) -> ContainerInfo:
        if not container or container.startswith("-"):
            raise TargetError(f"container name {container!r} is not valid")
        res = self._run("container", "inspect", container)
        if res.returncode != 0:
            err = _last_error(res)
            if "no such container" in err.lower():
                raise TargetError(f"container {container} not found in podman on this node")
            raise TargetError(f"podman inspect {container} failed: {err}")
        try:
            doc = json.loads(res.stdout)[0]
        except (ValueError, IndexError):
            raise TargetError(f"podman inspect {container}: unreadable output") from None
        return self._info(doc, container)

    def _info(self, doc: Dict[str, Any], container: str) -> ContainerInfo:
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
            raise TargetError(f"podman ps (pod {namespace}/{pod}) failed: {_last_error(res)}")
        return [line.strip() for line in res.stdout.splitlines() if line.strip()]
