"""From watched objects to the node agent's events (_agent_events): every predicate and every transition."""
from __future__ import annotations

import copy
import threading
from typing import Any, Dict, List, Optional, Tuple

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.agent import _agent_events as ae
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

JSON = Dict[str, Any]
NODE = "node-1"


def pod(name: str, ns: str = "ml", node: Optional[str] = NODE, phase: str = "Running", restore: Optional[str] = "snap",
        labels: Optional[Dict[str, str]] = None, running: bool = True, ready: bool = True,
        conditions: Optional[List[JSON]] = None, deleting: bool = False, uid: Optional[str] = None,
        annotations: Optional[Dict[str, str]] = None, containers: Tuple[str, ...] = ("main",)) -> JSON:
    meta: JSON = {"name": name, "namespace": ns, "uid": uid or f"uid-{name}", "labels": dict(labels or {}),
                  "annotations": dict(annotations or {}), "resourceVersion": "1"}
    if restore:
        meta["annotations"][podapi.ANN_RESTORE_FROM] = restore
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    spec: JSON = {"containers": [{"name": c, "image": "i"} for c in containers]}
    if node:
        spec["nodeName"] = node
    state = {"running": {"startedAt": "2026-01-01T00:00:00Z"}} if running else {"waiting": {"reason": "Creating"}}
    status: JSON = {"phase": phase, "containerStatuses": [{"name": c, "state": state} for c in containers],
                    "conditions": [{"type": "Ready", "status": "True" if ready else "False"}] + list(conditions or [])}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def source(name: str = "src", **kw: Any) -> JSON:
    kw.setdefault("restore", None)
    kw.setdefault("labels", {"app": "embed"})
    return pod(name, **kw)


def restored(status: str, reason: str, condition: str = podapi.RESTORE_CONDITION) -> List[JSON]:
    return [{"type": condition, "status": status, "reason": reason}]


def snapshot(name: str, ns: str = "ml", src: str = "src", uid: str = "uid-src", policy: Optional[str] = None,
             bound: Optional[str] = None, ready: Optional[str] = None, failed: Optional[str] = None,
             deleting: bool = False) -> JSON:
    spec: JSON = {"source": {"podRef": {"name": src, "uid": uid}}}
    if policy:
        spec["policyName"] = policy
    conditions = [{"type": t, "status": v} for t, v in (("Ready", ready), ("Failed", failed)) if v]
    status: JSON = {"conditions": conditions}
    if bound:
        status["boundSnapshotContentName"] = bound
    meta: JSON = {"name": name, "namespace": ns, "uid": f"uid-{name}"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"apiVersion": podapi.API_VERSION, "kind": "PodSnapshot", "metadata": meta, "spec": spec, "status": status}


def ready_snapshot(name: str, ns: str = "ml", **kw: Any) -> JSON:
    """A bound, Ready PodSnapshot as the checks of _podcontract.is_ready want it."""
    snap = snapshot(name, ns, bound=f"{ns}-{name}", **kw)
    snap["status"]["conditions"] = [{"type": "Ready", "status": "True", "reason": "Ready", "message": "",
                                     "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    assert podapi.is_ready(snap), podapi.readiness_problems(snap)
    return snap


def trigger(name: str, ns: str = "ml", target: str = "src", triggered: Optional[str] = None,
            deleting: bool = False) -> JSON:
    meta: JSON = {"name": name, "namespace": ns, "uid": f"uid-{name}"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: JSON = {"conditions": [{"type": "Triggered", "status": triggered, "reason": "Complete"}]} if triggered \
        else {}
    return {"apiVersion": podapi.API_VERSION, "kind": ae.KIND_TRIGGER, "metadata": meta, "spec": {"targetPod": target},
            "status": status}


def policy(name: str, ns: str = "ml", selector: Any = None, trigger_type: Optional[str] = "workload") -> JSON:
    spec: JSON = {"selector": {"matchLabels": {"app": "embed"}} if selector is None else selector}
    if trigger_type:
        spec["triggerConfig"] = {"type": trigger_type}
    meta = {"name": name, "namespace": ns, "uid": f"uid-{name}"}
    return {"apiVersion": podapi.API_VERSION, "kind": "PodSnapshotPolicy", "metadata": meta, "spec": spec}


def brief(events: List[JSON]) -> List[Tuple[str, str, Optional[str], str]]:
    """(type, namespace/name, node, reason) of each event."""
    return [(e["warmstart"]["type"], f"{e['warmstart']['namespace']}/{e['warmstart']['name']}",
             e["warmstart"]["node"], e["warmstart"]["reason"]) for e in events]


class Cluster:
    """The pods a lookup reads (the API server's, not only this node's), and the lookups made."""

    def __init__(self, *pods: JSON) -> None:
        self.pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
        self.calls: List[Tuple[str, str]] = []
        self.fail = False

    def lookup(self, namespace: str, name: str) -> Optional[JSON]:
        self.calls.append((namespace, name))
        if self.fail:
            raise WarmstartError("API server https://api.test unreachable: connection refused")
        return self.pods.get((namespace, name))


def agent(*pods: JSON, node: Optional[str] = NODE, **kw: Any) -> Tuple[ae.AgentEvents, Cluster, List[str]]:
    cluster = Cluster(*pods)
    problems: List[str] = []
    events = ae.AgentEvents(node, lookup_pod=cluster.lookup, on_problem=problems.append, **kw)
    assert events.start() == []
    return events, cluster, problems


# --- predicates ---------------------------------------------------------------------------

def test_restore_pods_by_any_of_the_restore_annotations() -> None:
    assert ae.is_restore_pod(pod("a"))
    assert ae.is_restore_pod(pod("a", restore=None, annotations={podapi.REF_ANN_RESTORE_FROM: "snap"}))
    assert ae.is_restore_pod(pod("a", restore=None, annotations={ae.ANN_RESTORE_SELECT: "True"}))
    assert not ae.is_restore_pod(pod("a", restore=None, annotations={ae.ANN_RESTORE_SELECT: "false"}))
    assert not ae.is_restore_pod(pod("a", restore=""))
    assert not ae.is_restore_pod(source())


def test_containers_running_counts_every_spec_container_and_no_init_container() -> None:
    assert ae.containers_running(pod("a", containers=("a", "b")))
    two = pod("a", containers=("a", "b"))
    two["status"]["containerStatuses"][1]["state"] = {"waiting": {}}
    assert not ae.containers_running(two)
    missing = pod("a", containers=("a", "b"))
    del missing["status"]["containerStatuses"][1]
    assert not ae.containers_running(missing)
    with_init = pod("a")
    with_init["spec"]["initContainers"] = [{"name": "init", "image": "i"}]
    assert ae.containers_running(with_init)
    assert not ae.containers_running({"spec": {"containers": []}, "status": {}})


@pytest.mark.parametrize("obj, node_name, holds", [
    (pod("a"), NODE, True),
    (pod("a"), None, True),
    (pod("a", node="node-2"), NODE, False),
    (pod("a", node=None), None, False),
    (pod("a", phase="Pending"), NODE, False),
    (pod("a", running=False), NODE, False),
    (pod("a", deleting=True), NODE, False),
    (pod("a", restore=None), NODE, False),
    (pod("a", conditions=restored("False", podapi.REASON_IN_PROGRESS)), NODE, True),
    (pod("a", conditions=restored("Unknown", podapi.REASON_IN_PROGRESS)), NODE, True),
    (pod("a", conditions=restored("True", podapi.REASON_SUCCEEDED)), NODE, False),
    (pod("a", conditions=restored("False", podapi.REASON_FAILED)), NODE, False),
    (pod("a", conditions=restored("False", podapi.REASON_INCOMPATIBLE)), NODE, False),
    (pod("a", conditions=restored("False", podapi.REASON_PARTIAL)), NODE, False),
    (pod("a", conditions=restored("False", "Other")), NODE, False),
    (pod("a", conditions=restored("True", podapi.REASON_SUCCEEDED, podapi.REF_RESTORE_CONDITION)), NODE, False),
], ids=["pending", "any-node", "other-node", "unscheduled", "phase-pending", "container-waiting", "deleting",
        "no-annotation", "in-progress", "in-progress-unknown", "succeeded", "failed", "incompatible", "partial",
        "other-reason", "reference-condition"])
def test_restore_ready(obj: JSON, node_name: Optional[str], holds: bool) -> None:
    assert ae.restore_ready(obj, node_name) is holds


@pytest.mark.parametrize("obj, pending", [
    (snapshot("s"), True),
    (snapshot("s", ready="False", failed="False"), True),
    (snapshot("s", bound="content"), False),
    (snapshot("s", ready="True"), False),
    (snapshot("s", failed="True"), False),
    (snapshot("s", deleting=True), False),
], ids=["new", "conditions-false", "bound", "ready", "failed", "deleting"])
def test_capture_pending(obj: JSON, pending: bool) -> None:
    assert ae.capture_pending(obj) is pending


def test_trigger_pending_until_any_triggered_condition() -> None:
    assert ae.trigger_pending(trigger("t"))
    assert not ae.trigger_pending(trigger("t", triggered="True"))
    assert not ae.trigger_pending(trigger("t", triggered="False"))
    assert not ae.trigger_pending(trigger("t", deleting=True))


@pytest.mark.parametrize("selector, labels, matches", [
    ({"matchLabels": {"app": "embed"}}, {"app": "embed", "x": "y"}, True),
    ({"matchLabels": {"app": "embed"}}, {"app": "chat"}, False),
    ({"matchLabels": {"app": "embed"}}, {}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu", "cpu"]}]}, {"tier": "gpu"}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}]}, {}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gpu"]}]}, {}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gpu"]}]}, {"tier": "gpu"}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, {"tier": ""}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, {}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, {}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, {"tier": "x"}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "Gt", "values": ["1"]}]}, {"tier": "2"}, False),
    ({"matchLabels": {"app": "embed"}, "matchExpressions": [{"key": "t", "operator": "Exists"}]}, {"app": "embed"},
     False),
    ({}, {"anything": "goes"}, True),
    (None, {"app": "embed"}, False),
    ({"matchLabels": "app=embed"}, {"app": "embed"}, False),
], ids=["labels", "labels-differ", "labels-absent", "in", "in-absent", "notin-absent", "notin", "exists",
        "exists-absent", "doesnotexist", "doesnotexist-present", "unknown-operator", "labels-and-expressions",
        "empty-selects-all", "none-selects-none", "malformed"])
def test_selector_matches(selector: Any, labels: Dict[str, str], matches: bool) -> None:
    assert ae.selector_matches(selector, labels) is matches


def test_policies_are_workload_unless_manual() -> None:
    assert ae.is_workload_policy(policy("p")) and ae.is_workload_policy(policy("p", trigger_type=None))
    assert not ae.is_workload_policy(policy("p", trigger_type="manual"))


def test_event_shape_is_the_contract() -> None:
    obj, src = snapshot("s"), source()
    event = ae.make_event(ae.CAPTURE_REQUEST, obj, NODE, ae.REASON_ADDED, src)
    assert event == {"warmstart": {"type": "capture_request", "namespace": "ml", "name": "s", "uid": "uid-s",
                                   "node": NODE, "reason": "added", "object": obj, "source_pod": src}}
    assert event["warmstart"]["object"] is not obj  # a copy: the consumer may keep it
    assert "source_pod" not in ae.make_event(ae.RESTORE_POD, pod("a"), NODE, ae.REASON_RESYNC)["warmstart"]


def test_the_retention_event_names_the_node_and_the_watched_namespaces() -> None:
    event = ae.retention_event(NODE, [None])["warmstart"]
    assert (event["type"], event["node"], event["reason"], event["object"]) == ("retention", NODE, "timer",
                                                                                {"namespaces": []})
    assert ae.retention_event(None, ["ml", "ops"])["warmstart"]["object"] == {"namespaces": ["ml", "ops"]}
    assert ae.RETENTION in ae.TYPES and ae.RETENTION not in ae.LEVEL_TYPES  # a timer: never made from an object


def _retaining(name: str, ns: str = "ml", keep: Optional[int] = None, timeout: Optional[str] = None,
               deleting: bool = False) -> JSON:
    """A manual policy with the given retention rules."""
    obj = policy(name, ns, trigger_type="manual")
    if keep is not None:
        obj["spec"]["snapshotGroupingRules"] = {"groupRetentionPolicy": {"maxSnapshotCountPerGroup": keep}}
    if timeout is not None:
        obj["spec"]["retentionConfig"] = {"lastAccessTimeout": timeout}
    if deleting:
        obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return obj


def test_retention_is_due_only_while_a_policys_retention_could_remove_a_snapshot() -> None:
    events, _cluster, _problems = agent()
    assert not events.retention_due()  # nothing known
    events.observe(ae.KIND_POLICY, "ADDED", _retaining("keep1", keep=1))
    events.observe(ae.KIND_POLICY, "ADDED", policy("plain"))  # no retention rules at all
    events.observe(ae.KIND_SNAPSHOT, "ADDED", ready_snapshot("p1", policy="plain"))
    events.observe(ae.KIND_SNAPSHOT, "ADDED", ready_snapshot("p2", policy="plain"))
    events.observe(ae.KIND_SNAPSHOT, "ADDED", ready_snapshot("k1", policy="keep1"))
    events.observe(ae.KIND_SNAPSHOT, "ADDED", snapshot("k2", policy="keep1"))  # not Ready: does not count
    events.observe(ae.KIND_SNAPSHOT, "ADDED", ready_snapshot("k3", ns="ops", policy="keep1"))  # another namespace
    assert not events.retention_due()  # one Ready of keep1 in ml: within its limit
    events.observe(ae.KIND_SNAPSHOT, "MODIFIED", ready_snapshot("k2", policy="keep1"))
    assert events.retention_due()  # two Ready, keep 1
    events.observe(ae.KIND_SNAPSHOT, "DELETED", ready_snapshot("k1", policy="keep1"))
    assert not events.retention_due()
    events.observe(ae.KIND_POLICY, "ADDED", _retaining("idle", ns="ops", timeout="1h"))
    assert not events.retention_due()  # a lastAccessTimeout with no Ready snapshot of it
    events.observe(ae.KIND_SNAPSHOT, "ADDED", ready_snapshot("i1", ns="ops", policy="idle"))
    assert events.retention_due()  # one Ready snapshot may expire by time
    events.observe(ae.KIND_POLICY, "MODIFIED", _retaining("idle", ns="ops", timeout="1h", deleting=True))
    assert not events.retention_due()  # a policy being deleted retains nothing


def test_a_policy_retention_cannot_read_makes_retention_due_so_the_sweep_names_it() -> None:
    events, _cluster, _problems = agent()
    bad = _retaining("odd")
    bad["spec"]["snapshotGroupingRules"] = {"groupRetentionPolicy": {"maxSnapshotCountPerGroup": "many"}}
    events.observe(ae.KIND_POLICY, "ADDED", bad)
    assert events.retention_due()


def test_unknown_types_are_refused_naming_each() -> None:
    with pytest.raises(ae.EventsError) as bad:
        ae.AgentEvents(types=["restore_pod", "capture", "bogus"])
    assert bad.value.message == ("types: unknown event type(s) bogus, capture; known: restore_pod, capture_request, "
                                 "manual_trigger, source_ready, pod_deleted, retention")
    with pytest.raises(ae.EventsError):
        ae.AgentEvents(resync_types=["nope"])


# --- restore_pod -------------------------------------------------------------------------

def test_restore_pod_when_it_becomes_so_then_on_every_resync_while_it_stays_so() -> None:
    events, _cluster, _p = agent()
    assert events.observe("Pod", "ADDED", pod("r", phase="Pending", running=False)) == []
    assert brief(events.observe("Pod", "MODIFIED", pod("r"))) == [("restore_pod", "ml/r", NODE, "modified")]
    in_progress = pod("r", conditions=restored("False", podapi.REASON_IN_PROGRESS))
    assert events.observe("Pod", "MODIFIED", in_progress) == []  # still the same restore pod: no new event
    assert brief(events.resync()) == [("restore_pod", "ml/r", NODE, "resync")]
    assert events.observe("Pod", "MODIFIED", pod("r", conditions=restored("True", podapi.REASON_SUCCEEDED))) == []
    assert events.resync() == []
    assert brief(events.observe("Pod", "ADDED", pod("s"))) == [("restore_pod", "ml/s", NODE, "added")]
    assert brief(events.observe("Pod", "MODIFIED", pod("t"), origin="relist")) == [
        ("restore_pod", "ml/t", NODE, "relist")]


def test_restore_pods_of_other_nodes_are_not_this_agents() -> None:
    events, _c, _p = agent()
    assert events.observe("Pod", "ADDED", pod("r", node="node-2")) == []
    everywhere, _c2, _p2 = agent(node=None)
    assert brief(everywhere.observe("Pod", "ADDED", pod("r", node="node-2"))) == [
        ("restore_pod", "ml/r", "node-2", "added")]


def test_a_snapshot_becoming_ready_re_emits_the_restore_pods_of_its_namespace() -> None:
    events, _c, _p = agent()
    events.observe("Pod", "ADDED", pod("r1"))
    events.observe("Pod", "ADDED", pod("r2", conditions=restored("False", podapi.REASON_IN_PROGRESS)))
    events.observe("Pod", "ADDED", pod("other", ns="web"))
    events.observe("Pod", "ADDED", pod("done", conditions=restored("True", podapi.REASON_SUCCEEDED)))
    assert events.observe("PodSnapshot", "ADDED", snapshot("snap", bound="c")) == []
    ready = ready_snapshot("snap")
    assert brief(events.observe("PodSnapshot", "MODIFIED", ready)) == [
        ("restore_pod", "ml/r1", NODE, "snapshot-ready"), ("restore_pod", "ml/r2", NODE, "snapshot-ready")]
    assert events.observe("PodSnapshot", "MODIFIED", copy.deepcopy(ready)) == []  # still Ready: nothing new
    assert brief(events.observe("PodSnapshot", "ADDED", ready_snapshot("snap2"))) == [
        ("restore_pod", "ml/r1", NODE, "snapshot-ready"), ("restore_pod", "ml/r2", NODE, "snapshot-ready")]


def test_ready_snapshots_of_the_first_lists_do_not_re_emit() -> None:
    events = ae.AgentEvents(NODE, lookup_pod=lambda ns, name: None)
    events.observe("Pod", "ADDED", pod("r"), origin="list")
    events.observe("PodSnapshot", "ADDED", ready_snapshot("snap"), origin="list")
    assert brief(events.start()) == [("restore_pod", "ml/r", NODE, "added")]


def test_pod_deleted_for_restore_pods_only() -> None:
    events, _c, _p = agent()
    events.observe("Pod", "ADDED", pod("r"))
    events.observe("Pod", "ADDED", source("plain"))
    gone = pod("r")
    gone["metadata"]["resourceVersion"] = "9"
    assert brief(events.observe("Pod", "DELETED", gone)) == [("pod_deleted", "ml/r", NODE, "deleted")]
    assert events.observe("Pod", "DELETED", source("plain")) == []
    events.observe("Pod", "ADDED", pod("r2", phase="Pending", running=False))
    assert brief(events.observe("Pod", "DELETED", pod("r2"), origin="relist")) == [
        ("pod_deleted", "ml/r2", NODE, "relist")]
    assert events.resync() == []  # a deleted pod is no longer held


def test_nothing_before_start_and_start_makes_what_holds() -> None:
    cluster = Cluster(source())
    events = ae.AgentEvents(NODE, lookup_pod=cluster.lookup)
    assert events.observe("Pod", "ADDED", pod("r"), origin="list") == []
    assert events.observe("Pod", "ADDED", source(), origin="list") == []
    assert events.observe("Pod", "DELETED", pod("gone"), origin="watch") == []
    assert events.observe("PodSnapshot", "ADDED", snapshot("req"), origin="list") == []
    assert events.observe(ae.KIND_TRIGGER, "ADDED", trigger("t"), origin="list") == []
    assert events.observe("PodSnapshotPolicy", "ADDED", policy("p"), origin="list") == []
    assert events.resync() == []
    assert brief(events.start()) == [("restore_pod", "ml/r", NODE, "added"),
                                     ("capture_request", "ml/req", NODE, "added"),
                                     ("manual_trigger", "ml/t", NODE, "added"),
                                     ("source_ready", "ml/p", NODE, "added")]


def test_unknown_kinds_are_ignored() -> None:
    events, _c, _p = agent()
    assert events.observe("ConfigMap", "ADDED", {"metadata": {"name": "x"}}) == []


# --- capture_request and manual_trigger --------------------------------------------------

def test_capture_request_names_the_source_pods_node_and_carries_it() -> None:
    src = source()
    events, cluster, _p = agent(src)
    out = events.observe("PodSnapshot", "ADDED", snapshot("req"))
    assert brief(out) == [("capture_request", "ml/req", NODE, "added")]
    assert out[0]["warmstart"]["source_pod"] == src and cluster.calls == [("ml", "src")]
    assert events.observe("PodSnapshot", "MODIFIED", snapshot("req", ready="False")) == []  # still pending
    assert brief(events.resync()) == [("capture_request", "ml/req", NODE, "resync")]
    assert events.observe("PodSnapshot", "MODIFIED", snapshot("req", bound="content")) == []
    assert events.resync() == []


def test_capture_request_of_an_absent_source_still_comes_without_node() -> None:
    events, _c, _p = agent()
    out = events.observe("PodSnapshot", "ADDED", snapshot("req"))
    assert brief(out) == [("capture_request", "ml/req", None, "added")] and out[0]["warmstart"]["source_pod"] is None
    other_incarnation, _c2, _p2 = agent(source(uid="uid-new"))
    assert brief(other_incarnation.observe("PodSnapshot", "ADDED", snapshot("req", uid="uid-old"))) == [
        ("capture_request", "ml/req", None, "added")]


def test_capture_request_of_another_nodes_pod_or_an_unscheduled_one_is_not_ours() -> None:
    events, cluster, _p = agent(source(node="node-2"))
    assert events.observe("PodSnapshot", "ADDED", snapshot("req")) == []
    assert events.observe("PodSnapshot", "MODIFIED", snapshot("req", ready="False")) == []
    assert events.resync() == []
    waiting, cluster, _p = agent(source(node=None, phase="Pending"))
    assert waiting.observe("PodSnapshot", "ADDED", snapshot("req")) == []
    cluster.pods[("ml", "src")] = source()  # now scheduled here
    assert brief(waiting.resync()) == [("capture_request", "ml/req", NODE, "resync")]


def test_a_lookup_that_fails_defers_the_event_and_says_why() -> None:
    events, cluster, problems = agent(source())
    cluster.fail = True
    assert events.observe("PodSnapshot", "ADDED", snapshot("req")) == []
    assert problems == ["capture_request ml/req: source pod ml/src not read (API server https://api.test "
                        "unreachable: connection refused); trying again on the next change or resync"]
    cluster.fail = False
    assert brief(events.observe("PodSnapshot", "MODIFIED", snapshot("req"))) == [
        ("capture_request", "ml/req", NODE, "modified")]


def test_manual_trigger_until_triggered() -> None:
    events, cluster, _p = agent(source("target"))
    out = events.observe(ae.KIND_TRIGGER, "ADDED", trigger("t", target="target"))
    assert brief(out) == [("manual_trigger", "ml/t", NODE, "added")]
    assert out[0]["warmstart"]["source_pod"]["metadata"]["name"] == "target"
    assert brief(events.resync()) == [("manual_trigger", "ml/t", NODE, "resync")]
    assert events.observe(ae.KIND_TRIGGER, "MODIFIED", trigger("t", target="target", triggered="True")) == []
    assert events.resync() == []
    assert events.observe(ae.KIND_TRIGGER, "DELETED", trigger("t")) == []
    assert brief(events.observe(ae.KIND_TRIGGER, "ADDED", trigger("u", target="missing"))) == [
        ("manual_trigger", "ml/u", None, "added")]


def test_without_a_lookup_the_watched_pods_are_the_sources() -> None:
    events = ae.AgentEvents(NODE)
    events.start()
    events.observe("Pod", "ADDED", source())
    assert brief(events.observe("PodSnapshot", "ADDED", snapshot("req"))) == [
        ("capture_request", "ml/req", NODE, "added")]


# --- source_ready ------------------------------------------------------------------------

def test_source_ready_for_a_ready_pod_a_workload_policy_selects() -> None:
    events, _c, _p = agent()
    events.observe("PodSnapshotPolicy", "ADDED", policy("p"))
    assert events.observe("Pod", "ADDED", source(ready=False)) == []
    out = events.observe("Pod", "MODIFIED", source())
    assert brief(out) == [("source_ready", "ml/p", NODE, "modified")]
    assert out[0]["warmstart"]["source_pod"]["metadata"]["name"] == "src"
    assert out[0]["warmstart"]["object"]["kind"] == "PodSnapshotPolicy"
    assert events.observe("Pod", "MODIFIED", source()) == []
    assert brief(events.resync()) == [("source_ready", "ml/p", NODE, "resync")]
    # the capture made its PodSnapshot: the pod is no longer a source of that policy
    assert events.observe("PodSnapshot", "ADDED", snapshot("s1", policy="p", bound="c")) == []
    assert events.resync() == []
    # the snapshot went (retention): the pod is a source again
    assert brief(events.observe("PodSnapshot", "DELETED", snapshot("s1", policy="p"))) == [
        ("source_ready", "ml/p", NODE, "modified")]


def test_a_policy_added_later_finds_the_ready_pods_and_one_event_per_policy() -> None:
    events, _c, _p = agent()
    events.observe("Pod", "ADDED", source("a"))
    events.observe("Pod", "ADDED", source("b", labels={"app": "chat"}))
    assert brief(events.observe("PodSnapshotPolicy", "ADDED", policy("p"))) == [
        ("source_ready", "ml/p", NODE, "added")]
    assert brief(events.observe("PodSnapshotPolicy", "ADDED", policy("q", selector={}))) == [
        ("source_ready", "ml/q", NODE, "added"), ("source_ready", "ml/q", NODE, "added")]
    assert events.observe("PodSnapshotPolicy", "DELETED", policy("q")) == []
    assert len(events.resync()) == 1


@pytest.mark.parametrize("obj, pol", [
    (source(), policy("p", trigger_type="manual")),
    (source(restore="snap"), policy("p")),
    (source(node="node-2"), policy("p")),
    (source(phase="Pending", ready=False), policy("p")),
    (source(deleting=True), policy("p")),
    (source(labels={"app": "chat"}), policy("p")),
    (source(ns="web"), policy("p")),
    (source(), policy("p", selector="app=embed")),
], ids=["manual-policy", "restore-pod", "other-node", "not-ready", "deleting", "not-selected", "other-namespace",
        "malformed-selector"])
def test_no_source_ready(obj: JSON, pol: JSON) -> None:
    events, _c, _p = agent(types=["source_ready"])
    events.observe("PodSnapshotPolicy", "ADDED", pol)
    assert events.observe("Pod", "ADDED", obj) == []
    assert events.resync() == []


def test_a_snapshot_of_another_policy_or_pod_does_not_count() -> None:
    events, _c, _p = agent()
    events.observe("PodSnapshot", "ADDED", snapshot("s1", policy="other", bound="c"))
    events.observe("PodSnapshot", "ADDED", snapshot("s2", policy="p", uid="uid-earlier", bound="c"))
    events.observe("PodSnapshot", "ADDED", snapshot("s3", ns="web", policy="p", bound="c"))
    events.observe("PodSnapshotPolicy", "ADDED", policy("p"))
    assert brief(events.observe("Pod", "ADDED", source())) == [("source_ready", "ml/p", NODE, "added")]


def test_start_sees_every_first_list_so_a_pod_with_its_snapshot_is_no_source() -> None:
    events = ae.AgentEvents(NODE)
    events.observe("Pod", "ADDED", source(), origin="list")
    events.observe("PodSnapshotPolicy", "ADDED", policy("p"), origin="list")
    events.observe("PodSnapshot", "ADDED", snapshot("s1", policy="p", bound="c"), origin="list")
    assert events.start() == []


# --- types, resync_types, threads --------------------------------------------------------

def test_only_the_types_asked_for_and_no_lookup_for_the_others() -> None:
    events, cluster, _p = agent(source(), types=["restore_pod"])
    events.observe("PodSnapshotPolicy", "ADDED", policy("p"))
    assert events.observe("Pod", "ADDED", source()) == []
    assert events.observe("PodSnapshot", "ADDED", snapshot("req")) == []
    assert events.observe(ae.KIND_TRIGGER, "ADDED", trigger("t")) == []
    assert events.observe("Pod", "DELETED", pod("r")) == []
    assert cluster.calls == []
    assert brief(events.observe("Pod", "ADDED", pod("r"))) == [("restore_pod", "ml/r", NODE, "added")]


def test_resync_types_narrow_what_a_resync_repeats() -> None:
    events, _c, _p = agent(source(), resync_types=["restore_pod"])
    events.observe("Pod", "ADDED", pod("r"))
    events.observe("PodSnapshot", "ADDED", snapshot("req"))
    assert brief(events.resync()) == [("restore_pod", "ml/r", NODE, "resync")]


def test_observe_is_thread_safe() -> None:
    events, _c, _p = agent(node=None)
    out: List[JSON] = []
    lock = threading.Lock()

    def feed(prefix: str) -> None:
        for i in range(200):
            made = events.observe("Pod", "ADDED", pod(f"{prefix}-{i}"))
            with lock:
                out.extend(made)

    threads = [threading.Thread(target=feed, args=(p,)) for p in "abcd"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(out) == 800 and len(events.resync()) == 800
