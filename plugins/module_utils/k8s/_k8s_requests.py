# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Snapshots asked for in the cluster: PodSnapshot requests and their capture attempts, PodSnapshotManualTriggers.

A **request** is a PodSnapshot created (by a user, a trigger or the agent) with ``spec.source.podRef`` and no
status. The agent captures it on the source pod's node, then ``_k8s_records.ensure_pod_snapshot`` binds it to its
PodSnapshotContent and makes it Ready - or, here, records a failed attempt:

- ``begin_capture`` claims one attempt: ``status.attempts`` + 1, ``lastAttemptTime``, Ready False
  ``SnapshotInProgress`` - one status patch guarded by the resourceVersion read, so of two agents one claims and
  the other is told (409: not claimed). Not claimed either: Ready or Failed already, an attempt in progress that
  started less than ``attempt_timeout`` seconds ago. An attempt older than that did not finish (its agent stopped)
  and counts as failed.
- ``fail_capture`` records a failed attempt: ``status.lastError``; while ``attempts < max_attempts`` the request
  stays open (Ready False with the reason, Failed False ``WillRetry``) so that the agent tries again without
  touching the source pod; the last one makes it Failed (True, the reason, the message with the attempt count).
  Recording the same attempt twice changes nothing.

A **manual trigger** (``PodSnapshotManualTrigger``, GKE's) asks for one snapshot of ``spec.targetPod`` now.
``reconcile_trigger`` creates its PodSnapshot request (``<trigger>-<first 8 hex of its uid>``, idempotent, with
the annotations ``snapshot.warmstart.io/trigger`` and ``trigger-uid``), records it in ``status.snapshotCreated``,
and once that PodSnapshot is Ready or Failed sets the ``Triggered`` condition (True ``Complete`` / False
``Failed``, with the cause). A missing target pod or policy fails the trigger at once. ``check_mode`` reads and
reports the same actions, and writes nothing.
"""
from __future__ import annotations

import datetime
from typing import List, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import (
    JSON, Cluster, K8sError, now, ref)

REASON_CAPTURING = "SnapshotInProgress"
REASON_WILL_RETRY = "WillRetry"
REASON_TIMED_OUT = "CaptureTimedOut"
REASON_COMPLETE = "Complete"
REASON_FAILED = "Failed"
ANN_TRIGGER = podapi.GROUP + "/trigger"
ANN_TRIGGER_UID = podapi.GROUP + "/trigger-uid"
DEFAULT_ATTEMPT_TIMEOUT = 3600.0


# --- capture attempts of a request --------------------------------------------------------------

def _condition(snap: JSON, type_: str) -> JSON:
    return podapi.get_condition(snap, type_) or {}


def _age(stamp: Optional[str], at: str) -> Optional[float]:
    """Seconds from RFC 3339 ``stamp`` to ``at`` (None when ``stamp`` is missing or unreadable)."""
    try:
        then = datetime.datetime.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ")
        later = datetime.datetime.strptime(at, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    return (later - then).total_seconds()


def _done(snap: JSON) -> Optional[str]:
    """Why a PodSnapshot needs no capture any more (Ready, or Failed for good); None when it does."""
    if _condition(snap, podapi.READY_CONDITION).get("status") == "True":
        return "it is Ready"
    failed = _condition(snap, podapi.FAILED_CONDITION)
    if failed.get("status") == "True":
        return f"it has failed ({failed.get('reason')}: {failed.get('message')})"
    return None


def _record(cluster: Cluster, snap: JSON, status: JSON, check_mode: bool) -> JSON:
    """Patch ``status`` into the PodSnapshot's status, guarded by the resourceVersion it was read with."""
    meta = snap["metadata"]
    if check_mode:
        return dict(snap, status=dict(snap.get("status") or {}, **status))
    return cluster.patch_status(podapi.KIND_SNAPSHOT, meta["name"], status, meta["namespace"], meta["resourceVersion"])


def _failed_status(snap: JSON, attempts: int, max_attempts: int, reason: str, message: str, stamp: str) -> JSON:
    """The status of a request whose attempt ``attempts`` failed: open for a retry, or Failed after the last."""
    conds = (snap.get("status") or {}).get("conditions") or []
    counted = f"attempt {attempts} of {max_attempts}"
    if attempts >= max_attempts:
        text = f"{message} ({counted}; no attempt left)"
        conds = podapi.set_condition(conds, podapi.READY_CONDITION, False, reason, text, stamp)
        conds = podapi.set_condition(conds, podapi.FAILED_CONDITION, True, reason, text, stamp)
    else:
        conds = podapi.set_condition(conds, podapi.READY_CONDITION, False, reason, f"{counted} failed: {message}", stamp)
        conds = podapi.set_condition(conds, podapi.FAILED_CONDITION, False, REASON_WILL_RETRY,
                                     f"{counted} failed ({reason}); the capture is tried again", stamp)
    return {"attempts": attempts, "lastError": f"{reason}: {message}", "conditions": conds}


def begin_capture(cluster: Cluster, namespace: str, name: str, max_attempts: int = 1,
                  attempt_timeout: float = DEFAULT_ATTEMPT_TIMEOUT, check_mode: bool = False) -> JSON:
    """Claim the next capture attempt of PodSnapshot ``namespace/name`` (see the module docstring).

    Returns ``{"changed", "claimed", "attempt", "max_attempts", "reason", "snapshot"}``: ``claimed`` True means
    this caller captures now (attempt ``attempt``); False says in ``reason`` why not (nothing was claimed).
    """
    sref = ref(podapi.KIND_SNAPSHOT, name, namespace)
    if max_attempts < 1:
        raise K8sError(f"{sref}: max_attempts must be at least 1, not {max_attempts}", sref)
    snap = cluster.get(podapi.KIND_SNAPSHOT, name, namespace)
    status, stamp = snap.get("status") or {}, now()
    attempts = int(status.get("attempts") or 0)
    out: JSON = {"changed": False, "claimed": False, "attempt": attempts, "max_attempts": max_attempts,
                 "reason": _done(snap), "snapshot": snap}
    if out["reason"]:
        return out
    ready = _condition(snap, podapi.READY_CONDITION)
    if ready.get("reason") == REASON_CAPTURING and attempts:
        age = _age(status.get("lastAttemptTime"), stamp)
        if age is None or age < attempt_timeout:
            out["reason"] = f"attempt {attempts} is in progress since {status.get('lastAttemptTime')}"
            return out
        lapsed = _failed_status(snap, attempts, max_attempts, REASON_TIMED_OUT,
                                f"attempt {attempts} did not finish within {attempt_timeout:g} s (its agent stopped?)",
                                stamp)
        if attempts >= max_attempts:
            return _settle_lapsed(cluster, snap, lapsed, out, check_mode)
        snap = dict(snap, status=dict(status, **lapsed))
    if attempts >= max_attempts:
        out["reason"] = f"its {attempts} attempts are spent (max_attempts {max_attempts})"
        last = str(status.get("lastError") or "no attempt left")
        lapsed = _failed_status(snap, attempts, max_attempts, REASON_FAILED, last, stamp)
        return _settle_lapsed(cluster, snap, lapsed, out, check_mode)
    return _claim(cluster, snap, attempts + 1, max_attempts, stamp, out, check_mode)


def _settle_lapsed(cluster: Cluster, snap: JSON, status: JSON, out: JSON, check_mode: bool) -> JSON:
    """No attempt left: the request is Failed now (recorded), nothing claimed."""
    out["reason"] = out["reason"] or "its last attempt did not finish: it is Failed now"
    out["snapshot"] = _record(cluster, snap, status, check_mode)
    out["changed"] = True
    return out


def _claim(cluster: Cluster, snap: JSON, attempt: int, max_attempts: int, stamp: str, out: JSON,
           check_mode: bool) -> JSON:
    conds = (snap.get("status") or {}).get("conditions") or []
    conds = podapi.set_condition(conds, podapi.READY_CONDITION, False, REASON_CAPTURING,
                                 f"capture attempt {attempt} of {max_attempts}", stamp)
    if _condition(snap, podapi.FAILED_CONDITION).get("reason") != REASON_WILL_RETRY:
        conds = podapi.set_condition(conds, podapi.FAILED_CONDITION, False, "NoFailure", "", stamp)
    status = dict(snap.get("status") or {})
    update = {"attempts": attempt, "lastAttemptTime": stamp, "conditions": conds,
              "lastError": status.get("lastError")}
    try:
        recorded = _record(cluster, snap, {k: v for k, v in update.items() if v is not None}, check_mode)
    except K8sError as exc:
        if not exc.conflict:
            raise
        out["reason"] = "it changed while it was claimed (another agent claimed it?): read it again"
        return out
    out.update(changed=True, claimed=True, attempt=attempt, reason=None, snapshot=recorded)
    return out


def fail_capture(cluster: Cluster, namespace: str, name: str, reason: str, message: str = "", max_attempts: int = 1,
                 check_mode: bool = False) -> JSON:
    """Record that the current capture attempt of PodSnapshot ``namespace/name`` failed (see the module docstring).

    Returns ``{"changed", "final", "attempts", "max_attempts", "snapshot"}``; ``final`` True when the request is
    Failed now (no attempt left). A failure with no attempt begun counts as attempt 1. Refused: a Ready PodSnapshot.
    """
    sref = ref(podapi.KIND_SNAPSHOT, name, namespace)
    if max_attempts < 1:
        raise K8sError(f"{sref}: max_attempts must be at least 1, not {max_attempts}", sref)
    snap = cluster.get(podapi.KIND_SNAPSHOT, name, namespace)
    if _condition(snap, podapi.READY_CONDITION).get("status") == "True":
        raise K8sError(f"{sref} is Ready: a failed capture cannot be recorded over it", sref)
    status = snap.get("status") or {}
    attempts = max(int(status.get("attempts") or 0), 1)
    desired = _failed_status(snap, attempts, max_attempts, reason, message or reason, now())
    changes = {k: v for k, v in desired.items() if status.get(k) != v}
    out: JSON = {"changed": bool(changes), "final": attempts >= max_attempts, "attempts": attempts,
                 "max_attempts": max_attempts, "snapshot": snap}
    if changes:
        meta = snap["metadata"]
        out["snapshot"] = (dict(snap, status=dict(status, **changes)) if check_mode else
                           cluster.patch_status(podapi.KIND_SNAPSHOT, meta["name"], changes, meta["namespace"]))
    return out


# --- manual triggers ---------------------------------------------------------------------------------

def trigger_snapshot_name(trigger: JSON) -> str:
    """The PodSnapshot a trigger creates: ``<trigger name>-<first 8 hex of its uid>`` (a trigger deleted and created
    again makes a new one)."""
    meta = trigger.get("metadata") or {}
    uid = str(meta.get("uid") or "").replace("-", "")[:8]
    return f"{str(meta.get('name'))[:244]}-{uid}".strip("-.") if uid else str(meta.get("name"))


def reconcile_trigger(cluster: Cluster, namespace: str, name: str, check_mode: bool = False) -> JSON:
    """One pass over PodSnapshotManualTrigger ``namespace/name`` (see the module docstring).

    Returns ``{"changed", "actions", "phase", "snapshot_name", "trigger", "snapshot"}``; ``phase`` is
    ``pending`` (the PodSnapshot is not Ready yet), ``complete`` or ``failed``.
    """
    tref = ref(podapi.KIND_TRIGGER, name, namespace)
    trigger = cluster.get(podapi.KIND_TRIGGER, name, namespace)
    actions: List[str] = []
    out: JSON = {"changed": False, "actions": actions, "trigger": trigger, "snapshot": None,
                 "snapshot_name": ((trigger.get("status") or {}).get("snapshotCreated") or {}).get("name")}
    triggered = podapi.get_condition(trigger, podapi.TRIGGERED_CONDITION)
    if triggered:
        out["phase"] = "complete" if triggered.get("status") == "True" else "failed"
        out["snapshot"] = cluster.find(podapi.KIND_SNAPSHOT, out["snapshot_name"], namespace) if out["snapshot_name"] else None
        return out
    recorded = out["snapshot_name"]
    sname = recorded or trigger_snapshot_name(trigger)
    snap, problem = _trigger_snapshot(cluster, trigger, sname, actions, check_mode)
    out.update(snapshot_name=sname if snap is not None or recorded else None, snapshot=snap)
    status: JSON = {}
    if snap is not None and not recorded:
        status["snapshotCreated"] = {"name": sname}
    phase, cond = _trigger_outcome(snap, sname, namespace, problem)
    out["phase"] = phase
    if cond is not None:
        status["conditions"] = podapi.set_condition((trigger.get("status") or {}).get("conditions"),
                                                    podapi.TRIGGERED_CONDITION, cond[0], cond[1], cond[2], now())
        actions.append(f"set {podapi.TRIGGERED_CONDITION} {cond[0]} ({cond[1]}) on {tref}")
    if status:
        if "snapshotCreated" in status:
            actions.append(f"recorded snapshotCreated {sname} on {tref}")
        out["trigger"] = (dict(trigger, status=dict(trigger.get("status") or {}, **status)) if check_mode else
                          cluster.patch_status(podapi.KIND_TRIGGER, name, status, namespace))
    out["changed"] = bool(actions)
    return out


def _trigger_snapshot(cluster: Cluster, trigger: JSON, sname: str, actions: List[str], check_mode: bool
                      ) -> Tuple[Optional[JSON], Optional[str]]:
    """The trigger's PodSnapshot, created as a request when missing: ``(snapshot, problem)``; a problem (target pod
    or policy missing, a PodSnapshot of that name that is not this trigger's, one deleted since) fails the trigger."""
    meta, spec = trigger.get("metadata") or {}, trigger.get("spec") or {}
    namespace, uid = str(meta.get("namespace")), str(meta.get("uid") or "")
    snap = cluster.find(podapi.KIND_SNAPSHOT, sname, namespace)
    if snap is not None:
        owner = ((snap.get("metadata") or {}).get("annotations") or {}).get(ANN_TRIGGER_UID)
        if owner != uid:
            return None, f"PodSnapshot {namespace}/{sname} exists and was not created by this trigger"
        return snap, None
    if ((trigger.get("status") or {}).get("snapshotCreated") or {}).get("name"):
        return None, f"PodSnapshot {namespace}/{sname} was deleted before it became Ready"
    pod = cluster.find("Pod", str(spec.get("targetPod")), namespace)
    if pod is None:
        return None, f"Pod {namespace}/{spec.get('targetPod')} not found"
    if spec.get("policyName") and cluster.find(podapi.KIND_POLICY, str(spec["policyName"]), namespace) is None:
        return None, f"PodSnapshotPolicy {namespace}/{spec['policyName']} not found"
    source: JSON = {"podRef": {"name": spec["targetPod"], "uid": pod["metadata"]["uid"]}}
    if spec.get("containers"):
        source["containers"] = list(spec["containers"])
    body: JSON = {"apiVersion": podapi.API_VERSION, "kind": podapi.KIND_SNAPSHOT,
                  "metadata": {"name": sname, "namespace": namespace,
                               "labels": dict((pod.get("metadata") or {}).get("labels") or {}),
                               "annotations": {ANN_TRIGGER: str(meta.get("name")), ANN_TRIGGER_UID: uid}},
                  "spec": dict({"source": source}, **({"policyName": spec["policyName"]} if spec.get("policyName")
                                                      else {}))}
    actions.append(f"created {ref(podapi.KIND_SNAPSHOT, sname, namespace)} (a request)")
    return (body if check_mode else cluster.create(podapi.KIND_SNAPSHOT, body, namespace)), None


def _trigger_outcome(snap: Optional[JSON], sname: str, namespace: str, problem: Optional[str]
                     ) -> Tuple[str, Optional[Tuple[bool, str, str]]]:
    """``(phase, (status, reason, message) of the Triggered condition to set, or None while pending)``."""
    if problem is not None:
        return "failed", (False, REASON_FAILED, problem)
    ready = _condition(snap or {}, podapi.READY_CONDITION)
    failed = _condition(snap or {}, podapi.FAILED_CONDITION)
    if ready.get("status") == "True":
        return "complete", (True, REASON_COMPLETE, f"PodSnapshot {namespace}/{sname} is Ready")
    if failed.get("status") == "True":
        return "failed", (False, REASON_FAILED, f"PodSnapshot {namespace}/{sname} failed ({failed.get('reason')}: "
                                                f"{failed.get('message')})")
    return "pending", None
