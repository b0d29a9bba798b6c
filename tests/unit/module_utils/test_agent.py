"""The node agent's restore of one pod (plugins/module_utils/agent/_agent.py) against the fake API server.

The node side is a recording double (``FakeNode``): these tests are about what the agent decides and writes to the
cluster - one attempt per pod, waiting, refusals, recovery, the cold-start fallback. The real node side runs in
tests/integration/test_agent_e2e.py.
"""
from __future__ import annotations

import copy
import threading
from typing import Any, Dict, List, Optional

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.agent import _agent as agent
from ansible_collections.warmstart.snapshot.plugins.module_utils.agent import _agent_node as an
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_client as k8s
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_records as rec
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podbuild as podbuild
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._store import StoreError
from tests.support import fake_apiserver as fake_server_module
from tests.support.fake_apiserver import FakeApiServer

fake_apiserver = fake_server_module.fake_apiserver  # the pytest fixture

SOURCE = [{"name": "main", "image": "registry.local/embed:1.0", "command": ["python", "/app/server.py"]}]


class FakeNode:
    """Records what the agent asks of the node; answers as told."""

    def __init__(self, outcome: str = "succeeded", state: str = agent.UNFINISHED,
                 fit: Optional[Dict[str, Any]] = None) -> None:
        self.outcome, self.state, self.facts = outcome, state, fit
        self.restored: List[agent.Work] = []
        self.given_up: List[agent.Work] = []
        self.lock = threading.Lock()

    def restore(self, work: agent.Work) -> agent.NodeResult:
        with self.lock:
            self.restored.append(work)
        if self.outcome != "succeeded" and work.cold_start:
            self.give_up(work)
            return agent.NodeResult(self.outcome, "CRIU failed; started cold")
        return agent.NodeResult(self.outcome, f"node says {self.outcome}")

    def attempt_state(self, work: agent.Work) -> str:
        return self.state

    def give_up(self, work: agent.Work) -> str:
        self.given_up.append(work)
        return "started cold" if work.cold_start else "main: killed"

    def fit(self) -> Optional[Dict[str, Any]]:
        return self.facts


def _cluster(server: FakeApiServer) -> k8s.Cluster:
    return k8s.cluster_from({"kubeconfig": str(server.kubeconfig)})


def _snapshot(server: FakeApiServer, ready: bool = True, name: str = "snap-a", created: str = "2026-12-02T12:00:00Z",
              source_node: Optional[Dict[str, Any]] = None, policy: Optional[str] = None,
              url: str = "/mnt/snapshots") -> None:
    """PodSnapshot ``name`` of pod embed-0 (SOURCE), bound and Ready unless ``ready`` is false."""
    server.install_crds()
    if server.store.get("pods", "embed-0", "default") is None:
        server.add_pod("embed-0", containers=copy.deepcopy(SOURCE), labels={"app": "embed"})
    params = {"namespace": "default", "name": name, "source_pod": "embed-0", "containers": ["main"],
              "scope": "whole-pod", "policy_name": policy, "labels": None, "content_name": None,
              "store": {"url": url, "snapshot_id": "20261202T120000Z-1a2b3c4d"}, "node": None,
              "source_node": source_node or {"hostname": "node-1"}, "size": 1, "created_at": created,
              "ready": ready, "failed_reason": None, "failed_message": None}
    rec.ensure_pod_snapshot(_cluster(server), params)


def _restore_pod(server: FakeApiServer, name: str, image: str = SOURCE[0]["image"], node: str = "node-1",
                 annotations: Optional[Dict[str, str]] = None, running: bool = True) -> Dict[str, Any]:
    template = {"metadata": {"labels": {"app": "embed"}}, "spec": {"containers": [dict(SOURCE[0], image=image)]}}
    built = podbuild.build(template, "snap-a")
    built["metadata"]["annotations"].update(annotations or {})
    return server.add_pod(name, containers=built["spec"]["containers"], spec=dict(built["spec"]), node=node,
                          labels={"app": "embed"}, annotations=built["metadata"]["annotations"],
                          phase="Running" if running else "Pending")


def _settings(name: str, **kw: Any) -> agent.Settings:
    return agent.Settings(namespace="default", name=name, agent=kw.pop("agent", "node-1"),
                          node_name=kw.pop("node_name", "node-1"), **kw)


def _condition(server: FakeApiServer, name: str) -> Dict[str, Any]:
    return podapi.get_condition(server.store.get("pods", name, "default"), podapi.RESTORE_CONDITION) or {}


def test_a_ready_snapshot_is_restored_once_and_recorded(fake_apiserver: FakeApiServer) -> None:
    _snapshot(fake_apiserver)
    _restore_pod(fake_apiserver, "r-0")
    node = FakeNode()
    out = agent.restore_pod(_cluster(fake_apiserver), _settings("r-0"), node)
    assert (out["action"], out["outcome"], out["recorded"]) == ("restored", "succeeded", True)
    assert 0 <= out["ready_seconds"] < 120, "from the placeholder's startedAt (set by the fake kubelet) to now"
    assert out["snapshot_age_seconds"] > 0 and out["snapshot_bytes"] == 1
    assert [(w.snapshot, w.snapshot_id, [p["container"] for p in w.pairs]) for w in node.restored] == [
        ("snap-a", "20261202T120000Z-1a2b3c4d", ["main"])]
    cond = _condition(fake_apiserver, "r-0")
    assert (cond["status"], cond["reason"]) == ("True", podapi.REASON_SUCCEEDED)
    pod = fake_apiserver.store.get("pods", "r-0", "default")
    assert podapi.FINALIZER not in (pod["metadata"].get("finalizers") or [])
    assert pod["metadata"]["annotations"][agent.ANN_ATTEMPT].startswith("node-1 ")
    again = agent.restore_pod(_cluster(fake_apiserver), _settings("r-0"), node)
    assert (again["action"], again["reason"]) == ("skipped", "its restore already ran (Succeeded)")
    assert len(node.restored) == 1


def _s3_policy(server: FakeApiServer, secret: bool = True) -> None:
    """PodSnapshotPolicy default/embed-s3 through storage config s3 (s3://bucket/fleet), whose credentials are in
    Secret warmstart/s3 (absent unless ``secret``)."""
    server.store.put("podsnapshotstorageconfigs", {"metadata": {"name": "s3"}, "spec": {
        "storeUrl": "s3://bucket/fleet", "options": {"endpointUrl": "http://127.0.0.1:9000"},
        "credentialsSecretRef": {"name": "s3", "namespace": "warmstart"}}}, group=podapi.GROUP)
    server.store.put("podsnapshotpolicies", {"metadata": {"name": "embed-s3", "namespace": "default"}, "spec": {
        "selector": {"matchLabels": {"app": "none"}}, "storageConfigName": "s3"}}, group=podapi.GROUP)
    if secret:
        server.store.put("secrets", {"metadata": {"name": "s3", "namespace": "warmstart"}, "data": {
            "AWS_ACCESS_KEY_ID": "a2V5", "AWS_SECRET_ACCESS_KEY": "c2VjcmV0LWtleQ=="}}, group="")


def test_the_restore_opens_the_store_with_its_policys_storage_config_and_credentials(
        fake_apiserver: FakeApiServer) -> None:
    """The agent's restore reads the snapshot where its capture wrote it: the policy's storage config options and
    the credentials of its Secret reach the node (never its repr); a policy gone leaves the node's own options."""
    _snapshot(fake_apiserver, policy="embed-s3", url="s3://bucket/fleet")
    _s3_policy(fake_apiserver)
    _restore_pod(fake_apiserver, "r-0")
    node = FakeNode()
    out = agent.restore_pod(_cluster(fake_apiserver), _settings("r-0"), node)
    assert out["outcome"] == "succeeded", out
    (work,) = node.restored
    assert work.store["url"] == "s3://bucket/fleet"
    assert work.store_options["endpoint_url"] == "http://127.0.0.1:9000"
    assert work.store_options["secret_access_key"] == "secret-key" and "secret-key" not in repr(work)
    assert "secret-key" not in repr(out)
    fake_apiserver.store.remove("podsnapshotpolicies", "embed-s3", "default", group=podapi.GROUP)
    _restore_pod(fake_apiserver, "r-1")
    agent.restore_pod(_cluster(fake_apiserver), _settings("r-1"), node)
    assert node.restored[-1].store_options == {}, "no policy: the node's own options"


def test_a_policy_whose_credentials_cannot_be_read_refuses_the_restore_naming_the_secret(
        fake_apiserver: FakeApiServer) -> None:
    _snapshot(fake_apiserver, policy="embed-s3", url="s3://bucket/fleet")
    _s3_policy(fake_apiserver, secret=False)
    _restore_pod(fake_apiserver, "r-0")
    node = FakeNode()
    out = agent.restore_pod(_cluster(fake_apiserver), _settings("r-0"), node)
    assert out["action"] == "refused" and node.restored == [], out
    assert any("warmstart/s3" in r for r in out["reasons"]), out["reasons"]


def test_a_missing_or_unready_snapshot_makes_the_pod_wait_without_spending_its_attempt(
        fake_apiserver: FakeApiServer) -> None:
    fake_apiserver.install_crds()
    _restore_pod(fake_apiserver, "r-w")
    node = FakeNode()
    out = agent.restore_pod(_cluster(fake_apiserver), _settings("r-w"), node)
    assert (out["action"], out["outcome"], out["pod_outcome"]) == ("waiting", None, "Pending")
    assert out["reasons"] == ["PodSnapshot default/snap-a does not exist yet"]
    cond = _condition(fake_apiserver, "r-w")
    assert (cond["status"], cond["reason"]) == ("False", podapi.REASON_IN_PROGRESS)
    assert cond["message"] == "waiting: PodSnapshot default/snap-a does not exist yet"
    assert agent.ANN_ATTEMPT not in fake_apiserver.store.get("pods", "r-w", "default")["metadata"]["annotations"]
    _snapshot(fake_apiserver, ready=False)
    out = agent.restore_pod(_cluster(fake_apiserver), _settings("r-w"), node)
    assert out["action"] == "waiting" and "is not Ready yet" in out["reasons"][0]
    assert not node.restored
    _snapshot(fake_apiserver, ready=True)
    out = agent.restore_pod(_cluster(fake_apiserver), _settings("r-w"), node)
    assert (out["action"], out["outcome"]) == ("restored", "succeeded")


def test_a_snapshot_of_another_pod_spec_is_refused_with_the_reasons_and_nothing_touched(
        fake_apiserver: FakeApiServer) -> None:
    _snapshot(fake_apiserver)
    _restore_pod(fake_apiserver, "r-x", image="registry.local/embed:2.0")
    node = FakeNode()
    out = agent.restore_pod(_cluster(fake_apiserver), _settings("r-x"), node)
    assert (out["action"], out["outcome"], out["placeholder"]) == ("refused", "incompatible", "left as it is")
    assert any("image" in r for r in out["reasons"]), out["reasons"]
    assert not node.restored and not node.given_up
    cond = _condition(fake_apiserver, "r-x")
    assert (cond["status"], cond["reason"]) == ("False", podapi.REASON_INCOMPATIBLE)


def test_cold_start_fallback_on_refusal_and_on_failure(fake_apiserver: FakeApiServer) -> None:
    _snapshot(fake_apiserver)
    _restore_pod(fake_apiserver, "r-cold", image="registry.local/embed:2.0",
                 annotations={agent.ANN_FALLBACK: "cold-start"})
    node = FakeNode()
    out = agent.restore_pod(_cluster(fake_apiserver), _settings("r-cold"), node)
    assert (out["action"], out["placeholder"]) == ("refused", "started cold")
    assert _condition(fake_apiserver, "r-cold")["message"].endswith("; started cold")
    _restore_pod(fake_apiserver, "r-fail")
    failing = FakeNode(outcome="failed")
    out = agent.restore_pod(_cluster(fake_apiserver), _settings("r-fail", fallback="cold-start"), failing)
    assert (out["action"], out["outcome"]) == ("restored", "failed")
    assert [w.cold_start for w in failing.restored] == [True] and len(failing.given_up) == 1
    cond = _condition(fake_apiserver, "r-fail")
    assert (cond["reason"], cond["message"]) == (podapi.REASON_FAILED, "CRIU failed; started cold")


def test_pods_of_other_nodes_unscheduled_or_not_running_are_skipped(fake_apiserver: FakeApiServer) -> None:
    _snapshot(fake_apiserver)
    _restore_pod(fake_apiserver, "r-far", node="node-2")
    _restore_pod(fake_apiserver, "r-slow", running=False)
    node = FakeNode()
    far = agent.restore_pod(_cluster(fake_apiserver), _settings("r-far"), node)
    assert far["reason"] == "the pod runs on node node-2, not on this agent's node node-1"
    slow = agent.restore_pod(_cluster(fake_apiserver), _settings("r-slow"), node)
    assert slow["reason"] == "its containers are not all running yet"
    gone = agent.restore_pod(_cluster(fake_apiserver), _settings("nope"), node)
    assert gone["reason"] == "the pod no longer exists"
    replaced = agent.restore_pod(_cluster(fake_apiserver), _settings("r-slow", uid="old-uid"), node)
    assert replaced["reason"] == "the pod was replaced (uid old-uid is gone)"
    assert not node.restored


def test_two_agents_racing_for_one_pod_restore_it_once(fake_apiserver: FakeApiServer) -> None:
    _snapshot(fake_apiserver)
    _restore_pod(fake_apiserver, "r-race")
    node = FakeNode()
    results: List[Dict[str, Any]] = []
    barrier = threading.Barrier(2)

    def run(who: str) -> None:
        barrier.wait()
        results.append(agent.restore_pod(_cluster(fake_apiserver), _settings("r-race", agent=who), node))

    threads = [threading.Thread(target=run, args=(who,)) for who in ("agent-a", "agent-b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(node.restored) == 1
    assert sorted(r["action"] for r in results) == ["restored", "skipped"]
    (skipped,) = [r for r in results if r["action"] == "skipped"]
    assert skipped["reason"].startswith(("agent agent-", "its restore already ran"))


def test_an_attempt_the_agent_did_not_record_is_recovered_never_replayed(fake_apiserver: FakeApiServer) -> None:
    _snapshot(fake_apiserver)
    for name in ("r-done", "r-half"):
        _restore_pod(fake_apiserver, name)
        pod = fake_apiserver.store.get("pods", name, "default")
        assert agent.claim(_cluster(fake_apiserver), pod, "node-1") is not None  # then the agent died
    done = FakeNode(state=agent.COMPLETE)
    out = agent.restore_pod(_cluster(fake_apiserver), _settings("r-done"), done)
    assert (out["action"], out["outcome"]) == ("recovered", "succeeded")
    assert _condition(fake_apiserver, "r-done")["reason"] == podapi.REASON_SUCCEEDED
    half = FakeNode(state=agent.UNFINISHED)
    out = agent.restore_pod(_cluster(fake_apiserver), _settings("r-half"), half)
    assert (out["action"], out["outcome"]) == ("recovered", "failed")
    assert "not replayed; placeholder main: killed" in out["message"]
    assert not done.restored and not half.restored and len(half.given_up) == 1
    other = agent.restore_pod(_cluster(fake_apiserver), _settings("r-done", agent="node-9"), half)
    assert other["action"] == "skipped"


def test_a_recovered_attempt_still_running_is_waited_for(fake_apiserver: FakeApiServer) -> None:
    _snapshot(fake_apiserver)
    _restore_pod(fake_apiserver, "r-run")
    agent.claim(_cluster(fake_apiserver), fake_apiserver.store.get("pods", "r-run", "default"), "node-1")
    node = FakeNode(state=agent.RUNNING)
    timer = threading.Timer(0.3, lambda: setattr(node, "state", agent.COMPLETE))
    timer.start()
    out = agent.restore_pod(_cluster(fake_apiserver), _settings("r-run", running_poll=0.05), node)
    timer.join()
    assert (out["action"], out["outcome"], out["attempt_state"]) == ("recovered", "succeeded", agent.COMPLETE)


def test_check_mode_writes_nothing(fake_apiserver: FakeApiServer) -> None:
    _snapshot(fake_apiserver)
    _restore_pod(fake_apiserver, "r-chk")
    before = len(fake_apiserver.writes())
    node = FakeNode()
    out = agent.restore_pod(_cluster(fake_apiserver), _settings("r-chk"), node, check_mode=True)
    assert (out["action"], out["changed"]) == ("would restore", True)
    assert len(fake_apiserver.writes()) == before and not node.restored


@pytest.mark.parametrize(("annotations", "expected"), [
    ({}, False), ({agent.ANN_FALLBACK: "cold-start"}, True), ({agent.ANN_FALLBACK: "none"}, False)])
def test_the_pod_annotation_decides_the_fallback_before_the_agent_default(
        annotations: Dict[str, str], expected: bool) -> None:
    pod = {"metadata": {"annotations": annotations}}
    assert agent.fallback_of(pod, "none") is expected
    assert agent.fallback_of(pod, "cold-start") is (expected or not annotations)


def test_a_pod_that_selects_at_restore_gets_the_newest_fitting_snapshot_pinned(fake_apiserver: FakeApiServer) -> None:
    template = {"metadata": {"labels": {"app": "embed"}}, "spec": {"containers": copy.deepcopy(SOURCE)}}
    built = podbuild.build(template, None)
    assert pc.restore_mode(built)["select"] and not pc.restore_mode(built)["restore_from"]
    fake_apiserver.install_crds()
    fake_apiserver.add_pod("r-sel", containers=built["spec"]["containers"], spec=dict(built["spec"]),
                           labels={"app": "embed"}, annotations=built["metadata"]["annotations"])
    node = FakeNode()
    early = agent.restore_pod(_cluster(fake_apiserver), _settings("r-sel"), node)
    assert early["action"] == "waiting" and not node.restored, "no snapshot fits yet: the pod waits"
    _snapshot(fake_apiserver)
    out = agent.restore_pod(_cluster(fake_apiserver), _settings("r-sel"), node)
    assert (out["action"], out["outcome"], out["pod_snapshot_name"]) == ("restored", "succeeded", "snap-a")
    assert (out["pod_ref"], out["pod_outcome"]) == ("default/r-sel", "Succeeded"), out
    pod = fake_apiserver.store.get("pods", "r-sel", "default")
    assert pod["metadata"]["annotations"][podapi.ANN_RESTORE_FROM] == "snap-a"


def test_a_newer_snapshot_from_a_node_unlike_this_one_is_passed_over(fake_apiserver: FakeApiServer) -> None:
    """The newest snapshot whose spec hash fits was taken on an H100 node: an A100 node pins the older one taken
    on a node like itself; a node like neither waits, naming why for each."""
    a100 = {"hostname": "n-a", "arch": "x86_64", "gpus": [{"name": "NVIDIA A100-SXM4-80GB"}]}
    h100 = {"hostname": "n-h", "arch": "x86_64", "gpus": [{"name": "NVIDIA H100 80GB HBM3"}]}
    _snapshot(fake_apiserver, name="snap-old-a100", created="2026-12-02T12:00:00Z", source_node=a100)
    _snapshot(fake_apiserver, name="snap-new-h100", created="2026-12-03T12:00:00Z", source_node=h100)
    template = {"metadata": {"labels": {"app": "embed"}}, "spec": {"containers": copy.deepcopy(SOURCE)}}
    built = podbuild.build(template, None)
    for name in ("r-a100", "r-cpu"):
        fake_apiserver.add_pod(name, containers=built["spec"]["containers"], spec=dict(built["spec"]),
                               labels={"app": "embed"}, annotations=built["metadata"]["annotations"])
    node = FakeNode(fit={"arch": "x86_64", "cpuVendor": "GenuineIntel", "gpuModels": ["NVIDIA A100-SXM4-80GB"]})
    out = agent.restore_pod(_cluster(fake_apiserver), _settings("r-a100"), node)
    assert (out["action"], out["pod_snapshot_name"]) == ("restored", "snap-old-a100"), out
    # a node like neither: waiting would not help (the pod is scheduled here): refused, and with the fallback
    # its placeholder starts cold
    cpu_node = FakeNode(fit={"arch": "x86_64", "gpuModels": []})
    cpu = agent.restore_pod(_cluster(fake_apiserver), _settings("r-cpu", fallback="cold-start"), cpu_node)
    assert (cpu["action"], cpu["outcome"], cpu["placeholder"]) == ("refused", "incompatible", "started cold"), cpu
    assert any("default/snap-new-h100 was taken on a node this one does not match: GPUs: snapshot NVIDIA H100 "
               "80GB HBM3, this node none" in r for r in cpu["reasons"]), cpu["reasons"]
    assert any("snap-old-a100" in r for r in cpu["reasons"]), cpu["reasons"]
    assert [p["container"] for p in cpu_node.given_up[0].pairs] == ["main"], "every container is a placeholder"
    cond = _condition(fake_apiserver, "r-cpu")
    assert cond["reason"] == podapi.REASON_INCOMPATIBLE and "started cold" in cond["message"], cond
    assert not cpu_node.restored


class FlakyStoreNode(FakeNode):
    """A node whose store fails (transiently) the first ``failures`` restores, before anything is touched."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def restore(self, work: agent.Work) -> agent.NodeResult:
        with self.lock:
            self.restored.append(work)
        if len(self.restored) <= self.failures:
            return agent.NodeResult(agent.RETRY, "store s3://snaps: downloading pages-1.img: cannot reach the endpoint")
        return agent.NodeResult("succeeded", "node says succeeded")


def _due_now(server: FakeApiServer, name: str) -> None:
    """The retry annotation's time has come (as after the backoff)."""
    pod = server.store.get("pods", name, "default")
    tries = pod["metadata"]["annotations"][agent.ANN_RETRY].split()[0]
    pod["metadata"]["annotations"][agent.ANN_RETRY] = f"{tries} 2026-01-01T00:00:00Z"
    server.store.put("pods", pod, group="")


def test_a_store_that_fails_for_a_while_gives_the_attempt_back_with_backoff(fake_apiserver: FakeApiServer) -> None:
    _snapshot(fake_apiserver)
    _restore_pod(fake_apiserver, "r-s")
    node = FlakyStoreNode(failures=2)
    cluster = _cluster(fake_apiserver)
    out = agent.restore_pod(cluster, _settings("r-s"), node)
    assert (out["action"], out["outcome"], out["pod_outcome"], out["retry"]) == ("waiting", None, "Pending", 1)
    assert "cannot reach the endpoint" in out["reasons"][0] and "try 1 of 5 failed" in out["reasons"][0]
    pod = fake_apiserver.store.get("pods", "r-s", "default")
    assert agent.ANN_ATTEMPT not in pod["metadata"]["annotations"], "the attempt is given back"
    assert podapi.FINALIZER not in (pod["metadata"].get("finalizers") or [])
    assert pod["metadata"]["annotations"][agent.ANN_RETRY] == f"1 {out['retry_at']}"
    cond = _condition(fake_apiserver, "r-s")
    assert (cond["status"], cond["reason"]) == ("False", podapi.REASON_IN_PROGRESS)
    assert cond["message"].startswith("waiting: the store failed before anything was touched")
    # an event before the backoff ends does nothing
    early = agent.restore_pod(cluster, _settings("r-s"), node)
    assert early["action"] == "skipped" and "the next try is not before" in early["reason"]
    assert len(node.restored) == 1
    _due_now(fake_apiserver, "r-s")
    out = agent.restore_pod(cluster, _settings("r-s"), node)
    assert (out["action"], out["retry"]) == ("waiting", 2)
    second, first = agent.retry_of(fake_apiserver.store.get("pods", "r-s", "default"))[1], agent.time.time()
    assert second is not None and second - first > agent.RETRY_BASE * 1.5, "the backoff doubles"
    _due_now(fake_apiserver, "r-s")
    out = agent.restore_pod(cluster, _settings("r-s"), node)
    assert (out["action"], out["outcome"]) == ("restored", "succeeded")
    assert len(node.restored) == 3 and not node.given_up
    assert (_condition(fake_apiserver, "r-s")["reason"]) == podapi.REASON_SUCCEEDED


def test_a_store_that_keeps_failing_spends_the_attempt_after_the_limit(fake_apiserver: FakeApiServer) -> None:
    _snapshot(fake_apiserver)
    _restore_pod(fake_apiserver, "r-f")
    node = FlakyStoreNode(failures=99)
    for n in range(1, agent.RETRY_LIMIT):
        out = agent.restore_pod(_cluster(fake_apiserver), _settings("r-f"), node)
        assert (out["action"], out["retry"]) == ("waiting", n)
        _due_now(fake_apiserver, "r-f")
    out = agent.restore_pod(_cluster(fake_apiserver), _settings("r-f"), node)
    assert (out["action"], out["outcome"], out["recorded"]) == ("restored", "failed", True)
    assert f"the store failed {agent.RETRY_LIMIT} tries, the attempt is spent; placeholder main: killed" in out["message"]
    assert len(node.restored) == agent.RETRY_LIMIT and len(node.given_up) == 1
    assert _condition(fake_apiserver, "r-f")["reason"] == podapi.REASON_FAILED
    assert agent.decide(fake_apiserver.store.get("pods", "r-f", "default"), "node-1", "node-1")[0] == "skip"


def test_the_node_side_turns_a_transient_store_error_into_a_retry_and_leaves_the_placeholders(
        monkeypatch: pytest.MonkeyPatch) -> None:
    raised: List[StoreError] = []

    def restore_into(*args: Any, **kwargs: Any) -> Dict[str, Any]:
        raise raised[0]

    monkeypatch.setattr(an.rinto, "restore_into", restore_into)
    monkeypatch.setattr(an, "open_store", lambda url, options: object())
    node = an.LocalNode()
    monkeypatch.setattr(node, "_container_id", lambda work, pair: "c" * 64)
    gave_up: List[str] = []
    monkeypatch.setattr(node, "give_up", lambda work: gave_up.append(work.name) or "started cold")
    work = agent.Work("default", "r-0", "uid", "snap-a", "id", {"url": "s3://snaps"},
                      [{"container": "main", "source": "main"}], cold_start=True)
    raised[:] = [StoreError("store s3://snaps: checking the bucket: cannot reach the endpoint", transient=True)]
    result = node.restore(work)
    assert (result.outcome, result.message) == (agent.RETRY, str(raised[0])) and gave_up == []
    raised[:] = [StoreError("store s3://snaps: snapshot id: not found")]
    result = node.restore(work)
    assert result.outcome == "failed" and gave_up == ["r-0"]  # not transient: spent, started cold


def test_a_pod_that_speaks_the_reference_contract_gets_its_condition_too(fake_apiserver: FakeApiServer) -> None:
    _snapshot(fake_apiserver)
    template = {"metadata": {"labels": {"app": "embed"}}, "spec": {"containers": [dict(SOURCE[0])]}}
    built = podbuild.build(template, "snap-a")
    ours = built["metadata"]["annotations"]
    for mine, theirs in podapi.ANNOTATION_ALIASES:  # only the reference's names on this pod
        if mine in ours:
            ours[theirs] = ours.pop(mine)
    fake_apiserver.add_pod("r-ref", containers=built["spec"]["containers"], spec=dict(built["spec"]), node="node-1",
                           labels={"app": "embed"}, annotations=ours, phase="Running")
    _restore_pod(fake_apiserver, "r-own")
    for name in ("r-ref", "r-own"):
        out = agent.restore_pod(_cluster(fake_apiserver), _settings(name), FakeNode())
        assert (out["action"], out["outcome"]) == ("restored", "succeeded")
    ref = fake_apiserver.store.get("pods", "r-ref", "default")
    both = [podapi.get_condition(ref, t) for t in (podapi.RESTORE_CONDITION, podapi.REF_RESTORE_CONDITION)]
    assert all(c and (c["status"], c["reason"]) == ("True", podapi.REASON_SUCCEEDED) for c in both), both
    assert both[0]["message"] == both[1]["message"]
    own = fake_apiserver.store.get("pods", "r-own", "default")
    assert podapi.get_condition(own, podapi.REF_RESTORE_CONDITION) is None  # ours only: nothing else written
