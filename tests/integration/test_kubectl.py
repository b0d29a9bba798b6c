"""The fake API server stays honest: the real ``kubectl`` (Debian's kubernetes-client where none is installed)
drives it with its own protocol - discovery of our CRDs, client-side apply (create, then a strategic merge patch
with the last-applied annotation), get, label, JSON and merge patches, watch, delete - and reads its errors the
way it reads a real server's.

kubectl's typed commands (``kubectl create configmap``) send protobuf, which the fake does not speak: it answers
415 as a server without that media type would. ``--validate=false`` because kubectl's own client-side schema
check needs the server's OpenAPI document, which the fake does not serve; the fake checks built-in objects
against Kubernetes' schemas itself (tests/support/k8s_schemas.py).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from tests.support.fake_apiserver import FakeApiServer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def kubectl() -> str:
    """kubectl on PATH, else Debian's kubernetes-client installed for it."""
    found = shutil.which("kubectl")
    if found is None:
        done = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "kubernetes-client"],
                              capture_output=True, text=True, check=False,
                              env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        found = shutil.which("kubectl")
        assert found, f"no kubectl, and Debian's kubernetes-client did not install: {done.stderr[-2000:]}"
    return found


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.write_kubeconfig(tmp_path / "kubeconfig")
        yield server.install_crds()


def run(kubectl: str, api: FakeApiServer, *args: str, stdin: Any = None, ok: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([kubectl, *args], capture_output=True, text=True, timeout=60, check=False,
                          input=json.dumps(stdin) if stdin is not None else None,
                          env=dict(os.environ, KUBECONFIG=str(api.kubeconfig), HOME=str(api.kubeconfig.parent)))
    if ok:
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done


def test_apply_get_label_patch_and_delete_a_configmap(kubectl: str, api: FakeApiServer) -> None:
    cm: Dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "profiles", "namespace": "default"}, "data": {"llm": "vllm"}}
    assert "created" in run(kubectl, api, "apply", "--validate=false", "-f", "-", stdin=cm).stdout
    cm["data"] = {"llm": "vllm-sleep", "embed": "tei"}
    assert "configured" in run(kubectl, api, "apply", "--validate=false", "-f", "-", stdin=cm).stdout
    stored = api.store.get("configmaps", "profiles", "default")
    assert stored["data"] == {"llm": "vllm-sleep", "embed": "tei"}
    last = json.loads(stored["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"])
    assert last["data"] == cm["data"]
    assert "unchanged" in run(kubectl, api, "apply", "--validate=false", "-f", "-", stdin=cm).stdout
    run(kubectl, api, "label", "configmap", "profiles", "tier=gold")
    run(kubectl, api, "patch", "configmap", "profiles", "--type=merge", "-p", '{"data": {"embed": null}}')
    got = json.loads(run(kubectl, api, "get", "configmap", "profiles", "-o", "json").stdout)
    assert got["metadata"]["labels"] == {"tier": "gold"} and got["data"] == {"llm": "vllm-sleep"}
    assert run(kubectl, api, "get", "configmaps", "-l", "tier=gold", "-o", "name").stdout.split() == [
        "configmap/profiles"]
    run(kubectl, api, "delete", "configmap", "profiles")
    assert api.store.get("configmaps", "profiles", "default") is None


def test_our_custom_resources_are_discovered_and_their_schema_enforced(kubectl: str, api: FakeApiServer) -> None:
    resources = run(kubectl, api, "api-resources", "--api-group=snapshot.warmstart.io", "-o", "name").stdout.split()
    assert "podsnapshots.snapshot.warmstart.io" in resources
    snap = {"apiVersion": "snapshot.warmstart.io/v1alpha1", "kind": "PodSnapshot",
            "metadata": {"name": "warm", "namespace": "default"}, "spec": {"source": {"podRef": {"name": "embed-0"}}}}
    run(kubectl, api, "apply", "--validate=false", "-f", "-", stdin=snap)
    assert run(kubectl, api, "get", "podsnapshots", "-o", "name").stdout.split() == [
        "podsnapshot.snapshot.warmstart.io/warm"]
    run(kubectl, api, "patch", "podsnapshot", "warm", "--type=json",
        "-p", '[{"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}}]')
    assert api.store.get("podsnapshots", "warm", "default", group="snapshot.warmstart.io")["metadata"][
        "annotations"] == {"a": "b"}
    # spec.source is immutable (a transition rule of the CRD): kubectl shows the server's refusal
    moved = run(kubectl, api, "patch", "podsnapshot", "warm", "--type=merge",
                "-p", '{"spec": {"source": {"podRef": {"name": "other"}}}}', ok=False)
    assert moved.returncode != 0 and "is invalid" in moved.stderr, moved.stderr


def test_a_builtin_object_that_breaks_the_schema_is_refused_with_each_cause(kubectl: str, api: FakeApiServer) -> None:
    bad = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent", "namespace": "default"},
           "spec": {"template": {"spec": {"containers": [{"name": "agent"}]}}}}
    done = run(kubectl, api, "create", "--validate=false", "-f", "-", stdin=bad, ok=False)
    assert done.returncode != 0
    assert 'The DaemonSet "agent" is invalid' in done.stderr and "spec.selector: Required value" in done.stderr, \
        done.stderr
    assert api.store.get("daemonsets", "agent", "default", group="apps") is None


def test_typed_commands_get_a_clear_415_for_protobuf(kubectl: str, api: FakeApiServer) -> None:
    done = run(kubectl, api, "create", "configmap", "x", "--from-literal=a=b", ok=False)
    if done.returncode == 0:  # a kubectl that sends JSON here: the object must then be stored as sent
        assert api.store.get("configmaps", "x", "default")["data"] == {"a": "b"}
    else:
        assert "unknown format" in done.stderr or "415" in done.stderr or "Unsupported" in done.stderr, done.stderr


def test_watch_streams_what_happens(kubectl: str, api: FakeApiServer) -> None:
    env = dict(os.environ, KUBECONFIG=str(api.kubeconfig), HOME=str(api.kubeconfig.parent))
    watcher = subprocess.Popen([kubectl, "get", "configmaps", "--watch", "-o", "name"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        api.wait_watches(1, timeout=20)
        for name in ("a", "b"):
            run(kubectl, api, "apply", "--validate=false", "-f", "-",
                stdin={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}})
        time.sleep(1.0)
    finally:
        watcher.terminate()
        out, _err = watcher.communicate(timeout=20)
    assert out.split().count("configmap/a") >= 1 and "configmap/b" in out.split(), out
