# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""warmstart.snapshot.k8s_events: an ansible-rulebook event source that watches the Kubernetes API server.

It lists and watches pods (only this node's with ``node_name``), PodSnapshots, PodSnapshotManualTriggers and
PodSnapshotPolicies - each in its own thread, resuming, re-listing and backing off as ``_k8s_watch`` does - and
puts the node agent's typed events (``_agent_events``) on the rulebook's queue. ansible-rulebook runs this file
with ``runpy.run_path``, outside any package: the collection's own ``module_utils`` are imported by their FQCN
once the directory that holds ``ansible_collections/warmstart/snapshot`` is on ``sys.path`` (see
``_make_collection_importable``).
"""
from __future__ import annotations

import asyncio
import importlib
import logging
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

DOCUMENTATION = r"""
---
short_description: Watch the Kubernetes API server for warmstart's restore pods, snapshot requests and triggers.
description:
  - An ansible-rulebook event source plugin for the warmstart node agent. It lists and watches pods, PodSnapshots,
    PodSnapshotManualTriggers and PodSnapshotPolicies with the kubernetes Python client (list, then watch from the
    list's resourceVersion; resume from the last event or bookmark after a dropped connection; list again on
    410 Gone and emit what changed meanwhile; reconnect with capped exponential backoff and jitter, logging one
    line naming the resource, the API server and the status when the API server is unreachable or refuses).
  - Each event is a dict with one key, C(warmstart), holding C(type), C(namespace), C(name), C(uid), C(node),
    C(reason), C(object) and (capture_request, manual_trigger, source_ready) C(source_pod). C(type) is
    C(restore_pod) (a restore pod on this node whose placeholder runs and whose restore has no outcome yet),
    C(capture_request) (a PodSnapshot not bound and neither Ready nor Failed), C(manual_trigger) (a
    PodSnapshotManualTrigger without a Triggered condition), C(source_ready) (a Running and Ready pod that a
    workload PodSnapshotPolicy selects and that has no PodSnapshot of that policy yet) or C(pod_deleted) (a
    restore pod was deleted). C(reason) says why now - added, modified, relist, resync, snapshot-ready, deleted.
    Events whose condition still holds are emitted again every O(resync_seconds); consumers must be idempotent.
  - C(retention) events come from a timer, not from an object - once the first lists are in, then every
    O(retention_seconds) - with C(node) this node and C(object.namespaces) the watched namespaces; each says it is
    time to apply the PodSnapshotPolicies' retention on this node (M(warmstart.snapshot.agent_retention)). A tick
    makes the event only while some policy's retention could remove a snapshot (a C(lastAccessTimeout) and a
    Ready PodSnapshot of that policy, or more Ready PodSnapshots of it than its C(maxSnapshotCountPerGroup)) -
    a node with nothing to retain runs no playbook. To know that, C(retention) watches PodSnapshots and
    PodSnapshotPolicies.
  - Needs the kubernetes Python library where ansible-rulebook runs.
options:
  auth:
    description:
      - The API server and credentials, as a dict of the keys below (kubeconfig, context, host, api_key,
        validate_certs, ca_cert). Keys given directly to the source win over the same keys here.
      - Without any, C(K8S_AUTH_*) environment variables, then C(~/.kube/config), then the in-cluster service
        account, as the collection's modules do.
    type: dict
    default: {}
  kubeconfig:
    description: Path of a kubeconfig file (env C(K8S_AUTH_KUBECONFIG)).
    type: str
  context:
    description: Context of the kubeconfig (env C(K8S_AUTH_CONTEXT)).
    type: str
  host:
    description: URL of the API server (env C(K8S_AUTH_HOST)).
    type: str
  api_key:
    description: Bearer token (env C(K8S_AUTH_API_KEY)).
    type: str
  validate_certs:
    description: Verify the API server's certificate (env C(K8S_AUTH_VERIFY_SSL)).
    type: bool
  ca_cert:
    description: CA bundle for the API server's certificate (env C(K8S_AUTH_SSL_CA_CERT)).
    type: str
  namespaces:
    description: Namespaces to watch (a list, or a comma-separated string); empty means all.
    type: list
    elements: str
    default: []
  node_name:
    description:
      - Only pods on this node (a C(spec.nodeName) field selector); capture requests and triggers only when their
        source pod is on it (or is absent). Default the environment variable C(NODE_NAME); empty means every node.
    type: str
  resync_seconds:
    description: Emit again every event whose condition still holds this often; 0 turns it off.
    type: int
    default: 30
  resync_types:
    description: The event types a resync emits again.
    type: list
    elements: str
    default: [restore_pod, capture_request, manual_trigger, source_ready]
  retention_seconds:
    description: Look this often whether a policy's retention is due, and emit a C(retention) event when it is; 0 turns
      it off.
    type: int
    default: 300
  backoff_max_seconds:
    description: The longest wait between two tries after errors (the backoff starts at 0.5 s and doubles).
    type: int
    default: 30
  types:
    description: The event types to emit; default all. Only the resources those types need are watched.
    type: list
    elements: str
    default: [restore_pod, capture_request, manual_trigger, source_ready, pod_deleted, retention]
  request_timeout:
    description: Seconds for one list or get request.
    type: int
    default: 30
  metrics_dir:
    description:
      - The node_exporter textfile collector directory the agent's playbooks write their C(*.prom) files into.
      - With O(metrics_port), the source also serves them over HTTP at C(/metrics).
    type: str
  metrics_port:
    description: Serve O(metrics_dir) at C(http://<metrics_host>:<port>/metrics); 0 or unset serves nothing.
    type: int
  metrics_host:
    description: The address the metrics endpoint listens on.
    type: str
    default: 0.0.0.0
"""

EXAMPLES = r"""
- name: warmstart node agent
  hosts: localhost
  sources:
    - warmstart.snapshot.k8s_events:
        node_name: "{{ NODE_NAME }}"
        namespaces: [ml]
        resync_seconds: 30
        metrics_dir: /var/lib/warmstart/metrics
        metrics_port: 9464
  rules:
    - name: Restore a restore pod of this node
      condition: event.warmstart.type == "restore_pod"
      action:
        run_playbook:
          name: warmstart.snapshot.agent_restore

- name: print what a cluster's agent would see, from a kubeconfig
  hosts: all
  sources:
    - warmstart.snapshot.k8s_events:
        auth:
          kubeconfig: ~/.kube/config
          context: staging
        types: [capture_request, manual_trigger]
  rules:
    - name: show
      condition: event.warmstart is defined
      action:
        print_event:
"""

LOG = logging.getLogger("warmstart.k8s_events")
COLLECTION = ("ansible_collections", "warmstart", "snapshot")
HERE = ("extensions", "eda", "plugins", "event_source")


def _make_collection_importable() -> None:
    """Put the directory that holds ``ansible_collections/warmstart/snapshot`` on ``sys.path`` when needed.

    ansible-rulebook finds this file in the installed collection (``ansible-galaxy collection list``) and runs it
    by path, so the directory above ``ansible_collections`` is this file's eighth parent; a copy run from
    elsewhere (``-S``) falls back to ANSIBLE_COLLECTIONS_PATH and the default collection paths.
    """
    try:
        importlib.import_module("ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_watch")
        return
    except ImportError:
        pass
    parts = os.path.abspath(globals().get("__file__") or "").split(os.sep)
    roots = [os.sep.join(parts[:-8])] if tuple(parts[-8:-1]) == COLLECTION + HERE else []
    env = os.environ.get("ANSIBLE_COLLECTIONS_PATH") or os.environ.get("ANSIBLE_COLLECTIONS_PATHS") or ""
    for entry in env.split(os.pathsep) + ["~/.ansible/collections", "/usr/share/ansible/collections"]:
        entry = os.path.expanduser(entry.strip())
        roots.append(os.path.dirname(entry) if os.path.basename(entry) == COLLECTION[0] else entry)
    for root in roots:
        if root and os.path.isdir(os.path.join(root, *COLLECTION, "plugins", "module_utils")):
            if root not in sys.path:
                sys.path.append(root)
            importlib.invalidate_caches()
            return


_make_collection_importable()

# pylint: disable=wrong-import-position
from ansible_collections.warmstart.snapshot.plugins.module_utils.agent import _agent_events as ae  # noqa: E402
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_watch as kw  # noqa: E402
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _metrics  # noqa: E402
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import (  # noqa: E402
    AUTH_ENV, Cluster, connect)
# pylint: enable=wrong-import-position

AUTH_KEYS = tuple(AUTH_ENV)
OPTIONS = AUTH_KEYS + ("auth", "namespaces", "node_name", "resync_seconds", "resync_types", "retention_seconds",
                       "backoff_max_seconds",
                       "types", "request_timeout", "metrics_dir", "metrics_port", "metrics_host")
SYNC_WAIT_SECONDS = 15.0  # how long the first lists may take before the events of what holds go out anyway


@dataclass
class Settings:
    """The source's arguments, checked (``parse``)."""

    auth: Dict[str, Any]
    namespaces: List[Optional[str]]  # [None]: all namespaces
    node_name: Optional[str]
    resync_seconds: float
    resync_types: List[str]
    retention_seconds: float
    backoff_max_seconds: float
    types: List[str]
    request_timeout: float
    metrics_dir: Optional[str]
    metrics_port: Optional[int]
    metrics_host: str


def _names(value: Any, key: str, problems: List[str]) -> Optional[List[str]]:
    """A list of strings from a list or a comma-separated string; None when not given."""
    if value is None:
        return None
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return [v.strip() for v in value if v.strip()]
    problems.append(f"{key} must be a list of strings (or a comma-separated string), not {value!r}")
    return None


def _number(args: Dict[str, Any], key: str, default: Optional[float], problems: List[str],
            minimum: float = 0) -> Optional[float]:
    value = args.get(key)
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        problems.append(f"{key} must be a number, not {value!r}")
        return default
    if number < minimum or isinstance(value, bool):
        problems.append(f"{key} must be a number >= {minimum:g}, not {value!r}")
        return default
    return number


def _auth(args: Dict[str, Any], problems: List[str]) -> Dict[str, Any]:
    given = args.get("auth") or {}
    if not isinstance(given, dict):
        problems.append(f"auth must be a dict of {', '.join(AUTH_KEYS)}, not {type(given).__name__}")
        given = {}
    unknown = sorted(set(given) - set(AUTH_KEYS))
    if unknown:
        problems.append(f"auth has unknown key(s) {', '.join(unknown)}; known: {', '.join(AUTH_KEYS)}")
    auth = {k: v for k, v in given.items() if k in AUTH_KEYS and v not in (None, "")}
    auth.update({k: args[k] for k in AUTH_KEYS if args.get(k) not in (None, "")})
    return auth


def _types(args: Dict[str, Any], key: str, default: Tuple[str, ...], problems: List[str]) -> List[str]:
    chosen = _names(args.get(key), key, problems)
    chosen = list(default) if chosen is None else chosen
    unknown = sorted(set(chosen) - set(ae.TYPES))
    if unknown:
        problems.append(f"{key}: unknown event type(s) {', '.join(unknown)}; known: {', '.join(ae.TYPES)}")
    return [t for t in chosen if t in ae.TYPES]


def parse(args: Dict[str, Any]) -> Settings:
    """The checked settings; a ValueError naming every problem at once."""
    problems: List[str] = []
    unknown = sorted(k for k in args if k not in OPTIONS and not str(k).startswith("eda_"))
    if unknown:
        problems.append(f"unknown argument(s) {', '.join(unknown)}; known: {', '.join(sorted(OPTIONS))}")
    namespaces = _names(args.get("namespaces"), "namespaces", problems) or []
    node = args.get("node_name")
    node = os.environ.get("NODE_NAME", "") if node is None else node
    if not isinstance(node, str):
        problems.append(f"node_name must be a string, not {node!r}")
        node = ""
    port = _number(args, "metrics_port", None, problems)
    if port is not None and (port != int(port) or port > 65535):
        problems.append(f"metrics_port must be a port number, not {args.get('metrics_port')!r}")
    settings = Settings(
        auth=_auth(args, problems), namespaces=list(dict.fromkeys(namespaces)) or [None], node_name=node or None,
        resync_seconds=_number(args, "resync_seconds", 30, problems) or 0,
        resync_types=_types(args, "resync_types", ae.LEVEL_TYPES, problems),
        retention_seconds=_number(args, "retention_seconds", 300, problems) or 0,
        backoff_max_seconds=_number(args, "backoff_max_seconds", 30, problems, minimum=0.5) or 30,
        types=_types(args, "types", ae.TYPES, problems),
        request_timeout=_number(args, "request_timeout", 30, problems, minimum=1) or 30,
        metrics_dir=str(args["metrics_dir"]) if args.get("metrics_dir") else None,
        metrics_port=int(port) if port else None, metrics_host=str(args.get("metrics_host") or "0.0.0.0"))
    if settings.metrics_port and not settings.metrics_dir:
        problems.append("metrics_port needs metrics_dir (the directory whose *.prom files it serves)")
    if problems:
        raise ValueError("warmstart.snapshot.k8s_events: " + "; ".join(problems))
    return settings


def targets(settings: Settings) -> List[Tuple[kw.Target, str]]:
    """(what to watch, the kind its objects are to _agent_events) for the event types asked for."""
    wanted = set(settings.types)
    resources: List[Tuple[kw.Resource, str]] = []
    if wanted & {ae.RESTORE_POD, ae.SOURCE_READY, ae.POD_DELETED}:
        resources.append((kw.PODS, ae.KIND_POD))
    if wanted & {ae.RESTORE_POD, ae.CAPTURE_REQUEST, ae.SOURCE_READY, ae.RETENTION}:
        resources.append((kw.POD_SNAPSHOTS, ae.KIND_SNAPSHOT))
    if ae.MANUAL_TRIGGER in wanted:
        resources.append((kw.MANUAL_TRIGGERS, ae.KIND_TRIGGER))
    if wanted & {ae.SOURCE_READY, ae.RETENTION}:  # retention: whether a policy's retention is due
        resources.append((kw.POLICIES, ae.KIND_POLICY))
    out = []
    for resource, kind in resources:
        fields = f"spec.nodeName={settings.node_name}" if resource is kw.PODS and settings.node_name else ""
        out += [(kw.Target(resource, namespace, field_selector=fields), kind) for namespace in settings.namespaces]
    return out


class Agent:
    """The watch threads, the event state and the queue of one source."""

    def __init__(self, settings: Settings, queue: Any, loop: asyncio.AbstractEventLoop,
                 client_factory: Optional[Callable[[Any], kw.WatchClient]] = None) -> None:
        self.settings, self.queue, self.loop = settings, queue, loop
        self.stop_event = threading.Event()
        api = connect(settings.auth)
        self.cluster = Cluster(api, int(settings.request_timeout))
        self.state = ae.AgentEvents(settings.node_name, settings.types, self._lookup, settings.resync_types,
                                    on_problem=LOG.warning)
        make_client = client_factory or (lambda a: kw.KubeWatchClient(a, settings.request_timeout))
        self.watchers = [kw.Watcher(target, make_client(api), self._handler(kind), self.stop_event,
                                    kw.Backoff(cap=settings.backoff_max_seconds))
                         for target, kind in targets(settings)]
        self.threads: List[threading.Thread] = []
        self.metrics: Any = None
        self.ticker: Optional["asyncio.Task[None]"] = None

    def _lookup(self, namespace: str, name: str) -> Optional[Dict[str, Any]]:
        return self.cluster.find("Pod", name, namespace)

    def _handler(self, kind: str) -> kw.Handler:
        def handle(type_: str, obj: Dict[str, Any], origin: str) -> None:
            self._put_from_thread(self.state.observe(kind, type_, obj, origin))
        return handle

    def _put_from_thread(self, events: List[Dict[str, Any]]) -> None:
        """Put events on the queue from a watch thread (waits while the queue is full, until stopped)."""
        for event in events:
            try:
                future = asyncio.run_coroutine_threadsafe(self.queue.put(event), self.loop)
            except RuntimeError:  # the loop is closed: the source is going away
                return
            while not self.stop_event.is_set():
                try:
                    future.result(timeout=1.0)
                    break
                except TimeoutError:
                    continue
                except Exception:  # pylint: disable=broad-exception-caught  # a cancelled put: going away
                    return

    async def run(self) -> None:
        self.metrics = self._serve_metrics()  # first: a port already taken fails the source at once
        LOG.info("k8s_events: watching %s on %s", ", ".join(w.target.describe() for w in self.watchers),
                 self.cluster.host)
        for watcher in self.watchers:
            thread = threading.Thread(target=watcher.run, name=f"k8s-watch-{watcher.target.resource.plural}",
                                      daemon=True)
            thread.start()
            self.threads.append(thread)
        await self._wait_synced()
        for event in self.state.start():
            await self.queue.put(event)
        if ae.RETENTION in self.settings.types and self.settings.retention_seconds > 0:
            self.ticker = self.loop.create_task(self._retention())
        while True:
            if self.settings.resync_seconds <= 0:
                await asyncio.Event().wait()  # no resync: wait to be cancelled
            await asyncio.sleep(self.settings.resync_seconds)
            for event in await self.loop.run_in_executor(None, self.state.resync):
                await self.queue.put(event)

    async def _retention(self) -> None:
        """Now, then every retention_seconds until cancelled: a retention event when some policy's retention could
        remove a snapshot (``AgentEvents.retention_due``); otherwise no event, and no playbook run."""
        while True:
            if self.state.retention_due():
                await self.queue.put(ae.retention_event(self.settings.node_name, self.settings.namespaces))
            await asyncio.sleep(self.settings.retention_seconds)

    async def _wait_synced(self) -> None:
        deadline = self.loop.time() + SYNC_WAIT_SECONDS
        while not all(w.synced.is_set() for w in self.watchers) and self.loop.time() < deadline:
            await asyncio.sleep(0.05)
        late = [w.target.describe() for w in self.watchers if not w.synced.is_set()]
        if late:
            LOG.warning("k8s_events: not listed yet after %.0f s: %s; events for them come when they are",
                        SYNC_WAIT_SECONDS, ", ".join(late))

    def _serve_metrics(self) -> Any:
        """With metrics_port: the textfile collector directory's *.prom files at /metrics (``_metrics.serve``)."""
        if not self.settings.metrics_port:
            return None
        server = _metrics.serve(self.settings.metrics_dir or "", self.settings.metrics_host,
                                self.settings.metrics_port)
        LOG.info("k8s_events: serving %s at %s", self.settings.metrics_dir, getattr(server, "url", "?"))
        return server

    def stop(self, join_seconds: float = 5.0) -> None:
        """Stop every watch (closing open streams), the retention timer and the metrics server; wait a little for
        the threads."""
        if self.ticker is not None:
            self.loop.call_soon_threadsafe(self.ticker.cancel)
        for watcher in self.watchers:
            watcher.stop()
        for thread in self.threads:
            thread.join(join_seconds / max(1, len(self.threads)))
        if self.metrics is not None:
            self.metrics.close()


async def main(queue: Any, args: Dict[str, Any]) -> None:
    """Watch the API server and put the node agent's events on ``queue`` until cancelled."""
    settings = parse(args)
    loop = asyncio.get_running_loop()
    agent = Agent(settings, queue, loop)
    try:
        await agent.run()
    finally:
        await loop.run_in_executor(None, agent.stop)


if __name__ == "__main__":
    # python k8s_events.py: print the events of the cluster of ~/.kube/config (or K8S_AUTH_*), for a look.

    class MockQueue:
        """Prints what the source puts."""

        async def put(self, event: Dict[str, Any]) -> None:
            print(event["warmstart"]["type"], event["warmstart"]["namespace"], event["warmstart"]["name"],
                  event["warmstart"]["node"], event["warmstart"]["reason"], flush=True)

    logging.basicConfig(level=logging.INFO)
    asyncio.run(main(MockQueue(), {}))
