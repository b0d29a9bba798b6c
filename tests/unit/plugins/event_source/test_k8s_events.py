"""The event source's own part (extensions/eda/plugins/event_source/k8s_events.py): its arguments, what it watches,
how it finds the collection's module_utils when ansible-rulebook runs it by path, and its metrics hook."""
from __future__ import annotations

import asyncio
import os
import runpy
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any, Dict, List

import pytest

REPO = Path(__file__).resolve().parents[4]
LINKED = REPO / ".collections" / "ansible_collections" / "warmstart" / "snapshot" / "extensions" / "eda" / \
    "plugins" / "event_source" / "k8s_events.py"


@pytest.fixture(scope="module")
def plugin() -> Dict[str, Any]:
    """The plugin's globals, loaded as ansible-rulebook loads it (runpy.run_path on the installed collection)."""
    return runpy.run_path(str(LINKED))


def test_documentation_and_examples_are_yaml_with_every_option(plugin: Dict[str, Any]) -> None:
    import yaml  # pylint: disable=import-outside-toplevel

    doc = yaml.safe_load(plugin["DOCUMENTATION"])
    assert set(doc["options"]) == set(plugin["OPTIONS"])
    assert doc["short_description"] and isinstance(yaml.safe_load(plugin["EXAMPLES"]), list)
    assert asyncio.iscoroutinefunction(plugin["main"])


def test_defaults(plugin: Dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-7")
    s = plugin["parse"]({"eda_feedback_queue": object()})
    assert (s.node_name, s.namespaces, s.resync_seconds, s.backoff_max_seconds, s.request_timeout) == (
        "gpu-7", [None], 30, 30, 30)
    assert s.types == ["restore_pod", "capture_request", "manual_trigger", "source_ready", "pod_deleted", "retention"]
    assert s.retention_seconds == 300
    assert s.resync_types == ["restore_pod", "capture_request", "manual_trigger", "source_ready"]
    assert (s.auth, s.metrics_dir, s.metrics_port, s.metrics_host) == ({}, None, None, "0.0.0.0")
    monkeypatch.delenv("NODE_NAME")
    assert plugin["parse"]({}).node_name is None
    assert plugin["parse"]({"node_name": ""}).node_name is None


def test_rendered_values_are_taken_as_a_rulebook_renders_them(plugin: Dict[str, Any]) -> None:
    s = plugin["parse"]({"auth": {"kubeconfig": "/k", "context": "c", "host": None}, "context": "top",
                         "namespaces": "ml, web,ml", "resync_seconds": "15", "types": "restore_pod,pod_deleted",
                         "metrics_dir": "/m", "metrics_port": "9464", "node_name": "n1"})
    assert s.auth == {"kubeconfig": "/k", "context": "top"}  # keys given to the source win over auth's
    assert s.namespaces == ["ml", "web"] and s.resync_seconds == 15 and s.types == ["restore_pod", "pod_deleted"]
    assert (s.metrics_dir, s.metrics_port) == ("/m", 9464)
    assert plugin["parse"]({"namespaces": [], "metrics_port": 0, "metrics_dir": ""}).namespaces == [None]


def test_every_bad_argument_is_named_at_once(plugin: Dict[str, Any]) -> None:
    with pytest.raises(ValueError) as bad:
        plugin["parse"]({"kubeconfg": "/k", "auth": {"token": "x"}, "namespaces": 3, "resync_seconds": "soon",
                         "backoff_max_seconds": 0, "types": ["restore_pod", "captures"], "metrics_port": 9464,
                         "node_name": 5})
    message = str(bad.value)
    assert message.startswith("warmstart.snapshot.k8s_events: unknown argument(s) kubeconfg; known: ")
    for part in ("auth has unknown key(s) token; known: kubeconfig, context, host, api_key, validate_certs, ca_cert",
                 "namespaces must be a list of strings (or a comma-separated string), not 3",
                 "resync_seconds must be a number, not 'soon'",
                 "backoff_max_seconds must be a number >= 0.5, not 0",
                 "types: unknown event type(s) captures",
                 "metrics_port needs metrics_dir", "node_name must be a string, not 5"):
        assert part in message, part
    with pytest.raises(ValueError, match="metrics_port must be a port number"):
        plugin["parse"]({"metrics_port": 70000, "metrics_dir": "/m"})


def test_main_refuses_bad_arguments_before_it_connects(plugin: Dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="unknown argument"):
        asyncio.run(plugin["main"](asyncio.Queue(), {"bogus": 1}))


def _targets(plugin: Dict[str, Any], **args: Any) -> List[str]:
    return [t.describe() + f" -> {kind}" for t, kind in plugin["targets"](plugin["parse"](args))]


def test_only_what_the_event_types_need_is_watched_and_pods_only_of_this_node(plugin: Dict[str, Any]) -> None:
    assert _targets(plugin, node_name="n1", types=["restore_pod"]) == [
        "pods (all namespaces, spec.nodeName=n1) -> Pod",
        "podsnapshots.snapshot.warmstart.io (all namespaces) -> PodSnapshot"]
    assert _targets(plugin, node_name="", types=["manual_trigger"], namespaces=["a", "b"]) == [
        "podsnapshotmanualtriggers.snapshot.warmstart.io (namespace a) -> PodSnapshotManualTrigger",
        "podsnapshotmanualtriggers.snapshot.warmstart.io (namespace b) -> PodSnapshotManualTrigger"]
    assert len(_targets(plugin, node_name="n1")) == 4
    assert _targets(plugin, types=["pod_deleted"], node_name="") == ["pods (all namespaces) -> Pod"]
    # a timer, due only while a policy's retention could remove a snapshot: the snapshots and the policies
    assert _targets(plugin, types=["retention"], node_name="n1") == [
        "podsnapshots.snapshot.warmstart.io (all namespaces) -> PodSnapshot",
        "podsnapshotpolicies.snapshot.warmstart.io (all namespaces) -> PodSnapshotPolicy"]


def _run_path(path: Path, env: Dict[str, str]) -> subprocess.CompletedProcess:
    code = f"import runpy; m = runpy.run_path({str(path)!r}); print(m['main'].__module__, m['kw'].__name__)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False,
                          cwd="/")


def _bare_env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "PYTHON"))}
    env["HOME"] = "/nonexistent"  # no ~/.ansible/collections to fall back on
    return env


def test_run_by_path_from_the_installed_collection_it_finds_its_module_utils() -> None:
    done = _run_path(LINKED, _bare_env())
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_watch" in done.stdout


def test_a_copy_elsewhere_finds_the_collection_on_ansible_collections_path(tmp_path: Path) -> None:
    copy = tmp_path / "sources" / "k8s_events.py"
    copy.parent.mkdir()
    shutil.copy(LINKED, copy)
    env = _bare_env()
    if not Path("/usr/share/ansible/collections/ansible_collections/warmstart/snapshot").exists():
        assert _run_path(copy, env).returncode != 0  # nowhere to find it (a system-wide install would be found)
    env["ANSIBLE_COLLECTIONS_PATH"] = f"/nonexistent:{REPO / '.collections'}"
    done = _run_path(copy, env)
    assert done.returncode == 0, done.stderr[-2000:]
    env["ANSIBLE_COLLECTIONS_PATH"] = str(REPO / ".collections" / "ansible_collections")  # the directory itself
    assert _run_path(copy, env).returncode == 0


class _Agent:
    def __init__(self, settings: Any) -> None:
        self.settings = settings


def test_metrics_port_serves_the_textfile_directory(plugin: Dict[str, Any], tmp_path: Path) -> None:
    """metrics_port: _metrics.serve's endpoint shows the directory's *.prom files; metrics_dir alone serves nothing."""
    (tmp_path / "warmstart.prom").write_text("# TYPE warmstart_restores_total counter\n"
                                             'warmstart_restores_total{outcome="succeeded"} 2\n')
    settings = plugin["parse"]({"metrics_dir": str(tmp_path), "metrics_port": 1, "metrics_host": "127.0.0.1"})
    settings.metrics_port = 0  # parse wants a real port; 0 = let the kernel pick one, for the test
    assert plugin["Agent"]._serve_metrics(_Agent(settings)) is None  # no port: nothing served
    settings.metrics_port = _free_port()
    server = plugin["Agent"]._serve_metrics(_Agent(settings))
    try:
        with urllib.request.urlopen(server.url, timeout=5) as resp:  # noqa: S310 - loopback
            body = resp.read().decode()
        assert 'warmstart_restores_total{outcome="succeeded"} 2' in body
    finally:
        server.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
