"""The fleet playbooks (snapshot, restore, cleanup) on this machine, with an S3 store on loopback.

Runs the playbooks by FQCN as a user would; checks the per-host summary (printed table and JSON file),
that a host the snapshot does not fit is refused with its reason before any work, and retention plus
node-cache pruning. The multi-node fan-out runs in the molecule scenario `fleet`.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Dict

import pytest

from .ansible_run import REPO, ansible_env, playbook
from .process_lab import Lab, free_port, query
from .s3_lab import SECRET, keys

pytestmark = pytest.mark.integration


def run(name: str, lab: Lab, extra: Dict[str, Any], tag: str) -> Dict[str, Any]:
    summary = lab.tmp / f"{tag}.json"
    res = playbook(f"warmstart.snapshot.{name}", extra=dict(extra, warmstart_summary_file=str(summary)))
    assert SECRET not in res.stdout + res.stderr
    doc = json.loads(summary.read_text()) if summary.exists() else None
    tasks = [t for p in res.result.get("plays", []) for t in p["tasks"]]
    table = [t for t in tasks if t["task"]["name"].endswith("Show the summary")]
    lines = table[0]["hosts"]["localhost"]["msg"] if table else []
    return {"rc": res.rc, "summary": doc, "table": lines, "messages": res.messages()}


def test_snapshot_restore_cleanup_playbooks(lab: Lab, s3: Dict[str, Any]) -> None:
    port = free_port()
    lab.play([lab.start("fleet", port, 16)])
    token = lab.token("fleet")
    common = {"warmstart_store": s3["url"], "warmstart_store_options": s3["opts"], "warmstart_become": False}
    target = {"workload": "fleet", "workloads_root": str(lab.workloads), "labels": {"app": "fleet"},
              "leave_running": False, "wait_ready": True}
    snap = run("snapshot", lab, dict(common, warmstart_snapshot_target=target), "snap")
    assert snap["rc"] == 0, snap["messages"]
    row = snap["summary"]["rows"][0]
    assert row["host"] == "localhost" and row["result"] == "snapshotted" and row["bytes"] > 16 << 20
    assert snap["table"][0] == "warmstart snapshot" and snap["table"][1].split()[:3] == ["host", "result", "snapshot"]
    assert any(row["snapshot"] in line for line in snap["table"])

    # with chunk sharing on (a fleet of one on loopback: the playbook builds peers from the hosts' addresses)
    share = {"warmstart_restore_share": True, "warmstart_restore_share_address": "127.0.0.1",
             "warmstart_restore_share_port": free_port(), "warmstart_restore_share_tls": False}
    rst = run("restore", lab, dict(common, warmstart_restore_labels={"app": "fleet"},
                                   warmstart_restore_workloads_root=str(lab.workloads), **share), "restore")
    assert rst["rc"] == 0, rst["messages"]
    row = rst["summary"]["rows"][0]
    assert row["result"] == "restored" and row["snapshot"] == snap["summary"]["rows"][0]["snapshot"]
    assert row["reused"] > 0 and row["downloaded"] == 0, "the checkpointing node restores from its own cache"
    assert row["from_peers"] == 0, f"sharing was on (None: off): {row}"
    assert query(port)["token"] == token

    # a snapshot that does not fit this node: refused with the reason, nothing attempted
    sid = row["snapshot"]
    doc = json.loads(s3["client"].get_object(Bucket=s3["bucket"], Key=f"fleet/snapshots/{sid}/manifest.json")["Body"].read())
    doc["source"]["arch"] = "riscv64"
    s3["client"].put_object(Bucket=s3["bucket"], Key=f"fleet/snapshots/{sid}/manifest.json", Body=json.dumps(doc).encode())
    lab.play([lab.stop("fleet")])
    bad = run("restore", lab, dict(common, warmstart_restore_snapshot=sid,
                                   warmstart_restore_workloads_root=str(lab.workloads)), "refused")
    assert bad["rc"] != 0
    row = bad["summary"]["rows"][0]
    assert row["result"] == "refused" and "riscv64" in row["detail"], row
    assert lab.ours() == [], "a refused host must not be attempted"
    assert "did not succeed" in bad["messages"]

    # retention: nothing older than 1 s stays -> the snapshot goes with its cached copy; a cached copy of a
    # snapshot that is gone from the store (removed from another node) is pruned on this node
    cache_root = Path(s3["cache"]) / "s3" / f"{s3['bucket']}__fleet"
    assert (cache_root / sid).is_dir()
    stale = cache_root / "20250101T000000Z-0badcafe"
    (stale / "containers").mkdir(parents=True)
    clean = run("cleanup", lab, dict(common, warmstart_cleanup_max_age="1s"), "cleanup")
    assert clean["rc"] == 0, clean["messages"]
    row = clean["summary"]["rows"][0]
    assert row["result"] == "cleaned" and int(row["store_removed"]) == 1 and int(row["cache_removed"]) == 1
    assert not [k for k in keys(s3) if sid in k]
    assert not (cache_root / sid).exists() and not stale.exists()


def test_an_unreachable_host_does_not_stop_the_others(lab: Lab, tmp_path: Path) -> None:
    port = free_port()
    lab.play([lab.start("reach", port, 4)])
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("localhost ansible_connection=local ansible_python_interpreter=/usr/bin/python3\n"
                         "ghost ansible_connection=containers.podman.podman ansible_host=warmstart-no-such-node\n")
    summary = tmp_path / "summary.json"
    extra = {"warmstart_become": False, "warmstart_summary_file": str(summary), "warmstart_store": str(lab.store),
             "warmstart_snapshot_target": {"workload": "reach", "workloads_root": str(lab.workloads)}}
    res = subprocess.run([str(REPO / ".venv" / "bin" / "ansible-playbook"), "warmstart.snapshot.snapshot",
                          "-i", str(inventory), "-e", json.dumps(extra)], cwd=REPO, env=ansible_env(),
                         capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode != 0, "a host that did not make it fails the play (after the summary)"
    rows = {r["host"]: r for r in json.loads(summary.read_text())["rows"]}
    assert rows["localhost"]["result"] == "snapshotted" and rows["localhost"]["snapshot"] in lab.published()
    assert rows["ghost"]["result"] == "unreachable"
    assert query(port)["token"] == lab.token("reach"), "the source keeps running (leave_running defaults to true)"
