"""_k8s_client.Cluster's transport against the fake API server: what is sent again, and what never is."""
from __future__ import annotations

from typing import List

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_client as k8s
from tests.support import fake_apiserver as fake_server_module
from tests.support.fake_apiserver import FakeApiServer

fake_apiserver = fake_server_module.fake_apiserver  # the pytest fixture


class Waits(List[float]):
    """The backoffs the client slept, recorded and not slept; ``heal_after`` sleeps the server heals."""

    def __init__(self, server: FakeApiServer) -> None:
        super().__init__()
        self.server = server
        self.heal_after = 0

    def sleep(self, seconds: float) -> None:
        self.append(seconds)
        if self.heal_after and len(self) >= self.heal_after:
            self.server.heal()
            self.server.go_online()


@pytest.fixture
def waits(fake_apiserver: FakeApiServer, monkeypatch: pytest.MonkeyPatch) -> Waits:
    slept = Waits(fake_apiserver)
    monkeypatch.setattr(k8s, "pause", slept.sleep)
    return slept


def _cluster(server: FakeApiServer) -> k8s.Cluster:
    return k8s.cluster_from({"kubeconfig": str(server.kubeconfig)})


def _sent(server: FakeApiServer, method: str, name: str) -> int:
    return len([r for r in server.requests if r["method"] == method and r["path"].endswith("/pods/" + name)])


@pytest.mark.parametrize("code", [429, 503])
def test_a_request_the_server_did_not_take_is_sent_again_after_a_backoff(
        fake_apiserver: FakeApiServer, waits: Waits, code: int) -> None:
    fake_apiserver.add_pod("p-0")
    cluster = _cluster(fake_apiserver)
    waits.heal_after = 2
    fake_apiserver.answer_errors(code)
    assert cluster.get("Pod", "p-0", "default")["metadata"]["name"] == "p-0"
    assert waits == [k8s.BACKOFF, 2 * k8s.BACKOFF] and _sent(fake_apiserver, "GET", "p-0") == 3
    waits.clear()
    fake_apiserver.answer_errors(code)
    cluster.patch("Pod", "p-0", {"metadata": {"labels": {"a": "b"}}}, "default")  # a write the server refused
    assert fake_apiserver.store.get("pods", "p-0", "default")["metadata"]["labels"] == {"a": "b"}
    assert _sent(fake_apiserver, "PATCH", "p-0") == 3


def test_a_write_is_not_sent_again_after_a_server_error_a_read_is(fake_apiserver: FakeApiServer,
                                                                  waits: Waits) -> None:
    fake_apiserver.add_pod("p-1")
    cluster = _cluster(fake_apiserver)
    fake_apiserver.answer_errors(500)
    with pytest.raises(k8s.K8sError, match=r"injected 500 InternalError \(500") as err:
        cluster.patch("Pod", "p-1", {"metadata": {"labels": {"a": "b"}}}, "default")
    assert err.value.status == 500 and _sent(fake_apiserver, "PATCH", "p-1") == 1 and waits == []
    with pytest.raises(k8s.K8sError, match="injected 500"):
        cluster.get("Pod", "p-1", "default")
    assert _sent(fake_apiserver, "GET", "p-1") == k8s.SENDS and len(waits) == k8s.SENDS - 1
    assert waits == [min(k8s.BACKOFF_CAP, k8s.BACKOFF * 2 ** n) for n in range(k8s.SENDS - 1)]
    fake_apiserver.heal()


def test_errors_that_another_send_cannot_mend_are_raised_at_once(fake_apiserver: FakeApiServer,
                                                                 waits: Waits) -> None:
    cluster = _cluster(fake_apiserver)
    with pytest.raises(k8s.K8sError) as err:
        cluster.get("Pod", "nobody", "default")
    assert err.value.not_found and waits == []
    fake_apiserver.answer_errors(403)
    with pytest.raises(k8s.K8sError, match="forbidden"):
        cluster.get("Pod", "nobody", "default")
    assert waits == []
    fake_apiserver.heal()


def test_an_api_server_that_comes_back_within_the_backoff_is_reached(fake_apiserver: FakeApiServer,
                                                                     waits: Waits) -> None:
    fake_apiserver.add_pod("p-2")
    cluster = _cluster(fake_apiserver)
    waits.heal_after = 1
    fake_apiserver.go_offline()
    cluster.patch("Pod", "p-2", {"metadata": {"labels": {"x": "y"}}}, "default")  # refused: never sent, so resent
    assert waits == [k8s.BACKOFF] and fake_apiserver.store.get("pods", "p-2", "default")["metadata"]["labels"] == {"x": "y"}
