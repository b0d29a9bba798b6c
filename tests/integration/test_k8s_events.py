"""The event source warmstart.snapshot.k8s_events, for real: its file loaded as ansible-rulebook loads it (runpy, from
the installed collection), the real kubernetes client, the fake API server with the collection's CRDs - and once
under the real ansible-rulebook. Faults: a connection cut mid-stream, a 410 in the middle of a stream, bookmarks,
403 and an unreachable API server, and node filtering."""
from __future__ import annotations

import asyncio
import logging
import os
import runpy
import subprocess
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi

from tests.support.fake_apiserver import FakeApiServer

from .ansible_run import REPO, VENV_BIN

pytestmark = pytest.mark.integration

COLLECTIONS = REPO / ".collections"
SOURCE = COLLECTIONS / "ansible_collections" / "warmstart" / "snapshot" / "extensions" / "eda" / "plugins" / \
    "event_source" / "k8s_events.py"
NODE = "node-1"
PODS = "/api/v1/pods"


def restore_pod(api: FakeApiServer, name: str, node: Optional[str] = NODE, **kw: Any) -> Dict[str, Any]:
    return api.add_pod(name, namespace="ml", node=node or "", annotations={podapi.ANN_RESTORE_FROM: "snap"}, **kw)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeApiServer]:
    """A fake API server (bookmarks every 0.2 s) serving the collection's CRDs, with namespace ml."""
    server = FakeApiServer(bookmark_interval=0.2).start()
    server.write_kubeconfig(tmp_path / "kubeconfig")
    server.install_crds()
    server.store.put("namespaces", {"metadata": {"name": "ml"}})
    try:
        yield server
    finally:
        server.stop()


class Source:
    """The plugin's ``main`` on its own event loop in a thread; what it puts on the queue lands in ``events``."""

    def __init__(self, args: Dict[str, Any]) -> None:
        self.module = runpy.run_path(str(SOURCE))  # as ansible-rulebook runs it: by path, outside any package
        self.args = args
        self.events: List[Dict[str, Any]] = []
        self.error: Optional[BaseException] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._task: Optional[asyncio.Task] = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def consume() -> None:
            queue: asyncio.Queue = asyncio.Queue(maxsize=1)  # as small as ansible-rulebook's: back-pressure works
            self._loop = asyncio.get_running_loop()
            self._task = asyncio.ensure_future(self.module["main"](queue, dict(self.args)))
            while not self._task.done():
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait([getter, self._task], return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    self.events.append(getter.result()["warmstart"])
                else:
                    getter.cancel()
            if not self._task.cancelled() and self._task.exception():
                self.error = self._task.exception()

        asyncio.run(consume())

    def __enter__(self) -> "Source":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        deadline = time.monotonic() + 5
        while self._loop is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if self._loop is not None and self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(15)
        assert not self._thread.is_alive(), "the source did not stop when cancelled"

    def brief(self) -> List[tuple]:
        return [(e["type"], e["name"], e["node"], e["reason"]) for e in list(self.events)]

    def wait(self, check: Callable[[List[tuple]], bool], timeout: float = 20.0) -> List[tuple]:
        deadline = time.monotonic() + timeout
        while not check(self.brief()):
            assert self.error is None, f"the source failed: {self.error!r}"
            assert time.monotonic() < deadline, f"timed out; events so far: {self.brief()}"
            time.sleep(0.02)
        return self.brief()


def source_args(api: FakeApiServer, **kw: Any) -> Dict[str, Any]:
    args: Dict[str, Any] = {"kubeconfig": str(api.kubeconfig), "node_name": NODE, "resync_seconds": 0,
                            "retention_seconds": 0}
    args.update(kw)
    return args


def watch_requests(api: FakeApiServer, path: str = PODS) -> List[Dict[str, Any]]:
    return [r for r in list(api.requests) if r["path"] == path and r["query"].get("watch") == "true"]


def list_requests(api: FakeApiServer, path: str = PODS) -> List[Dict[str, Any]]:
    return [r for r in list(api.requests) if r["path"] == path and r["method"] == "GET" and "watch" not in r["query"]]


# --- resume, re-list, bookmarks -------------------------------------------------------------

def test_a_cut_connection_resumes_without_losing_or_doubling_events(api: FakeApiServer) -> None:
    with Source(source_args(api, types=["restore_pod", "pod_deleted"])) as src:
        api.wait_watches(2)
        restore_pod(api, "r1")
        src.wait(lambda ev: ("restore_pod", "r1", NODE, "added") in ev)
        assert api.drop_watches() == 2
        restore_pod(api, "r2")  # while the watches are cut
        api.store.remove("pods", "r1", "ml")
        seen = src.wait(lambda ev: ("pod_deleted", "r1", NODE, "deleted") in ev and len(ev) >= 3)
        time.sleep(0.5)  # anything doubled would come now
        assert src.brief() == seen == [("restore_pod", "r1", NODE, "added"), ("restore_pod", "r2", NODE, "added"),
                                       ("pod_deleted", "r1", NODE, "deleted")]
    assert len(list_requests(api)) == 1  # resumed, not listed again
    resumed = watch_requests(api)[1]["query"]
    assert int(resumed["resourceVersion"]) >= int(watch_requests(api)[0]["query"]["resourceVersion"])


def test_a_410_in_the_middle_of_a_stream_lists_again_and_emits_what_changed(api: FakeApiServer) -> None:
    restore_pod(api, "gone")
    with Source(source_args(api, types=["restore_pod", "pod_deleted"])) as src:
        src.wait(lambda ev: ("restore_pod", "gone", NODE, "added") in ev)
        api.wait_watches(2)
        with api.store.lock:  # the open stream sees nothing of this but an ERROR 410
            restore_pod(api, "new")
            api.store.remove("pods", "gone", "ml")
            api.compact()
        seen = src.wait(lambda ev: len(ev) >= 3)
        assert seen == [("restore_pod", "gone", NODE, "added"), ("pod_deleted", "gone", NODE, "relist"),
                        ("restore_pod", "new", NODE, "relist")]
    assert len(list_requests(api)) == 2


def test_bookmarks_advance_the_resource_version_a_resume_starts_from(api: FakeApiServer) -> None:
    with Source(source_args(api, types=["restore_pod"])) as src:
        first = api.wait_watches(1, path=PODS)[0]["resource_version"]
        for i in range(5):
            api.add_pod(f"elsewhere-{i}", node="node-2")  # not this node's: no event, but the rv moves on
        target = api.store.rv
        time.sleep(0.6)  # a few bookmarks
        api.drop_watches()
        deadline = time.monotonic() + 10
        while len(watch_requests(api)) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert src.brief() == []
    resumed = watch_requests(api)[1]["query"]["resourceVersion"]
    assert int(resumed) >= target > int(first)


# --- faults: 403 and unreachable --------------------------------------------------------

def test_403_logs_one_clear_line_backs_off_and_recovers(api: FakeApiServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="warmstart")
    api.answer_errors(403)
    with Source(source_args(api, types=["restore_pod"], backoff_max_seconds=1)) as src:
        time.sleep(3)
        tries = len(list_requests(api))
        assert 2 <= tries <= 8, f"{tries} lists in 3 s: the backoff must bound them"
        lines = [r.getMessage() for r in caplog.records if "403 Forbidden" in r.getMessage()
                 and r.getMessage().startswith("k8s watch pods ")]
        assert lines and all("\n" not in line for line in lines)
        assert lines[0].startswith(f"k8s watch pods (all namespaces, spec.nodeName={NODE}) on {api.url}: 403 "
                                   'Forbidden: pods is forbidden: User "system:serviceaccount:warmstart:agent" '
                                   'cannot list resource "pods" in API group "" at the cluster scope; trying again in')
        api.heal()
        restore_pod(api, "r")
        src.wait(lambda ev: ("restore_pod", "r", NODE, "added") in ev)
    assert any("listed 1 object(s)" in r.getMessage() and "again, after" in r.getMessage() for r in caplog.records)


def test_an_unreachable_api_server_logs_backs_off_and_the_watch_resumes(api: FakeApiServer,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="warmstart")
    with Source(source_args(api, types=["restore_pod"], backoff_max_seconds=1)) as src:
        api.wait_watches(2)
        api.go_offline()
        restore_pod(api, "while-down")  # stored while no one can ask
        time.sleep(2.5)
        down = [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage()]
        assert down and down[0].startswith("k8s watch ") and f"API server {api.url} unreachable" in down[0]
        assert len(down) <= 12, "the backoff must bound the retries"
        api.go_online()
        src.wait(lambda ev: ("restore_pod", "while-down", NODE, "added") in ev)
    assert len(list_requests(api)) == 1  # the watch resumed from where it was: nothing listed again


# --- node filtering and the object kinds ---------------------------------------------------

def _ready_snapshot(api: FakeApiServer, name: str, policy: str) -> None:
    api.store.put("podsnapshots", {
        "apiVersion": podapi.API_VERSION, "kind": podapi.KIND_SNAPSHOT, "metadata": {"name": name, "namespace": "ml"},
        "spec": {"source": {"podRef": {"name": "src"}}, "policyName": policy},
        "status": {"boundSnapshotContentName": f"ml-{name}", "conditions": [{
            "type": "Ready", "status": "True", "reason": "Ready", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}, group=podapi.GROUP)


def test_the_retention_timer_ticks_with_this_node_and_the_namespaces_while_retention_is_due(
        api: FakeApiServer) -> None:
    api.store.put("podsnapshotpolicies", {
        "apiVersion": podapi.API_VERSION, "kind": podapi.KIND_POLICY, "metadata": {"name": "keep1", "namespace": "ml"},
        "spec": {"selector": {"matchLabels": {"app": "embed"}}, "triggerConfig": {"type": "manual"},
                 "snapshotGroupingRules": {"groupRetentionPolicy": {"maxSnapshotCountPerGroup": 1}}}},
        group=podapi.GROUP)
    _ready_snapshot(api, "old", "keep1")
    with Source(source_args(api, types=["retention", "restore_pod"], retention_seconds=1, namespaces=["ml"])) as src:
        api.wait_watches(3)  # pods, PodSnapshots, PodSnapshotPolicies
        time.sleep(2.5)
        assert not [e for e in src.events if e["type"] == "retention"], "one snapshot, keep 1: nothing to retain"
        _ready_snapshot(api, "new", "keep1")  # two now: the timer's next tick makes the event
        src.wait(lambda ev: len([e for e in ev if e[0] == "retention"]) >= 2, timeout=10)
    ticks = [e for e in src.events if e["type"] == "retention"]
    assert {(e["node"], e["reason"], e["name"]) for e in ticks} == {(NODE, "timer", "")}
    assert ticks[0]["object"] == {"namespaces": ["ml"]}
    with Source(source_args(api, types=["restore_pod"], retention_seconds=1)) as src:  # not asked for: none
        api.wait_watches(2)
        time.sleep(1.5)
    assert not [e for e in src.events if e["type"] == "retention"]


def test_node_filtering_and_every_event_type(api: FakeApiServer) -> None:
    api.add_pod("src-here", namespace="ml", labels={"app": "embed"}, node=NODE)
    api.add_pod("src-there", namespace="ml", labels={"app": "other"}, node="node-2")
    with Source(source_args(api)) as src:
        api.wait_watches(4)
        assert {w["query"].get("fieldSelector") for w in api.open_watches() if w["path"] == PODS} == {
            f"spec.nodeName={NODE}"}
        restore_pod(api, "there", node="node-2")
        restore_pod(api, "later", node=None, phase="Pending")  # not scheduled yet
        group = f"/apis/{podapi.GROUP}/{podapi.VERSION}/namespaces/ml"
        for name, pod in (("req-here", "src-here"), ("req-there", "src-there"), ("req-orphan", "missing")):
            api.route("POST", f"{group}/podsnapshots", {}, {"metadata": {"name": name}, "spec": {
                "source": {"podRef": {"name": pod}, "containers": ["main"]}}}, "application/json")
        api.route("POST", f"{group}/podsnapshotmanualtriggers", {},
                  {"metadata": {"name": "now"}, "spec": {"targetPod": "src-here"}}, "application/json")
        api.route("POST", f"{group}/podsnapshotpolicies", {},
                  {"metadata": {"name": "embed"}, "spec": {"selector": {"matchLabels": {"app": "embed"}},
                                                           "triggerConfig": {"type": "workload"}}},
                  "application/json")
        restore_pod(api, "later")  # the scheduler binds it here, the kubelet starts it: it enters the node's watch
        seen = src.wait(lambda ev: len(ev) >= 5)
        time.sleep(0.5)
        assert sorted(src.brief()) == sorted([
            ("capture_request", "req-here", NODE, "added"), ("capture_request", "req-orphan", None, "added"),
            ("manual_trigger", "now", NODE, "added"), ("source_ready", "embed", NODE, "added"),
            ("restore_pod", "later", NODE, "added")]), seen
    by_type = {e["type"]: e for e in src.events}
    assert by_type["source_ready"]["source_pod"]["metadata"]["name"] == "src-here"
    assert by_type["manual_trigger"]["source_pod"]["spec"]["nodeName"] == NODE


# --- the real ansible-rulebook ------------------------------------------------------------

def test_ansible_rulebook_runs_the_source_and_the_rules_see_its_events(api: FakeApiServer, tmp_path: Path) -> None:
    rulebook = tmp_path / "rulebook.yml"
    rulebook.write_text(textwrap.dedent(f"""\
        ---
        - name: k8s_events under ansible-rulebook
          hosts: all
          sources:
            - warmstart.snapshot.k8s_events:
                auth:
                  kubeconfig: {api.kubeconfig}
                node_name: "{{{{ NODE_NAME }}}}"
                namespaces: [ml]
                resync_seconds: 0
          rules:
            - name: a restore pod of this node
              condition: event.warmstart.type == "restore_pod"
              action:
                debug:
                  msg: >-
                    RESTORE {{{{ event.warmstart.namespace }}}}/{{{{ event.warmstart.name }}}}
                    on {{{{ event.warmstart.node }}}} ({{{{ event.warmstart.reason }}}})
            - name: stop once it is deleted
              condition: event.warmstart.type == "pod_deleted"
              actions:
                - debug:
                    msg: "DELETED {{{{ event.warmstart.namespace }}}}/{{{{ event.warmstart.name }}}}"
                - shutdown:
                    delay: 0
        """))
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all:\n  hosts:\n    localhost:\n      ansible_connection: local\n")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS), NODE_NAME=NODE, PYTHONUNBUFFERED="1",
               PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    proc = subprocess.Popen([str(VENV_BIN / "ansible-rulebook"), "--rulebook", str(rulebook), "-i", str(inventory),
                             "--env-vars", "NODE_NAME"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: List[str] = []
    seen = threading.Event()

    def read() -> None:  # the rules' output as it comes: the pod is deleted only once its event was handled
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "RESTORE ml/r " in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        api.wait_watches(4, timeout=180)  # pods, podsnapshots, triggers, policies: all listed, the source started
        restore_pod(api, "r")
        restore_pod(api, "elsewhere", node="node-2")
        assert seen.wait(180), "no restore_pod event handled within 180 s: " + "".join(lines)[-3000:]
        api.store.remove("pods", "r", "ml")
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(10)
    out = "".join(lines)
    assert proc.returncode == 0, out[-3000:]
    assert "RESTORE ml/r on node-1 (added)" in out and "DELETED ml/r" in out, out[-3000:]
    assert "elsewhere" not in out
