"""Lazy restore (CRIU lazy pages over userfaultfd) with real CRIU: the restored process answers before its
memory is in, its memory ends up identical to the source's, and every fault is bounded and clean.

Faults are driven through the engine (lazy_driver.py) where the test must act while memory is still loading:
the driver SIGSTOPs the lazy-pages daemon the moment the restore returns, so the test can then kill it,
delete the images under it, or let lazy_timeout run out - deterministically, whatever the machine's speed.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Dict

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _checksums as ck

from .ansible_run import REPO
from .process_lab import Lab, checkpointed, free_port, gone, proc_state, query

pytestmark = pytest.mark.integration

DRIVER = Path(__file__).with_name("lazy_driver.py")
CRIU = "/opt/warmstart/criu/current/bin/criu"


def criu_bin() -> str:
    return CRIU if os.access(CRIU, os.X_OK) else "/usr/local/bin/criu"


def drive(lab: Lab, snap_id: str, *args: str) -> Dict[str, Any]:
    done = subprocess.run(["/usr/bin/python3", str(DRIVER), str(lab.store), str(lab.restore_root), snap_id,
                           "--workloads-root", str(lab.workloads), *args],
                          capture_output=True, text=True, check=False, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def state(work_dir: str) -> Dict[str, Any]:
    path = Path(work_dir) / "lazy-state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def wait_state(work_dir: str, want: str, timeout: float) -> Dict[str, Any]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = state(work_dir)
        if got.get("state") == want:
            return got
        time.sleep(0.05)
    pytest.fail(f"lazy restore in {work_dir} did not become {want!r} within {timeout} s: {state(work_dir)}")


def digest(port: int) -> Dict[str, Any]:
    got = query(port)
    assert got["sha256"] == got["digest_at_start"], "restored memory differs from the source's"
    return got


def test_lazy_restore_answers_and_memory_completes(lab: Lab) -> None:
    snap = checkpointed(lab, "lazy1", 96)
    res = lab.play([lab.restore("lazy restore", snapshot=snap["id"], lazy=True),
                    lab.restore("second copy refused", snapshot=snap["id"], lazy=True, expect_fail=True)])
    out = res["lazy restore"]["restore"]
    assert res["lazy restore"]["changed"] is True
    lazy = out["lazy"]
    assert lazy["used"] is True and lazy["daemon_pid"] > 0, lazy
    assert 0 < lazy["resumed_after"] <= out["timings"]["total"] + 0.01
    assert "running on this node" in res["second copy refused"]["msg"]
    got = digest(snap["port"])  # every page the hash reads is faulted in from the images
    assert got["pid"] and got["pair_ok"] is True
    final = wait_state(out["work_dir"], "complete", 60)
    assert final["complete_at"] >= final["resumed_at"] >= final["started_at"]
    assert gone(lazy["daemon_pid"], 10), "the lazy-pages daemon did not exit when memory was complete"
    assert not (Path(out["work_dir"]) / "images").exists()
    assert (lab.wdir("lazy1") / "control" / "restore-complete").exists()


def test_lazy_wait_reports_memory_complete_and_checkpoint_after_it(lab: Lab) -> None:
    snap = checkpointed(lab, "lazy2", 64)
    res = lab.play([lab.restore("lazy restore", snapshot=snap["id"], lazy=True, lazy_wait=True),
                    lab.checkpoint("checkpoint again", workload="lazy2", leave_running=True)])
    lazy = res["lazy restore"]["restore"]["lazy"]
    assert lazy["used"] is True and lazy["complete_after"] >= lazy["resumed_after"] > 0, lazy
    assert state(res["lazy restore"]["restore"]["work_dir"])["state"] == "complete"
    assert res["checkpoint again"]["changed"] is True
    digest(snap["port"])


def test_checkpoint_refused_while_memory_is_loading(lab: Lab) -> None:
    snap = checkpointed(lab, "lazy3", 512, "--pattern")
    out = drive(lab, snap["id"], "--stop-daemon")
    assert out["lazy"]["used"] is True, out
    try:
        res = lab.play([lab.checkpoint("checkpoint while loading", workload="lazy3", expect_fail=True)])
        msg = res["checkpoint while loading"]["msg"]
        assert "still loading" in msg and "lazily" in msg, msg
        assert not lab.published()[1:], "a second snapshot was published"
    finally:
        os.kill(out["lazy"]["daemon_pid"], signal.SIGCONT)
    wait_state(out["work_dir"], "complete", 60)


def test_daemon_killed_mid_stream_kills_the_restored_tree(lab: Lab) -> None:
    snap = checkpointed(lab, "lazy4", 512, "--pattern")
    out = drive(lab, snap["id"], "--stop-daemon")
    pid, daemon = out["pid"], out["lazy"]["daemon_pid"]
    assert state(out["work_dir"]).get("held_uffds", 0) >= 1, "the supervisor holds no userfault descriptor"
    os.kill(daemon, signal.SIGKILL)
    final = wait_state(out["work_dir"], "failed", 15)
    assert "killed by signal 9 before memory was complete" in final["error"], final
    assert f"restored tree (pid {pid}) was killed" in final["error"]
    assert gone(pid, 10), f"restored pid {pid} still runs ({proc_state(pid)}) after its daemon died"
    assert not lab.ours(), "a restored copy is still running"
    failed = lab.wdir("lazy4") / "control" / "restore-failed"
    assert failed.exists() and "lazy-pages daemon" in failed.read_text()


def test_lazy_timeout_bounds_a_stalled_daemon(lab: Lab) -> None:
    snap = checkpointed(lab, "lazy5", 512, "--pattern")
    t0 = time.monotonic()
    out = drive(lab, snap["id"], "--stop-daemon", "--lazy-timeout", "4")
    final = wait_state(out["work_dir"], "failed", 30)
    waited = time.monotonic() - t0
    assert "not complete within 4 s" in final["error"], final
    assert waited < 25, f"the stalled lazy restore took {waited:.1f} s to be failed"
    assert gone(out["pid"], 10) and gone(out["lazy"]["daemon_pid"], 10)
    assert not lab.ours()


def test_images_deleted_during_lazy_restore(lab: Lab) -> None:
    """The daemon holds the page images open: deleting the snapshot under it loses nothing."""
    # The driver stops the daemon as soon as CRIU's restore returned; from a hot page cache a daemon may have
    # streamed a whole snapshot in that moment (it did once, in CI, at 512 MiB). Such a run cannot delete the
    # images under a loading daemon: stop that copy and try again, bigger.
    for size in (512, 1024, 2048):
        snap = checkpointed(lab, f"lazy6-{size}", size, "--pattern")
        out = drive(lab, snap["id"], "--stop-daemon")
        if state(out["work_dir"]).get("state") != "complete":
            break
        with contextlib.suppress(ProcessLookupError):  # it finished, and exited
            os.kill(out["lazy"]["daemon_pid"], signal.SIGCONT)
        lab.play([lab.stop(snap["name"])])
    else:
        pytest.fail("memory was complete before the daemon was stopped, at 512 MiB, 1 GiB and 2 GiB")
    shutil.rmtree(lab.store / "snapshots" / snap["id"])
    assert snap["id"] not in lab.published()
    os.kill(out["lazy"]["daemon_pid"], signal.SIGCONT)
    digest(snap["port"])
    wait_state(out["work_dir"], "complete", 60)


def test_images_deleted_before_lazy_restore_is_refused(lab: Lab) -> None:
    snap = checkpointed(lab, "lazy7", 32)
    pages = sorted((lab.store / "snapshots" / snap["id"]).rglob("pages-*.img"))
    assert pages
    pages[0].unlink()
    res = lab.play([lab.restore("lazy restore", snapshot=snap["id"], lazy=True, expect_fail=True)])
    assert res["lazy restore"]["failed"] and "missing" in res["lazy restore"]["msg"]
    assert not lab.ours()
    assert not lab.restore_root.exists() or not list(lab.restore_root.iterdir()), "a refused restore left a work dir"


@pytest.mark.parametrize("lazy", [False, True])
def test_a_page_corrupted_after_the_checkpoint_is_refused(lab: Lab, lazy: bool) -> None:
    """The checkpoint records its digests for this node (no second hashing pass on restore); a page changed
    behind its back, even with its mtime put back, is still hashed and refused before anything runs."""
    snap = checkpointed(lab, f"corrupt{int(lazy)}", 32)
    pages = max((lab.store / "snapshots" / snap["id"]).rglob("pages-*.img"), key=lambda p: p.stat().st_size)
    before = pages.stat()
    with open(pages, "r+b") as handle:
        handle.seek(before.st_size // 2)
        byte = handle.read(1)
        handle.seek(before.st_size // 2)
        handle.write(bytes([byte[0] ^ 0x01]))
    os.utime(pages, ns=(before.st_atime_ns, before.st_mtime_ns))
    res = lab.play([lab.restore("restore", snapshot=snap["id"], lazy=lazy, expect_fail=True)])
    assert res["restore"]["failed"], res["restore"]
    assert any("SHA256 mismatch" in r for r in res["restore"].get("reasons", [])), res["restore"]
    assert not lab.ours(), "a restore of corrupted pages started a process"


def test_no_uffd_falls_back_to_eager(lab: Lab, tmp_path: Path) -> None:
    """A kernel without userfaultfd, as CRIU sees it: criu check --feature uffd fails."""
    wrapper = tmp_path / "criu-no-uffd"
    wrapper.write_text("#!/bin/sh\n"
                       "if [ \"$1\" = check ] && [ \"$2\" = --feature ]; then case \"$3\" in uffd*) "
                       "echo \"$3 is not supported\"; exit 1;; esac; fi\n"
                       f"exec {criu_bin()} \"$@\"\n")
    wrapper.chmod(0o755)
    snap = checkpointed(lab, "lazy8", 32)
    res = lab.play([lab.restore("lazy restore", snapshot=snap["id"], lazy=True, criu_path=str(wrapper))])
    lazy = res["lazy restore"]["restore"]["lazy"]
    assert lazy["used"] is False and "uffd" in lazy["reason"] and "restored eagerly" in lazy["reason"], lazy
    assert not (Path(res["lazy restore"]["restore"]["work_dir"]) / "lazy-state.json").exists()
    digest(snap["port"])


def test_page_server_serves_a_lazy_restore(lab: Lab) -> None:
    snap = checkpointed(lab, "lazy9", 96)
    port = free_port()
    res = lab.play([
        {"name": "serve (check)", "check_mode": True, "warmstart.snapshot.page_server": {
            "store": str(lab.store), "snapshot": snap["id"], "address": "127.0.0.1", "port": port}},
        {"name": "serve", "warmstart.snapshot.page_server": {
            "store": str(lab.store), "snapshot": snap["id"], "address": "127.0.0.1", "port": port, "timeout": 120,
            "log_dir": str(lab.tmp / "ps")}},
        {"name": "serve twice", "ignore_errors": True, "warmstart.snapshot.page_server": {
            "store": str(lab.store), "snapshot": snap["id"], "address": "127.0.0.1", "port": port}},
        lab.restore("restore from page server", snapshot=snap["id"], page_server=f"127.0.0.1:{port}",
                    lazy_wait=True),
    ])
    assert "pid" not in res["serve (check)"]["page_server"]
    served = res["serve"]["page_server"]
    assert served["pid"] > 0 and served["port"] == port and served["snapshot_id"] == snap["id"]
    assert "in use" in res["serve twice"]["msg"]
    out = res["restore from page server"]["restore"]
    assert out["lazy"]["used"] is True and out["lazy"]["complete_after"] > 0
    pages_size = sum(p.stat().st_size for p in (lab.store / "snapshots" / snap["id"]).rglob("pages-*.img"))
    assert 0 < out["lazy"]["eager_bytes"] < pages_size / 4, out["lazy"]
    digest(snap["port"])
    assert gone(served["pid"], 15), "the page server did not exit after serving its restore"
    top = lab.store / "snapshots" / snap["id"]
    manifest = json.loads((top / "manifest.json").read_text())
    assert ck.verify_files(str(top), manifest, phase=False) == [], "serving the snapshot changed it"


def test_an_eager_page_corrupted_in_the_restoring_nodes_store_is_refused(lab: Lab) -> None:
    """The pages CRIU restores itself come from the restoring node's store, not from the page server: a byte
    changed there (the page server's copy intact) is refused before anything runs."""
    snap = checkpointed(lab, "lazy12", 32)
    theirs = lab.tmp / "store-b"
    shutil.copytree(lab.store / "snapshots" / snap["id"], theirs / "snapshots" / snap["id"])
    pages = max((theirs / "snapshots" / snap["id"]).rglob("pages-*.img"), key=lambda p: p.stat().st_size)
    assert pages.stat().st_size <= 64 << 20, "the image has chunks: the flipped byte may miss the eager ones"
    with open(pages, "r+b") as handle:
        handle.seek(pages.stat().st_size // 2)
        byte = handle.read(1)
        handle.seek(pages.stat().st_size // 2)
        handle.write(bytes([byte[0] ^ 0x01]))
    port = free_port()
    served = lab.play([{"name": "serve", "warmstart.snapshot.page_server": {
        "store": str(lab.store), "snapshot": snap["id"], "address": "127.0.0.1", "port": port, "timeout": 60,
        "log_dir": str(lab.tmp / "ps12")}}])["serve"]["page_server"]
    try:
        res = lab.play([lab.restore("restore", store=theirs, snapshot=snap["id"], page_server=f"127.0.0.1:{port}",
                                    expect_fail=True)])["restore"]
        assert res["failed"] and res.get("outcome") == "incompatible", res
        assert any("pages: " in r and "SHA256 mismatch" in r and pages.name in r for r in res["reasons"]), res
        assert not lab.ours(), "a restore of corrupted eager pages started a process"
        assert not list(lab.restore_root.iterdir()), "a refused restore left a work dir"
    finally:
        os.kill(served["pid"], signal.SIGTERM)


def test_page_server_unreachable(lab: Lab) -> None:
    snap = checkpointed(lab, "lazy10", 32)
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    res = lab.play([lab.restore("restore", snapshot=snap["id"], page_server=f"127.0.0.1:{port}", expect_fail=True)])
    msg = res["restore"]["msg"]
    assert res["restore"]["failed"] and f"page server 127.0.0.1:{port}" in msg, msg
    assert res["restore"].get("criu_log_tail"), "no CRIU log tail"
    assert not lab.ours(), "a half-restored copy is running"
    failed = lab.wdir("lazy10") / "control" / "restore-failed"
    assert failed.exists()


@pytest.mark.parametrize("probes", [1, 3])
def test_page_server_ignores_probes_and_serves_the_restore(lab: Lab, probes: int) -> None:
    """A port probe or health check (connect, close) used to end the page server before its restore came."""
    snap = checkpointed(lab, f"lazyp{probes}", 32)
    port = free_port()
    served = lab.play([{"name": "serve", "warmstart.snapshot.page_server": {
        "store": str(lab.store), "snapshot": snap["id"], "address": "127.0.0.1", "port": port, "timeout": 120,
        "log_dir": str(lab.tmp / "ps")}}])["serve"]["page_server"]
    for _probe in range(probes):
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    time.sleep(0.3)
    assert not gone(served["pid"], 0.5), "a probe ended the page server"
    out = lab.play([lab.restore("restore", snapshot=snap["id"], page_server=f"127.0.0.1:{port}",
                                lazy_wait=True)])["restore"]["restore"]
    assert out["lazy"]["used"] is True and out["lazy"]["complete_after"] > 0
    digest(snap["port"])
    notes = Path(served["connections_log"]).read_text()
    assert notes.count("ignored a connection from 127.0.0.1") == probes, notes
    assert "serving 127.0.0.1" in notes
    assert gone(served["pid"], 15), "the page server did not exit after serving its restore"
