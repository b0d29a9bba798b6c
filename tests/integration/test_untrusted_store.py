"""The store is input: what a writer of the store can no longer do, on real CRIU through the real modules.

One real snapshot of a real workload per module; each case copies it under a new id, tampers with the copy
as someone with write access to the store would, and restores (or lists, verifies, cleans) through the
modules. The checks: the restore is refused before anything runs, with the reason; nothing is written
outside the snapshot and the node's own directories; at most one copy of a workload runs.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf

from .ansible_run import REPO
from .process_lab import Lab, free_port, query, slow_criu, wait_for_swrk

# serial: it watches what the whole node holds (its mount table, any CRIU worker running): nothing else may run beside it.
pytestmark = [pytest.mark.integration, pytest.mark.serial]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    lab = Lab(tmp_path_factory.mktemp("untrusted"))
    port = free_port()
    try:
        res = lab.play([lab.start("victim", port, 8),
                        lab.checkpoint("checkpoint", workload="victim", leave_running=False)])
        yield {"lab": lab, "sid": res["checkpoint"]["snapshot"]["id"], "port": port, "copies": []}
    finally:
        lab.cleanup()


def tampered(world: Dict[str, Any], change: Callable[[Dict[str, Any], Path], None]) -> str:
    """A copy of the module's snapshot under a new id, its manifest (and files) changed by ``change``."""
    lab: Lab = world["lab"]
    src = lab.store / "snapshots" / world["sid"]
    sid = mf.new_id()
    dst = lab.store / "snapshots" / sid
    shutil.copytree(src, dst, symlinks=True)
    doc = json.loads((dst / "manifest.json").read_text())
    doc["id"] = sid
    change(doc, dst)
    (dst / "manifest.json").write_text(json.dumps(doc))
    world["copies"].append(dst)
    return sid


@pytest.fixture(autouse=True)
def _drop_copies(world: Dict[str, Any]):
    """Each test's tampered copies go with it: later tests restore 'the newest' by name."""
    yield
    for path in world["copies"]:
        shutil.rmtree(path, ignore_errors=True)
    world["copies"].clear()


def restore_refused(world: Dict[str, Any], sid: str, **extra: Any) -> Dict[str, Any]:
    lab: Lab = world["lab"]
    res = lab.play([lab.restore("restore", snapshot=sid, expect_fail=True, **extra)])["restore"]
    assert res.get("failed"), res
    assert "criu_log_tail" not in res, "CRIU ran"
    assert lab.ours() == [], "a copy of the workload runs"
    return res


def files_of(doc: Dict[str, Any]) -> List[Dict[str, Any]]:
    return doc["targets"][0]["workload_files"]


# --- 1. manifest fields other than files[] no longer steer writes -------------------------------

@pytest.mark.parametrize("case", ["absolute", "dotdot", "setuid"])
def test_workload_files_cannot_write_outside_or_setuid(world: Dict[str, Any], tmp_path: Path, case: str) -> None:
    victim = tmp_path / "victim-file"
    victim.write_text("root's file")
    os.chmod(victim, 0o600)

    def change(doc: Dict[str, Any], _dst: Path) -> None:
        entry = files_of(doc)[0]
        if case == "absolute":
            entry["path"] = str(victim)
        elif case == "dotdot":
            entry["path"] = "../" * 12 + str(victim).lstrip("/")
        else:
            entry["mode"] = 0o4777
    res = restore_refused(world, tampered(world, change), verify=False)
    assert "manifest" in res["msg"] and ("workload_files[0]" in res["msg"]), res["msg"]
    assert victim.read_text() == "root's file" and (os.stat(victim).st_mode & 0o7777) == 0o600


@pytest.mark.parametrize("field, value, fragment", [
    ("path", "containers/../../../../../etc", "path 'containers/../../../../../etc' is not 'containers/victim'"),
    ("path", "/etc", "path '/etc' is not 'containers/victim'"),
    ("control_dir", "/etc/../etc/cron.d", "control_dir '/etc/../etc/cron.d' is not normalised"),
])
def test_target_paths_cannot_leave_the_snapshot(world: Dict[str, Any], field: str, value: str, fragment: str) -> None:
    sid = tampered(world, lambda doc, _dst: doc["targets"][0].__setitem__(field, value))
    res = restore_refused(world, sid)
    assert fragment in res["msg"], res["msg"]


@pytest.mark.parametrize("root", ["/etc", "/var/lib/warmstart/elsewhere"])
def test_node_locations_come_from_the_node_not_the_manifest(world: Dict[str, Any], root: str) -> None:
    lab: Lab = world["lab"]
    sid = tampered(world, lambda doc, _dst: doc["targets"][0].__setitem__("workloads_root", root))
    res = restore_refused(world, sid)
    assert f"it ran under {root} at checkpoint" in res["msg"] and str(lab.workloads) in res["msg"], res["msg"]
    assert not Path(root, "victim").exists()


# --- 2. verify accounts for every file ----------------------------------------------------------

@pytest.mark.parametrize("how", ["dropped_then_corrupted", "extra_file", "symlinked_image"])
def test_verify_refuses_what_the_manifest_does_not_account_for(world: Dict[str, Any], how: str) -> None:
    lab: Lab = world["lab"]

    def change(doc: Dict[str, Any], dst: Path) -> None:
        pages = next(e for e in doc["files"] if "/pages-" in e["path"])
        if how == "dropped_then_corrupted":
            doc["files"].remove(pages)
            with open(dst / pages["path"], "r+b") as handle:
                handle.write(b"\xcc" * 4096)
        elif how == "extra_file":
            (dst / "containers" / "victim" / "criu" / "pages-99.img").write_bytes(b"planted")
        else:
            (dst / pages["path"]).unlink()
            (dst / pages["path"]).symlink_to("/etc/passwd")
    sid = tampered(world, change)
    info = lab.play([{"name": "info", "warmstart.snapshot.snapshot_info": {
        "store": str(lab.store), "verify": True}}])["info"]
    item = next(s for s in info["snapshots"] if s["id"] == sid)
    assert item["intact"] is False, item
    want = {"dropped_then_corrupted": "not listed in the manifest", "extra_file": "pages-99.img: not listed",
            "symlinked_image": "a symlink, not a regular file"}[how]
    assert any(want in p for p in item["problems"]), item["problems"]
    res = restore_refused(world, sid)
    assert want in res["msg"], res["msg"]


# --- 3. cleanup removes only warmstart's own staging entries ------------------------------------

def test_cleanup_keeps_foreign_entries_and_refuses_a_symlinked_tmp(world: Dict[str, Any], tmp_path: Path) -> None:
    lab: Lab = world["lab"]
    store = tmp_path / "store"
    (store / "snapshots").mkdir(parents=True)
    (store / "tmp").mkdir()
    foreign = store / "tmp" / "operator-notes"
    ours = store / "tmp" / ("0123abcd" * 4)
    for path in (foreign, ours):
        path.mkdir()
        (path / "f").write_text("x")
        os.utime(path, (time.time() - 7200, time.time() - 7200))
        os.utime(path / "f", (time.time() - 7200, time.time() - 7200))
    res = lab.play([{"name": "clean", "warmstart.snapshot.cleanup": {
        "store": str(store), "incomplete_older_than": "1h", "restore_root": str(tmp_path / "none")}}])["clean"]
    assert [e["path"] for e in res["removed_staging"]] == [str(ours)], res
    assert (foreign / "f").read_text() == "x"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("keep")
    os.utime(elsewhere / "precious", (time.time() - 7200, time.time() - 7200))
    shutil.rmtree(store / "tmp")
    (store / "tmp").symlink_to(elsewhere)
    res = lab.play([{"name": "clean", "ignore_errors": True, "warmstart.snapshot.cleanup": {
        "store": str(store), "incomplete_older_than": "1h", "restore_root": str(tmp_path / "none")}}])["clean"]
    assert res.get("failed") and "is a symlink" in res["msg"], res
    assert (elsewhere / "precious").read_text() == "keep"


# --- 4. a restore is exclusive and never leaves an untracked copy -------------------------------

def module_pids(marker: str) -> List[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if b"AnsiballZ_restore" in cmd and marker.encode() in Path(f"/proc/{entry}/environ").read_bytes():
                out.append(int(entry))
    # the module itself, not its restorer child (a fork of it, in a session of its own)
    return [pid for pid in out if os.getsid(pid) != pid]


def test_killed_restore_module_leaves_a_tracked_copy_and_no_second_one(world: Dict[str, Any], tmp_path: Path) -> None:
    lab: Lab = world["lab"]
    wrapper = slow_criu(tmp_path, 3)
    marker = f"WS_TEST_{os.getpid()}_{time.monotonic_ns()}"
    os.environ[marker] = "1"  # inherited by ansible and the module: identifies our module process
    try:
        done: Dict[str, Any] = {}
        runner = threading.Thread(target=lambda: done.update(lab.play([lab.restore(
            "restore", snapshot=world["sid"], criu_path=str(wrapper), expect_fail=True)], timeout=120)))
        runner.start()
        wait_for_swrk(wrapper, timeout=60, poll=0.05)  # the module is inside CRIU's restore
        assert module_pids(marker), "no restore module process found"
        for pid in module_pids(marker):
            os.kill(pid, signal.SIGKILL)
        runner.join(120)
    finally:
        del os.environ[marker]
    end = time.monotonic() + 30
    while lab.pidfile_pid("victim") is None and time.monotonic() < end:
        time.sleep(0.1)
    pid = lab.pidfile_pid("victim")
    assert pid is not None and pid in lab.ours(), "the restored copy is not tracked by its pidfile"
    assert query(world["port"])["token"] == lab.token("victim")
    again = lab.play([lab.restore("again", snapshot=world["sid"], expect_fail=True)])["again"]
    assert again.get("failed") and "is running on this node" in again["msg"], again
    assert len(lab.ours()) == 1
    lab.play([lab.stop("victim")])


def test_concurrent_restores_of_one_workload_start_one_copy(world: Dict[str, Any], tmp_path: Path) -> None:
    lab: Lab = world["lab"]
    wrapper = slow_criu(tmp_path, 2)
    results: List[Dict[str, Any]] = []

    def one(n: int) -> None:
        results.append(lab.play([lab.restore(f"restore {n}", snapshot=world["sid"], criu_path=str(wrapper),
                                             expect_fail=True)], timeout=120)[f"restore {n}"])
    threads = [threading.Thread(target=one, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    ok = [r for r in results if not r.get("failed")]
    refused = [r for r in results if r.get("failed")]
    assert len(ok) == 1 and len(refused) == 1, results
    assert "another restore of workload victim" in refused[0]["msg"] or "is running on this node" in refused[0]["msg"]
    assert len(lab.ours()) == 1 and lab.pidfile_pid("victim") == ok[0]["restore"]["pid"]
    lab.play([lab.stop("victim")])


# --- 5. one bad manifest does not break the store for everyone ----------------------------------

@pytest.mark.parametrize("bad", ["deep", "labels_list", "targets_strings", "no_created_at"])
def test_a_broken_manifest_is_listed_broken_and_the_others_still_work(world: Dict[str, Any], bad: str) -> None:
    lab: Lab = world["lab"]
    sid = mf.new_id()
    top = lab.store / "snapshots" / sid
    top.mkdir(mode=0o700)
    doc = json.loads((lab.store / "snapshots" / world["sid"] / "manifest.json").read_text())
    doc["id"] = sid
    body = {"deep": None, "labels_list": dict(doc, labels=["a"]), "targets_strings": dict(doc, targets=["x"]),
            "no_created_at": {k: v for k, v in doc.items() if k != "created_at"}}[bad]
    (top / "manifest.json").write_text('{"schema": 1, "x": ' + "[" * 20000 + "]" * 20000 + "}" if body is None
                                       else json.dumps(body))
    res = lab.play([
        {"name": "info", "warmstart.snapshot.snapshot_info": {"store": str(lab.store)}},
        lab.restore("restore by name", name="victim", check=True, expect_fail=True),
        lab.restore("restore by name, skipping", name="victim", check=True, skip_unreadable=True),
        {"name": "clean", "check_mode": True, "warmstart.snapshot.cleanup": {
            "store": str(lab.store), "remove_broken": True, "restore_root": str(lab.restore_root)}},
    ])
    broken = {b["id"]: b for b in res["info"]["broken"]}
    assert sid in broken and "manifest" in broken[sid]["error"], res["info"]["broken"]
    assert world["sid"] in [s["id"] for s in res["info"]["snapshots"]]
    # newer than the good one, unreadable: it might be a newer version of "victim", so no silent fallback
    assert "refusing to fall back to an older one silently" in res["restore by name"]["msg"]
    assert res["restore by name"]["reasons"][0].startswith(f"{sid}: unreadable: ")
    skipping = res["restore by name, skipping"]["restore"]
    assert skipping["id"] == world["sid"] and sid in [p["id"] for p in skipping["passed_over"]]
    removed = [e["id"] for e in res["clean"]["removed"]]
    assert sid in removed and world["sid"] not in removed
    world["copies"].append(top)


# --- 6. empty and almost-valid input ------------------------------------------------------------

@pytest.mark.parametrize("args, fragment", [
    ({"snapshot": ""}, "empty value for snapshot"),
    ({"name": ""}, "empty value for name"),
    ({"name": "victim\n"}, "is not allowed"),
    ({"snapshot": "20261202T120000Z-1a2b3c4d\n"}, "is malformed"),
])
def test_empty_and_almost_valid_selectors_are_refused(world: Dict[str, Any], args: Dict[str, str], fragment: str) -> None:
    lab: Lab = world["lab"]
    res = lab.play([lab.restore("restore", expect_fail=True, **args)])["restore"]
    assert res.get("failed") and fragment in res["msg"], res
    assert lab.ours() == []


# --- 7. errors that said the wrong thing ---------------------------------------------------------

def test_a_non_root_caller_is_told_permission_denied(world: Dict[str, Any]) -> None:
    lab: Lab = world["lab"]
    code = ("import sys; sys.path.insert(0, sys.argv[1]);"
            "from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st;"
            "print(st.FsStore(sys.argv[2]).list())")
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
                           code, str(REPO / ".collections"), str(lab.store)],
                          capture_output=True, text=True, check=False)
    assert done.returncode != 0 and "permission denied" in done.stderr, (done.stdout, done.stderr)


def test_cleanup_counts_what_it_kept_after_removing(world: Dict[str, Any], tmp_path: Path) -> None:
    lab: Lab = world["lab"]
    store = tmp_path / "one"
    shutil.copytree(lab.store / "snapshots" / world["sid"], store / "snapshots" / world["sid"])
    res = lab.play([{"name": "clean", "warmstart.snapshot.cleanup": {
        "store": str(store), "snapshot_ids": [world["sid"]], "restore_root": str(tmp_path / "none")}}])["clean"]
    assert [e["id"] for e in res["removed"]] == [world["sid"]] and res["kept"] == []
    assert "kept 0 snapshot(s)" in res["msg"], res["msg"]
