"""Lazy restore into a placeholder container (issue 35, item 3), with real podman and CRIU.

A container snapshot restored with ``lazy: true`` into a placeholder: the copy runs as soon as CRIU restored it,
its memory streamed in by CRIU's lazy-pages daemon from the same verified copy of the images an eager restore
reads; the result says so per destination, and with ``lazy_wait`` when memory was complete; the verified copy
is removed once the daemon is done with it. A daemon that dies while memory is still loading (driven through the
engine, lazy_driver.py, which stops it the moment CRIU returned) takes the copy and the placeholder with it - the
copy never runs on missing memory, and the placeholder's supervisor (the kubelet) replaces it - with
``restore-failed`` in the placeholder's control dir saying why.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from .ansible_run import REPO
from .container_lab import Pod, ask, pod_for, wait_file

pytestmark = pytest.mark.integration

DRIVER = Path(__file__).with_name("lazy_driver.py")


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    yield from pod_for(tmp_path_factory.mktemp("lazy-containers"))


@pytest.fixture(scope="module")
def got(pod: Pod) -> Dict[str, Any]:
    """One snapshot of a source (64 MiB of random memory) that every test restores: the source's answer, the
    snapshot. The daemon is stopped the moment CRIU returns where a test faults it: memory is still loading."""
    src = pod.source("lzsrc", APP_MIB="64")
    before = ask(pod.ip(src))
    snap = pod.play([pod.checkpoint("checkpoint", container=src, leave_running=False)], "lzsrc-ck")
    return {"snap": snap["checkpoint"]["snapshot"], "before": before}


def gone(pid: int, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < end:
        time.sleep(0.05)
    return not os.path.exists(f"/proc/{pid}")


def test_a_lazy_restore_into_a_placeholder_answers_and_its_memory_completes(pod: Pod, got: Dict[str, Any]) -> None:
    ph = pod.placeholder("lzph")
    res = pod.play([pod.restore("restore", snapshot=got["snap"]["id"], into={"container": ph}, lazy=True,
                                lazy_wait=True)], "lz-rs")["restore"]
    dest = res["restore"]["destinations"][0]
    assert dest["result"] == "succeeded", dest
    lazy = dest["lazy"]
    assert lazy["used"] is True and lazy["daemon_pid"] > 0 and lazy["complete_after"] >= lazy["resumed_after"], lazy
    answer = ask(pod.ip(ph))
    assert answer["token"] == got["before"]["token"] and answer["sha256"] == answer["digest"] == \
        got["before"]["digest"], answer
    assert gone(lazy["daemon_pid"], 10), "the daemon did not exit with memory complete"
    work = Path(dest["work_dir"])
    assert json.loads((work / "lazy-state.json").read_text())["state"] == "complete"
    assert not (work / "snapshot").exists(), "the verified copy of the images outlived the lazy restore"
    assert (pod.control("lzph") / "restore-complete").exists()


def test_a_daemon_dying_mid_stream_takes_the_copy_and_the_placeholder_with_it(pod: Pod, got: Dict[str, Any]) -> None:
    ph = pod.placeholder("lzph2")
    placeholder_pid = pod.pid1(ph)
    done = subprocess.run(["/usr/bin/python3", str(DRIVER), str(pod.store), str(pod.restore_root),
                           got["snap"]["id"], "--into", ph, "--stop-daemon"],
                          capture_output=True, text=True, check=False, timeout=300, cwd=REPO, env=pod.env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    dest = out["destinations"][0]
    assert dest["result"] == "succeeded" and dest["lazy"]["used"] is True, dest
    copy, daemon = dest["pid"], dest["lazy"]["daemon_pid"]
    assert os.path.exists(f"/proc/{copy}"), "the copy runs while its memory is loading"
    os.kill(daemon, signal.SIGKILL)
    failed = wait_file(pod.control("lzph2") / "restore-failed", 30)
    assert "killed by signal 9 before memory was complete" in failed, failed
    assert f"restored tree (pid {copy}) was killed with its placeholder" in failed, failed
    assert gone(copy, 10) and gone(placeholder_pid, 10), "the copy or its placeholder survived"
    end = time.monotonic() + 30
    while pod.running(ph):
        assert time.monotonic() < end, "the placeholder container still runs"
        time.sleep(0.2)
    work = Path(dest["work_dir"])
    assert json.loads((work / "lazy-state.json").read_text())["state"] == "failed"
    assert not (work / "snapshot").exists(), "the verified copy of the images outlived the failed lazy restore"


def test_memory_not_complete_in_time_fails_a_waiting_restore_and_kills_copy_and_placeholder(
        pod: Pod, got: Dict[str, Any]) -> None:
    ph = pod.placeholder("lzph4")
    placeholder_pid = pod.pid1(ph)
    done = subprocess.run(["/usr/bin/python3", str(DRIVER), str(pod.store), str(pod.restore_root), got["snap"]["id"],
                           "--into", ph, "--stop-daemon", "--lazy-timeout", "4", "--lazy-wait"],
                          capture_output=True, text=True, check=False, timeout=300, cwd=REPO, env=pod.env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    dest = out["destinations"][0]
    assert out["outcome"] == "failed" and dest["result"] == "failed", dest
    assert "not complete within 4 s" in dest["error"] and dest["placeholder"] in ("killed", "already gone"), dest
    assert gone(dest["pid"], 10) and gone(placeholder_pid, 10)
    assert "not complete within 4 s" in (pod.control("lzph4") / "restore-failed").read_text()


def test_two_placeholders_restored_lazily_at_the_same_time_both_answer(pod: Pod, got: Dict[str, Any]) -> None:
    ph = [pod.placeholder("lzph3a"), pod.placeholder("lzph3b")]
    src = got["snap"]["name"]
    res = pod.play([pod.restore("restore", snapshot=got["snap"]["id"], lazy=True, lazy_wait=True,
                                into={"container_map": [f"{src}={ph[0]}", f"{src}={ph[1]}"]})], "lz-fan")["restore"]
    dests = res["restore"]["destinations"]
    assert [d["result"] for d in dests] == ["succeeded", "succeeded"], dests
    assert all(d["lazy"]["used"] is True and "complete_after" in d["lazy"] for d in dests), dests
    assert len({d["work_dir"] for d in dests}) == 2
    for full in ph:
        answer = ask(pod.ip(full))
        assert answer["token"] == got["before"]["token"] and answer["sha256"] == got["before"]["digest"], answer
