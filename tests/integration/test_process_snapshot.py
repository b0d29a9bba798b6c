"""Process snapshots end to end: a warm process is checkpointed and restored through the real modules.

The workload (SERVER below, written into each test's tmp_path) holds the kinds of state an inference
server holds: a counter that keeps ticking, 50 MB of random memory whose SHA256 it reports, a journal
file in its workload dir that it appends to (opened O_RDWR|O_APPEND, so CRIU records its size and checks
it at restore - the engine's copy of the workload's own files is what makes that restorable after the
source wrote on; a file outside that dir is restorable only while nobody changes it, see test_faults),
a listening TCP socket on 127.0.0.1 (SO_REUSEADDR) that answers with its state, and a
unix socketpair whose far end a thread echoes through.

Every test has its own store, workloads root and restore root under tmp_path; a finalizer kills every
process running that test's copy of the script (sources and restored copies alike) and unmounts what
the test mounted.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from .ansible_run import Run, playbook

pytestmark = pytest.mark.integration

SERVER = r'''
"""warmstart test workload: memory, an open journal, a TCP listener, a socketpair."""
import argparse, ctypes, hashlib, json, os, platform, select, socket, threading

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--mb", type=int, default=50)
ap.add_argument("--pattern", action="store_true", help="fill memory with a pattern (fast; no hashing)")
ap.add_argument("--outside", help="also append to this file, outside the workload dir")
ap.add_argument("--perf", action="store_true", help="hold a perf_event fd, which CRIU cannot dump")
args = ap.parse_args()

ctl = os.environ["SNAPSHOT_CONTROL_DIR"]
wdir = os.path.dirname(ctl)
token = os.urandom(8).hex()
size = args.mb << 20
mem = bytearray(b"\xa5") * size if args.pattern else bytearray(os.urandom(size))
hashing = not args.pattern
digest = hashlib.sha256(mem).hexdigest() if hashing else None
# O_RDWR|O_APPEND: CRIU records this file's size and checks it at restore
# (it does not for O_WRONLY|O_APPEND files such as stdout.log).
journal = open(os.path.join(wdir, "journal.log"), "a+", buffering=1)
outside = open(args.outside, "a+", buffering=1) if args.outside else None
perf_fd = None
if args.perf:
    nr = {"x86_64": 298, "aarch64": 241}.get(platform.machine())
    attr = ctypes.create_string_buffer(128)
    attr[0:8] = (1).to_bytes(4, "little") + (128).to_bytes(4, "little")  # PERF_TYPE_SOFTWARE, size; CPU clock
    perf_fd = ctypes.CDLL(None, use_errno=True).syscall(nr, attr, 0, -1, -1, 0) if nr else -1
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


def echo():
    while True:
        data = b.recv(4096)
        if not data:
            return
        b.sendall(data[::-1])


threading.Thread(target=echo, daemon=True).start()
srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", args.port))
srv.listen(16)
print(f"token={token} port={args.port} perf_fd={perf_fd}", flush=True)
ready = os.path.join(ctl, "ready-for-snapshot")
with open(ready + ".tmp", "w") as handle:
    handle.write(token + "\n")
os.rename(ready + ".tmp", ready)
counter = 0
while True:
    readable, _, _ = select.select([srv], [], [], 0.05)
    counter += 1
    journal.write(f"tick {counter}\n")
    if outside:
        outside.write(f"tick {counter}\n")
    if not readable:
        continue
    conn, _ = srv.accept()
    with conn:
        conn.settimeout(5)
        conn.recv(64)
        probe = os.urandom(16)
        a.sendall(probe)
        echoed = a.recv(4096)
        state = {"counter": counter, "token": token, "pid": os.getpid(), "digest_at_start": digest,
                 "sha256": hashlib.sha256(mem).hexdigest() if hashing else None,
                 "pair_ok": echoed == probe[::-1], "journal_size": os.fstat(journal.fileno()).st_size}
        conn.sendall((json.dumps(state) + "\n").encode())
'''

TICK = 0.05  # the workload's loop period: its counter cannot grow faster than 1/TICK per second (+1 per query)


# --- helpers shared with test_faults.py ----------------------------------------

def needs_root_and_criu() -> None:
    if os.geteuid() != 0:
        pytest.fail("checkpoints need root")
    if not os.access("/usr/local/bin/criu", os.X_OK) and not os.access("/opt/warmstart/criu/current/bin/criu", os.X_OK):
        pytest.fail("no CRIU on this node although prepare_nodes ran")
    probe = subprocess.run(["/usr/bin/python3", "-c", "import pycriu"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.fail("/usr/bin/python3 cannot import pycriu although prepare_nodes ran")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def query(port: int, timeout: float = 10.0) -> Dict[str, Any]:
    """The workload's state, over its TCP socket (retried briefly: a restore may still be settling)."""
    end = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(b"state\n")
                data = b""
                while not data.endswith(b"\n"):
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            return json.loads(data)
        except (OSError, ValueError):
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


def proc_state(pid: int) -> str:
    """One-letter state from /proc/<pid>/stat ('-' when gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return "-"


def tracer_pid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("TracerPid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def running_free(pid: int) -> bool:
    """Alive, not stopped ('T') nor held by a tracer (CRIU)."""
    return proc_state(pid) in ("R", "S", "D") and tracer_pid(pid) == 0


def pids_running(needle: str) -> List[int]:
    """PIDs whose command line contains ``needle``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmd = handle.read()
        except OSError:
            continue
        if needle.encode() in cmd and proc_state(int(entry)) not in ("Z", "X", "-"):
            out.append(int(entry))
    return out


def listing(top: Path) -> List[str]:
    """Relative paths of everything under ``top`` (empty if it does not exist)."""
    if not top.exists():
        return []
    return sorted(str(p.relative_to(top)) for p in top.rglob("*"))


class Lab:
    """One test's world: script, store, workloads root and restore root under its tmp dir."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.script = tmp / "server.py"
        self.script.write_text(SERVER)
        self.store = tmp / "store"
        self.workloads = tmp / "workloads"
        self.restore_root = tmp / "restore"
        self.mounts: List[Path] = []
        self.runs = 0
        self.last: Optional[Run] = None

    # -- playbooks ---------------------------------------------------------
    def play(self, tasks: List[Dict[str, Any]], timeout: int = 300) -> Dict[str, Dict[str, Any]]:
        """Run ``tasks`` (each named) on localhost; each task's result by name.

        A task that fails without ``ignore_errors`` fails the test; those with it are the expected failures.
        """
        self.runs += 1
        path = self.tmp / f"play{self.runs}.yml"
        path.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}], indent=1))
        run = playbook(str(path), timeout=timeout)
        self.last = run
        try:
            plays = run.result["plays"]
        except (ValueError, KeyError):
            pytest.fail(f"no JSON from ansible-playbook (rc={run.rc}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
        results = {t["task"]["name"]: t["hosts"]["localhost"] for t in plays[0]["tasks"]}
        for task in tasks:
            res = results.get(task["name"])
            assert res is not None, f"task {task['name']!r} did not run:\n{json.dumps(results, indent=1)[-4000:]}"
            if res.get("failed") and not task.get("ignore_errors"):
                pytest.fail(f"task {task['name']!r} failed: {res.get('msg')}\n{json.dumps(res, indent=1)[-3000:]}")
        return results

    # -- task builders -------------------------------------------------------
    def start(self, name: str, port: int, mb: int, *extra: str) -> Dict[str, Any]:
        return {"name": f"start {name}", "warmstart.snapshot.workload": {
            "name": name, "root": str(self.workloads), "wait_ready": True, "ready_timeout": 120,
            "command": ["/usr/bin/python3", str(self.script), "--port", str(port), "--mb", str(mb), *extra]}}

    def stop(self, name: str) -> Dict[str, Any]:
        return {"name": f"stop {name}", "warmstart.snapshot.workload": {
            "name": name, "root": str(self.workloads), "state": "stopped"}}

    def checkpoint(self, task: str, store: Optional[Path] = None, expect_fail: bool = False,
                   check: bool = False, **args: Any) -> Dict[str, Any]:
        args.setdefault("workloads_root", str(self.workloads))
        out: Dict[str, Any] = {"name": task, "warmstart.snapshot.checkpoint": {"store": str(store or self.store), **args}}
        if expect_fail:
            out["ignore_errors"] = True
        if check:
            out["check_mode"] = True
        return out

    def restore(self, task: str, store: Optional[Path] = None, restore_root: Optional[Path] = None,
                expect_fail: bool = False, check: bool = False, **args: Any) -> Dict[str, Any]:
        if "into" not in args:
            args.setdefault("workloads_root", str(self.workloads))
        out: Dict[str, Any] = {"name": task, "warmstart.snapshot.restore": {
            "store": str(store or self.store), "restore_root": str(restore_root or self.restore_root), **args}}
        if expect_fail:
            out["ignore_errors"] = True
        if check:
            out["check_mode"] = True
        return out

    # -- state ----------------------------------------------------------------
    def wdir(self, name: str) -> Path:
        return self.workloads / name

    def pidfile_pid(self, name: str) -> Optional[int]:
        path = self.wdir(name) / "pid"
        return int(path.read_text()) if path.exists() else None

    def token(self, name: str) -> str:
        """The token the workload printed at start (in the stdout.log it alone holds)."""
        found = re.findall(r"token=([0-9a-f]+)", (self.wdir(name) / "stdout.log").read_text())
        assert found, f"{name} printed no token"
        return found[-1]

    def published(self, store: Optional[Path] = None) -> List[str]:
        snaps = (store or self.store) / "snapshots"
        return sorted(os.listdir(snaps)) if snaps.is_dir() else []

    def staging(self, store: Optional[Path] = None) -> List[str]:
        tmp = (store or self.store) / "tmp"
        return sorted(os.listdir(tmp)) if tmp.is_dir() else []

    def ours(self) -> List[int]:
        """Every live process running this test's copy of the workload script."""
        return pids_running(str(self.script))

    def mount_tmpfs(self, path: Path, options: str) -> None:
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            pytest.fail(f"cannot mount a tmpfs (tests run as root): {done.stderr.strip()}")
        self.mounts.append(path)

    def remount_ro(self, path: Path) -> None:
        subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True, capture_output=True)

    def cleanup(self) -> None:
        for pid in self.ours():
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        end = time.monotonic() + 10
        while self.ours() and time.monotonic() < end:
            time.sleep(0.05)
        for path in reversed(self.mounts):
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


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
    assert res["id"] == info["id"] and res["ns_pid"] == 1 and res["workload"] == "warm"
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

    # Once that copy is stopped, the same snapshot restores again.
    again = lab.play([lab.stop("twice"), lab.restore("again", name="twice")])["again"]["restore"]
    assert again["id"] == first["id"] and again["pid"] != first["pid"]
    assert lab.ours() == [again["pid"]]
    assert query(port)["pair_ok"] is True
