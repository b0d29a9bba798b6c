"""Faults in checkpoint and restore, through the real modules: each is refused or fails with a clear
reason, leaves the source running (not stopped, not traced), publishes nothing and leaves no staging
behind (except when the checkpointing module itself is killed: then only its staging is left, for
cleanup); a refused restore touches nothing - no work dir, no sentinel, no process.

Faults that share a set-up run as the tasks of one playbook (each with its own store and restore root)
and are checked case by case.
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
from typing import Any, Dict, Iterator, Optional, Tuple

import pytest

from .ansible_run import REPO, VENV_BIN, ansible_env
from .process_lab import (Lab, free_port, needs_root_and_criu, port_open, proc_state, query, running_free,
                          tracer_pid, wait_for_swrk)

# serial: it watches what the whole node holds (its mount table, any CRIU worker running): nothing else may run beside it.
pytestmark = [pytest.mark.integration, pytest.mark.serial]

PF_KTHREAD = 0x00200000


@pytest.fixture(scope="module")
def module_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    needs_root_and_criu()
    world = Lab(tmp_path_factory.mktemp("faults"))
    try:
        yield world
    finally:
        world.cleanup()


def unused_pid() -> int:
    with open("/proc/sys/kernel/pid_max", encoding="ascii") as handle:
        pid_max = int(handle.read())
    for pid in range(pid_max - 1, 300, -1):
        if not os.path.exists(f"/proc/{pid}"):
            return pid
    raise AssertionError("no unused pid")


def vanished_pid() -> int:
    child = subprocess.Popen(["sleep", "60"])
    child.kill()
    child.wait()
    assert proc_state(child.pid) == "-"
    return child.pid


def kernel_thread() -> Optional[Tuple[int, str]]:
    for entry in ["2"] + sorted(os.listdir("/proc")):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                flags = int(handle.read().rsplit(b")", 1)[1].split()[6])
            with open(f"/proc/{entry}/status", encoding="utf-8") as handle:
                name = handle.readline().split(":", 1)[1].strip()
        except (OSError, IndexError, ValueError):
            continue
        if flags & PF_KTHREAD:
            return int(entry), name
    return None  # e.g. in a container with its own PID namespace


def source_untouched(lab: Lab, name: str, pid: int, port: int, token: str) -> None:
    """The source still runs free (not 'T', no tracer), under the same pid, with the same memory."""
    assert running_free(pid), f"{name} (pid {pid}) is {proc_state(pid)}, tracer {tracer_pid(pid)}"
    assert lab.pidfile_pid(name) == pid
    state = query(port)
    assert state["token"] == token and state["pair_ok"] is True


# --- bad targets ----------------------------------------------------------------------

TARGET_CASES = ["unknown pid", "vanished pid", "pid 1", "kernel thread", "pidfile without a pid",
                "workload not running", "name with slash", "name with dotdot"]


@pytest.fixture(scope="module")
def target_faults(module_lab: Lab) -> Dict[str, Any]:
    lab = module_lab
    port = free_port()
    unknown, vanished = unused_pid(), vanished_pid()
    kpid, kname = kernel_thread() or (0, "")
    junk = lab.tmp / "junk.pid"
    junk.write_text("not-a-pid\n")
    args = {
        "unknown pid": {"pid": unknown},
        "vanished pid": {"pid": vanished},
        "pid 1": {"pid": 1},
        "kernel thread": {"pid": kpid},
        "pidfile without a pid": {"pidfile": str(junk)},
        "workload not running": {"workload": "ghost"},
        "name with slash": {"workload": "victim", "name": "../escape"},
        "name with dotdot": {"workload": "victim", "name": "x..y"},
    }
    tasks = [lab.start("victim", port, 8)]
    for case in TARGET_CASES:
        if case == "kernel thread" and not kpid:
            continue
        # leave_running=false: were a bad request to go ahead, the source would be gone
        tasks.append(lab.checkpoint(case, lab.tmp / f"store-{case.replace(' ', '-')}", expect_fail=True,
                                    leave_running=False, **args[case]))
    results = lab.play(tasks)
    expected = {
        "unknown pid": f"pid {unknown}: no such running process",
        "vanished pid": f"pid {vanished}: no such running process",
        "pid 1": "pid 1 is this node's init; it cannot be checkpointed",
        "kernel thread": f"pid {kpid} is a kernel thread ({kname}); only user processes can be checkpointed",
        "pidfile without a pid": f"pidfile {junk} does not hold a pid (found 'not-a-pid')",
        "workload not running": f"workload ghost is not running (no live pid in {lab.wdir('ghost') / 'pid'})",
        "name with slash": "snapshot name '../escape' is not allowed",
        "name with dotdot": "snapshot name 'x..y' is not allowed",
    }
    return {"results": results, "expected": expected, "port": port,
            "pid": results["start victim"]["workload"]["pid"], "token": lab.token("victim")}


@pytest.mark.parametrize("case", TARGET_CASES)
def test_bad_target_is_refused_and_source_keeps_running(module_lab: Lab, target_faults: Dict[str, Any],
                                                        case: str) -> None:
    lab = module_lab
    assert case in target_faults["results"], "no kernel thread visible in /proc (kthreadd is pid 2 on Linux)"
    res = target_faults["results"][case]
    assert res["failed"] is True
    assert target_faults["expected"][case] in res["msg"], res["msg"]
    if "name" in case:
        assert "without '/' or '..'" in res["msg"]
    store = lab.tmp / f"store-{case.replace(' ', '-')}"
    assert lab.published(store) == [] and lab.staging(store) == []
    source_untouched(lab, "victim", target_faults["pid"], target_faults["port"], target_faults["token"])


# --- dump faults: CRIU refuses, store read-only, store full ------------------------------

DUMP_CASES = ["criu cannot dump", "store read-only (empty)", "store read-only (laid out)", "store full"]


@pytest.fixture(scope="module")
def dump_faults(module_lab: Lab) -> Dict[str, Any]:
    lab = module_lab
    ports = {"steady": free_port(), "perfy": free_port()}
    ro_empty, ro_laid, full = lab.tmp / "ro-empty", lab.tmp / "ro-laid", lab.tmp / "full"
    lab.mount_tmpfs(ro_empty, "size=1m,mode=0700,ro")
    lab.mount_tmpfs(ro_laid, "size=1m,mode=0700")
    (ro_laid / "snapshots").mkdir(mode=0o700)
    (ro_laid / "tmp").mkdir(mode=0o700)
    lab.remount_ro(ro_laid)
    lab.mount_tmpfs(full, "size=2m,mode=0700")
    stores = {"criu cannot dump": lab.tmp / "store-perf", "store read-only (empty)": ro_empty,
              "store read-only (laid out)": ro_laid, "store full": full}
    targets = {"criu cannot dump": "perfy", "store read-only (empty)": "steady",
               "store read-only (laid out)": "steady", "store full": "steady"}
    tasks = [lab.start("steady", ports["steady"], 50), lab.start("perfy", ports["perfy"], 1, "--perf")]
    for case in DUMP_CASES:
        tasks.append(lab.checkpoint(case, stores[case], expect_fail=True, workload=targets[case],
                                    leave_running=False))
    results = lab.play(tasks)
    return {"results": results, "stores": stores, "targets": targets, "ports": ports,
            "pids": {n: results[f"start {n}"]["workload"]["pid"] for n in ports},
            "tokens": {n: lab.token(n) for n in ports},
            "perf_ok": "perf_fd=-1" not in (lab.wdir("perfy") / "stdout.log").read_text()}


@pytest.mark.parametrize("case", DUMP_CASES)
def test_failed_dump_leaves_source_running_and_nothing_published(
        module_lab: Lab, dump_faults: Dict[str, Any], case: str) -> None:
    lab = module_lab
    if case == "criu cannot dump":
        assert dump_faults["perf_ok"], "perf_event_open was refused: the test has no fd CRIU cannot dump"
    res = dump_faults["results"][case]
    store = dump_faults["stores"][case]
    name = dump_faults["targets"][case]
    pid = dump_faults["pids"][name]
    assert res["failed"] is True, res
    msg = res["msg"]
    if case == "criu cannot dump":
        assert msg.startswith(f"CRIU dump of pid {pid} failed")
        # CRIU's own words for the cause, not the benign RLIMIT_NOFILE error it logs on every run
        assert "Can't dump file" in msg and "perf_event" in msg, msg
        assert "RLIMIT_NOFILE" not in msg
        assert any("Dumping FAILED" in line for line in res["criu_log_tail"])
    elif case == "store read-only (empty)":
        assert msg == f"store {store}: cannot create {store}/snapshots: Read-only file system"
    elif case == "store read-only (laid out)":
        assert msg == f"store {store}: {store}/tmp is not writable (read-only filesystem or permissions)"
    else:
        assert msg.startswith(f"CRIU dump of pid {pid} failed") and "No space left on device" in msg, msg
        assert res["criu_log_tail"]
    # The message cites no log that is already gone (CRIU's dump log went with the staging dir).
    assert "; log " not in msg or os.path.exists(msg.rsplit("; log ", 1)[1]), msg
    assert res["target"]["pid"] == pid
    assert lab.published(store) == [] and lab.staging(store) == []
    source_untouched(lab, name, pid, dump_faults["ports"][name], dump_faults["tokens"][name])


# --- the checkpointing module killed mid-dump -------------------------------------------

def test_killed_checkpoint_resumes_source_and_publishes_nothing(lab: Lab) -> None:
    port = free_port()
    pid = lab.play([lab.start("huge", port, 500, "--pattern")])["start huge"]["workload"]["pid"]
    token = lab.token("huge")
    book = lab.tmp / "checkpoint-bg.yml"
    book.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [
        lab.checkpoint("checkpoint", workload="huge", leave_running=False)]}]))
    bg = subprocess.Popen([str(VENV_BIN / "ansible-playbook"), str(book), "-i", "localhost,", "-c", "local"],
                          cwd=REPO, env=ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Mid-dump: CRIU is attached (TracerPid) and its parasite drains the memory (the source shows as
        # S/R then, not 't'). CRIU's parent is the module's python.
        end = time.monotonic() + 120
        criu = 0
        while criu <= 0 or proc_state(pid) not in ("S", "R", "D"):
            assert time.monotonic() < end and bg.poll() is None, "the checkpoint never attached CRIU"
            criu = tracer_pid(pid)
            time.sleep(0.002)
        with open(f"/proc/{criu}/stat", "rb") as handle:
            module_pid = int(handle.read().rsplit(b")", 1)[1].split()[1])
        with open(f"/proc/{module_pid}/cmdline", "rb") as handle:
            assert b"AnsiballZ_checkpoint" in handle.read()
        os.kill(module_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        assert tracer_pid(pid) > 0, "the dump was over before the module was killed"
        # The guardian resumes the source once the orphaned CRIU lets go of it.
        while not running_free(pid):
            assert time.monotonic() - killed_at < 20, f"source is {proc_state(pid)}, tracer {tracer_pid(pid)}"
            time.sleep(0.05)
        states = set()
        for _tick in range(20):  # and it stays running
            states.add(proc_state(pid))
            time.sleep(0.05)
        assert "T" not in states and "t" not in states, states
        out, _err = bg.communicate(timeout=120)
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.communicate()
    assert bg.returncode != 0
    result = json.loads(out)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert result["failed"] is True
    assert lab.pidfile_pid("huge") == pid and port_open(port)
    assert query(port)["token"] == token
    assert lab.published() == []
    staging = lab.staging()
    assert len(staging) == 1, staging  # left for cleanup
    assert not (lab.store / "tmp" / staging[0] / "manifest.json").exists()
    shutil.rmtree(lab.store / "tmp" / staging[0])  # 500 MB of pages


# --- restore faults: refused before anything is touched -----------------------------------

RESTORE_CASES = ["corrupted image", "truncated image", "missing manifest", "missing manifest (by name)",
                 "missing manifest (by name, skip unreadable)", "newer manifest schema", "name with slash", "name with dotdot", "id with slash",
                 "incompatible node", "incompatible node (by name)"]


@pytest.fixture(scope="module")
def golden(module_lab: Lab) -> Dict[str, Any]:
    """One published snapshot of workload 'gold' (source ended), copied into each case's store."""
    lab = module_lab
    store, port = lab.tmp / "golden-store", free_port()
    results = lab.play([lab.start("gold", port, 4),
                        lab.checkpoint("checkpoint gold", store, workload="gold", leave_running=False)])
    return {"store": store, "id": results["checkpoint gold"]["snapshot"]["id"], "token": lab.token("gold"),
            "port": port}


def _edit_manifest(path: Path, **changes: Any) -> None:
    doc = json.loads(path.read_text())
    for key, value in changes.items():
        if key == "source":
            doc["source"].update(value)
        else:
            doc[key] = value
    path.write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def restore_faults(module_lab: Lab, golden: Dict[str, Any]) -> Dict[str, Any]:
    lab = module_lab
    sid = golden["id"]
    pages = "containers/gold/criu/pages-1.img"
    stores, roots, sizes = {}, {}, {}
    by = {"missing manifest (by name)": {"name": "gold"},
          "missing manifest (by name, skip unreadable)": {"name": "gold", "skip_unreadable": True}, "name with slash": {"name": "../gold"},
          "name with dotdot": {"name": "gold..x"}, "id with slash": {"snapshot": "../../etc"},
          "incompatible node (by name)": {"name": "gold"}}
    tasks = []
    for case in RESTORE_CASES + ["skip compat check"]:
        slug = case.replace(" ", "-").replace("(", "").replace(")", "")
        stores[case], roots[case] = lab.tmp / f"rstore-{slug}", lab.tmp / f"rroot-{slug}"
        shutil.copytree(golden["store"], stores[case])
        snap = stores[case] / "snapshots" / sid
        img = snap / pages
        sizes[case] = img.stat().st_size
        if case == "corrupted image":
            with open(img, "r+b") as handle:
                handle.seek(sizes[case] // 2)
                chunk = handle.read(16)
                handle.seek(sizes[case] // 2)
                handle.write(bytes(c ^ 0xFF for c in chunk))
        elif case == "truncated image":
            os.truncate(img, sizes[case] // 2)
        elif case.startswith("missing manifest"):
            (snap / "manifest.json").unlink()
        elif case == "newer manifest schema":
            _edit_manifest(snap / "manifest.json", schema=99)
        elif case.startswith("incompatible node") or case == "skip compat check":
            flags = json.loads((snap / "manifest.json").read_text())["source"]["cpu_flags"]
            _edit_manifest(snap / "manifest.json", source={"arch": "aarch64", "cpu_flags": flags + ["zz_fake_flag"]})
        args = by.get(case, {"snapshot": sid})
        if case == "skip compat check":
            args["skip_compat_check"] = True
        tasks.append(lab.restore(case, stores[case], roots[case], expect_fail=case != "skip compat check", **args))
    assert lab.pidfile_pid("gold") is None
    others = set(lab.ours())  # the module's other sources
    results = lab.play(tasks)  # the one that restores runs last
    return {"results": results, "stores": stores, "roots": roots, "sizes": sizes, "pages": pages, "id": sid,
            "started": sorted(set(lab.ours()) - others), "pidfile": lab.pidfile_pid("gold")}


@pytest.mark.parametrize("case", RESTORE_CASES)
def test_bad_snapshot_or_node_is_refused_before_anything_is_touched(restore_faults: Dict[str, Any], case: str) -> None:
    res = restore_faults["results"][case]
    sid, pages, size = restore_faults["id"], restore_faults["pages"], restore_faults["sizes"][case]
    store = restore_faults["stores"][case]
    manifest = store / "snapshots" / sid / "manifest.json"
    assert res["failed"] is True
    msg = res["msg"]
    refusal = f"refusing to restore snapshot {sid} (gold) on this node"
    arch = f"architecture: snapshot is aarch64, this node is {os.uname().machine}"
    flags = "cpu flags: this node lacks zz_fake_flag"
    if case == "corrupted image":
        # a page image is hashed while CRIU restores the tree stopped (_overlap): the copy is killed before it runs
        assert res["outcome"] == "failed" and "its page images do not match the manifest" in msg, msg
        assert "was killed" in msg and res["reasons"] == [f"checksum: {pages}: SHA256 mismatch (corrupted)"]
    elif case == "truncated image":
        assert msg.startswith(refusal)
        assert res["reasons"] == [f"checksum: {pages}: size {size // 2} bytes, manifest says {size} (truncated or replaced)"]
    elif case == "missing manifest":
        assert msg == f"{manifest}: manifest is missing (snapshot not published or incomplete)"
    elif case == "missing manifest (by name)":
        # a published dir without its manifest may have been a newer 'gold': no silent fall back (or none at all)
        assert msg.startswith(f"1 snapshot(s) in {store} newer than every match cannot be read or trusted"), msg
        assert "skip_unreadable" in msg and f"{sid}: unreadable: {manifest}: manifest is missing" in msg, msg
    elif case == "missing manifest (by name, skip unreadable)":
        assert msg == f"no published snapshot in {store} matches name='gold' labels={{}}"
    elif case == "newer manifest schema":
        assert msg == (f"{manifest}: manifest schema 99 is newer than this warmstart understands (1); "
                       "upgrade the collection on this node")
    elif case == "name with slash":
        assert msg.startswith("snapshot name '../gold' is not allowed") and "without '/' or '..'" in msg
    elif case == "name with dotdot":
        assert msg.startswith("snapshot name 'gold..x' is not allowed") and "without '/' or '..'" in msg
    elif case == "id with slash":
        assert msg == "snapshot id '../../etc' is malformed (expected e.g. 20261202T120000Z-1a2b3c4d)"
    elif case == "incompatible node":
        assert msg.startswith(refusal) and res["reasons"] == [arch, flags]  # every reason, not the first
    else:
        assert msg.startswith("no snapshot matching name='gold' labels={} is compatible with this node")
        assert res["reasons"] == [f"{sid}: {arch}; {flags}"]
    # Nothing touched: no restore work dir (made before anything else is), the snapshot still there. The
    # corrupted page image got as far as a stopped copy: its work dir keeps CRIU's log, the copy is gone.
    if case == "corrupted image":
        assert [p.name for p in restore_faults["roots"][case].glob("*/restore.log")] == ["restore.log"]
    else:
        assert not restore_faults["roots"][case].exists()
    if not case.startswith("missing manifest"):
        assert manifest.exists()
    # Of all the restores in the batch only the skip-compat one (run last) started a process.
    assert restore_faults["started"] == [restore_faults["pidfile"]]
    assert restore_faults["results"]["skip compat check"]["restore"]["pid"] == restore_faults["pidfile"]


def test_skip_compat_check_gets_past_the_compat_refusal(golden: Dict[str, Any], restore_faults: Dict[str, Any]) -> None:
    res = restore_faults["results"]["skip compat check"]
    assert res.get("failed") is not True, res.get("msg")
    restored = res["restore"]
    assert restored["id"] == golden["id"] and restored["ns_pid"] == 1
    assert len(os.listdir(restore_faults["roots"]["skip compat check"])) == 1
    state = query(golden["port"])
    assert state["token"] == golden["token"] and state["pair_ok"] is True


# --- a file outside the workload dir changed after the checkpoint ------------------------------

def test_changed_outside_file_is_refused_and_criu_failure_is_reported(lab: Lab) -> None:
    port = free_port()
    outside = lab.tmp / "outside.log"
    results = lab.play([
        lab.start("drift", port, 1, "--outside", str(outside)),
        lab.checkpoint("checkpoint", workload="drift", leave_running=True),
        {"name": "let the source write on", "ansible.builtin.wait_for": {"timeout": 1}},
        lab.stop("drift"),
        lab.restore("restore", restore_root=lab.tmp / "root-preflight", name="drift", expect_fail=True),
        lab.restore("restore anyway", restore_root=lab.tmp / "root-criu", name="drift", expect_fail=True,
                    skip_compat_check=True),
    ])
    recorded = json.loads((Path(results["checkpoint"]["snapshot"]["path"]) / "manifest.json").read_text())
    then = recorded["targets"][0]["files_in_use"][str(outside)]
    now = outside.stat().st_size
    assert now > then
    # The preflight names the file and refuses before anything is touched.
    refused = results["restore"]
    assert refused["failed"] is True
    assert any(r.startswith(f"file {outside}: {now} bytes on this node, {then} at checkpoint")
               for r in refused["reasons"]), refused["reasons"]
    assert not (lab.tmp / "root-preflight").exists()
    # Forced past it, CRIU refuses: its own words, its log tail, restore-failed, no process left behind.
    forced = results["restore anyway"]
    assert forced["failed"] is True
    msg = forced["msg"]
    assert msg.startswith("CRIU restore failed") and f"File {str(outside).lstrip('/')} has bad size {now}" in msg, msg
    assert forced["criu_log_tail"] and "RLIMIT_NOFILE" not in msg
    cited = msg.rsplit("; log ", 1)[1]
    assert os.path.exists(cited) and Path(cited).parent.parent == lab.tmp / "root-criu"
    control = lab.wdir("drift") / "control"
    assert "CRIU restore failed" in (control / "restore-failed").read_text()
    assert not (control / "restore-complete").exists()
    assert lab.ours() == [] and lab.pidfile_pid("drift") is None and not port_open(port)


def test_snapshot_deleted_while_restore_reads_it(lab: Lab) -> None:
    """Cleanup on another node removes the snapshot from the shared store while CRIU restores it.

    Either CRIU already holds the images open (an unlinked file stays readable) and the copy runs with its
    state intact, or it fails to open them: then restore-failed is written and no process is left. Never a
    half-restored process.
    """
    port = free_port()
    res = lab.play([lab.start("shared", port, 1024, "--pattern"),
                    lab.checkpoint("checkpoint", workload="shared", leave_running=False)])
    snap = res["checkpoint"]["snapshot"]
    token = lab.token("shared")
    removed = threading.Event()

    def remove_when_criu_restores() -> None:
        if wait_for_swrk():
            shutil.rmtree(snap["path"])
            removed.set()

    remover = threading.Thread(target=remove_when_criu_restores, daemon=True)
    remover.start()
    out = lab.play([lab.restore("restore", expect_fail=True, snapshot=snap["id"], verify=False)])["restore"]
    remover.join(10)
    assert removed.is_set(), "the snapshot was never removed: CRIU was not seen running"
    assert not Path(snap["path"]).exists()
    control = lab.wdir("shared") / "control"
    if out.get("failed"):
        assert "CRIU restore failed" in out["msg"], out["msg"]
        assert (control / "restore-failed").exists() and not (control / "restore-complete").exists()
        assert lab.ours() == [], "a half-restored process is left"
    else:
        state = query(port)
        assert state["token"] == token and (control / "restore-complete").exists()
