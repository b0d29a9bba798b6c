"""The workload helper (workload/warmstart_workload.py): sentinels, restore detection, instance state."""
from __future__ import annotations

import importlib.util
import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

HELPER = Path(__file__).resolve().parents[3] / "workload" / "warmstart_workload.py"
spec = importlib.util.spec_from_file_location("warmstart_workload", HELPER)
ws = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ws)


def test_inactive_without_a_control_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SNAPSHOT_CONTROL_DIR", raising=False)
    control = ws.Control()
    assert not control.active
    control.ready()
    assert control.restored() is None and control.wait_restored(0.01) is None and control.on_restore(print) is None
    assert control.env() == {}


def test_ready_is_atomic_and_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SNAPSHOT_CONTROL_DIR", str(tmp_path))
    ws.Control().ready()
    assert (tmp_path / "ready-for-snapshot").read_text() == f"pid={os.getpid()}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["ready-for-snapshot"]


def test_only_a_new_restore_complete_counts(tmp_path: Path) -> None:
    (tmp_path / "restore-complete").write_text("pid=6\nsnapshot=old\n")
    control = ws.Control(str(tmp_path))
    control.ready()
    assert control.restored() is None, "a sentinel older than ready() is not this copy's restore"
    time.sleep(0.01)
    (tmp_path / "restore-complete.new").write_text("pid=7\nhost_pid=999\nsnapshot=s2\n")
    os.rename(tmp_path / "restore-complete.new", tmp_path / "restore-complete")
    info = control.restored()
    assert info is not None and info.pid == 7 and info.snapshot == "s2" and info.fields["host_pid"] == "999"
    assert control.restored() is None, "the same restore is reported once"


def test_wait_restored_times_out_and_wakes_up(tmp_path: Path) -> None:
    control = ws.Control(str(tmp_path), poll=0.01)
    control.ready()
    t0 = time.monotonic()
    assert control.wait_restored(0.1) is None and time.monotonic() - t0 >= 0.1
    # written as warmstart writes it (a whole file renamed into place): a reader never sees it half-written
    (tmp_path / ".restore-complete.tmp").write_text("pid=9\n")
    threading.Timer(0.05, lambda: (tmp_path / ".restore-complete.tmp").rename(tmp_path / "restore-complete")).start()
    info = control.wait_restored(5)
    assert info is not None and info.pid == 9


def test_on_restore_calls_back_in_a_thread(tmp_path: Path) -> None:
    control = ws.Control(str(tmp_path), poll=0.01)
    seen = []
    done = threading.Event()
    control.on_restore(lambda info: (seen.append(info.pid), done.set()))
    control.ready()
    (tmp_path / "restore-complete").write_text("pid=12\n")
    assert done.wait(5) and seen == [12]


def test_failed_and_env_and_instance(tmp_path: Path) -> None:
    control = ws.Control(str(tmp_path))
    assert control.failed() is None
    (tmp_path / "restore-failed").write_text("CRIU restore failed: x\n")
    assert control.failed() == "CRIU restore failed: x"
    (tmp_path / "env.json").write_text(json.dumps({"ROLE": "replica-2", "N": 3}))
    me = ws.instance(control)
    assert me.env == {"ROLE": "replica-2", "N": "3"} and me.hostname == socket.gethostname()
    assert isinstance(me.ips, list) and all(ip.count(".") == 3 for ip in me.ips)
    (tmp_path / "env.json").write_text("{broken")
    assert control.env() == {}


# --- checkpoint hooks (checkpoint-requested -> pre_checkpoint -> ready-for-snapshot | checkpoint-refused) ---------


def request(path: Path, request_id: str = "r1", deadline: float = 0.0) -> None:
    deadline = deadline or time.time() + 60
    tmp = path / "checkpoint-requested.tmp"
    tmp.write_text(f"request={request_id}\nrequested_by=1\ndeadline={deadline:.3f}\n")
    os.rename(tmp, path / "checkpoint-requested")


def test_pre_checkpoint_callbacks_run_in_order_then_ready(tmp_path: Path) -> None:
    control = ws.Control(str(tmp_path), watch=False)
    seen = []
    assert control.on_pre_checkpoint(lambda req: seen.append(("drain", req.request))) is None, "watch=False: no thread"
    control.on_pre_checkpoint(lambda req: seen.append(("drop-cache", req.remaining() > 0)))
    control.check()
    assert seen == [] and not (tmp_path / "ready-for-snapshot").exists(), "nothing requested yet"
    request(tmp_path, "r1")
    control.check()
    assert seen == [("drain", "r1"), ("drop-cache", True)]
    assert (tmp_path / "ready-for-snapshot").read_text() == f"request=r1\npid={os.getpid()}\n"
    control.check()
    assert len(seen) == 2, "one request is handled once"


def test_a_raising_pre_checkpoint_callback_refuses_and_resumes(tmp_path: Path) -> None:
    control = ws.Control(str(tmp_path), watch=False)
    calls = []

    def drain(req):
        calls.append("drain")

    def busy(req):
        raise RuntimeError("3 requests still in flight\nafter 30 s")

    control.on_pre_checkpoint(drain)
    control.on_pre_checkpoint(busy)
    control.on_pre_checkpoint(lambda req: calls.append("never"))
    control.on_post_checkpoint(lambda req: calls.append(("resume", req.result, req.request)))
    request(tmp_path, "r2")
    control.check()
    assert (tmp_path / "checkpoint-refused").read_text() == (
        f"request=r2\npid={os.getpid()}\nerror=RuntimeError: 3 requests still in flight after 30 s\n"
        "stage=lock_pre\ncallback=busy\n")
    assert not (tmp_path / "ready-for-snapshot").exists()
    assert calls == ["drain", ("resume", "refused", "r2")]


def test_post_checkpoint_runs_when_the_source_keeps_running(tmp_path: Path) -> None:
    control = ws.Control(str(tmp_path), watch=False)
    results = []
    control.on_pre_checkpoint(lambda req: None)
    control.on_post_checkpoint(lambda req: results.append((req.request, req.result)))
    (tmp_path / "checkpoint-done").write_text("request=r3\nresult=ok\n")
    control.check()
    assert results == [], "not the end of a checkpoint this process quiesced for"
    request(tmp_path, "r3")
    control.check()
    (tmp_path / "checkpoint-done.tmp").write_text("request=other\nresult=ok\n")
    os.rename(tmp_path / "checkpoint-done.tmp", tmp_path / "checkpoint-done")
    control.check()
    assert results == [], "another request's end"
    (tmp_path / "checkpoint-done.tmp").write_text("request=r3\nresult=failed\ndetail=CRIU dump failed\n")
    os.rename(tmp_path / "checkpoint-done.tmp", tmp_path / "checkpoint-done")
    control.check()
    assert results == [("r3", "failed")]
    control.check()
    assert results == [("r3", "failed")], "once"


def test_an_expired_request_is_ignored_but_a_waiting_one_is_answered(tmp_path: Path) -> None:
    request(tmp_path, "old", deadline=time.time() - 1)
    control = ws.Control(str(tmp_path), watch=False)
    ran = []
    control.on_pre_checkpoint(lambda req: ran.append(req.request))
    control.check()
    assert ran == [] and not (tmp_path / "ready-for-snapshot").exists()
    request(tmp_path, "new")
    fresh = ws.Control(str(tmp_path), watch=False)  # started after the request was written
    fresh.on_pre_checkpoint(lambda req: ran.append(req.request))
    fresh.check()
    assert ran == ["new"]


def test_a_restored_copy_gets_post_restore_not_post_checkpoint(tmp_path: Path) -> None:
    control = ws.Control(str(tmp_path), watch=False)
    events = []
    control.on_pre_checkpoint(lambda req: events.append("pre"))
    control.on_post_checkpoint(lambda req: events.append("post_checkpoint"))
    assert control.on_post_restore == control.on_restore
    control.on_post_restore(lambda info: events.append(("post_restore", info.pid)))
    request(tmp_path, "r4")
    control.check()  # answered: the dump would happen now; the copy wakes up below
    time.sleep(0.01)
    (tmp_path / "checkpoint-hooks").unlink()  # restored into another control dir
    (tmp_path / "restore-complete").write_text("pid=7\n")
    (tmp_path / "checkpoint-done").write_text("request=r4\nresult=ok\n")
    control.check()
    assert events == ["pre", ("post_restore", 7)]
    assert (tmp_path / "checkpoint-hooks").read_text().startswith(f"pid={os.getpid()}\n"), "the copy advertises again"


def test_a_failing_callback_is_reported_and_the_watcher_survives(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    control = ws.Control(str(tmp_path), poll=0.01)
    done = threading.Event()

    def broken(info):
        raise ValueError("cannot reach the database")

    thread = control.on_restore(broken)
    assert control.on_pre_checkpoint(lambda req: done.set()) is thread, "one watcher thread for every hook"
    control.ready()
    (tmp_path / "restore-complete").write_text("pid=8\n")
    request(tmp_path, "r5")
    assert done.wait(5)
    assert control.errors == ["unlock_post callback broken failed: ValueError: cannot reach the database"]
    assert "cannot reach the database" in capsys.readouterr().err


# --- the six lifecycle stages: on / off, the aliases, checkpoint-stage ---------------------------------------


def stage(path: Path, name: str, request_id: str = "r1", deadline: float = 0.0, **extra: str) -> None:
    deadline = deadline or time.time() + 60
    body = f"request={request_id}\nstage={name}\ndeadline={deadline:.3f}\n" + "".join(f"{k}={v}\n" for k, v in extra.items())
    (path / "checkpoint-stage.tmp").write_text(body)
    os.rename(path / "checkpoint-stage.tmp", path / "checkpoint-stage")


def answer(path: Path) -> dict:
    return ws._parse((path / "checkpoint-stage-done").read_text())


def test_stages_register_unregister_and_advertise(tmp_path: Path) -> None:
    control = ws.Control(str(tmp_path), watch=False)
    assert ws.STAGES == ("lock_pre", "backup_pre", "backup_post", "restore_pre", "restore_post", "unlock_post")
    with pytest.raises(ValueError, match="'backup' is not a stage"):
        control.on("backup", print)
    control.on_restore(print)
    assert control.stages() == [] and not (tmp_path / "checkpoint-hooks").exists(), "a copy-only callback asks nothing"

    def flush(req):
        pass

    control.on("backup_post", flush)
    control.on_pre_checkpoint(flush)
    assert control.stages() == ["lock_pre", "backup_post"]
    assert (tmp_path / "checkpoint-hooks").read_text() == f"pid={os.getpid()}\nstages=lock_pre,backup_post\n"
    assert control.off("lock_pre", flush) is True and control.off("lock_pre", flush) is False
    assert control.stages() == ["backup_post"]
    control.off("backup_post", flush)
    assert not (tmp_path / "checkpoint-hooks").exists(), "nothing left to drive: warmstart asks nothing"
    control.on_post_checkpoint(flush)
    assert control.stages() == ["unlock_post"]


def test_aliases_map_to_the_stages(tmp_path: Path) -> None:
    control = ws.Control(str(tmp_path), watch=False)
    events = []
    control.on_pre_checkpoint(lambda req: events.append(("lock_pre", req.stage)))
    control.on_post_checkpoint(lambda req: events.append(("source unlock_post", req.result)))
    control.on_post_restore(lambda info: events.append(("copy unlock_post", info.stage)))
    control.on("unlock_post", lambda arg: events.append(("any unlock_post", type(arg).__name__)))
    request(tmp_path, "r1")
    control.check()
    (tmp_path / "checkpoint-done").write_text("request=r1\nresult=ok\n")
    control.check()
    assert events == [("lock_pre", "lock_pre"), ("source unlock_post", "ok"), ("any unlock_post", "CheckpointRequest")]
    events.clear()
    control.ready()
    time.sleep(0.01)
    (tmp_path / "restore-complete").write_text("pid=3\n")
    control.check()
    assert events == [("copy unlock_post", "unlock_post"), ("any unlock_post", "RestoreInfo")]


def test_a_stage_is_answered_only_for_the_request_this_process_quiesced_for(tmp_path: Path) -> None:
    control = ws.Control(str(tmp_path), watch=False)
    seen = []
    control.on("backup_pre", lambda req: seen.append((req.stage, req.request)))
    stage(tmp_path, "backup_pre", "r1")
    control.check()
    assert seen == [] and not (tmp_path / "checkpoint-stage-done").exists(), "no lock_pre answered yet"
    request(tmp_path, "r1")
    control.check()
    stage(tmp_path, "backup_pre", "r1")
    control.check()
    assert seen == [("backup_pre", "r1")]
    assert answer(tmp_path) == {"request": "r1", "stage": "backup_pre", "pid": str(os.getpid()), "result": "ok"}
    control.check()
    assert len(seen) == 1, "once"


def test_a_raising_stage_callback_refuses_and_skips_the_rest(tmp_path: Path) -> None:
    control = ws.Control(str(tmp_path), watch=False)
    calls = []

    def pause_io(req):
        raise RuntimeError("writer busy")

    control.on("backup_post", pause_io)
    control.on("backup_post", lambda req: calls.append("never"))
    request(tmp_path, "r1")
    control.check()
    stage(tmp_path, "backup_post", "r1")
    control.check()
    assert answer(tmp_path)["result"] == "refused"
    assert answer(tmp_path)["error"] == "RuntimeError: writer busy" and answer(tmp_path)["callback"] == "pause_io"
    assert calls == [] and control.errors == ["backup_post callback pause_io failed: RuntimeError: writer busy"]


def test_a_hanging_stage_callback_is_cut_off_before_the_deadline(tmp_path: Path) -> None:
    control = ws.Control(str(tmp_path), watch=False)
    release = threading.Event()

    def wait_forever(req):
        release.wait(10)

    control.on("restore_pre", wait_forever)
    request(tmp_path, "r1")
    control.check()
    stage(tmp_path, "restore_pre", "r1", deadline=time.time() + 0.5)
    t0 = time.monotonic()
    control.check()
    assert time.monotonic() - t0 < 0.5, "answered before warmstart's own deadline"
    assert answer(tmp_path)["result"] == "refused" and answer(tmp_path)["callback"] == "wait_forever"
    assert "did not return within" in answer(tmp_path)["error"]
    release.set()


def test_a_copy_stage_gets_restore_info_and_forgets_the_source_checkpoint(tmp_path: Path) -> None:
    control = ws.Control(str(tmp_path), watch=False)
    events = []
    control.on("restore_post", lambda arg: events.append((type(arg).__name__, arg.stage, arg.snapshot)))
    control.on_post_checkpoint(lambda req: events.append("post_checkpoint"))
    request(tmp_path, "r1")
    control.check()  # the dump happens here; the copy wakes up below with the source's request answered
    stage(tmp_path, "restore_post", "restore-s9", copy="1", snapshot="s9", pid="1")
    (tmp_path / "checkpoint-done").write_text("request=r1\nresult=ok\n")
    control.check()
    assert events == [("RestoreInfo", "restore_post", "s9")], "a copy never runs the source's post_checkpoint"
    assert answer(tmp_path)["result"] == "ok"


def test_standby_blocks_until_cold_start_and_only_in_a_standby_pod(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SNAPSHOT_RESTORE_STANDBY", raising=False)
    assert ws.Control(str(tmp_path)).standby() is False, "not a standby pod: returns at once"
    monkeypatch.setenv("SNAPSHOT_RESTORE_STANDBY", "1")
    assert ws.Control("").standby() is False, "no control dir: nothing can ever say cold-start"
    returned = threading.Event()
    waiter = threading.Thread(target=lambda: ws.Control(str(tmp_path), poll=0.01).standby() and returned.set(),
                              daemon=True)
    waiter.start()
    time.sleep(0.5)
    assert not returned.is_set(), "a standby entrypoint waits for the restore's outcome"
    (tmp_path / "restore-complete").write_text("pid=7\n")
    time.sleep(0.5)
    assert not returned.is_set(), "a successful restore runs the copy beside it; the placeholder keeps waiting"
    (tmp_path / "cold-start").write_text("start cold\n")
    waiter.join(5)
    assert returned.is_set(), "cold-start lets the entrypoint initialise"
