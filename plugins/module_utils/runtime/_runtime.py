# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Container runtimes: a container name or id -> what a checkpoint or restore needs.

``Runtime`` is the whole interface warmstart needs from a container runtime (a
``typing.Protocol``, so an implementation need not inherit from it):
``inspect`` returns a ContainerInfo (host PID of the container's PID 1, cgroup
path, rootfs and overlay upper dir as host paths, image name and id);
``pod_containers`` finds the containers of a Kubernetes pod on this node by the
labels the kubelet's CRI runtimes put on them (``io.kubernetes.pod.namespace``,
``.pod.name``, ``.container.name``), so a pod target needs no API access on
the node. What is derived from those two (``running``, ``pod_container``) lives
here, once, for every runtime.

One file per runtime (``_podman``, ``_containerd``), which returns
``_containerinfo`` types and satisfies ``Runtime`` without importing this file.
A further runtime (CRI-O: ``crictl inspect`` gives the same facts) is one new
file plus one entry in RUNTIMES; nothing else names a runtime.

``auto`` (``Auto``) is the runtime that owns the container: every registered
runtime whose tool is installed is asked, and exactly one must know it.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Protocol, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._containerinfo import (
    POD_CONTAINER, POD_NAME, POD_NAMESPACE, ContainerInfo)
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._containerd import Containerd
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._podman import Podman
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._proc import TargetError

__all__ = ["AUTO", "POD_CONTAINER", "POD_NAME", "POD_NAMESPACE", "RUNTIMES", "Auto", "ContainerInfo", "Runtime",
           "get_runtime", "pod_container", "running"]


class Runtime(Protocol):
    """A container runtime on this node, as checkpoint, restore and pod lookup use it. Reads only."""

    name: str
    """The runtime's name: the registry key and the scheme of a pod status's ``<runtime>://<id>``."""

    def inspect(self, container: str) -> ContainerInfo:
        """The container named or identified by ``container``, running or not.

        Raises TargetError (never another error) when the runtime is missing, the name is not valid
        (empty, or an option such as ``--all``), the container does not exist or cannot be read; the
        message names the container and the runtime.
        """

    def pod_containers(self, namespace: str, pod: str, container: str) -> List[str]:
        """Full ids of this node's containers, running or not, labelled as container ``container`` of pod
        ``namespace/pod`` (POD_NAMESPACE, POD_NAME, POD_CONTAINER); empty when none. TargetError when the
        runtime cannot be asked."""


def running(runtime: Runtime, container: str) -> ContainerInfo:
    """``runtime.inspect(container)``, refused with TargetError unless it runs with a host PID."""
    info = runtime.inspect(container)
    if not info.running or info.pid <= 0:
        raise TargetError(f"container {container} ({info.runtime}) is not running (status: {info.status})")
    return info


AUTO = "auto"


def _installed(runtime: Runtime) -> bool:
    """A runtime is asked by ``auto`` when its CLI is installed (its ``binary``; one without is always asked)."""
    return bool(getattr(runtime, "binary", True))


class Auto:
    """The runtime that owns the container: each registered runtime whose tool is installed is asked."""

    name = AUTO

    def __init__(self) -> None:
        self.runtimes: List[Runtime] = [new() for key, new in sorted(RUNTIMES.items()) if key != AUTO]

    def _asked(self) -> List[Runtime]:
        asked = [rt for rt in self.runtimes if _installed(rt)]
        if not asked:
            raise TargetError("runtime auto: no container runtime is installed on this node "
                              f"(none of {', '.join(rt.name for rt in self.runtimes)})")
        return asked

    def _each(self, ask: Callable[[Runtime], Any]) -> Tuple[List[Tuple[Runtime, Any]], List[str]]:
        found, errors = [], []
        for rt in self._asked():
            try:
                found.append((rt, ask(rt)))
            except TargetError as exc:
                errors.append(f"{rt.name}: {exc}")
        return found, errors

    def inspect(self, container: str) -> ContainerInfo:
        found, errors = self._each(lambda rt: rt.inspect(container))
        if len(found) > 1:
            owners = " and ".join(f"{rt.name} ({info.id[:12]})" for rt, info in found)
            raise TargetError(f"container {container} is known to {owners}: set runtime to the one meant")
        if not found:
            raise TargetError(f"container {container}: no container runtime on this node knows it (runtime auto asked "
                              f"{', '.join(rt.name for rt in self._asked())}: {'; '.join(errors)})")
        info: ContainerInfo = found[0][1]
        return info

    def pod_containers(self, namespace: str, pod: str, container: str) -> List[str]:
        found, errors = self._each(lambda rt: rt.pod_containers(namespace, pod, container))
        if not found:
            raise TargetError(f"pod {namespace}/{pod}: no container runtime on this node could be asked "
                              f"({'; '.join(errors)})")
        return [cid for _rt, ids in found for cid in ids]


# name -> a new runtime of that name: the only place that knows which runtimes exist
RUNTIMES: Dict[str, Callable[[], Runtime]] = {"podman": Podman, "containerd": Containerd, AUTO: Auto}


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
    if sep and runtime.name == AUTO and scheme in RUNTIMES and scheme != AUTO:
        runtime = get_runtime(scheme)  # the pod's status names the runtime that owns the container
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
    up = [i.id for i in infos if i.running]
    if not up:
        states = ", ".join(f"{i.id[:12]} {i.status}" for i in infos)
        raise TargetError(f"{what}: not running on this node (container {states})")
    if len(up) > 1:
        raise TargetError(f"{what}: {len(up)} containers on this node carry its labels and run "
                          f"({', '.join(c[:12] for c in up)}); expected exactly one")
    return up[0]


def get_runtime(name: str) -> Runtime:
    """The runtime registered as ``name``; TargetError naming the supported ones for any other name."""
    new = RUNTIMES.get(name)
    if new is None:
        raise TargetError(f"container runtime {name!r} is not supported (supported: {', '.join(sorted(RUNTIMES))})")
    return new()
