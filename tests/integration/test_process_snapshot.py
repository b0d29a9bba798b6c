"""Process snapshots end to end: a warm process is checkpointed and restored through the real modules.

The workload (process_lab.SERVER, written into each test's tmp_path) holds the kinds of state an inference
server holds: a counter that keeps ticking, 50 MB of random memory whose SHA256 it reports, a journal
file in its workload dir that it appends to (opened O_RDWR|O_APPEND, so CRIU records its size and checks
it at restore - the engine's copy of the workload's own files is what makes that restorable after the
source wrote on; a file outside that dir is restorable only while nobody changes it, see test_faults),
a listening TCP socket on 127.0.0.1 (SO_REUSEADDR) that answers with its state, and a
unix socketpair whose far end a thread echoes through.

Every test has its own store, workloads root and restore root under tmp_path (the ``lab`` fixture); a
finalizer kills every process running that test's copy of the script (sources and restored copies alike)
and unmounts what the test mounted.
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from typing import List

import pytest

from .process_lab import Lab, free_port, port_open, proc_state, query, running_free

pytestmark = pytest.mark.integration

TICK = 0.05  # the workload's loop period: its counter cannot grow faster than 1/TICK per second (+1 per query)


def listing(top: Path) -> List[str]:
    """Relative paths of everything under ``top`` (empty if it does not exist)."""
    if not top.exists():
        return []
    return sorted(str(p.relative_to(top)) for p in top.rglob("*"))


def assert_locked_down(snap_dir: Path) -> None:
    """Snapshots hold process memory: every directory 0700, every file 0600."""
    assert (os.stat(snap_dir).st_mode & 0o7777) == 0o700
    for path in [snap_dir, *snap_dir.rglob("*")]:
        mode = os.lstat(path).st_mode & 0o7777
        want = 0o700 if path.is_dir() else 0o600
        assert mode == want, f"{path} has mode {oct(mode)}, want {oct(want)}"


def journal_ticks(path: Path) -> List[int]:
    return [int(line.split()[1]) for line in path.read_text().splitlines()]


# --- the "done when" ---------------------------------------------------------------

def test_checkpoint_stops_source_and_restore_continues_its_state(lab: Lab) -> None:
    port = free_port()
    outside = lab.tmp / "outside.log"  # a file outside the workload dir: restorable while nobody else changes it
    pid = lab.play([lab.start("warm", port, 50, "--outside", str(outside))])["start warm"]["workload"]["pid"]
    before = query(port)
    while before["counter"] < 20:  # enough ticks that a restart from zero could not pass for a continuation
        time.sleep(0.2)
        before = query(port)
    t_before = time.monotonic()
    assert before["pair_ok"] and before["pid"] == 1 and before["sha256"] == before["digest_at_start"]

    snap = lab.play([lab.checkpoint("checkpoint", workload="warm", leave_running=False,
                                    labels={"model": "test"})])["checkpoint"]
    assert snap["changed"] is True
    info = snap["snapshot"]
    assert info["source_running"] is False and info["pid"] == pid

    # The source is gone, its port free, its pidfile removed.
    assert proc_state(pid) in ("-", "Z")
    assert not port_open(port)
    assert lab.pidfile_pid("warm") is None

    # Published: manifest present, staging empty, everything 0700/0600.
    assert lab.published() == [info["id"]]
    assert lab.staging() == []
    snap_dir = lab.store / "snapshots" / info["id"]
    assert Path(info["path"]) == snap_dir
    manifest = json.loads((snap_dir / "manifest.json").read_text())
    assert manifest["id"] == info["id"] and manifest["name"] == "warm" and manifest["labels"] == {"model": "test"}
    assert manifest["schema"] == 1 and manifest["source"]["arch"] == os.uname().machine
    target = manifest["targets"][0]
    assert target["workload"] == "warm" and target["pid"] == pid and target["ns_pid"] == 1
    recorded = {f["path"]: f for f in manifest["files"]}
    pages = [p for p in recorded if re.match(r"containers/warm/criu/pages-\d+\.img$", p)]
    assert pages and sum(recorded[p]["size"] for p in pages) >= 50 << 20
    assert "containers/warm/files/journal.log" in recorded
    assert manifest["size"] == sum(f["size"] for f in manifest["files"])
    assert_locked_down(snap_dir)
    assert (os.stat(lab.store).st_mode & 0o777) == 0o700
    assert (os.stat(lab.store / "snapshots").st_mode & 0o777) == 0o700
    snap_journal = journal_ticks(snap_dir / "containers/warm/files/journal.log")

    # Restore the newest compatible snapshot by name.
    restored = lab.play([lab.restore("restore", name="warm", labels={"model": "test"})])["restore"]
    assert restored["changed"] is True
    res = restored["restore"]
    assert res["id"] == info["id"] and res["ns_pid"] == 1 and res["workload_name"] == "warm"
    # CRIU's statistics in warmstart's units: times in seconds (CRIU's images count microseconds), pages counted
    for stats, timed in ((info["criu_stats"], "frozen_time"), (res["criu_stats"], "restore_time")):
        assert isinstance(stats[timed], float) and 0 < stats[timed] < 60, stats
    assert isinstance(info["criu_stats"]["pages_written"], int) and info["criu_stats"]["pages_written"] >= 50 << 8
    after = query(port)
    elapsed = time.monotonic() - t_before
    # The counter continues: not below its value at checkpoint, and no further on than the process could
    # have ticked while it actually ran (a wall-clock bound; a restart from zero would be far below).
    assert before["counter"] <= after["counter"] < before["counter"] + elapsed / TICK + 10, (before, after, elapsed)
    assert after["token"] == before["token"]
    assert after["sha256"] == before["sha256"] == after["digest_at_start"]
    assert after["pair_ok"] is True
    assert after["pid"] == 1

    # restore-complete names the namespace pid; the pidfile the host pid.
    complete = (lab.wdir("warm") / "control" / "restore-complete").read_text()
    assert "pid=1" in complete.splitlines() and f"host_pid={res['pid']}" in complete
    assert f"snapshot={info['id']}" in complete
    assert lab.pidfile_pid("warm") == res["pid"]
    assert running_free(res["pid"])
    assert Path(res["work_dir"]).parent == lab.restore_root and (Path(res["work_dir"]) / "restore.log").exists()

    # The journal, opened O_RDWR|O_APPEND, continues the snapshot's copy: ticks 1..N, no gap, no repeat.
    ticks = journal_ticks(lab.wdir("warm") / "journal.log")
    assert ticks[:len(snap_journal)] == snap_journal
    assert ticks == list(range(1, len(ticks) + 1)) and len(ticks) > len(snap_journal)
    assert after["journal_size"] >= (snap_dir / "containers/warm/files/journal.log").stat().st_size
    # The outside file, untouched between checkpoint and restore, continues the same way.
    assert journal_ticks(outside) == list(range(1, len(journal_ticks(outside)) + 1))
    assert str(outside) in target["files_in_use"]


def test_leave_running_snapshot_then_restore_after_stopping_source(lab: Lab) -> None:
    port = free_port()
    pid = lab.play([lab.start("keep", port, 16)])["start keep"]["workload"]["pid"]
    time.sleep(0.5)
    before = query(port)

    info = lab.play([lab.checkpoint("checkpoint", workload="keep", leave_running=True)])["checkpoint"]["snapshot"]
    assert info["source_running"] is True
    # The source keeps running and answering, with the same memory, and keeps writing its journal.
    assert running_free(pid) and lab.pidfile_pid("keep") == pid
    during = query(port)
    assert during["token"] == before["token"] and during["sha256"] == before["sha256"]
    assert during["counter"] > before["counter"] and during["pair_ok"]
    snap_dir = lab.store / "snapshots" / info["id"]
    snap_journal = snap_dir / "containers/keep/files/journal.log"
    time.sleep(0.5)
    assert (lab.wdir("keep") / "journal.log").stat().st_size > snap_journal.stat().st_size

    # While the source runs, a restore is refused (it would share its files and port).
    t_restore = time.monotonic()
    results = lab.play([
        lab.restore("refused while source runs", snapshot=info["id"], expect_fail=True),
        lab.stop("keep"),
        lab.restore("restore", snapshot=info["id"]),
    ])
    refused = results["refused while source runs"]
    assert refused["failed"] is True
    assert f"workload keep is running on this node (pid {pid})" in refused["msg"]
    assert results["stop keep"]["changed"] is True
    res = results["restore"]["restore"]
    assert res["pid"] != pid

    after = query(port)
    since_restore = time.monotonic() - t_restore
    assert after["token"] == before["token"] and after["sha256"] == before["sha256"] and after["pair_ok"]
    # It continues from the snapshot (taken between `before` and `during`), not from where the source stopped.
    assert before["counter"] <= after["counter"] < during["counter"] + since_restore / TICK + 10
    assert after["pid"] == 1
    # The supported open-file case: the source appended to its journal after the snapshot, which CRIU
    # would refuse (size check); the engine put the snapshot's copy back and kept the source's aside.
    journal = lab.wdir("keep") / "journal.log"
    ticks = journal_ticks(journal)
    assert ticks == list(range(1, len(ticks) + 1))
    assert ticks[:len(journal_ticks(snap_journal))] == journal_ticks(snap_journal)
    kept = list(lab.wdir("keep").glob("journal.log.pre-restore-*"))
    assert len(kept) == 1 and journal_ticks(kept[0])[-1] > journal_ticks(snap_journal)[-1]


def test_check_mode_changes_nothing(lab: Lab) -> None:
    port = free_port()
    pid = lab.play([lab.start("dry", port, 8)])["start dry"]["workload"]["pid"]
    before = query(port)

    dry = lab.play([lab.checkpoint("checkpoint check", check=True, workload="dry", leave_running=False)])
    res = dry["checkpoint check"]
    assert res["changed"] is True and "would snapshot pid" in res["msg"] and "snapshot" not in res
    assert res["target"]["pid"] == pid
    assert lab.published() == [] and lab.staging() == []
    assert running_free(pid) and lab.pidfile_pid("dry") == pid
    assert query(port)["token"] == before["token"]

    results = lab.play([
        lab.checkpoint("checkpoint", workload="dry", leave_running=False),
        lab.restore("restore check", check=True, name="dry"),
    ])
    snap_id = results["checkpoint"]["snapshot"]["id"]
    plan = results["restore check"]
    assert plan["changed"] is True and plan["restore"]["id"] == snap_id
    assert plan["restore"]["verified"] is True and plan["restore"]["compat_checked"] is True
    assert "pid" not in plan["restore"]
    # Nothing restored: no process, no pidfile, no restore work dir, no sentinel.
    assert lab.ours() == [] and not port_open(port)
    assert lab.pidfile_pid("dry") is None
    assert listing(lab.restore_root) == []
    assert not (lab.wdir("dry") / "control" / "restore-complete").exists()
    assert not list(lab.wdir("dry").glob("*.pre-restore-*"))


def test_second_restore_of_same_snapshot_is_refused_while_first_runs(lab: Lab) -> None:
    port = free_port()
    results = lab.play([
        lab.start("twice", port, 8),
        lab.checkpoint("checkpoint", workload="twice", leave_running=False),
        lab.restore("first", name="twice"),
        lab.restore("second", name="twice", expect_fail=True),
    ])
    first = results["first"]["restore"]
    second = results["second"]
    assert second["failed"] is True
    assert second["msg"].startswith(f"refusing to restore snapshot {first['id']} (twice) on this node")
    assert second["reasons"] == [
        f"workload twice is running on this node (pid {first['pid']}); a restored copy would share its files "
        "and ports - stop it first"]
    # Only the first copy runs, untouched; the refused one left no work dir.
    assert lab.ours() == [first["pid"]] and running_free(first["pid"])
    assert lab.pidfile_pid("twice") == first["pid"]
    assert sorted(os.listdir(lab.restore_root)) == [Path(first["work_dir"]).name]
    assert query(port)["pid"] == 1

    # if_running: keep - a re-run converges on the copy of this snapshot (check mode too); a newer snapshot of the
    # workload (taken from the copy) does not replace the copy running from the older one: still refused.
    kept = lab.play([lab.restore("keep", name="twice", if_running="keep"),
                     lab.restore("keep, check", name="twice", if_running="keep", check=True),
                     lab.checkpoint("newer", workload="twice", leave_running=True),
                     lab.restore("keep, newer", name="twice", if_running="keep", expect_fail=True)])
    for task in ("keep", "keep, check"):
        assert kept[task]["changed"] is False, kept[task]
        assert kept[task]["restore"]["already_running"] is True and kept[task]["restore"]["pid"] == first["pid"]
        assert kept[task]["msg"] == (f"workload twice already runs as the restore of snapshot {first['id']} "
                                     f"(pid {first['pid']})")
    newer = kept["keep, newer"]
    assert newer["failed"] is True and newer["reasons"] == second["reasons"], newer
    assert lab.ours() == [first["pid"]] and running_free(first["pid"])

    # Once that copy is stopped, the same snapshot restores again.
    again = lab.play([lab.stop("twice"), lab.restore("again", snapshot=first["id"])])["again"]["restore"]
    assert again["id"] == first["id"] and again["pid"] != first["pid"]
    assert lab.ours() == [again["pid"]]
    assert query(port)["pair_ok"] is True


def test_journal_appended_to_around_the_dump_is_cut_back_to_the_dumps_size(lab: Lab) -> None:
    """A file CRIU records the size of grows while the checkpoint runs (here another process appends to the
    workload's journal every millisecond; the source itself can run on for a moment before CRIU's SIGSTOP
    takes hold). The copy in the snapshot is cut back to the size the dump recorded, so the restore's size
    check passes and the journal the copy finds is the one its memory knows."""
    port = free_port()
    lab.play([lab.start("appended", port, 8, "--pattern")])
    journal = lab.wdir("appended") / "journal.log"
    stop = threading.Event()

    def append() -> None:
        with open(journal, "a", encoding="utf-8") as handle:
            while not stop.is_set():
                handle.write("outside\n")
                handle.flush()
                time.sleep(0.001)

    writer = threading.Thread(target=append, daemon=True)
    writer.start()
    try:
        snap = lab.play([lab.checkpoint("checkpoint", workload="appended", leave_running=False)])["checkpoint"]
    finally:
        stop.set()
        writer.join()
    sid = snap["snapshot"]["id"]
    entry = json.loads((lab.store / "snapshots" / sid / "manifest.json").read_text())["targets"][0]
    trimmed = entry.get("workload_files_trimmed")
    assert trimmed and trimmed[0]["path"] == "journal.log" and trimmed[0]["bytes"] > 0, entry
    kept = (lab.store / "snapshots" / sid / "containers" / "appended" / "files" / "journal.log").read_bytes()
    lab.play([lab.restore("restore", snapshot=sid)])
    state = query(port)
    assert state["journal_size"] >= len(kept), (state, len(kept))  # the copy appends on from the dump's size
    assert journal.read_bytes().startswith(kept), "the restored journal does not go on from the snapshot's"
