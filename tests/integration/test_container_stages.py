"""The six lifecycle stages of a workload in a real podman container, checkpointed and restored into placeholders.

The app (written into the Pod's /app next to warmstart_workload.py) registers a callback for every stage with
``Control.on``; each records the stage and whether it ran in the source or in a restored copy, in memory, and the
app serves that list on port 8080. Real CRIU: the source runs lock_pre .. unlock_post around its checkpoint; a
copy restored into a placeholder holds what ran before the dump (lock_pre, backup_pre) and then runs its own
restore_pre, restore_post and unlock_post (a CPU-only container: the device restore between them is empty). A
``restore_pre`` callback that raises in the copy (a flag file in the placeholder's control dir) fails the
restore naming the stage and the callback: copy and placeholder killed, ``restore-failed`` written.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from .container_lab import Pod, ask, pod_for, wait_file

pytestmark = pytest.mark.integration

APP = r'''
import json, os, socket, sys
sys.path.insert(0, "/app")
import warmstart_workload as ws

events = []


def hook(stage):
    def callback(arg):
        events.append(f"{stage}:{'copy' if isinstance(arg, ws.RestoreInfo) else 'source'}")
        if os.path.exists(f"/snapshot-control/fail-{stage}"):
            raise RuntimeError(f"{stage} says no")
    callback.__name__ = f"app_{stage}"
    return callback


control = ws.Control(poll=0.02)
for stage in ws.STAGES:
    control.on(stage, hook(stage))
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", 8080))
srv.listen(16)
control.ready()
while True:
    conn, _ = srv.accept()
    with conn:
        conn.sendall((json.dumps({"events": events, "pid": os.getpid()}) + "\n").encode())
'''


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    yield from pod_for(tmp_path_factory.mktemp("stage-containers"), {"stages.py": APP})


def source(pod: Pod, name: str) -> str:
    full = pod.run(name, "python3", "/app/stages.py")
    wait_file(pod.control(name) / "ready-for-snapshot", 60)
    return full


def events(pod: Pod, full: str, count: int, timeout: float = 15.0) -> List[str]:
    end = time.monotonic() + timeout
    while True:
        got = list(ask(pod.ip(full))["events"])
        if len(got) >= count or time.monotonic() > end:
            return got
        time.sleep(0.1)


def test_stages_run_in_the_source_container_and_in_the_copy_in_a_placeholder(pod: Pod) -> None:
    src = source(pod, "stsrc")
    snap = pod.play([pod.checkpoint("checkpoint", container=src)], "st-ck")["checkpoint"]["snapshot"]
    assert {"hook_backup_pre", "hook_backup_post", "hook_restore_pre", "hook_restore_post"} <= set(snap["timings"])
    assert events(pod, src, 6) == ["lock_pre:source", "backup_pre:source", "backup_post:source",
                                   "restore_pre:source", "restore_post:source", "unlock_post:source"]
    ph = pod.placeholder("stph")
    res = pod.play([pod.restore("restore", snapshot=snap["id"], into={"container": ph})], "st-rs")["restore"]
    dest = res["restore"]["destinations"][0]
    assert dest["result"] == "succeeded", dest
    assert events(pod, ph, 5) == ["lock_pre:source", "backup_pre:source",
                                  "restore_pre:copy", "restore_post:copy", "unlock_post:copy"]


def test_a_raising_restore_pre_in_the_copy_kills_copy_and_placeholder(pod: Pod) -> None:
    src = source(pod, "stfsrc")
    snap = pod.play([pod.checkpoint("checkpoint", container=src)], "st-ck2")["checkpoint"]["snapshot"]
    ph = pod.placeholder("stfph")
    (pod.control("stfph") / "fail-restore_pre").write_text("")
    res: Dict[str, Any] = pod.play([pod.restore("restore", snapshot=snap["id"], into={"container": ph},
                                                expect_fail=True)], "st-rsfail", ok=False)["restore"]
    assert res.get("failed")
    dest = res["restore"]["destinations"][0]
    assert dest["result"] == "failed", dest
    assert "restore_pre callback app_restore_pre failed: RuntimeError: restore_pre says no" in dest["error"], dest
    assert dest["placeholder"] == "killed"
    end = time.monotonic() + 30
    while pod.running(ph):
        assert time.monotonic() < end, f"placeholder {ph} still running"
        time.sleep(0.2)
    control: Path = pod.control("stfph")
    assert (control / "restore-failed").exists() and not (control / "restore-complete").exists()
    assert ask(pod.ip(src))["events"][-1] == "unlock_post:source", "the source runs on"
