"""snapshot_info and cleanup end to end: real workloads, real CRIU snapshots, real ansible-playbook."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from .ansible_run import VENV_BIN, Run, playbook
from .process_lab import needs_root_and_criu

pytestmark = pytest.mark.integration

LOOP = ["/usr/bin/python3", "-c", "import time\nwhile True: time.sleep(0.2)"]
HOUR = 3600


class Env:
    """One test's own workloads root, store and restore root, and the playbooks it ran."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.workloads = tmp_path / "workloads"
        self.store = tmp_path / "store"
        self.restore_root = tmp_path / "restore"
        self.started: List[str] = []
        self.runs = 0

    def play(self, tasks: List[Dict[str, Any]], *args: str, may_fail: Tuple[str, ...] = ()) -> Dict[str, Dict[str, Any]]:
        """Run ``tasks`` on localhost; returns each named task's result. Fails on a failed task not in ``may_fail``."""
        results, run = self.play_raw(tasks, *args)
        failed = {k: v for k, v in results.items() if v.get("failed") and k not in may_fail}
        assert run.rc == 0 and not failed, f"rc={run.rc} failed={json.dumps(failed, indent=1)}\n{run.stderr[-3000:]}"
        return results

    def play_raw(self, tasks: List[Dict[str, Any]], *args: str) -> Tuple[Dict[str, Dict[str, Any]], Run]:
        self.runs += 1
        path = self.tmp / f"play{self.runs}.yml"
        path.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
        run = playbook(str(path), *args, timeout=600)
        try:
            plays = run.result["plays"]
        except (ValueError, KeyError):
            pytest.fail(f"no JSON from ansible-playbook (rc={run.rc}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
        results = {}
        for task in plays[0]["tasks"]:
            results[task["task"]["name"]] = task["hosts"].get("localhost", {})
        return results, run

    # task builders -------------------------------------------------------------
    def start(self, name: str) -> Dict[str, Any]:
        self.started.append(name)
        return {"name": f"start {name}", "warmstart.snapshot.workload": {
            "name": name, "root": str(self.workloads), "command": LOOP}}

    def checkpoint(self, task: str, workload: str, name: str, labels: Dict[str, str]) -> Dict[str, Any]:
        return {"name": task, "warmstart.snapshot.checkpoint": {
            "workload": workload, "workloads_root": str(self.workloads), "store": str(self.store),
            "name": name, "labels": labels}}

    def info(self, task: str, **args: Any) -> Dict[str, Any]:
        return {"name": task, "warmstart.snapshot.snapshot_info": dict(store=str(self.store), **args)}

    def cleanup(self, task: str, **args: Any) -> Dict[str, Any]:
        return {"name": task, "warmstart.snapshot.cleanup": dict(
            store=str(self.store), restore_root=str(self.restore_root), **args)}

    def stop_all(self) -> None:
        if not self.started:
            return
        tasks = [{"name": f"stop {n}", "warmstart.snapshot.workload": {
            "name": n, "root": str(self.workloads), "state": "stopped"}} for n in self.started]
        try:
            self.play_raw(tasks)
        finally:  # whatever the playbook did: nothing of ours may outlive the test
            for name in self.started:
                pidfile = self.workloads / name / "pid"
                try:
                    pid = int(pidfile.read_text().strip())
                    os.kill(pid, signal.SIGKILL)
                except (OSError, ValueError):
                    pass


@pytest.fixture()
def env(tmp_path: Path) -> Iterator[Env]:
    needs_root_and_criu()
    e = Env(tmp_path)
    try:
        yield e
    finally:
        e.stop_all()


def embed_snapshots(env: Env, *snapshots: Tuple[str, str, str]) -> List[str]:
    """Workload "embed" started, then checkpointed once per (task title, snapshot name, model label), in one
    playbook: the snapshot ids, in that order."""
    r = env.play([env.start("embed")] + [env.checkpoint(title, "embed", name, {"model": model})
                                         for title, name, model in snapshots])
    return [r[title]["snapshot"]["id"] for title, _name, _model in snapshots]


def snapshot_files(store: Path, snapshot_id: str) -> List[Path]:
    return sorted(p for p in (store / "snapshots" / snapshot_id).rglob("*") if p.is_file())


def make_old(path: Path, age: float) -> None:
    """Set the mtime of ``path`` and everything in it ``age`` seconds into the past."""
    when = time.time() - age
    for p in sorted(path.rglob("*"), reverse=True):
        os.utime(p, (when, when), follow_symlinks=False)
    os.utime(path, (when, when))


def jmespath_in_system_python() -> bool:
    return subprocess.run(["/usr/bin/python3", "-c", "import jmespath"], capture_output=True,
                          check=False).returncode == 0


def test_info_lists_filters_queries_and_verifies(env: Env) -> None:
    venv_python = str(VENV_BIN / "python")
    r = env.play([
        env.info("empty store"),
        env.start("embed"),
        env.checkpoint("snap1", "embed", "embed", {"model": "m1"}),
        env.checkpoint("snap2", "embed", "embed", {"model": "m1", "tier": "gold"}),
        env.checkpoint("snap3", "embed", "chat", {"model": "m2"}),
        env.info("all"),
        env.info("by name", name="embed"),
        env.info("by labels", labels={"model": "m1", "tier": "gold"}),
        env.info("details", name="chat", details=True),
        env.info("verify", verify=True),
        dict(env.info("query", query="[?labels.model=='m1'].id", labels={"model": "m1"}),
             vars={"ansible_python_interpreter": venv_python}),
        dict(env.info("bad query", query="[?labels.model=="),
             vars={"ansible_python_interpreter": venv_python}, ignore_errors=True),
        dict(env.info("query with system python", query="[].name"), ignore_errors=True),
        env.info("check mode", verify=True, name="chat"),
    ], may_fail=("bad query", "query with system python"))
    assert r["empty store"]["count"] == 0 and r["empty store"]["store"]["exists"] is False
    ids = [r[f"snap{i}"]["snapshot"]["id"] for i in (1, 2, 3)]
    everything = r["all"]
    assert everything["changed"] is False
    assert [s["id"] for s in everything["snapshots"]] == list(reversed(ids)), "newest first"
    assert everything["count"] == 3 and everything["broken"] == [] and everything["staging"] == []
    first = everything["snapshots"][-1]
    assert first["name"] == "embed" and first["labels"] == {"model": "m1"}
    assert first["targets"] == [{"name": "embed", "kind": "process"}]
    assert first["size"] == r["snap1"]["snapshot"]["size"] > 0
    # the source node as the checkpoint module returns it
    assert first["source_node"] == r["snap1"]["snapshot"]["source_node"] and "cpu_flags" not in first["source_node"]
    assert first["path"] == str(env.store / "snapshots" / ids[0])
    assert "intact" not in first and "files" not in first

    assert [s["id"] for s in r["by name"]["snapshots"]] == [ids[1], ids[0]]
    assert [s["id"] for s in r["by labels"]["snapshots"]] == [ids[1]]
    detail = r["details"]["snapshots"]
    assert [s["id"] for s in detail] == [ids[2]]
    assert detail[0]["schema"] == 1 and detail[0]["files"] and detail[0]["source"]["arch"] == os.uname().machine
    assert detail[0]["targets"][0]["workload"] == "embed"

    assert [(s["intact"], s["problems"]) for s in r["verify"]["snapshots"]] == [(True, [])] * 3

    assert r["query"]["query_result"] == [ids[1], ids[0]]
    assert r["bad query"]["failed"] is True
    assert "is not valid JMESPath" in r["bad query"]["msg"]
    if jmespath_in_system_python():
        assert r["query with system python"]["query_result"] == ["chat", "embed", "embed"]
    else:
        assert r["query with system python"]["failed"] is True
        assert "jmespath" in r["query with system python"]["msg"]
        assert "apt-get install python3-jmespath" in r["query with system python"]["msg"]

    # Damage snapshot 2: flip a byte in its largest CRIU image, truncate another file.
    files = snapshot_files(env.store, ids[1])
    images = [p for p in files if p.parent.name == "criu"]
    victim = max(images, key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    spec = next(p for p in files if p.name == "spec.json")
    spec.write_bytes(spec.read_bytes()[:5])
    # ... and make snapshot 3 unreadable.
    (env.store / "snapshots" / ids[2] / "manifest.json").write_text("{broken")

    r = env.play([env.info("verify again", verify=True), env.info("check mode", verify=True)], "--check")
    for res in (r["verify again"], r["check mode"]):
        assert res.get("failed") is not True and res["changed"] is False
        by_id = {s["id"]: s for s in res["snapshots"]}
        assert set(by_id) == {ids[0], ids[1]}
        assert by_id[ids[0]]["intact"] is True
        assert by_id[ids[1]]["intact"] is False
        rel_victim = str(victim.relative_to(env.store / "snapshots" / ids[1]))
        rel_spec = str(spec.relative_to(env.store / "snapshots" / ids[1]))
        assert f"{rel_victim}: SHA256 mismatch (corrupted)" in by_id[ids[1]]["problems"]
        assert any(p.startswith(f"{rel_spec}: size 5 bytes") for p in by_id[ids[1]]["problems"])
        assert [b["id"] for b in res["broken"]] == [ids[2]]
        assert "manifest cannot be read" in res["broken"][0]["error"]
        assert res["broken"][0]["newer_schema"] is False


def test_cleanup_keep_last_check_mode_then_real(env: Env) -> None:
    old_id, new_id, chat_id = embed_snapshots(env, ("old embed", "embed", "m1"), ("new embed", "embed", "m1"),
                                              ("chat", "chat", "m2"))
    old_size = sum(p.stat().st_size for p in snapshot_files(env.store, old_id))

    # Left-overs: a stale and a fresh staging dir, an unreadable snapshot dir, restore work dirs.
    stale = env.store / "tmp" / ("a" * 32)
    (stale / "containers" / "embed" / "criu").mkdir(parents=True)
    (stale / "containers" / "embed" / "criu" / "pages-1.img").write_bytes(b"p" * 8192)
    make_old(stale, 3 * HOUR)
    fresh = env.store / "tmp" / ("b" * 32)
    fresh.mkdir()
    (fresh / "pages-1.img").write_bytes(b"p" * 100)
    broken_id = "20200101T000000Z-deadbeef"
    (env.store / "snapshots" / broken_id / "containers").mkdir(parents=True)
    old_restore = env.restore_root / f"{old_id}-0123abcd"
    old_restore.mkdir(parents=True)
    (old_restore / "restore.log").write_text("restored\n")
    make_old(old_restore, 2 * HOUR)
    foreign = env.restore_root / "keep-me"
    foreign.mkdir()
    make_old(foreign, 100 * HOUR)

    plan = env.play([env.cleanup("plan", keep_last=1)], "--check")["plan"]
    assert plan["changed"] is True
    assert [e["id"] for e in plan["removed"]] == [old_id]
    assert plan["removed"][0]["reason"] == "keep_last=1 for name=embed (it is the 2nd newest)"
    assert plan["removed"][0]["size"] >= old_size
    assert [e["path"] for e in plan["removed_staging"]] == [str(stale)]
    assert plan["removed_staging"][0]["size"] == 8192
    assert "unchanged for 3h" in plan["removed_staging"][0]["reason"]
    assert [e["path"] for e in plan["removed_restore_dirs"]] == [str(old_restore)]
    assert plan["bytes_freed"] == plan["removed"][0]["size"] + 8192 + len("restored\n")
    assert sorted(e["id"] for e in plan["kept"]) == sorted([new_id, chat_id])
    assert plan["broken"] == [{"id": broken_id, "remove": False, "error": plan["broken"][0]["error"],
                               "reason": "unreadable snapshot; kept (set remove_broken to remove it)"}]
    assert plan["msg"].startswith("would remove 1 snapshot(s), 1 staging dir(s) and 1 restore work dir(s)")
    # check mode removed nothing
    assert (env.store / "snapshots" / old_id / "manifest.json").is_file()
    assert stale.is_dir() and old_restore.is_dir()

    r = env.play([
        env.cleanup("real", keep_last=1),
        env.cleanup("again", keep_last=1),
        env.info("after"),
        env.cleanup("repair", remove_broken=True),
    ])
    real = r["real"]
    assert real["changed"] is True and [e["id"] for e in real["removed"]] == [old_id]
    assert real["bytes_freed"] == plan["bytes_freed"]
    assert real["msg"].startswith("removed 1 snapshot(s)")
    assert not (env.store / "snapshots" / old_id).exists()
    assert not stale.exists() and fresh.is_dir()
    assert not old_restore.exists() and foreign.is_dir()
    assert r["again"]["changed"] is False and r["again"]["removed"] == [] and r["again"]["bytes_freed"] == 0
    after = r["after"]
    assert [s["id"] for s in after["snapshots"]] == [chat_id, new_id]
    assert [s["path"] for s in after["staging"]] == [str(fresh)]
    assert r["repair"]["changed"] is True and [e["id"] for e in r["repair"]["removed"]] == [broken_id]
    assert not (env.store / "snapshots" / broken_id).exists()
    assert (env.store / "snapshots" / new_id / "manifest.json").is_file()


def test_cleanup_by_label_group_max_age_and_bad_options(env: Env) -> None:
    a1, b1, c1 = embed_snapshots(env, ("a1", "a", "m1"), ("b1", "b", "m1"), ("c1", "c", "m2"))
    r2 = env.play([
        dict(env.cleanup("bad duration", max_age="7x"), ignore_errors=True),
        dict(env.cleanup("bad keep_last", keep_last=-2), ignore_errors=True),
        env.cleanup("by model", keep_last=1, group_by=["model"], name="a"),
        env.cleanup("by model, all names", keep_last=1, group_by=["model"]),
        env.cleanup("young enough", max_age="1d"),
    ], may_fail=("bad duration", "bad keep_last"))
    assert r2["bad duration"]["failed"] is True
    assert r2["bad duration"]["msg"].startswith("max_age: unknown unit 'x' in '7x'")
    assert r2["bad keep_last"]["msg"].startswith("keep_last: -2 must be a whole number >= 0")
    assert r2["by model"]["changed"] is False and [e["id"] for e in r2["by model"]["kept"]] == [a1]  # only name=a considered
    assert [e["id"] for e in r2["by model, all names"]["removed"]] == [a1]
    assert sorted(e["id"] for e in r2["by model, all names"]["kept"]) == sorted([b1, c1])
    assert r2["young enough"]["changed"] is False
