"""The six lifecycle stages (lock_pre ... unlock_post) of a real process using warmstart_workload, through real CRIU.

The workload registers a callback for every stage with ``Control.on``; each callback records, in the
process's memory, the stage, the fake libcuda's state of its own pid at that moment (tests/support/
fake_libcuda.c, compiled here) and whether it ran in the source or in a restored copy. The source's list
and the copy's list (the copy resumes from the dump, so it holds exactly what ran before the dump) prove
when each stage ran relative to the lock, the dump, the device restore and the unlock. A flag file makes a
stage's callback raise or hang: the checkpoint (or restore) fails naming the stage and the callback, and is
rolled back (source unlocked and running, nothing published; the copy killed).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from tests.support.fake_cuda import task_environment

from .process_lab import Lab, free_port, json_line, running_free

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("lock_pre", "backup_pre", "backup_post", "restore_pre", "restore_post", "unlock_post")

APP = r'''
import json, os, select, socket, sys, time
sys.path.insert(0, sys.argv[3])
import warmstart_workload as ws

port, flags = int(sys.argv[1]), sys.argv[2]
events = []


def cuda_state():
    path = sys.argv[4]
    if not os.path.exists(path):
        return "none"
    status = open("/proc/self/status").read().splitlines()
    me = [line.split()[1] for line in status if line.startswith("NSpid:")][0]  # pid as the host sees it
    for line in open(path).read().splitlines():
        parts = line.split()
        if parts and parts[0] == me:
            return parts[1]
    return "untouched"  # no driver call on this pid yet


def hook(stage):
    def callback(arg):
        where = "copy" if isinstance(arg, ws.RestoreInfo) else "source"
        events.append(f"{stage}:{cuda_state()}:{where}:{getattr(arg, 'result', None) or '-'}")
        flag = os.path.join(flags, stage)
        mode = open(flag).read().strip() if os.path.exists(flag) else ""
        if mode == "raise":
            raise RuntimeError(f"{stage} says no")
        if mode == "hang":
            time.sleep(3600)
    callback.__name__ = f"app_{stage}"
    return callback


control = ws.Control(poll=0.02)
for stage in ws.STAGES:
    control.on(stage, hook(stage))
srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port))
srv.listen(8)
control.ready()
while True:
    readable, _, _ = select.select([srv], [], [], 0.05)
    if readable:
        conn, _ = srv.accept()
        with conn:
            conn.sendall((json.dumps({"pid": os.getpid(), "events": events, "errors": control.errors}) + "\n").encode())
'''


def ask(port: int, timeout: float = 10.0) -> Dict[str, Any]:
    """The workload's answer on 127.0.0.1:``port`` (its pid, events and errors), retried until ``timeout``."""
    return json_line(("127.0.0.1", port), timeout=timeout)


def events_when(port: int, count: int, timeout: float = 10.0) -> List[str]:
    """The workload's events once there are ``count`` (the last stages run after the module returned)."""
    end = time.monotonic() + timeout
    while True:
        events = ask(port)["events"]
        if len(events) >= count or time.monotonic() > end:
            return list(events)
        time.sleep(0.05)


class World:
    def __init__(self, lab: Lab, cuda: bool) -> None:
        self.lab = lab
        self.flags = lab.tmp / "flags"
        self.flags.mkdir()
        lab.script.write_text(APP)  # Lab.cleanup kills every process running lab.script
        self.port = free_port()
        self.env: Dict[str, Any] = {}
        if cuda:
            self.env, self.state, _log = task_environment(lab.tmp, lab.script)
        self.cuda = "required" if cuda else "off"

    def start(self, name: str) -> int:
        self.lab.play([{"name": f"start {name}", "warmstart.snapshot.workload": {
            "name": name, "root": str(self.lab.workloads), "wait_ready": True, "ready_timeout": 60,
            # the node's /proc: the workload looks up the fake driver's state of its host pid (NSpid's first field),
            # which a /proc of its own PID namespace does not show
            "mount_namespace": False,
            "command": ["/usr/bin/python3", str(self.lab.script), str(self.port), str(self.flags),
                        str(ROOT / "workload"), str(self.lab.tmp / "cuda.state")]}}])
        pid = self.lab.pidfile_pid(name)
        assert pid
        return pid

    def checkpoint(self, name: str, expect_fail: bool = False, **args: Any) -> Dict[str, Any]:
        task = self.lab.checkpoint("checkpoint", workload=name, cuda=self.cuda, expect_fail=expect_fail, **args)
        task["environment"] = self.env
        return self.lab.play([task])["checkpoint"]

    def restore(self, snapshot: str, expect_fail: bool = False) -> Dict[str, Any]:
        task = self.lab.restore("restore", snapshot=snapshot, cuda=self.cuda, expect_fail=expect_fail)
        if self.env:
            task["environment"] = dict(self.env, FAKE_CUDA_ADOPT=f"{self.lab.script}=checkpointed")
        return self.lab.play([task])["restore"]


@pytest.mark.parametrize("cuda", [True, False], ids=["fake-cuda", "no-accelerator"])
def test_every_stage_runs_in_order_around_the_lock_the_dump_the_restore_and_the_unlock(lab: Lab, cuda: bool) -> None:
    world = World(lab, cuda)
    pid = world.start("staged")
    snap = world.checkpoint("staged")["snapshot"]
    assert snap["cuda"]["used"] is cuda
    assert {"quiesce", "hook_backup_pre", "hook_backup_post", "hook_restore_pre", "hook_restore_post"} <= set(snap["timings"])
    # the source: lock_pre before the lock; backup_pre locked + checkpointed before the dump; backup_post and
    # restore_pre after the dump while still locked; restore_post and unlock_post unlocked (running)
    locked = "checkpointed" if cuda else "none"
    free = "running" if cuda else "none"
    assert events_when(world.port, 6) == [
        f"lock_pre:{'untouched' if cuda else 'none'}:source:-", f"backup_pre:{locked}:source:-", f"backup_post:{locked}:source:-",
        f"restore_pre:{locked}:source:-", f"restore_post:{free}:source:-", f"unlock_post:{free}:source:ok"]
    assert running_free(pid)

    lab.play([lab.stop("staged")])
    out = world.restore(snap["id"])["restore"]
    assert {"hook_restore_pre", "hook_restore_post"} <= set(out["timings"])
    # the copy resumes from the dump: it holds lock_pre and backup_pre, then its own restore stages around the
    # device restore (no driver call on its new pid before restore_pre), and unlock_post after restore-complete
    # (never backup_post: the dump is behind it)
    assert events_when(world.port, 5) == [
        f"lock_pre:{'untouched' if cuda else 'none'}:source:-", f"backup_pre:{locked}:source:-",
        f"restore_pre:{'untouched' if cuda else 'none'}:copy:-", f"restore_post:{free}:copy:-", f"unlock_post:{free}:copy:-"]


@pytest.mark.parametrize("stage,mode", [("lock_pre", "raise"), ("backup_pre", "raise"), ("backup_post", "hang"),
                                        ("restore_post", "raise")])
def test_a_stage_that_raises_or_hangs_rolls_the_checkpoint_back(lab: Lab, stage: str, mode: str) -> None:
    world = World(lab, True)
    (world.flags / stage).write_text(mode)
    pid = world.start("refusing")
    t0 = time.monotonic()
    failed = world.checkpoint("refusing", expect_fail=True, ready_timeout=4)
    assert failed.get("failed"), failed
    assert f"callback app_{stage}" in failed["msg"] and stage in failed["msg"], failed["msg"]
    assert ("did not return within" if mode == "hang" else f"{stage} says no") in failed["msg"]
    assert time.monotonic() - t0 < 60
    assert lab.published() == [] and lab.staging() == []
    assert running_free(pid)
    assert world.state.read_text().split()[:2] in ([], [str(pid), "running"])  # never left locked
    events = events_when(world.port, STAGES.index(stage) + 2)
    if stage == "lock_pre":  # refused before anything was locked: the driver never saw the process
        assert events == ["lock_pre:untouched:source:-", "unlock_post:untouched:source:refused"]
    else:
        assert events[-1] == "unlock_post:running:source:failed", events


def test_a_restore_pre_that_raises_kills_the_copy(lab: Lab) -> None:
    world = World(lab, True)
    world.start("copyfail")
    snap = world.checkpoint("copyfail", leave_running=False)["snapshot"]
    (world.flags / "restore_pre").write_text("raise")
    failed = world.restore(snap["id"], expect_fail=True)
    assert failed.get("failed")
    assert "restore_pre callback app_restore_pre failed: RuntimeError: restore_pre says no" in failed["msg"]
    assert "was killed" in failed["msg"]
    assert lab.ours() == []
    assert (lab.wdir("copyfail") / "control" / "restore-failed").exists()
