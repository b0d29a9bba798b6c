# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""From watched objects to the node agent's events: the event contract of issue 21. Pure, stdlib only.

``AgentEvents`` keeps the objects the watches deliver (pods, PodSnapshots, PodSnapshotManualTriggers,
PodSnapshotPolicies) and answers each change (``observe``) with the events it makes, each
``{"warmstart": {"type", "namespace", "name", "uid", "node", "reason", "object"[, "source_pod"]}}``:

``restore_pod``
    A pod with a restore annotation (``restore-from``, ours or the reference's, or ``restore-select: "true"``),
    on this node (when ``node_name`` is set), phase Running, every container running, not being deleted, and
    ``_podcontract.classify`` Pending (no Restored condition, or RestoreInProgress). Emitted when it becomes so,
    and again for every such pod of a namespace when a PodSnapshot there becomes Ready (reason
    ``snapshot-ready``).
``capture_request``
    A PodSnapshot, not being deleted, with no ``status.boundSnapshotContentName`` and neither a Ready nor a Failed
    condition True. ``node`` and ``source_pod`` are its source pod's (``spec.source.podRef``, read with
    ``lookup_pod``; a pod of another uid than the podRef's counts as absent). An absent source pod still makes the
    event, with ``node`` and ``source_pod`` None (the consumer marks the request Failed); a source pod that is not
    scheduled yet, or on another node than ``node_name``, makes none.
``manual_trigger``
    A PodSnapshotManualTrigger, not being deleted, with no ``Triggered`` condition; its source is
    ``spec.targetPod`` in the trigger's namespace, as for a capture request.
``source_ready``
    A Running + Ready pod (not being deleted, not a restore pod, on this node) that a PodSnapshotPolicy of its
    namespace with ``triggerConfig.type: workload`` (the default) selects (``spec.selector``, a LabelSelector:
    matchLabels and matchExpressions In / NotIn / Exists / DoesNotExist; a missing selector selects nothing),
    when no PodSnapshot there has that ``spec.policyName`` and the pod's uid as ``spec.source.podRef.uid``. The
    event's object is the policy; ``source_pod`` the pod. One event per (pod, policy).
``pod_deleted``
    A watched pod with a restore annotation was deleted (reason ``deleted``; ``relist`` when a re-list found it
    gone).
``retention``
    Not made from an object: the source's timer (``retention_event``, reason ``timer``) says it is time to apply
    the PodSnapshotPolicies' retention on ``node`` (``agent_retention``); its object holds the watched namespaces.
    The timer asks ``retention_due()`` first: only while some policy's retention could remove a snapshot (a
    ``lastAccessTimeout`` and a Ready PodSnapshot of the policy, or more Ready PodSnapshots of it than its
    ``maxSnapshotCountPerGroup``) is the event made - a node with nothing to retain runs no playbook.

Reasons: ``added`` / ``modified`` (the change that made it so), ``relist`` (found by a re-list after 410 Gone),
``resync`` (``resync()``: every event whose condition still holds, of the types in ``resync_types``, is made
again; consumers are idempotent), ``snapshot-ready``, ``deleted``. Until ``start()`` the objects are only kept:
``start()`` then makes the events of everything that holds at once (reason ``added``), so that the order in
which the first lists arrive does not matter (no source_ready for a pod whose PodSnapshot was not listed yet).
Only the event types in ``types`` are made. A ``lookup_pod`` that raises a ``WarmstartError`` defers that event
(to the next change or resync) and tells ``on_problem``. All methods are thread-safe.
"""
from __future__ import annotations

import copy
import threading
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_summaries as summ
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

JSON = Dict[str, Any]
Key = Tuple[str, str]
PodLookup = Callable[[str, str], Optional[JSON]]

RESTORE_POD, CAPTURE_REQUEST, MANUAL_TRIGGER = "restore_pod", "capture_request", "manual_trigger"
SOURCE_READY, POD_DELETED = "source_ready", "pod_deleted"
RETENTION = "retention"  # a tick of the source's timer (``retention_event``), not made from an object
TYPES = (RESTORE_POD, CAPTURE_REQUEST, MANUAL_TRIGGER, SOURCE_READY, POD_DELETED, RETENTION)
LEVEL_TYPES = (RESTORE_POD, CAPTURE_REQUEST, MANUAL_TRIGGER, SOURCE_READY)  # made again on resync
WITH_SOURCE = (CAPTURE_REQUEST, MANUAL_TRIGGER, SOURCE_READY)
REASON_ADDED, REASON_MODIFIED, REASON_RESYNC = "added", "modified", "resync"
REASON_SNAPSHOT_READY, REASON_RELIST, REASON_DELETED = "snapshot-ready", "relist", "deleted"

KIND_POD = "Pod"
KIND_SNAPSHOT = podapi.KIND_SNAPSHOT
KIND_TRIGGER = podapi.KIND_TRIGGER
KIND_POLICY = podapi.KIND_POLICY
ANN_RESTORE_SELECT = podapi.ANN_RESTORE_SELECT  # a restore pod whose snapshot the agent selects when it runs
TRIGGERED_CONDITION = podapi.TRIGGERED_CONDITION


class EventsError(WarmstartError, ValueError):
    """Settings the events cannot be made with (unknown event types)."""


# --- predicates over one object -------------------------------------------------------

def _meta(obj: JSON) -> JSON:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _part(obj: JSON, name: str) -> JSON:
    value = obj.get(name)
    return value if isinstance(value, dict) else {}


def key_of(obj: JSON) -> Key:
    meta = _meta(obj)
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def node_of(pod: Optional[JSON]) -> Optional[str]:
    node = _part(pod, "spec").get("nodeName") if isinstance(pod, dict) else None
    return str(node) if node else None


def deleting(obj: JSON) -> bool:
    return bool(_meta(obj).get("deletionTimestamp"))


def _condition_true(obj: JSON, type_: str) -> bool:
    return (podapi.get_condition(obj, type_) or {}).get("status") == "True"


def is_restore_pod(pod: JSON) -> bool:
    """Whether the pod asks for a restore: a restore-from (ours or nvidia.com's) or restore-select: "true"."""
    annotations, _conflicts = pc.restore_annotations(pod)
    select = str(annotations.get(ANN_RESTORE_SELECT, "")).strip().lower() == "true"
    return bool(annotations.get(podapi.ANN_RESTORE_FROM)) or select


def containers_running(pod: JSON) -> bool:
    """Every container of the spec has a status whose state is running (init containers do not count)."""
    names = [c.get("name") for c in _part(pod, "spec").get("containers") or [] if isinstance(c, dict)]
    states = {s.get("name"): s.get("state") for s in _part(pod, "status").get("containerStatuses") or []
              if isinstance(s, dict)}
    return bool(names) and all(isinstance(states.get(n), dict) and "running" in (states.get(n) or {}) for n in names)


def on_node(pod: JSON, node_name: Optional[str]) -> bool:
    node = node_of(pod)
    return node is not None and (not node_name or node == node_name)


def restore_ready(pod: JSON, node_name: Optional[str]) -> bool:
    """A restore pod of this node whose placeholder runs and whose restore has no outcome yet."""
    return (is_restore_pod(pod) and on_node(pod, node_name) and _part(pod, "status").get("phase") == "Running"
            and containers_running(pod) and not deleting(pod) and pc.classify(pod) == podapi.OUTCOME_PENDING)


def running_and_ready(pod: JSON) -> bool:
    return _part(pod, "status").get("phase") == "Running" and _condition_true(pod, "Ready") and not deleting(pod)


def capture_pending(snapshot: JSON) -> bool:
    """A PodSnapshot that asks for a capture: not bound, neither Ready nor Failed, not being deleted."""
    done = _condition_true(snapshot, podapi.READY_CONDITION) or _condition_true(snapshot, podapi.FAILED_CONDITION)
    return not _part(snapshot, "status").get("boundSnapshotContentName") and not deleting(snapshot) and not done


def trigger_pending(trigger: JSON) -> bool:
    return podapi.get_condition(trigger, TRIGGERED_CONDITION) is None and not deleting(trigger)


def _expression_matches(expr: Any, labels: Dict[str, Any]) -> bool:
    if not isinstance(expr, dict):
        return False
    key, op, values = expr.get("key"), expr.get("operator"), [str(v) for v in expr.get("values") or []]
    if op == "In":
        return key in labels and str(labels[key]) in values
    if op == "NotIn":
        return key not in labels or str(labels[key]) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    return False  # an unknown operator selects nothing


def selector_matches(selector: Any, labels: Optional[Dict[str, Any]]) -> bool:
    """metav1.LabelSelector semantics: every matchLabels pair and every expression; ``{}`` selects all, None none."""
    if not isinstance(selector, dict):
        return False
    have = labels or {}
    match = selector.get("matchLabels") or {}
    if not isinstance(match, dict) or any(k not in have or str(have[k]) != str(v) for k, v in match.items()):
        return False
    return all(_expression_matches(e, have) for e in selector.get("matchExpressions") or [])


def is_workload_policy(policy: JSON) -> bool:
    return (_part(_part(policy, "spec"), "triggerConfig").get("type") or "workload") == "workload"


def snapshot_source(snapshot: JSON) -> Tuple[str, str]:
    """(name, uid) of a PodSnapshot's source pod (``spec.source.podRef``); "" when not given."""
    ref = _part(_part(_part(snapshot, "spec"), "source"), "podRef")
    return str(ref.get("name") or ""), str(ref.get("uid") or "")


def make_event(type_: str, obj: JSON, node: Optional[str], reason: str, source_pod: Optional[JSON] = None) -> JSON:
    """One event of the contract (copies of the objects)."""
    meta = _meta(obj)
    body: JSON = {"type": type_, "namespace": str(meta.get("namespace") or ""), "name": str(meta.get("name") or ""),
                  "uid": str(meta.get("uid") or ""), "node": node, "reason": reason, "object": copy.deepcopy(obj)}
    if type_ in WITH_SOURCE:
        body["source_pod"] = copy.deepcopy(source_pod)
    return {"warmstart": body}


def retention_event(node: Optional[str], namespaces: List[Optional[str]]) -> JSON:
    """The timer's event: time to apply the PodSnapshotPolicies' retention (``agent_retention``) on ``node``."""
    return {"warmstart": {"type": RETENTION, "namespace": "", "name": "", "uid": "", "node": node, "reason": "timer",
                          "object": {"namespaces": [n for n in namespaces if n]}}}


def _types(value: Optional[Iterable[str]], default: Iterable[str], what: str) -> Set[str]:
    chosen = set(default if value is None else value)
    unknown = sorted(chosen - set(TYPES))
    if unknown:
        raise EventsError(f"{what}: unknown event type(s) {', '.join(unknown)}; known: {', '.join(TYPES)}")
    return chosen


class AgentEvents:
    """The objects seen so far and which of them hold an event's condition now (see the module docstring)."""

    def __init__(self, node_name: Optional[str] = None, types: Optional[Iterable[str]] = None,
                 lookup_pod: Optional[PodLookup] = None, resync_types: Optional[Iterable[str]] = None,
                 on_problem: Optional[Callable[[str], None]] = None) -> None:
        self.node_name = node_name or None
        self.types = _types(types, TYPES, "types")
        self.resync_types = _types(resync_types, LEVEL_TYPES, "resync_types") & set(LEVEL_TYPES)
        self.lookup_pod = lookup_pod
        self.on_problem = on_problem or (lambda _message: None)
        self.started = False
        self.objects: Dict[str, Dict[Key, JSON]] = {KIND_POD: {}, KIND_SNAPSHOT: {}, KIND_TRIGGER: {}, KIND_POLICY: {}}
        self.holding: Dict[str, Set[Any]] = {RESTORE_POD: set(), CAPTURE_REQUEST: set(), MANUAL_TRIGGER: set(),
                                             SOURCE_READY: set()}
        self.ready: Set[Key] = set()  # PodSnapshots that are Ready
        self._lock = threading.RLock()

    @property
    def pods(self) -> Dict[Key, JSON]:
        return self.objects[KIND_POD]

    # -- entry points --------------------------------------------------------------

    def observe(self, kind: str, type_: str, obj: JSON, origin: str = "watch") -> List[JSON]:
        """One change (ADDED / MODIFIED / DELETED of a ``kind``; origin list / watch / relist): the events it makes."""
        reason = REASON_RELIST if origin == "relist" else REASON_ADDED if type_ == "ADDED" else REASON_MODIFIED
        with self._lock:
            if kind not in self.objects:
                return []
            key = key_of(obj)
            before = self.objects[kind].pop(key, None) if type_ == "DELETED" else self.objects[kind].get(key)
            if type_ != "DELETED":
                self.objects[kind][key] = obj
            if not self.started:
                return []
            if kind == KIND_POD:
                return self._pod_changed(key, before, obj if type_ != "DELETED" else None, reason)
            if kind == KIND_SNAPSHOT:
                return self._snapshot_changed(key, reason)
            if kind == KIND_TRIGGER:
                return self._pending_changed(MANUAL_TRIGGER, key, reason)
            return self._sources_changed(self._pairs(namespace=key[0]), reason)

    def start(self) -> List[JSON]:
        """From now on changes make events; the events of everything that holds now (reason ``added``)."""
        with self._lock:
            self.started = True
            self.ready = {k for k, s in self.objects[KIND_SNAPSHOT].items() if podapi.is_ready(s)}
            return self._everything(self.types & set(LEVEL_TYPES), REASON_ADDED)

    def resync(self) -> List[JSON]:
        """Every event of ``resync_types`` whose condition holds now, again (reason ``resync``)."""
        with self._lock:
            if not self.started:
                return []
            return self._everything(self.types & self.resync_types, REASON_RESYNC)

    def retention_due(self) -> bool:
        """Whether ``agent_retention`` could remove a snapshot now: some policy (not being deleted) with a
        ``lastAccessTimeout`` has a Ready PodSnapshot, or one with a ``maxSnapshotCountPerGroup`` has more Ready
        PodSnapshots than that (its groups are subsets: fewer in all means fewer in each)."""
        with self._lock:
            ready: Dict[Key, int] = {}
            for key, snap in self.objects[KIND_SNAPSHOT].items():
                if podapi.is_ready(snap) and not deleting(snap):
                    policy_key = (key[0], str(_part(snap, "spec").get("policyName") or ""))
                    ready[policy_key] = ready.get(policy_key, 0) + 1
            for key, policy in self.objects[KIND_POLICY].items():
                if deleting(policy):
                    continue
                try:
                    settings = summ.policy_settings(policy)
                except (TypeError, ValueError):
                    return True  # a policy the sweep cannot read either: agent_retention names it
                count = ready.get(key, 0)
                if (settings["last_access_timeout"] and count) or (settings["max_per_group"] and
                                                                   count > settings["max_per_group"]):
                    return True
            return False

    # -- what holds ----------------------------------------------------------------

    def _everything(self, types: Set[str], reason: str) -> List[JSON]:
        """The events of everything of ``types`` that holds now (what is held is computed afresh)."""
        out: List[JSON] = []
        if RESTORE_POD in types:
            self.holding[RESTORE_POD] = {k for k, p in self.pods.items() if restore_ready(p, self.node_name)}
            out += [make_event(RESTORE_POD, self.pods[k], node_of(self.pods[k]), reason)
                    for k in sorted(self.holding[RESTORE_POD])]
        for type_ in (CAPTURE_REQUEST, MANUAL_TRIGGER):
            if type_ in types:
                self.holding[type_] = set()
                for key in sorted(self.objects[self._kind(type_)]):
                    out += self._pending_changed(type_, key, reason)
        if SOURCE_READY in types:
            self.holding[SOURCE_READY] = set()
            out += self._sources_changed(self._pairs(), reason)
        return out

    def _pod_changed(self, key: Key, before: Optional[JSON], pod: Optional[JSON], reason: str) -> List[JSON]:
        out: List[JSON] = []
        now = pod is not None and restore_ready(pod, self.node_name)
        was = key in self.holding[RESTORE_POD]
        (self.holding[RESTORE_POD].add if now else self.holding[RESTORE_POD].discard)(key)
        if now and not was and RESTORE_POD in self.types and pod is not None:
            out.append(make_event(RESTORE_POD, pod, node_of(pod), reason))
        if pod is None and before is not None and POD_DELETED in self.types and is_restore_pod(before) \
                and (not self.node_name or node_of(before) in (None, self.node_name)):
            out.append(make_event(POD_DELETED, before, node_of(before),
                                  REASON_RELIST if reason == REASON_RELIST else REASON_DELETED))
        return out + self._sources_changed(self._pairs(pod_key=key), reason)

    def _snapshot_changed(self, key: Key, reason: str) -> List[JSON]:
        out = self._pending_changed(CAPTURE_REQUEST, key, reason)
        snapshot = self.objects[KIND_SNAPSHOT].get(key)
        now_ready = snapshot is not None and podapi.is_ready(snapshot)
        if now_ready and key not in self.ready and RESTORE_POD in self.types:
            out += [make_event(RESTORE_POD, self.pods[k], node_of(self.pods[k]), REASON_SNAPSHOT_READY)
                    for k in sorted(self.holding[RESTORE_POD]) if k[0] == key[0] and k in self.pods]
        (self.ready.add if now_ready else self.ready.discard)(key)
        return out + self._sources_changed(self._pairs(namespace=key[0]), reason)

    @staticmethod
    def _kind(type_: str) -> str:
        return KIND_SNAPSHOT if type_ == CAPTURE_REQUEST else KIND_TRIGGER

    def _pending_changed(self, type_: str, key: Key, reason: str) -> List[JSON]:
        """A capture request or manual trigger: its event when it becomes pending (``_everything`` clears
        ``holding`` first, so there every pending one makes its event)."""
        obj = self.objects[self._kind(type_)].get(key)
        pending = obj is not None and (capture_pending(obj) if type_ == CAPTURE_REQUEST else trigger_pending(obj))
        if not pending or obj is None:
            self.holding[type_].discard(key)
            return []
        if key in self.holding[type_] or type_ not in self.types:
            return []
        return self._source_event(type_, obj, key, reason)

    def _source_event(self, type_: str, obj: JSON, key: Key, reason: str) -> List[JSON]:
        """The event of a request whose source pod is read now; none while it cannot be (deferred)."""
        if type_ == CAPTURE_REQUEST:
            name, uid = snapshot_source(obj)
        else:
            name, uid = str(_part(obj, "spec").get("targetPod") or ""), ""
        try:
            pod = self._lookup(key[0], name) if name else None
        except WarmstartError as exc:
            self.on_problem(f"{type_} {key[0]}/{key[1]}: source pod {key[0]}/{name} not read ({exc}); "
                            "trying again on the next change or resync")
            return []
        if pod is not None and uid and _meta(pod).get("uid") != uid:
            pod = None  # another incarnation of that name: the source is gone
        if pod is not None and node_of(pod) is None:
            return []  # not scheduled yet: a later resync sees it
        self.holding[type_].add(key)
        if pod is not None and self.node_name and node_of(pod) != self.node_name:
            return []  # another node's agent captures it
        return [make_event(type_, obj, node_of(pod), reason, pod)]

    def _lookup(self, namespace: str, name: str) -> Optional[JSON]:
        if self.lookup_pod is not None:
            return self.lookup_pod(namespace, name)
        return self.pods.get((namespace, name))

    # -- source_ready --------------------------------------------------------------

    def _pairs(self, namespace: Optional[str] = None, pod_key: Optional[Key] = None) -> List[Tuple[Key, Key]]:
        """(pod, policy) pairs of one namespace (or one pod, or all) to look at again, known or held."""
        pods = [pod_key] if pod_key is not None else [k for k in self.pods if namespace is None or k[0] == namespace]
        policies = list(self.objects[KIND_POLICY])
        pairs = {(p, q) for p in pods for q in policies if p[0] == q[0]}
        pairs |= {pair for pair in self.holding[SOURCE_READY]
                  if (pod_key is None or pair[0] == pod_key) and (namespace is None or pair[0][0] == namespace)}
        return sorted(pairs)

    def _source_holds(self, pod: Optional[JSON], policy: Optional[JSON]) -> bool:
        if pod is None or policy is None or not is_workload_policy(policy):
            return False
        if not (running_and_ready(pod) and on_node(pod, self.node_name) and not is_restore_pod(pod)):
            return False
        if not selector_matches(_part(policy, "spec").get("selector"), _meta(pod).get("labels")):
            return False
        policy_name, uid = str(_meta(policy).get("name") or ""), str(_meta(pod).get("uid") or "")
        namespace = key_of(pod)[0]
        return not any(k[0] == namespace and _part(s, "spec").get("policyName") == policy_name
                       and snapshot_source(s)[1] == uid for k, s in self.objects[KIND_SNAPSHOT].items())

    def _sources_changed(self, pairs: List[Tuple[Key, Key]], reason: str) -> List[JSON]:
        out: List[JSON] = []
        held = self.holding[SOURCE_READY]
        for pod_key, policy_key in pairs:
            pod, policy = self.pods.get(pod_key), self.objects[KIND_POLICY].get(policy_key)
            now = self._source_holds(pod, policy)
            was = (pod_key, policy_key) in held
            (held.add if now else held.discard)((pod_key, policy_key))
            if now and not was and SOURCE_READY in self.types and pod is not None and policy is not None:
                out.append(make_event(SOURCE_READY, policy, node_of(pod), reason, pod))
        return out
