# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""List + watch of one Kubernetes resource that keeps going: the node agent's event source runs one per resource.

``Watcher(target, client, handler, stop).run()`` lists the target, hands every object to ``handler`` as ADDED,
then watches from the list's resourceVersion and hands on each change, until ``stop`` is set:

- **Resume.** The resourceVersion of the last event or BOOKMARK is kept; a watch that ends (the server's
  ``timeoutSeconds``) or whose connection drops is opened again from it, so nothing is lost and nothing is seen
  twice (an object is also handed on only when its resourceVersion changed).
- **410 Gone** (at the start of a watch or as an ERROR event in the middle of one: the resourceVersion is older
  than the server's history) lists again and hands on what changed meanwhile, found by comparing with the objects
  it knows: ADDED, MODIFIED (another resourceVersion), DELETED (gone from the list; the last known object).
  These carry the origin ``relist``; those of the first list ``list``, the rest ``watch``.
- **Errors** (API server unreachable, 5xx, 401/403, a CRD that is not installed) log one line naming the resource,
  the API server and the status, then wait a capped exponential backoff with jitter (``Backoff``: 0.5 s doubling
  to ``cap``, each wait drawn from [half, all] of it) before trying again; a watch that the server ends at once
  with nothing in it counts as a failure too, so no path loops tightly. Progress - a list, or a watch that
  delivers an event or a bookmark - resets it, with one line saying that it works again.
- A handler that raises is logged (one line naming the object) and the next event goes on: the watcher never
  dies of it, and ``run`` only returns when ``stop`` is set (``Watcher.stop`` also closes an open watch).

The API is reached through a ``WatchClient`` (the seam: tests pass their own). ``KubeWatchClient`` is the real one:
the ``kubernetes`` library's ``ApiClient`` (auth, TLS, proxy: ``_k8s_client.connect``) and its ``watch.Watch``,
reading plain JSON dicts in the API's own shape (no model classes). Nothing here imports Ansible.
"""
from __future__ import annotations

import json
import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Protocol, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

JSON = Dict[str, Any]
Key = Tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects
Handler = Callable[[str, JSON, str], None]  # (ADDED | MODIFIED | DELETED, object, origin)

ADDED, MODIFIED, DELETED, BOOKMARK, ERROR = "ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"
ORIGIN_LIST, ORIGIN_WATCH, ORIGIN_RELIST = "list", "watch", "relist"
DEFAULT_TIMEOUT_SECONDS = 300  # asked of the server per watch; it ends the stream cleanly, and we resume
LOG = logging.getLogger("warmstart.k8s_watch")


@dataclass(frozen=True)
class Resource:
    """One resource type: ``group`` "" is the core API."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    def path(self, namespace: Optional[str] = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        return base + (f"/namespaces/{namespace}" if namespace and self.namespaced else "") + f"/{self.plural}"

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


PODS = Resource("", "v1", "pods", "Pod")
POD_SNAPSHOTS = Resource(podapi.GROUP, podapi.VERSION, "podsnapshots", podapi.KIND_SNAPSHOT)
MANUAL_TRIGGERS = Resource(podapi.GROUP, podapi.VERSION, "podsnapshotmanualtriggers", podapi.KIND_TRIGGER)
POLICIES = Resource(podapi.GROUP, podapi.VERSION, "podsnapshotpolicies", podapi.KIND_POLICY)


@dataclass(frozen=True)
class Target:
    """What one watcher watches: a resource, in one namespace or all, with optional selectors."""

    resource: Resource
    namespace: Optional[str] = None
    label_selector: str = ""
    field_selector: str = ""

    def describe(self) -> str:
        """``pods (all namespaces, spec.nodeName=node-1)``: how log lines name it."""
        where = [f"namespace {self.namespace}" if self.namespace else "all namespaces"]
        where += [s for s in (self.label_selector, self.field_selector) if s]
        return f"{self.resource.qualified} ({', '.join(where)})"


class WatchError(WarmstartError):
    """A list or watch that failed: ``status`` is the HTTP status (None when there was no answer)."""

    def __init__(self, message: str, status: Optional[int] = None, reason: str = "", dropped: bool = False) -> None:
        super().__init__(message)
        self.status, self.reason, self.dropped = status, reason, dropped

    @property
    def gone(self) -> bool:
        return self.status == 410


@dataclass
class ListResult:
    items: List[JSON]
    resource_version: str


class WatchClient(Protocol):
    """The API as a watcher needs it; ``host`` names the API server in log lines."""

    host: str

    def list(self, target: Target) -> ListResult:
        """Every object of the target and the list's resourceVersion; raises WatchError."""

    def watch(self, target: Target, resource_version: str, timeout_seconds: int) -> Iterator[JSON]:
        """Open a watch (raises WatchError when it cannot be opened), then yield raw events ``{"type", "object"}``
        until the server ends it; raises WatchError (``gone`` for an ERROR 410, ``dropped`` for a cut)."""

    def stop(self) -> None:
        """Close the open watch, if any (called from another thread)."""


@dataclass
class Backoff:
    """Capped exponential backoff with "equal jitter": failure n waits in [d/2, d], d = min(cap, base * 2^(n-1))."""

    base: float = 0.5
    cap: float = 30.0
    rand: Callable[[], float] = random.random

    def delay(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        full = min(self.cap, self.base * float(1 << min(failures - 1, 30)))
        return full / 2 + full / 2 * float(self.rand())


def object_key(obj: JSON) -> Key:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def resource_version_of(obj: JSON) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def diff(known: Dict[Key, JSON], listed: List[JSON]) -> List[Tuple[str, JSON]]:
    """What a fresh list says changed against the known objects: DELETED first, then ADDED / MODIFIED (by key)."""
    fresh = {object_key(obj): obj for obj in listed}
    out: List[Tuple[str, JSON]] = [(DELETED, known[key]) for key in sorted(known) if key not in fresh]
    for key in sorted(fresh):
        before = known.get(key)
        if before is None:
            out.append((ADDED, fresh[key]))
        elif resource_version_of(before) != resource_version_of(fresh[key]):
            out.append((MODIFIED, fresh[key]))
    return out


@dataclass
class Watcher:
    """The list + watch loop of one target (see the module docstring)."""

    target: Target
    client: WatchClient
    handler: Handler
    stop_event: threading.Event = field(default_factory=threading.Event)
    backoff: Backoff = field(default_factory=Backoff)
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS
    min_watch_seconds: float = 1.0
    log: logging.Logger = LOG
    clock: Callable[[], float] = time.monotonic
    known: Dict[Key, JSON] = field(default_factory=dict)
    resource_version: str = ""
    failures: int = 0
    listed: bool = False
    synced: threading.Event = field(default_factory=threading.Event)  # set once the first list was handed on

    @property
    def name(self) -> str:
        return f"{self.target.describe()} on {self.client.host}"

    def stop(self) -> None:
        self.stop_event.set()
        self.client.stop()

    def run(self) -> None:
        """List, watch, resume, re-list, back off: until the stop event is set."""
        need_list = True
        while not self.stop_event.is_set():
            try:
                if need_list:
                    self._list()
                    need_list = False
                self._watch()
            except WatchError as exc:
                if self.stop_event.is_set():
                    break
                need_list = need_list or exc.gone
                self._failed(exc)
            except Exception as exc:  # pylint: disable=broad-exception-caught  # a bug here must not end the agent
                if self.stop_event.is_set():
                    break
                self._failed(WatchError(f"unexpected {type(exc).__name__}: {exc}"))

    # -- one list, one watch -------------------------------------------------------

    def _list(self) -> None:
        result = self.client.list(self.target)
        origin = ORIGIN_RELIST if self.listed else ORIGIN_LIST
        changes = diff(self.known, result.items)
        self.known = {object_key(obj): obj for obj in result.items}
        self.resource_version = result.resource_version
        self.listed = True
        self._progress(f"listed {len(result.items)} object(s) at resourceVersion {result.resource_version}")
        for type_, obj in changes:
            self._hand_on(type_, obj, origin)
        self.synced.set()

    def _watch(self) -> None:
        started, seen = self.clock(), 0
        stream = self.client.watch(self.target, self.resource_version, self.timeout_seconds)
        self.log.debug("k8s watch %s: watching from resourceVersion %s", self.name, self.resource_version)
        try:
            for event in stream:
                if self.stop_event.is_set():
                    return
                if not seen:
                    self._progress(f"watching from resourceVersion {self.resource_version}", quiet=True)
                seen += 1
                self._apply(str(event.get("type") or ""), event.get("object") or {})
        finally:
            close = getattr(stream, "close", None)
            if callable(close):
                close()
        if not seen and self.clock() - started < self.min_watch_seconds and not self.stop_event.is_set():
            raise WatchError("the API server ended the watch at once, with no event")

    def _hand_on(self, type_: str, obj: JSON, origin: str) -> None:
        try:
            self.handler(type_, obj, origin)
        except Exception as exc:  # pylint: disable=broad-exception-caught  # one bad object must not stop the rest
            namespace, name = object_key(obj)
            self.log.error("k8s watch %s: handling %s %s %s failed: %s: %s", self.name, type_,
                           self.target.resource.kind, f"{namespace}/{name}" if namespace else name,
                           type(exc).__name__, exc)

    def _apply(self, type_: str, obj: JSON) -> None:
        """One watch event: update what is known and the resourceVersion, hand on real changes."""
        if type_ == ERROR:
            code = obj.get("code")
            raise WatchError(f"{obj.get('reason') or 'error'}: {obj.get('message') or ''}",
                             code if isinstance(code, int) else None, str(obj.get("reason") or ""))
        rv = resource_version_of(obj)
        if type_ == BOOKMARK:
            self.resource_version = rv or self.resource_version
            return
        key = object_key(obj)
        before = self.known.get(key)
        if type_ == DELETED:
            self.known.pop(key, None)
            self.resource_version = rv or self.resource_version
            self._hand_on(DELETED, obj, ORIGIN_WATCH)
            return
        if type_ not in (ADDED, MODIFIED):
            return
        self.resource_version = rv or self.resource_version
        if before is not None and resource_version_of(before) == rv:
            return  # seen already
        self.known[key] = obj
        self._hand_on(ADDED if before is None else MODIFIED, obj, ORIGIN_WATCH)

    # -- progress and failure ------------------------------------------------------

    def _progress(self, what: str, quiet: bool = False) -> None:
        """It works: one line when it had failed (and the backoff starts again), else a debug line."""
        if self.failures:
            self.log.warning("k8s watch %s: %s again, after %d failure(s)", self.name, what, self.failures)
            self.failures = 0
        elif not quiet:
            self.log.debug("k8s watch %s: %s", self.name, what)

    def _failed(self, exc: WatchError) -> None:
        self.failures += 1
        wait = self.backoff.delay(self.failures)
        if exc.gone:
            then = "listing again"
        elif exc.dropped:
            then = f"resuming from resourceVersion {self.resource_version}"
        else:
            then = "trying again"
        level = logging.INFO if (exc.gone or exc.dropped) and self.failures == 1 else logging.WARNING
        self.log.log(level, "k8s watch %s: %s; %s in %.1f s", self.name, exc.message, then, wait)
        self.stop_event.wait(wait)


# --- the real client -------------------------------------------------------------------

def _status_text(exc: Any) -> Tuple[str, str]:
    """(message, reason) of an ApiException: its Status body, else what the client says."""
    body = getattr(exc, "body", None)
    try:
        doc = json.loads(body) if body else None
    except (TypeError, ValueError):
        doc = None
    if isinstance(doc, dict):
        return str(doc.get("message") or ""), str(doc.get("reason") or "")
    return "", str(getattr(exc, "reason", "") or "")


def translate(exc: BaseException, host: str) -> WatchError:
    """A kubernetes / urllib3 / socket error as the WatchError a watcher understands (no credentials in it)."""
    status = getattr(exc, "status", None)
    if type(exc).__name__ == "ApiException" and isinstance(status, int) and status:
        message, reason = _status_text(exc)
        reason = reason or str(getattr(exc, "reason", "") or "")
        text = f"{status} {reason}".strip() + (f": {message}" if message and message != reason else "")
        return WatchError(text, status, reason.split(":", 1)[0])
    name = type(exc).__name__
    if name in ("ProtocolError", "IncompleteRead", "InvalidChunkLength", "ConnectionResetError"):
        return WatchError(f"the watch connection dropped ({name})", dropped=True)
    cause = getattr(exc, "reason", None) or exc
    if name == "ReadTimeoutError":
        return WatchError(f"API server {host} sent nothing in time ({cause})", dropped=True)
    return WatchError(f"API server {host} unreachable: {cause}")


class KubeWatchClient:
    """The real ``WatchClient``: an ``ApiClient`` of the ``kubernetes`` library and its ``watch.Watch``."""

    def __init__(self, api_client: Any, request_timeout: float = 30.0) -> None:
        self.api = api_client
        self.host = str(api_client.configuration.host)
        self.request_timeout = request_timeout
        self._watch: Any = None
        self._lock = threading.Lock()

    def _query(self, target: Target, **extra: Any) -> List[Tuple[str, Any]]:
        pairs = [("labelSelector", target.label_selector), ("fieldSelector", target.field_selector)]
        pairs += list(extra.items())
        return [(k, v) for k, v in pairs if v not in (None, "")]

    def _get(self, target: Target, query: List[Tuple[str, Any]], timeout: Any) -> Any:
        """GET the target's collection; the urllib3 response, unread (raises the client's own errors)."""
        from kubernetes.client.exceptions import ApiException  # pylint: disable=import-outside-toplevel

        req = self.api.param_serialize("GET", target.resource.path(target.namespace), query_params=query,
                                       header_params={"Accept": "application/json"}, auth_settings=["BearerToken"])
        resp = self.api.call_api(*req, _request_timeout=timeout)
        if not 200 <= resp.status <= 299:
            resp.read()
            raise ApiException(http_resp=resp)
        return resp

    def list(self, target: Target) -> ListResult:
        try:
            resp = self._get(target, self._query(target), self.request_timeout)
            doc = json.loads(resp.read() or b"{}")
        except Exception as exc:  # pylint: disable=broad-exception-caught  # every client error becomes a WatchError
            raise translate(exc, self.host) from None
        items = [i for i in doc.get("items") or [] if isinstance(i, dict)]
        return ListResult(items, str((doc.get("metadata") or {}).get("resourceVersion") or ""))

    def watch(self, target: Target, resource_version: str, timeout_seconds: int) -> Iterator[JSON]:
        from kubernetes.watch import watch as k8s_watch  # pylint: disable=import-outside-toplevel

        query = self._query(target, watch="true", allowWatchBookmarks="true", timeoutSeconds=timeout_seconds,
                            resourceVersion=resource_version or None)
        try:  # opened here, so that a refusal (403, 410, unreachable) shows before the first event
            opened = [self._get(target, query, (self.request_timeout, timeout_seconds + 30)).response]
        except Exception as exc:  # pylint: disable=broad-exception-caught
            raise translate(exc, self.host) from None

        def watch_response(**_kwargs: Any) -> Any:
            """The already opened response (no ':rtype:': the events stay plain dicts)."""
            return opened.pop()

        watch_class: Any = getattr(k8s_watch, "Watch")
        with self._lock:
            self._watch = watch_class()
        return self._events(self._watch, watch_response, timeout_seconds)

    def _events(self, w: Any, func: Callable[..., Any], timeout_seconds: int) -> Iterator[JSON]:
        try:
            for event in w.stream(func, timeout_seconds=timeout_seconds):
                yield {"type": event.get("type"), "object": event.get("raw_object", event.get("object"))}
        except Exception as exc:  # pylint: disable=broad-exception-caught
            raise translate(exc, self.host) from None
        finally:
            with self._lock:
                self._watch = None

    def stop(self) -> None:
        with self._lock:
            if self._watch is not None:
                self._watch.stop()
