# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node agent's restore of one pod: decide, claim, restore on this node, record.

An event (``k8s_events``) says a restore pod may need its restore; this module decides from the pod as the API
server has it *now*, so a stale, repeated or replayed event does nothing. Invariants:

- **One attempt per pod.** A restore starts only after the claim: one merge patch, guarded by the pod's
  resourceVersion, that sets the annotation ``snapshot.warmstart.io/restore-attempt: <agent> <time>`` and the
  finalizer. Two agents racing for a pod: one patch wins, the other gets 409 and skips. The Restored condition
  then says RestoreInProgress.
- **No replay.** A pod that carries an attempt but no final Restored reason was claimed by an agent that did not
  record the outcome (it was killed or restarted). Its own agent *recovers* it from the node's sentinels - the
  ``restore-complete`` / ``restore-failed`` control files the restore writes, and whether a restore of it still
  holds the node's lock - and never runs CRIU over it again: complete is Succeeded; failed, or no sentinel at all
  (a restore may have half-run), is Failed and the placeholder is killed (or started cold, see below).
- **Waiting is not an attempt.** A pod whose PodSnapshot does not exist or is not Ready yet gets the condition
  ``False`` / ``RestoreInProgress`` with a message that starts ``waiting:`` and says why; it is not claimed, and
  the next event for it (a resync, or its snapshot becoming Ready) tries again.
- **Refusals spend the attempt before anything is touched.** A snapshot that cannot be restored into this pod
  (another pod spec, a broken binding, conflicting annotations) is claimed and recorded RestoreIncompatible with
  every reason; the node is not asked. So is a pod that selects its snapshot at restore when Ready snapshots fit
  its spec but none was taken on a node like this one (``Node.fit``, ``_selection.node_fit``).
- **A store that fails for a while is not the pod's fault.** A restore that stops on a transient store error
  (the endpoint unreachable or cut off, the server overloaded: the error's ``transient`` detail) before any
  process was touched gives the attempt back: the claim is lifted, the annotation
  ``snapshot.warmstart.io/restore-retry: <tries> <not before>`` says when the next event may try again (backoff
  doubling from ``RETRY_BASE`` seconds), and the condition says it waits. After ``RETRY_LIMIT`` tries the attempt
  is spent (RestoreFailed). A download cut off resumes from what was verified.
- **Cold-start fallback** (pod annotation ``snapshot.warmstart.io/restore-fallback: cold-start``, or the agent's
  ``fallback`` setting): when the restore fails or is refused, the placeholder is not killed; the node writes
  ``cold-start`` into each container's snapshot-control dir, and a standby-aware entrypoint starts the app cold.
  The condition still says RestoreFailed / RestoreIncompatible, and its message says it started cold.

The node side (restore, attempt state, cold start, kill) is the ``Node`` protocol; ``_agent_node.LocalNode`` is
the real one, tests pass their own. No Ansible import here.
"""
from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Protocol, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_restorepods as rpods
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_storage as storage
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _selection as selection
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import Cluster, K8sError, now

JSON = Dict[str, Any]

ANN_ATTEMPT = podapi.GROUP + "/restore-attempt"
ANN_FALLBACK = podapi.ANN_RESTORE_FALLBACK
FALLBACK_COLD_START = podapi.FALLBACK_COLD_START
FALLBACKS = podapi.FALLBACKS
ANN_RETRY = podapi.GROUP + "/restore-retry"
WAITING = "waiting: "
CLAIM_TRIES = 3
RETRY = "retry"          # a NodeResult outcome: stopped by a transient store error, nothing touched
RETRY_LIMIT = 5          # tries of one pod's restore the store may fail before the attempt is spent
RETRY_BASE = 15.0        # seconds before the first retry; doubled for each later one
RETRY_CAP = 600.0

# attempt states the node reports for a claimed pod
COMPLETE, FAILED, RUNNING, UNFINISHED = "complete", "failed", "running", "unfinished"


@dataclass
class Work:
    """What the node restores for one pod: the plan of ``_k8s_restorepods.restore_plan`` plus where it is."""

    namespace: str
    name: str
    uid: str
    snapshot: str
    snapshot_id: Optional[str]
    store: JSON
    pairs: List[JSON]
    skip_compat_check: bool = False
    cold_start: bool = False
    created: Optional[float] = None  # the PodSnapshot's status.createdAt (epoch s): the snapshot's age at restore
    running_since: Optional[float] = None  # when the placeholder containers were all running (epoch s)
    size: int = 0  # the PodSnapshot's status.size (bytes)
    retries: int = 0  # earlier tries the store failed (the pod's restore-retry annotation)
    also: List[str] = field(default_factory=list)  # the reference's condition, for a pod that speaks its contract
    # the snapshot's policy's store options (its storage config's, with its credentials Secret): never logged
    store_options: JSON = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, pod: JSON, plan: Optional[JSON], fallback: bool) -> "Work":
        meta = pod.get("metadata") or {}
        plan = plan or {}
        store = plan.get("store") or {}
        return cls(namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""),
                   uid=str(meta.get("uid") or ""), snapshot=str(plan.get("pod_snapshot_name") or ""),
                   snapshot_id=store.get("snapshot_id"), store=dict(store),
                   pairs=list(plan.get("pairs") or []) if plan else _every_container(pod),
                   skip_compat_check=bool(plan.get("skip_compat_check")), cold_start=fallback,
                   also=pc.reference_conditions(pod))


def _every_container(pod: JSON) -> List[JSON]:
    """Without a plan (a refusal), every container of the pod is a placeholder to start cold or kill."""
    ids = {c.get("name"): c.get("containerID") for c in podapi.dicts_of((pod.get("status") or {}).get("containerStatuses"))}
    return [{"container": c["name"], "container_id": ids.get(c["name"])}
            for c in podapi.dicts_of((pod.get("spec") or {}).get("containers")) if c.get("name")]


@dataclass
class NodeResult:
    """A node's restore of one pod: the outcome name of ``_k8s_restorepods.OUTCOMES`` and what to say about it."""

    outcome: str
    message: str
    details: JSON = field(default_factory=dict)


class Node(Protocol):
    """The node-side steps (``_agent_node.LocalNode`` on a real node)."""

    def restore(self, work: Work) -> NodeResult:
        """Restore ``work`` into its placeholders; never raises for a failed restore (the result says it). With
        ``work.cold_start`` a failed restore leaves the placeholders running and writes ``cold-start``. A restore
        stopped by a transient store error before anything was touched is outcome ``RETRY``, placeholders as
        they were."""

    def attempt_state(self, work: Work) -> str:
        """``complete``, ``failed``, ``running`` (a restore of it holds the lock now) or ``unfinished``."""

    def give_up(self, work: Work) -> str:
        """The attempt is spent without a restore: start cold (``work.cold_start``) or kill the placeholders;
        says which."""

    def fit(self) -> Optional[JSON]:
        """This node in a PodSnapshotContent's ``status.source`` terms (arch, cpuVendor, gpuModels), for
        selecting a snapshot taken on a node like it; None: selection does not compare nodes."""


# --- deciding -------------------------------------------------------------------------------------

def fallback_of(pod: JSON, default: str) -> bool:
    """Whether a failed restore of ``pod`` starts it cold: its annotation, else the agent's ``default``."""
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANN_FALLBACK, default)
    return str(value).strip().lower() == FALLBACK_COLD_START


def _containers_running(pod: JSON) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    wanted = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
    running = {s.get("name") for s in statuses if "running" in ((s.get("state") or {}))}
    return bool(wanted) and all(name in running for name in wanted)


def retry_of(pod: JSON) -> Tuple[int, Optional[float]]:
    """``(tries the store failed, not before: epoch s)`` from the pod's restore-retry annotation; (0, None)."""
    value = str(((pod.get("metadata") or {}).get("annotations") or {}).get(ANN_RETRY) or "").split()
    try:
        return (int(value[0]), _epoch(value[1])) if len(value) == 2 and int(value[0]) > 0 else (0, None)
    except ValueError:
        return 0, None


def decide(pod: JSON, agent: str, node_name: Optional[str], at: Optional[float] = None) -> Tuple[str, str]:
    """``(action, why)`` for ``pod`` as it is now (``at``, epoch s: now): ``skip``, ``recover`` (this agent's
    unrecorded attempt) or ``restore`` (the snapshot is looked at next). Pure given ``at``."""
    meta = pod.get("metadata") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    if meta.get("deletionTimestamp") and podapi.FINALIZER not in (meta.get("finalizers") or []):
        return "skip", "the pod is being deleted"
    if node_name and node != node_name:
        return "skip", f"the pod runs on node {node or '(none yet)'}, not on this agent's node {node_name}"
    if not pc.is_restore_pod(pod):
        return "skip", "not a restore pod (neither restore-from nor restore-select)"
    outcome = pc.classify(pod)
    if outcome != "Pending":
        return "skip", f"its restore already ran ({outcome})"
    attempt = str((meta.get("annotations") or {}).get(ANN_ATTEMPT) or "")
    if attempt:
        holder = attempt.split(" ", 1)[0]
        if holder != agent:
            return "skip", f"agent {holder} claimed it ({attempt})"
        return "recover", f"this agent claimed it ({attempt}) and did not record the outcome"
    if meta.get("deletionTimestamp"):
        return "skip", "the pod is being deleted"
    if not _containers_running(pod):
        return "skip", "its containers are not all running yet"
    tries, not_before = retry_of(pod)
    if not_before is not None and not_before > (time.time() if at is None else at):
        return "skip", f"the store failed {tries} time(s); the next try is not before {now(not_before)}"
    return "restore", ""


def wait_reasons(cluster: Cluster, pod: JSON) -> Tuple[List[str], Optional[JSON]]:
    """Why ``pod``'s PodSnapshot cannot be restored from *yet* (it does not exist, or is not Ready and has not
    failed), and the PodSnapshot; no reasons when it is Ready or has failed for good (``restore_plan`` then says
    the rest)."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    source = pc.restore_annotations(pod)[0].get(podapi.ANN_RESTORE_FROM)
    snap = cluster.find(podapi.KIND_SNAPSHOT, str(source), namespace)
    if snap is None:
        return [f"PodSnapshot {namespace}/{source} does not exist yet"], None
    failed = podapi.get_condition(snap, podapi.FAILED_CONDITION)
    if failed and failed.get("status") == "True":
        return [], snap
    ready = podapi.get_condition(snap, podapi.READY_CONDITION)
    if not ready or ready.get("status") != "True":
        why = f"{ready.get('reason')}: {ready.get('message')}" if ready else "no Ready condition"
        return [f"PodSnapshot {namespace}/{source} is not Ready yet ({why})"], snap
    return [], snap


def _epoch(stamp: Any) -> Optional[float]:
    """An API timestamp (RFC 3339, UTC) as seconds since the epoch; None when absent or unreadable."""
    try:
        return datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def running_since(pod: JSON) -> Optional[float]:
    """When the last of ``pod``'s containers started running (its placeholder is up from then), epoch seconds."""
    starts = [_epoch(((s.get("state") or {}).get("running") or {}).get("startedAt"))
              for s in (pod.get("status") or {}).get("containerStatuses") or []]
    known = [t for t in starts if t is not None]
    return max(known) if known and len(known) == len(starts) else None


# --- writing ----------------------------------------------------------------------------------------

def claim(cluster: Cluster, pod: JSON, agent: str) -> Optional[JSON]:
    """Claim ``pod``'s one attempt (attempt annotation + finalizer, guarded by its resourceVersion); the pod, or
    None when it changed since it was read (another agent, or the kubelet: read it again and decide again)."""
    meta = pod.get("metadata") or {}
    finalizers = list(meta.get("finalizers") or [])
    if podapi.FINALIZER not in finalizers:
        finalizers.append(podapi.FINALIZER)
    patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"), "finalizers": finalizers,
                          "annotations": {ANN_ATTEMPT: f"{agent} {now()}"}}}
    try:
        return cluster.patch("Pod", str(meta.get("name")), patch, str(meta.get("namespace")))
    except K8sError as exc:
        if exc.conflict:
            return None
        raise


def mark_waiting(cluster: Cluster, pod: JSON, reasons: List[str]) -> bool:
    """Say in the Restored condition why ``pod`` waits (RestoreInProgress, as the reference's Pending); changed?"""
    meta = pod.get("metadata") or {}
    changed, _pod = cluster.set_pod_condition(str(meta.get("namespace")), str(meta.get("name")),
                                              podapi.RESTORE_CONDITION, "False", podapi.REASON_IN_PROGRESS,
                                              WAITING + "; ".join(reasons), also=pc.reference_conditions(pod))
    return changed


def _in_progress(cluster: Cluster, work: Work, node: str) -> None:
    cluster.set_pod_condition(work.namespace, work.name, podapi.RESTORE_CONDITION, "False", podapi.REASON_IN_PROGRESS,
                              f"restoring from PodSnapshot {work.snapshot} on node {node or '?'}", also=work.also)


def settle(cluster: Cluster, work: Work, outcome: str, message: str) -> JSON:
    """Record ``outcome`` (Restored condition, finalizer released: ``finish_restore``); the result fields."""
    try:
        done = rpods.finish_restore(cluster, work.namespace, work.name, outcome, message[:32000])
    except K8sError as exc:
        return {"recorded": False, "record_error": str(exc)}
    return {"recorded": True, "pod_outcome": done.get("pod_outcome")}


# --- one pod ---------------------------------------------------------------------------------------

@dataclass
class Settings:
    """The agent's settings for one pod's restore (module options)."""

    namespace: str
    name: str
    uid: Optional[str] = None
    agent: str = "agent"
    node_name: Optional[str] = None
    fallback: str = "none"
    running_timeout: float = 900.0
    running_poll: float = 1.0

    @classmethod
    def of(cls, p: Mapping[str, Any]) -> "Settings":
        return cls(namespace=p.get("namespace") or "default", name=p["name"], uid=p.get("uid") or None,
                   agent=p.get("agent_id") or p.get("node_name") or "agent", node_name=p.get("node_name") or None,
                   fallback=p.get("fallback") or "none")


def restore_pod(cluster: Cluster, s: Settings, node: Node, check_mode: bool = False) -> JSON:
    """Handle one restore pod once (see the module docstring); the result says ``action`` and why."""
    for _try in range(CLAIM_TRIES):
        pod = cluster.find("Pod", s.name, s.namespace)
        if pod is None:
            return _skip(s, "the pod no longer exists")
        if s.uid and (pod.get("metadata") or {}).get("uid") != s.uid:
            return _skip(s, f"the pod was replaced (uid {s.uid} is gone)")
        action, why = decide(pod, s.agent, s.node_name)
        if action == "skip":
            return _skip(s, why, pc.classify(pod))
        if action == "recover":
            return _recover(cluster, s, pod, node, check_mode)
        done = _try_restore(cluster, s, pod, node, check_mode)
        if done is not None:
            return done
    return _skip(s, f"the pod kept changing while it was claimed ({CLAIM_TRIES} tries); the next event retries")


def _skip(s: Settings, why: str, pod_outcome: Optional[str] = None) -> JSON:
    return {"changed": False, "action": "skipped", "pod_ref": f"{s.namespace}/{s.name}", "reason": why, "outcome": None,
            "pod_outcome": pod_outcome}


def _try_restore(cluster: Cluster, s: Settings, pod: JSON, node: Node, check_mode: bool) -> Optional[JSON]:
    """Wait, refuse or restore ``pod``; None when the claim lost to a concurrent change (decide again)."""
    ref = f"{s.namespace}/{s.name}"
    try:  # a pod that selects its snapshot at restore gets the newest fitting one pinned first
        pod, pinned, unfit = rpods.pin_selected(cluster, pod, check_mode, node.fit())
    except K8sError as exc:
        if exc.conflict:
            return None
        raise
    if pinned is None and any(selection.NODE_MISFIT in r for r in unfit):
        return _unfit_node(cluster, s, pod, node, unfit, check_mode)
    waiting, snap = (unfit, None) if pinned is None else wait_reasons(cluster, pod)
    if waiting:
        changed = False if check_mode else mark_waiting(cluster, pod, waiting)
        return {"changed": changed, "action": "waiting", "pod_ref": ref, "reasons": waiting, "outcome": None,
                "pod_outcome": podapi.OUTCOME_PENDING}
    fallback = fallback_of(pod, s.fallback)
    try:
        plan: Optional[JSON] = rpods.restore_plan(cluster, pod)
        options = store_options(cluster, s.namespace, plan or {})
        refusal: List[str] = []
    except K8sError as exc:
        plan, options, refusal = None, {}, exc.reasons or [exc.message]
    if check_mode:
        return {"changed": True, "action": "would refuse" if refusal else "would restore", "pod_ref": ref,
                "reasons": refusal, "outcome": None, "pod_outcome": podapi.OUTCOME_PENDING}
    if claim(cluster, pod, s.agent) is None:
        return None
    work = Work.of(pod, plan, fallback)
    work.store_options = options
    work.created = _epoch(((snap or {}).get("status") or {}).get("createdAt"))
    work.running_since = running_since(pod)
    work.size = int(((snap or {}).get("status") or {}).get("size") or 0)
    work.retries = retry_of(pod)[0]
    if refusal:
        return _refused(cluster, s, work, node, refusal)
    return _restore(cluster, s, work, node)


def store_options(cluster: Cluster, namespace: str, plan: JSON) -> JSON:
    """The store options of the snapshot's PodSnapshotPolicy (``_k8s_storage.resolve_store``: its storage config's
    options and credentials Secret) when that policy's store is the one the content names; {} without a policy
    (the node's own options apply). A policy whose store cannot be resolved (its Secret unreadable) raises."""
    policy, url = plan.get("policy_name"), (plan.get("store") or {}).get("url")
    if not policy or not url:
        return {}
    try:
        where = storage.resolve_store(cluster, namespace, policy=str(policy))
    except K8sError as exc:
        if exc.not_found and exc.what == f"{podapi.KIND_POLICY} {namespace}/{policy}":
            return {}  # the policy is gone: the node's own options
        raise
    return dict(where.get("store_options") or {}) if where.get("store") == url else {}


def _unfit_node(cluster: Cluster, s: Settings, pod: JSON, node: Node, reasons: List[str], check_mode: bool
                ) -> Optional[JSON]:
    """Ready snapshots fit the pod but none was taken on a node like this one: waiting would not help (the pod
    is scheduled here), so the attempt is spent as a refusal (a cold start with the fallback)."""
    if check_mode:
        return {"changed": True, "action": "would refuse", "pod_ref": f"{s.namespace}/{s.name}", "reasons": reasons,
                "outcome": None, "pod_outcome": podapi.OUTCOME_PENDING}
    if claim(cluster, pod, s.agent) is None:
        return None
    return _refused(cluster, s, Work.of(pod, None, fallback_of(pod, s.fallback)), node, reasons)


def _refused(cluster: Cluster, s: Settings, work: Work, node: Node, reasons: List[str]) -> JSON:
    """The snapshot cannot go into this pod: the attempt is spent (claimed), nothing restored."""
    fate = node.give_up(work) if work.cold_start else "left as it is"
    message = "; ".join(reasons) + ("; started cold" if fate == "started cold" else "")
    out = {"changed": True, "action": "refused", "pod_ref": f"{s.namespace}/{s.name}", "outcome": "incompatible",
           "reasons": reasons, "placeholder": fate}
    out.update(settle(cluster, work, "incompatible", message))
    return out


def _restore(cluster: Cluster, s: Settings, work: Work, node: Node) -> JSON:
    """Claimed: say so, restore on the node, record the outcome."""
    _in_progress(cluster, work, s.node_name or "")
    started = time.monotonic()
    result = node.restore(work)
    if result.outcome == RETRY:
        if work.retries + 1 < RETRY_LIMIT:
            return _retry_later(cluster, s, work, result)
        result = NodeResult("failed", f"{result.message}; the store failed {RETRY_LIMIT} tries, the attempt is "
                                      f"spent; placeholder {node.give_up(work)}", result.details)
    out = {"changed": True, "action": "restored", "pod_ref": f"{s.namespace}/{s.name}", "outcome": result.outcome,
           "message": result.message, "pod_snapshot_name": work.snapshot, "seconds": round(time.monotonic() - started, 3)}
    if work.running_since is not None:  # placeholder running -> restore complete (the agent's own latency in)
        out["ready_seconds"] = round(time.time() - work.running_since, 3)
    out["snapshot_bytes"] = work.size
    if work.created is not None:
        out["snapshot_age_seconds"] = round(time.time() - work.created, 3)
    out.update(result.details)
    out.update(settle(cluster, work, result.outcome, result.message))
    return out


def _retry_later(cluster: Cluster, s: Settings, work: Work, result: NodeResult) -> JSON:
    """A transient store error before anything was touched: give the attempt back, say when it is tried again."""
    tries = work.retries + 1
    not_before = time.time() + min(RETRY_CAP, RETRY_BASE * 2 ** (tries - 1))
    for _try in range(CLAIM_TRIES):
        pod = cluster.get("Pod", work.name, work.namespace)
        meta = pod.get("metadata") or {}
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                              "finalizers": [f for f in meta.get("finalizers") or [] if f != podapi.FINALIZER],
                              "annotations": {ANN_ATTEMPT: None, ANN_RETRY: f"{tries} {now(not_before)}"}}}
        try:
            cluster.patch("Pod", work.name, patch, work.namespace)
            break
        except K8sError as exc:
            if not exc.conflict:
                raise
    else:
        raise K8sError(f"Pod {work.namespace}/{work.name}: its attempt could not be given back: the pod kept "
                       "changing", "Pod")
    why = (f"the store failed before anything was touched ({result.message}); try {tries} of {RETRY_LIMIT} failed, "
           f"the next is not before {now(not_before)}")
    mark_waiting(cluster, pod, [why])
    return {"changed": True, "action": "waiting", "pod_ref": f"{s.namespace}/{s.name}", "reasons": [why],
            "outcome": None, "pod_outcome": podapi.OUTCOME_PENDING, "retry": tries, "retry_at": now(not_before),
            "message": result.message}


def _recover(cluster: Cluster, s: Settings, pod: JSON, node: Node, check_mode: bool) -> JSON:
    """This agent's claimed, unrecorded attempt: record what the node shows; never restore it again."""
    try:
        plan: Optional[JSON] = rpods.restore_plan(cluster, pod)
    except K8sError:
        plan = None
    work = Work.of(pod, plan, fallback_of(pod, s.fallback))
    state = node.attempt_state(work) if work.pairs else UNFINISHED
    deadline = time.monotonic() + s.running_timeout
    while state == RUNNING and time.monotonic() < deadline:
        time.sleep(s.running_poll)
        state = node.attempt_state(work)
    ref = f"{s.namespace}/{s.name}"
    if check_mode:
        return {"changed": True, "action": "would recover", "pod_ref": ref, "attempt_state": state}
    if state == COMPLETE:
        outcome, message = "succeeded", "restored (recorded after the agent restarted)"
    else:
        fate = node.give_up(work)
        outcome = "failed"
        message = (f"the agent restarted during this pod's one restore attempt (node state: {state}); "
                   f"not replayed; placeholder {fate}")
    out = {"changed": True, "action": "recovered", "pod_ref": ref, "outcome": outcome, "message": message,
           "attempt_state": state}
    out.update(settle(cluster, work, outcome, message))
    return out
