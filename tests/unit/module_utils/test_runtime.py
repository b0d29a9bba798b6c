"""Pod targets: pod + container -> the container on this node, by its CRI labels; runtime auto; the registry."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime import _runtime as rt
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._proc import TargetError
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._runtime import (
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


class Known(FakeRuntime):
    """A fake runtime named ``name`` that knows ``ids`` (all running); ``binary`` "" when not installed."""

    def __init__(self, name: str, ids: List[str], binary: str = "/usr/bin/tool", fail: str = "") -> None:
        super().__init__({cid: labels("ml", "embed-0", "main") for cid in ids}, {cid: True for cid in ids})
        self.name, self.binary, self.fail = name, binary, fail

    def inspect(self, container: str) -> ContainerInfo:
        if self.fail:
            raise TargetError(self.fail)
        if container not in self.containers:
            raise TargetError(f"container {container} not found in {self.name}")
        return dataclasses.replace(super().inspect(container), runtime=self.name)

    def pod_containers(self, namespace: str, pod: str, container: str) -> List[str]:
        if self.fail:
            raise TargetError(self.fail)
        return super().pod_containers(namespace, pod, container)


@pytest.fixture(name="registry")
def fixture_registry(monkeypatch: pytest.MonkeyPatch) -> Dict[str, Any]:
    """RUNTIMES with fake podman and containerd (set ``registry[name]`` to the runtime ``get_runtime`` builds)."""
    made: Dict[str, Any] = {"podman": Known("podman", []), "containerd": Known("containerd", [])}
    monkeypatch.setattr(rt, "RUNTIMES", {"podman": lambda: made["podman"], "containerd": lambda: made["containerd"],
                                         rt.AUTO: rt.Auto})
    return made


def test_auto_is_the_one_runtime_that_knows_the_container(registry: Dict[str, Any]) -> None:
    registry["containerd"] = Known("containerd", [NEW])
    info = rt.get_runtime("auto").inspect(NEW)
    assert info.runtime == "containerd" and info.id == NEW


def test_auto_refuses_a_container_two_runtimes_know(registry: Dict[str, Any]) -> None:
    registry["podman"], registry["containerd"] = Known("podman", [NEW]), Known("containerd", [NEW])
    with pytest.raises(TargetError, match=r"container b+ is known to containerd \(bbbbbbbbbbbb\) and podman "
                                          r"\(bbbbbbbbbbbb\): set runtime to the one meant"):
        rt.get_runtime("auto").inspect(NEW)


def test_auto_names_every_runtime_asked_when_none_knows(registry: Dict[str, Any]) -> None:
    registry["containerd"] = Known("containerd", [], fail="containerd socket /run/containerd/containerd.sock does not exist")
    with pytest.raises(TargetError) as err:
        rt.get_runtime("auto").inspect("web")
    assert str(err.value) == ("container web: no container runtime on this node knows it (runtime auto asked containerd, "
                              "podman: containerd: containerd socket /run/containerd/containerd.sock does not exist; "
                              "podman: container web not found in podman)")


def test_auto_asks_only_installed_runtimes(registry: Dict[str, Any]) -> None:
    registry["podman"] = Known("podman", [NEW], binary="")
    registry["containerd"] = Known("containerd", [NEW])
    assert rt.get_runtime("auto").inspect(NEW).runtime == "containerd"
    registry["containerd"] = Known("containerd", [NEW], binary="")
    with pytest.raises(TargetError, match=r"runtime auto: no container runtime is installed on this node "
                                          r"\(none of containerd, podman\)"):
        rt.get_runtime("auto").inspect(NEW)


def test_auto_pod_containers_joins_what_each_runtime_has(registry: Dict[str, Any]) -> None:
    registry["podman"], registry["containerd"] = Known("podman", [OLD]), Known("containerd", [NEW])
    assert sorted(rt.get_runtime("auto").pod_containers("ml", "embed-0", "main")) == [OLD, NEW]
    registry["podman"] = Known("podman", [], fail="podman broke")
    assert rt.get_runtime("auto").pod_containers("ml", "embed-0", "main") == [NEW]
    registry["containerd"] = Known("containerd", [], fail="no socket")
    with pytest.raises(TargetError, match=r"pod ml/embed-0: no container runtime on this node could be asked "
                                          r"\(containerd: no socket; podman: podman broke\)"):
        rt.get_runtime("auto").pod_containers("ml", "embed-0", "main")


def test_auto_follows_the_scheme_of_the_pod_status_container_id(registry: Dict[str, Any]) -> None:
    registry["podman"], registry["containerd"] = Known("podman", [NEW]), Known("containerd", [OLD])
    pod = {"namespace": "ml", "name": "embed-0", "container": "main"}
    auto = rt.get_runtime("auto")
    assert pod_container(auto, dict(pod, container_id=f"containerd://{OLD}")) == OLD
    assert pod_container(auto, dict(pod, container_id=f"podman://{NEW}")) == NEW
    with pytest.raises(TargetError, match=r"a cri-o container; this node was asked to use auto"):
        pod_container(auto, dict(pod, container_id=f"cri-o://{NEW}"))


def test_every_registered_runtime_is_named_for_an_unknown_one() -> None:
    assert {"podman", "containerd", "auto"} <= set(rt.RUNTIMES)
    assert rt.get_runtime("containerd").name == "containerd"
    with pytest.raises(TargetError, match=r"'cri-o' is not supported \(supported: auto, containerd, podman\)"):
        rt.get_runtime("cri-o")
