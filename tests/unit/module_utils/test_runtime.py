"""Pod targets: pod + container -> the container on this node, by its CRI labels."""
from __future__ import annotations

from typing import Dict, List

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils._proc import TargetError
from ansible_collections.warmstart.snapshot.plugins.module_utils._runtime import (
    POD_CONTAINER, POD_NAME, POD_NAMESPACE, ContainerInfo, Runtime, pod_container)


class FakeRuntime(Runtime):
    name = "podman"

    def __init__(self, containers: Dict[str, Dict[str, str]], running: Dict[str, bool]) -> None:
        self.containers = containers
        self.is_running = running

    def pod_containers(self, namespace: str, pod: str, container: str) -> List[str]:
        want = {POD_NAMESPACE: namespace, POD_NAME: pod, POD_CONTAINER: container}
        return [cid for cid, labels in self.containers.items() if all(labels.get(k) == v for k, v in want.items())]

    def inspect(self, container: str) -> ContainerInfo:
        up = self.is_running[container]
        return ContainerInfo(id=container, name=container, runtime="podman", image="i", image_id="x", running=up,
                             status="running" if up else "exited", pid=10 if up else 0, cgroup_path="", rootfs="/",
                             upper_dir=None, hostname="h")


def labels(ns: str, pod: str, c: str) -> Dict[str, str]:
    return {POD_NAMESPACE: ns, POD_NAME: pod, POD_CONTAINER: c}


OLD, NEW, OTHER = "a" * 64, "b" * 64, "c" * 64
RT = FakeRuntime({OLD: labels("ml", "embed-0", "main"), NEW: labels("ml", "embed-0", "main"),
                  OTHER: labels("ml", "embed-0", "sidecar")},
                 {OLD: False, NEW: True, OTHER: True})


def test_the_running_container_of_the_pod_is_found() -> None:
    assert pod_container(RT, {"namespace": "ml", "name": "embed-0", "container": "main"}) == NEW
    assert pod_container(RT, {"namespace": "ml", "name": "embed-0", "container": "sidecar"}) == OTHER


def test_container_id_from_the_pod_status_pins_it() -> None:
    assert pod_container(RT, {"namespace": "ml", "name": "embed-0", "container": "main",
                              "container_id": f"podman://{NEW}"}) == NEW
    with pytest.raises(TargetError, match=r"container main: not running on this node \(container aaaaaaaaaaaa exited\)"):
        pod_container(RT, {"namespace": "ml", "name": "embed-0", "container": "main", "container_id": OLD[:12]})


def test_a_pod_elsewhere_or_a_wrong_container_is_named() -> None:
    with pytest.raises(TargetError, match=r"pod ml/embed-1 container main: no podman container on this node "
                                          r"carries the labels .*io.kubernetes.pod.name=embed-1"):
        pod_container(RT, {"namespace": "ml", "name": "embed-1", "container": "main"})
    with pytest.raises(TargetError, match=r"container dddddddddddd from the pod's status is not on this node"):
        pod_container(RT, {"namespace": "ml", "name": "embed-0", "container": "main", "container_id": "d" * 64})
    with pytest.raises(TargetError, match=r"a containerd container; this node was asked to use podman"):
        pod_container(RT, {"namespace": "ml", "name": "embed-0", "container": "main",
                           "container_id": f"containerd://{NEW}"})
    with pytest.raises(TargetError, match=r"needs a name and a container"):
        pod_container(RT, {"namespace": "ml", "name": "embed-0"})


def test_two_running_containers_are_ambiguous() -> None:
    rt = FakeRuntime({OLD: labels("d", "p", "c"), NEW: labels("d", "p", "c")}, {OLD: True, NEW: True})
    with pytest.raises(TargetError, match=r"2 containers on this node carry its labels and run.*expected exactly one"):
        pod_container(rt, {"namespace": "d", "name": "p", "container": "c"})
