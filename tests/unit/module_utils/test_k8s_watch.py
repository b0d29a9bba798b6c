"""The list + watch loop (_k8s_watch): resume, re-list on 410, backoff, stop - with a scripted client, and the real
client (KubeWatchClient) against the fake API server."""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_watch as kw
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import connect

from tests.support import fake_apiserver as fake_server_module
from tests.support.fake_apiserver import FakeApiServer

fake_apiserver = fake_server_module.fake_apiserver  # the pytest fixture

HOST = "https://api.test:6443"
TARGET = kw.Target(kw.PODS, field_selector="spec.nodeName=node-1")


def pod(name: str, rv: Union[int, str], namespace: str = "default") -> Dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": str(rv)}}


def ev(type_: str, obj: Dict[str, Any]) -> Dict[str, Any]:
    return {"type": type_, "object": obj}


def bookmark(rv: int) -> Dict[str, Any]:
    return ev("BOOKMARK", {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": str(rv)}})


class Stop(threading.Event):
    """The stop event, recording each backoff wait instead of sleeping."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: List[Optional[float]] = []

    def wait(self, timeout: Optional[float] = None) -> bool:
        self.waits.append(timeout)
        return self.is_set()


Step = Union[kw.ListResult, kw.WatchError, List[Any]]


class Scripted:
    """A WatchClient that plays a script: list steps (ListResult or WatchError) and watch steps (a WatchError raised
    at opening, or a list of events whose last item may be a WatchError raised mid-stream). When the script is
    played out it sets the stop event."""

    host = HOST

    def __init__(self, stop: threading.Event, lists: List[Step], watches: List[Step]) -> None:
        self.stop_event, self.lists, self.watches = stop, list(lists), list(watches)
        self.calls: List[Tuple[str, ...]] = []
        self.stopped = False

    def list(self, target: kw.Target) -> kw.ListResult:
        self.calls.append(("list",))
        step = self.lists.pop(0) if self.lists else kw.WatchError("script: no more lists")
        if not self.lists and not self.watches:
            self.stop_event.set()
        if isinstance(step, kw.WatchError):
            raise step
        assert isinstance(step, kw.ListResult)
        return step

    def watch(self, target: kw.Target, resource_version: str, timeout_seconds: int) -> Iterator[Dict[str, Any]]:
        self.calls.append(("watch", resource_version))
        if not self.watches:
            self.stop_event.set()
            return iter(())
        step = self.watches.pop(0)
        if isinstance(step, kw.WatchError):
            raise step
        assert isinstance(step, list)
        return self._play(step)

    def _play(self, events: List[Any]) -> Iterator[Dict[str, Any]]:
        for item in events:
            if isinstance(item, kw.WatchError):
                raise item
            yield item

    def stop(self) -> None:
        self.stopped = True


Seen = List[Tuple[str, str, str]]


def run(lists: List[Step], watches: List[Step], **kwargs: Any) -> Tuple[Seen, Scripted, Stop, kw.Watcher]:
    """Run a watcher over a script; the (type, name@rv, origin) handed on, the client, the stop event, the watcher."""
    stop = Stop()
    client = Scripted(stop, lists, watches)
    seen: List[Tuple[str, str, str]] = []

    def handler(type_: str, obj: Dict[str, Any], origin: str) -> None:
        seen.append((type_, f"{obj['metadata']['name']}@{obj['metadata']['resourceVersion']}", origin))

    kwargs.setdefault("min_watch_seconds", 0.0)
    watcher = kw.Watcher(TARGET, client, kwargs.pop("handler", handler), stop,
                         kwargs.pop("backoff", kw.Backoff(rand=lambda: 1.0)), **kwargs)
    watcher.run()
    return seen, client, stop, watcher


# --- the loop -----------------------------------------------------------------------------

def test_lists_then_watches_from_the_lists_resource_version() -> None:
    seen, client, stop, watcher = run([kw.ListResult([pod("a", 3), pod("b", 4)], "10")],
                                      [[ev("ADDED", pod("c", 11)), ev("MODIFIED", pod("a", 12)),
                                        ev("DELETED", pod("b", 13))]])
    assert seen == [("ADDED", "a@3", "list"), ("ADDED", "b@4", "list"), ("ADDED", "c@11", "watch"),
                    ("MODIFIED", "a@12", "watch"), ("DELETED", "b@13", "watch")]
    assert client.calls[:2] == [("list",), ("watch", "10")]
    assert sorted(watcher.known) == [("default", "a"), ("default", "c")] and watcher.resource_version == "13"
    assert stop.waits == []  # no failure, no wait
    assert watcher.synced.is_set()


def test_synced_only_after_a_first_list() -> None:
    forbidden = kw.WatchError("403 Forbidden", 403)
    _seen, _client, _stop, watcher = run([forbidden], [])
    assert not watcher.synced.is_set()


def test_a_dropped_connection_resumes_from_the_last_event_or_bookmark_without_listing() -> None:
    dropped = kw.WatchError("the watch connection dropped (ProtocolError)", dropped=True)
    seen, client, stop, _w = run([kw.ListResult([], "10")],
                                 [[ev("ADDED", pod("a", 11)), bookmark(15), dropped],
                                  [ev("MODIFIED", pod("a", 16))]])
    assert client.calls[:3] == [("list",), ("watch", "10"), ("watch", "15")]
    assert seen == [("ADDED", "a@11", "watch"), ("MODIFIED", "a@16", "watch")]
    assert len(stop.waits) == 1 and stop.waits[0] == 0.5  # one short wait, the first of the backoff


def test_gone_in_the_middle_of_a_stream_lists_again_and_hands_on_only_what_changed() -> None:
    gone = kw.WatchError("410 Expired: too old resource version: 11 (20)", 410, "Expired")
    seen, client, _stop, watcher = run(
        [kw.ListResult([pod("keep", 3), pod("edit", 4), pod("drop", 5)], "10"),
         kw.ListResult([pod("keep", 3), pod("edit", 18), pod("new", 19)], "20")],
        [[ev("ADDED", pod("x", 11)), gone], [ev("MODIFIED", pod("new", 21))]])
    assert client.calls[:4] == [("list",), ("watch", "10"), ("list",), ("watch", "20")]
    assert seen[3:] == [("ADDED", "x@11", "watch"),
                        ("DELETED", "drop@5", "relist"), ("DELETED", "x@11", "relist"),
                        ("MODIFIED", "edit@18", "relist"), ("ADDED", "new@19", "relist"),
                        ("MODIFIED", "new@21", "watch")]
    assert sorted(watcher.known) == [("default", "edit"), ("default", "keep"), ("default", "new")]


def test_gone_when_opening_and_an_error_event_from_the_client_also_list_again() -> None:
    error_410 = ev("ERROR", {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"})
    _seen, client, _stop, _w = run([kw.ListResult([], "10"), kw.ListResult([], "30"), kw.ListResult([], "40")],
                                   [kw.WatchError("410 Expired", 410), [error_410], []])
    assert [c[0] for c in client.calls][:6] == ["list", "watch", "list", "watch", "list", "watch"]


def test_errors_log_one_line_and_back_off_exponentially_to_the_cap_then_recover(
        caplog: pytest.LogCaptureFixture) -> None:
    forbidden = kw.WatchError('403 Forbidden: pods is forbidden: User "agent" cannot list resource "pods"', 403,
                              "Forbidden")
    caplog.set_level(logging.DEBUG, logger="warmstart.k8s_watch")
    seen, _client, stop, _w = run([forbidden] * 7 + [kw.ListResult([pod("a", 1)], "5")], [[]],
                                  backoff=kw.Backoff(base=0.5, cap=4.0, rand=lambda: 1.0))
    assert stop.waits == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings[0] == (f"k8s watch pods (all namespaces, spec.nodeName=node-1) on {HOST}: 403 Forbidden: pods "
                           'is forbidden: User "agent" cannot list resource "pods"; trying again in 0.5 s')
    assert len(warnings) == 8 and "\n" not in "".join(warnings)
    assert warnings[-1].endswith("listed 1 object(s) at resourceVersion 5 again, after 7 failure(s)")
    assert seen == [("ADDED", "a@1", "list")]


def test_unreachable_then_back_resumes_the_watch(caplog: pytest.LogCaptureFixture) -> None:
    down = kw.WatchError(f"API server {HOST} unreachable: connection refused")
    _seen, client, stop, _w = run([kw.ListResult([], "10")], [down, down, [ev("ADDED", pod("a", 11))]],
                                  backoff=kw.Backoff(rand=lambda: 0.0))
    assert client.calls[:4] == [("list",), ("watch", "10"), ("watch", "10"), ("watch", "10")]
    assert stop.waits[:2] == [0.25, 0.5]  # the lower end of the jitter: half of 0.5, half of 1
    assert any("unreachable: connection refused; trying again in 0.2 s" in r.getMessage() for r in caplog.records)


def test_a_watch_that_ends_at_once_with_nothing_backs_off_so_the_loop_is_never_tight() -> None:
    _seen, client, stop, _w = run([kw.ListResult([], "10")], [[], [], []], min_watch_seconds=5.0)
    assert [c[0] for c in client.calls][:4] == ["list", "watch", "watch", "watch"]
    assert stop.waits[:3] == [0.5, 1.0, 2.0]


def test_duplicates_are_dropped_and_types_follow_what_is_known() -> None:
    seen, _client, _stop, _w = run([kw.ListResult([pod("a", 3)], "10")],
                                   [[ev("MODIFIED", pod("a", 3)), ev("ADDED", pod("a", 12)),
                                     ev("MODIFIED", pod("b", 13)), ev("WEIRD", pod("c", 14))]])
    assert seen == [("ADDED", "a@3", "list"), ("MODIFIED", "a@12", "watch"), ("ADDED", "b@13", "watch")]


def test_a_handler_that_raises_is_logged_and_the_next_event_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    handled: List[str] = []

    def handler(type_: str, obj: Dict[str, Any], origin: str) -> None:
        if obj["metadata"]["name"] == "bad":
            raise ValueError("boom")
        handled.append(obj["metadata"]["name"])

    run([kw.ListResult([pod("bad", 1), pod("good", 2)], "10")], [[ev("ADDED", pod("next", 11))]], handler=handler)
    assert handled == ["good", "next"]
    assert any("handling ADDED Pod default/bad failed: ValueError: boom" in r.getMessage() for r in caplog.records)


def test_stop_sets_the_event_and_closes_the_open_watch() -> None:
    stop = Stop()
    client = Scripted(stop, [], [])
    watcher = kw.Watcher(TARGET, client, lambda *a: None, stop)
    watcher.stop()
    assert stop.is_set() and client.stopped
    watcher.run()  # returns at once
    assert client.calls == []


def test_backoff_is_capped_and_jittered_within_half_to_all() -> None:
    low, high = kw.Backoff(base=1, cap=8, rand=lambda: 0.0), kw.Backoff(base=1, cap=8, rand=lambda: 0.999999)
    assert [low.delay(n) for n in range(0, 7)] == [0.0, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert [round(high.delay(n), 3) for n in range(1, 6)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert kw.Backoff().delay(10_000) <= 30.0


def test_diff_synthesises_deleted_then_added_and_modified() -> None:
    known = {("ns", "a"): pod("a", 1, "ns"), ("ns", "b"): pod("b", 2, "ns")}
    assert [(t, o["metadata"]["name"]) for t, o in kw.diff(known, [pod("b", 3, "ns"), pod("c", 4, "ns")])] == [
        ("DELETED", "a"), ("MODIFIED", "b"), ("ADDED", "c")]
    assert kw.diff(known, list(known.values())) == []


def test_paths_and_descriptions() -> None:
    assert kw.PODS.path() == "/api/v1/pods" and kw.PODS.path("ml") == "/api/v1/namespaces/ml/pods"
    triggers = "/apis/snapshot.warmstart.io/v1alpha1/namespaces/ml/podsnapshotmanualtriggers"
    assert kw.MANUAL_TRIGGERS.path("ml") == triggers
    described = kw.Target(kw.POLICIES, "ml", "app=x").describe()
    assert described == "podsnapshotpolicies.snapshot.warmstart.io (namespace ml, app=x)"


class ApiException(Exception):
    """Stands for kubernetes' ApiException (translate goes by the class name, never importing the library)."""

    def __init__(self, status: int, reason: str, body: Optional[str] = None) -> None:
        super().__init__(reason)
        self.status, self.reason, self.body = status, reason, body


class ProtocolError(Exception):
    pass


class MaxRetryError(Exception):
    def __init__(self, reason: Exception) -> None:
        super().__init__(str(reason))
        self.reason = reason


def test_translate_names_the_status_and_the_cause() -> None:
    forbidden = kw.translate(ApiException(403, "Forbidden", '{"kind": "Status", "reason": "Forbidden", '
                                                            '"message": "pods is forbidden"}'), HOST)
    assert (forbidden.status, forbidden.message) == (403, "403 Forbidden: pods is forbidden")
    expired = kw.translate(ApiException(410, "Expired: too old resource version: 3 (9)"), HOST)
    assert expired.gone and expired.message == "410 Expired: too old resource version: 3 (9)"
    assert expired.reason == "Expired"
    cut = kw.translate(ProtocolError("Response ended prematurely"), HOST)
    assert cut.dropped and cut.status is None
    down = kw.translate(MaxRetryError(ConnectionRefusedError("Connection refused")), HOST)
    assert down.message == f"API server {HOST} unreachable: Connection refused" and not down.dropped


# --- the real client against the fake API server ------------------------------------------

@pytest.fixture
def real(fake_apiserver: FakeApiServer) -> kw.KubeWatchClient:
    return kw.KubeWatchClient(connect({"kubeconfig": str(fake_apiserver.kubeconfig)}), request_timeout=5)


def _take(events: Iterator[Dict[str, Any]], count: int) -> List[Tuple[str, str]]:
    out = []
    for event in events:
        out.append((event["type"], (event["object"].get("metadata") or {}).get("name")))
        if len(out) >= count:
            break
    return out


def test_real_client_lists_and_watches_plain_dicts(fake_apiserver: FakeApiServer, real: kw.KubeWatchClient) -> None:
    fake_apiserver.add_pod("a", node="node-1")
    fake_apiserver.add_pod("b", node="node-2")
    listed = real.list(TARGET)
    assert [p["metadata"]["name"] for p in listed.items] == ["a"] and listed.resource_version
    events = real.watch(TARGET, listed.resource_version, 5)
    fake_apiserver.add_pod("c", node="node-1")
    fake_apiserver.add_pod("d", node="node-2")
    first = next(events)
    assert first["type"] == "ADDED" and first["object"]["metadata"]["name"] == "c"
    assert isinstance(first["object"], dict) and first["object"]["spec"]["nodeName"] == "node-1"
    query = fake_apiserver.open_watches()[0]["query"]
    assert query["allowWatchBookmarks"] == "true" and query["timeoutSeconds"] == "5"
    assert query["fieldSelector"] == "spec.nodeName=node-1"


def test_real_client_refusals_show_when_opening(fake_apiserver: FakeApiServer, real: kw.KubeWatchClient) -> None:
    fake_apiserver.answer_errors(403)
    with pytest.raises(kw.WatchError) as forbidden:
        real.watch(TARGET, "1", 5)
    assert forbidden.value.status == 403 and "cannot watch resource" in forbidden.value.message
    with pytest.raises(kw.WatchError) as listing:
        real.list(kw.Target(kw.PODS))
    assert listing.value.message.startswith("403 Forbidden: pods is forbidden")
    fake_apiserver.heal()
    fake_apiserver.add_pod("a")
    fake_apiserver.compact()
    with pytest.raises(kw.WatchError) as gone:
        real.watch(TARGET, "1", 5)
    assert gone.value.gone and "too old resource version" in gone.value.message
    with pytest.raises(kw.WatchError) as missing:
        real.list(kw.Target(kw.MANUAL_TRIGGERS))
    assert missing.value.status == 404


def test_real_client_mid_stream_faults(fake_apiserver: FakeApiServer, real: kw.KubeWatchClient) -> None:
    rv = real.list(TARGET).resource_version
    events = real.watch(TARGET, rv, 5)
    fake_apiserver.add_pod("a", node="node-1")
    assert _take(events, 1) == [("ADDED", "a")]
    fake_apiserver.drop_watches()
    with pytest.raises(kw.WatchError) as cut:
        _take(events, 1)
    assert cut.value.dropped
    events = real.watch(TARGET, str(fake_apiserver.store.rv), 5)
    fake_apiserver.compact()
    with pytest.raises(kw.WatchError) as gone:
        _take(events, 1)
    assert gone.value.gone


def test_real_client_unreachable(fake_apiserver: FakeApiServer, real: kw.KubeWatchClient) -> None:
    fake_apiserver.go_offline()
    with pytest.raises(kw.WatchError) as down:
        real.list(TARGET)
    assert down.value.status is None and f"API server {fake_apiserver.url} unreachable" in down.value.message


def test_real_client_stop_ends_an_open_watch_at_once(fake_apiserver: FakeApiServer, real: kw.KubeWatchClient) -> None:
    events = real.watch(TARGET, real.list(TARGET).resource_version, 60)
    started = time.monotonic()
    threading.Timer(0.2, real.stop).start()
    try:
        _take(events, 1)
    except kw.WatchError:
        pass  # a cut is how some urllib3 versions see it
    assert time.monotonic() - started < 5


def test_a_watcher_on_the_real_client_resumes_and_relists(fake_apiserver: FakeApiServer,
                                                          real: kw.KubeWatchClient, tmp_path: Path) -> None:
    seen: List[Tuple[str, str, str]] = []
    lock = threading.Lock()

    def handler(type_: str, obj: Dict[str, Any], origin: str) -> None:
        with lock:
            seen.append((type_, obj["metadata"]["name"], origin))

    fake_apiserver.add_pod("before", node="node-1")
    watcher = kw.Watcher(TARGET, real, handler, backoff=kw.Backoff(base=0.05, cap=0.2))
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    try:
        fake_apiserver.wait_watches(1)
        fake_apiserver.add_pod("one", node="node-1")
        _until(lambda: ("ADDED", "one", "watch") in seen)
        fake_apiserver.drop_watches()
        fake_apiserver.add_pod("two", node="node-1")  # while no watch is open
        _until(lambda: ("ADDED", "two", "watch") in seen)
        fake_apiserver.compact()  # an ERROR 410 now, in the middle of the stream
        fake_apiserver.store.remove("pods", "one", "default")
        fake_apiserver.add_pod("three", node="node-1")
        _until(lambda: ("ADDED", "three", "relist") in seen and ("DELETED", "one", "relist") in seen)
    finally:
        watcher.stop()
        thread.join(10)
    assert not thread.is_alive()
    assert [s for s in seen if s[1] == "two"] == [("ADDED", "two", "watch")]  # neither lost nor doubled
    assert seen[0] == ("ADDED", "before", "list")


def _until(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
