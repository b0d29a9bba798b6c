# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Per-host (and, for the Kubernetes playbooks, per-pod) summaries of the fleet playbooks."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc


def fleet_rows(hosts: Sequence[str], hostvars: Any) -> List[Dict[str, Any]]:
    rows = []
    for host in hosts:
        try:
            row = hostvars[host].get("warmstart__row")
        except (KeyError, AttributeError):
            row = None
        if isinstance(row, dict) and row:
            rows.append(dict(row, host=host))
        else:
            rows.append({"host": host, "result": "unreachable", "detail": "no result: unreachable or failed earlier"})
    return rows


def _human(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value).lower()
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def fleet_table(rows: Sequence[Dict[str, Any]], columns: Sequence[str]) -> List[str]:
    """Rows as an aligned text table (a list of lines, for ansible.builtin.debug)."""
    cells = [[str(c) for c in columns]] + [[_human(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    out = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip() for line in cells]
    out.insert(1, "  ".join("-" * w for w in widths))
    return out


def k8s_node_map(hosts: Sequence[str], hostvars: Any) -> Dict[str, str]:
    """Kubernetes node name -> inventory host (a host's warmstart_k8s_node_name, else its inventory name)."""
    out: Dict[str, str] = {}
    for host in hosts:
        try:
            node = hostvars[host].get("warmstart_k8s_node_name")
        except (KeyError, AttributeError):
            node = None
        out[str(node or host)] = host
    return out


def _pod(target: Dict[str, Any]) -> str:
    return f"{target.get('namespace')}/{target.get('name')}"


def k8s_rows(targets: Sequence[Dict[str, Any]], node_map: Dict[str, str], hostvars: Any, register: str,
             records: Sequence[Dict[str, Any]] = ()) -> List[Dict[str, Any]]:
    """One row per pod of ``targets`` (pod_info's summaries).

    ``register`` names the per-host loop result of the node-side step (checkpoint or restore); ``records``
    are the loop results of the step that recorded each outcome in the cluster (their ``item`` is the node
    step's result). A pod whose node is not in the inventory, or whose host never reported, says so.
    """
    recorded = {}
    for rec in records or ():
        item = rec.get("item") or {}
        key = _pod(item.get("item") or {})
        recorded[key] = rec
    rows = []
    for target in targets:
        pod, node = _pod(target), target.get("node_name")
        row: Dict[str, Any] = {"pod": pod, "host": node_map.get(str(node)), "result": "", "detail": ""}
        rows.append(row)
        if not node:
            row.update(result="skipped", detail="not scheduled on any node")
            continue
        if row["host"] is None:
            row.update(result="skipped", detail=f"node {node} is not in the inventory")
            continue
        try:
            results = (hostvars[row["host"]].get(register) or {}).get("results") or []
        except (KeyError, AttributeError):
            results = []
        mine = [r for r in results if _pod(r.get("item") or {}) == pod]
        if not mine:
            row.update(result="unreachable", detail=f"no result from {row['host']}: unreachable or failed earlier")
            continue
        res = mine[0]
        if res.get("failed"):
            row.update(result="failed", detail=str(res.get("msg") or "failed"))
            continue
        snap = res.get("snapshot") or {}
        restored = res.get("restore") or {}
        row.update(snapshot=snap.get("id") or restored.get("id"), bytes=snap.get("size"),
                   dump_s=(snap.get("timings") or {}).get("dump"),
                   restore_s=(restored.get("timings") or {}).get("total"),
                   result="snapshotted" if snap else "restored")
        rec = recorded.get(pod)
        if rec is not None and rec.get("failed"):
            row.update(result="failed", detail="recording it in the cluster failed: " + str(rec.get("msg")))
    return rows


def k8s_restore_work(begun: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One work item per (pod, destination container) from the loop results of restore_pod action=begin."""
    out = []
    for res in begun or ():
        if res.get("failed") or res.get("skipped") or not res.get("pairs"):
            continue
        meta = (res.get("pod") or {}).get("metadata") or {}
        store = res.get("store") or {}
        for pair in res["pairs"]:
            out.append({"namespace": meta.get("namespace"), "name": meta.get("name"), "node": res.get("node_name"),
                        "source": pair.get("source"), "container": pair.get("container"),
                        "container_id": pair.get("container_id"), "snapshot": res.get("pod_snapshot_name"),
                        "snapshot_id": store.get("snapshot_id"), "store_url": store.get("url"),
                        "skip_compat_check": bool(res.get("skip_compat_check"))})
    return out


OUTCOMES = tuple(podapi.RESULT_CONDITIONS)  # succeeded, failed, partially_succeeded, incompatible


def _restore_result(node_map: Dict[str, str], hostvars: Any, register: str, work: Dict[str, Any]
                    ) -> Tuple[Optional[Dict[str, Any]], str]:
    """The restore result the destination's host registered for ``work``, or (None, why there is none)."""
    host = node_map.get(str(work.get("node")))
    if host is None:
        return None, f"node {work.get('node')} is not in the inventory"
    try:
        results = (hostvars[host].get(register) or {}).get("results") or []
    except (KeyError, AttributeError):
        results = []
    for res in results:
        item = res.get("item") or {}
        if all(item.get(k) == work.get(k) for k in ("namespace", "name", "container")):
            if res.get("skipped"):
                return None, f"skipped on {host}"
            return res, ""
    return None, f"no result from {host}: unreachable or failed earlier"


def _destination_outcome(res: Optional[Dict[str, Any]], missing: str) -> Tuple[str, str]:
    """(outcome, message) of one destination: the restore module's own ``outcome``; no result is a failure."""
    if res is None:
        return "failed", missing
    outcome = res.get("outcome")
    if outcome not in OUTCOMES:
        return "failed", str(res.get("msg") or "the restore result carries no outcome")
    return str(outcome), "" if outcome == "succeeded" else str(res.get("msg") or outcome)


def _pod_outcome(ok: List[str], bad: List[Tuple[str, str]]) -> Tuple[str, str]:
    """A pod's outcome over its destinations: ``ok`` (succeeded) and ``bad`` ((outcome, "container: message"))."""
    kinds = {outcome for outcome, _text in bad}
    failed = "; ".join(text for _outcome, text in bad)
    if not bad:
        return "succeeded", "restored " + ", ".join(ok)
    if ok or "partially_succeeded" in kinds:
        return "partially_succeeded", "; ".join(([f"restored {', '.join(ok)}"] if ok else []) + [f"failed {failed}"])
    return ("incompatible" if "incompatible" in kinds else "failed"), failed


def k8s_restore_outcomes(work: Sequence[Dict[str, Any]], node_map: Dict[str, str], hostvars: Any,
                         register: str) -> List[Dict[str, Any]]:
    """Per restore pod: succeeded / failed / partially_succeeded / incompatible over its destinations.

    Each destination's outcome is the one the node-side restore module returned (``outcome``, on success and on
    failure); a destination without a result (its node not in the inventory, its host unreachable, the item
    skipped) failed, and the message says why. Only the aggregation per pod is done here: every destination
    succeeded -> succeeded; some did (or one partially) -> partially_succeeded; none did -> incompatible when a
    node refused the snapshot before touching anything, else failed. ``outcome`` stays in the restore module's
    words (it is restore_pod action=finish's ``outcome`` option); ``reason`` is the Restored reason finish records
    and ``pod_outcome`` the reference contract's name the pod is then classified as (Succeeded,
    PartiallySucceeded, Failed).
    """
    pods: Dict[str, Dict[str, Any]] = {}
    for item in work or ():
        entry = pods.setdefault(_pod(item), {"namespace": item.get("namespace"), "name": item.get("name"),
                                             "ok": [], "bad": []})
        outcome, message = _destination_outcome(*_restore_result(node_map, hostvars, register, item))
        if outcome == "succeeded":
            entry["ok"].append(str(item.get("container")))
        else:
            entry["bad"].append((outcome, f"{item.get('container')}: {message}"))
    out = []
    for entry in pods.values():
        outcome, message = _pod_outcome(entry["ok"], entry["bad"])
        out.append({"namespace": entry["namespace"], "name": entry["name"], "outcome": outcome,
                    "reason": podapi.RESULT_CONDITIONS[outcome][1], "pod_outcome": pc.result_outcome(outcome),
                    "message": message[:1000]})
    return out


def k8s_restore_rows(pods: Sequence[Dict[str, Any]], node_map: Dict[str, str], scheduled: Sequence[Dict[str, Any]],
                     begun: Sequence[Dict[str, Any]], finished: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per restore pod the playbook created."""
    def by_name(results: Sequence[Dict[str, Any]], path: Any) -> Dict[str, Dict[str, Any]]:
        out = {}
        for res in results or ():
            out[path(res.get("item") or {})] = res
        return out

    waited = by_name(scheduled, lambda i: (i.get("metadata") or {}).get("name"))
    started = by_name(begun, lambda i: ((i.get("item") or {}).get("metadata") or {}).get("name"))
    ended = by_name(finished, lambda i: i.get("name"))
    rows = []
    for pod in pods or ():
        meta = pod.get("metadata") or {}
        name = meta.get("name")
        row: Dict[str, Any] = {"pod": f"{meta.get('namespace')}/{name}", "host": None, "result": "", "detail": "",
                               "snapshot": pc.contract_annotations(meta.get("annotations") or {},
                                                                   f"pod {meta.get('namespace')}/{name}")[0]
                               .get(podapi.ANN_RESTORE_FROM)}
        rows.append(row)
        wait = waited.get(name) or {}
        target = (wait.get("targets") or [{}])[0]
        row["host"] = node_map.get(str(target.get("node_name"))) or target.get("node_name")
        if wait.get("failed"):
            row.update(result="not started", detail=str(wait.get("msg")))
            continue
        begin = started.get(name) or {}
        if begin.get("failed"):
            row.update(result="refused", detail=str(begin.get("msg")))
            continue
        end = ended.get(name) or {}
        if end.get("failed") or not end:
            row.update(result="failed", detail=str(end.get("msg") or "no outcome recorded"))
            continue
        outcome = (end.get("item") or {}).get("outcome")
        row.update(result={"succeeded": "restored"}.get(str(outcome), str(outcome)),
                   detail="" if outcome == "succeeded" else str((end.get("item") or {}).get("message")))
    return rows


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"fleet_rows": fleet_rows, "fleet_table": fleet_table, "k8s_node_map": k8s_node_map,
                "k8s_rows": k8s_rows, "k8s_restore_work": k8s_restore_work,
                "k8s_restore_outcomes": k8s_restore_outcomes, "k8s_restore_rows": k8s_restore_rows}
