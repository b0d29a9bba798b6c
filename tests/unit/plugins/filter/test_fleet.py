"""The per-pod summaries and restore bookkeeping of the Kubernetes playbooks (plugins/filter/fleet.py)."""
from __future__ import annotations

from typing import Any, Dict

from ansible_collections.warmstart.snapshot.plugins.filter.fleet import (
    k8s_node_map, k8s_restore_outcomes, k8s_restore_rows, k8s_restore_work, k8s_rows)

HOSTVARS: Dict[str, Dict[str, Any]] = {"gpu-01": {}, "node-b": {"warmstart_k8s_node_name": "ip-10-0-0-7"}}


def target(name: str, node: Any) -> Dict[str, Any]:
    return {"namespace": "ml", "name": name, "node_name": node, "containers": [{"name": "main"}]}


def test_node_names_map_onto_inventory_hosts() -> None:
    assert k8s_node_map(["gpu-01", "node-b"], HOSTVARS) == {"gpu-01": "gpu-01", "ip-10-0-0-7": "node-b"}


def test_snapshot_rows_say_what_happened_to_each_pod() -> None:
    nodes = k8s_node_map(["gpu-01", "node-b"], HOSTVARS)
    ok = {"item": target("a", "gpu-01"), "snapshot": {"id": "S1", "size": 10, "timings": {"dump": 0.5}}}
    bad = {"item": target("b", "gpu-01"), "failed": True, "msg": "CRIU failed: boom"}
    hostvars = {"gpu-01": {"ck": {"results": [ok, bad]}}, "node-b": {}}
    records = [{"item": ok, "changed": True}]
    rows = k8s_rows([target("a", "gpu-01"), target("b", "gpu-01"), target("c", "far"), target("d", None),
                     target("e", "ip-10-0-0-7")], nodes, hostvars, "ck", records)
    by = {r["pod"]: r for r in rows}
    assert (by["ml/a"]["result"], by["ml/a"]["snapshot"], by["ml/a"]["dump_s"]) == ("snapshotted", "S1", 0.5)
    assert by["ml/b"]["result"] == "failed" and "boom" in by["ml/b"]["detail"]
    assert by["ml/c"]["result"] == "skipped" and "node far is not in the inventory" in by["ml/c"]["detail"]
    assert by["ml/d"]["result"] == "skipped" and "not scheduled" in by["ml/d"]["detail"]
    assert by["ml/e"]["host"] == "node-b" and by["ml/e"]["result"] == "unreachable"


def test_a_failed_record_fails_the_row() -> None:
    ok = {"item": target("a", "gpu-01"), "snapshot": {"id": "S1"}}
    rows = k8s_rows([target("a", "gpu-01")], {"gpu-01": "gpu-01"}, {"gpu-01": {"ck": {"results": [ok]}}}, "ck",
                    [{"item": ok, "failed": True, "msg": "409 Conflict"}])
    assert rows[0]["result"] == "failed" and "recording it in the cluster failed: 409 Conflict" in rows[0]["detail"]


def begun(name: str, node: str, pairs: Any) -> Dict[str, Any]:
    return {"pod": {"metadata": {"namespace": "ml", "name": name}}, "node_name": node, "pod_snapshot_name": "snap-1",
            "store": {"url": "/mnt/s", "snapshot_id": "S1", "path": None}, "pairs": pairs, "skip_compat_check": False}


def test_restore_work_is_one_item_per_destination() -> None:
    work = k8s_restore_work([
        begun("r-0", "gpu-01", [{"source": "main", "container": "main", "container_id": "podman://x"}]),
        begun("r-1", "gpu-01", [{"source": "main", "container": "a"}, {"source": "main", "container": "b"}]),
        {"failed": True, "msg": "refused", "item": {}},
    ])
    assert [(w["name"], w["container"]) for w in work] == [("r-0", "main"), ("r-1", "a"), ("r-1", "b")]
    assert work[0]["snapshot_id"] == "S1" and work[0]["store_url"] == "/mnt/s" and work[0]["container_id"] == "podman://x"


def test_outcomes_over_destinations() -> None:
    work = k8s_restore_work([
        begun("all", "gpu-01", [{"source": "m", "container": "a"}]),
        begun("some", "gpu-01", [{"source": "m", "container": "a"}, {"source": "m", "container": "b"}]),
        begun("none", "gpu-01", [{"source": "m", "container": "a"}]),
        begun("unfit", "gpu-01", [{"source": "m", "container": "a"}]),
        begun("away", "far", [{"source": "m", "container": "a"}]),
    ])
    by_item = {(w["name"], w["container"]): w for w in work}
    # as the node-side restore module returns them: a top-level outcome on success and on failure
    results = [
        {"item": by_item[("all", "a")], "outcome": "succeeded", "restore": {"id": "S1"}},
        {"item": by_item[("some", "a")], "outcome": "succeeded", "restore": {"id": "S1"}},
        {"item": by_item[("some", "b")], "failed": True, "outcome": "failed", "msg": "CRIU restore failed",
         "restore": {"id": "S1"}},
        {"item": by_item[("none", "a")], "failed": True, "outcome": "failed", "msg": "CRIU restore failed",
         "restore": {"id": "S1"}},
        {"item": by_item[("unfit", "a")], "failed": True, "outcome": "incompatible", "msg": "refusing",
         "reasons": ["kernel: older"]},
    ]
    out = {o["name"]: o for o in k8s_restore_outcomes(work, {"gpu-01": "gpu-01"}, {"gpu-01": {"rs": {"results": results}}}, "rs")}
    assert out["all"]["outcome"] == "succeeded"
    assert out["some"]["outcome"] == "partially_succeeded" and "b: CRIU restore failed" in out["some"]["message"]
    assert out["none"]["outcome"] == "failed"
    assert out["unfit"]["outcome"] == "incompatible"
    assert out["away"]["outcome"] == "failed" and "node far is not in the inventory" in out["away"]["message"]
    # the Restored reason finish records, and the reference's outcome name the pod then has
    assert [(out[n]["reason"], out[n]["pod_outcome"]) for n in ("all", "some", "none", "unfit")] == [
        ("RestoreSucceeded", "Succeeded"), ("RestorePartiallySucceeded", "PartiallySucceeded"),
        ("RestoreFailed", "Failed"), ("RestoreIncompatible", "Failed")]


def test_restore_rows() -> None:
    pods = [{"metadata": {"namespace": "ml", "name": n, "annotations": {"snapshot.warmstart.io/restore-from": "snap-1"}}}
            for n in ("ok", "late", "refused", "bad")]
    pods[3]["metadata"]["annotations"] = {"nvidia.com/restore-from": "snap-2"}  # the reference's name is read too
    scheduled = [{"item": p, "targets": [{"node_name": "gpu-01"}]} for p in pods]
    scheduled[1] = {"item": pods[1], "failed": True, "msg": "timed out after 300 s"}
    begun_ = [{"item": {"item": pods[0]}}, {"item": {"item": pods[2]}, "failed": True, "msg": "already ran"},
              {"item": {"item": pods[3]}}]
    finished = [{"item": {"name": "ok", "outcome": "succeeded", "message": "restored main"}},
                {"item": {"name": "bad", "outcome": "failed", "message": "main: CRIU restore failed"}}]
    rows = {r["pod"]: r for r in k8s_restore_rows(pods, {"gpu-01": "gpu-01"}, scheduled, begun_, finished)}
    assert (rows["ml/ok"]["result"], rows["ml/ok"]["host"], rows["ml/ok"]["snapshot"]) == ("restored", "gpu-01", "snap-1")
    assert rows["ml/late"]["result"] == "not started" and "timed out" in rows["ml/late"]["detail"]
    assert rows["ml/refused"]["result"] == "refused" and "already ran" in rows["ml/refused"]["detail"]
    assert rows["ml/bad"]["result"] == "failed" and "CRIU restore failed" in rows["ml/bad"]["detail"]
    assert rows["ml/bad"]["snapshot"] == "snap-2"


def test_outcomes_come_from_the_module_and_a_missing_one_fails() -> None:
    work = k8s_restore_work([
        begun("crashed", "gpu-01", [{"source": "m", "container": "a"}]),
        begun("skipped", "gpu-01", [{"source": "m", "container": "a"}]),
        begun("half", "gpu-01", [{"source": "m", "container": "a"}]),
        begun("mixed", "gpu-01", [{"source": "m", "container": "a"}, {"source": "m", "container": "b"}]),
    ])
    by_item = {(w["name"], w["container"]): w for w in work}
    results = [
        {"item": by_item[("crashed", "a")], "failed": True, "msg": "MODULE FAILURE"},
        {"item": by_item[("skipped", "a")], "skipped": True},
        {"item": by_item[("half", "a")], "failed": True, "outcome": "partially_succeeded", "msg": "1 of 2"},
        {"item": by_item[("mixed", "a")], "failed": True, "outcome": "incompatible", "msg": "kernel"},
        {"item": by_item[("mixed", "b")], "failed": True, "outcome": "failed", "msg": "CRIU"},
    ]
    out = {o["name"]: o for o in k8s_restore_outcomes(work, {"gpu-01": "gpu-01"},
                                                      {"gpu-01": {"rs": {"results": results}}}, "rs")}
    assert (out["crashed"]["outcome"], out["crashed"]["message"]) == ("failed", "a: MODULE FAILURE")
    assert (out["skipped"]["outcome"], out["skipped"]["message"]) == ("failed", "a: skipped on gpu-01")
    assert (out["half"]["outcome"], out["half"]["message"]) == ("partially_succeeded", "failed a: 1 of 2")
    assert (out["mixed"]["outcome"], out["mixed"]["message"]) == ("incompatible", "a: kernel; b: CRIU")
