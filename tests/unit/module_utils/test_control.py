"""Control-dir sentinels (_control), the checkpoint request answered by the real workload helper."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, List

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _control as ctl

HELPER = Path(__file__).resolve().parents[3] / "workload" / "warmstart_workload.py"
spec = importlib.util.spec_from_file_location("warmstart_workload_for_control", HELPER)
ws = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ws)


def test_sentinel_names_match_the_helper() -> None:
    for name in ("READY", "RESTORE_COMPLETE", "RESTORE_FAILED", "CHECKPOINT_REQUESTED", "CHECKPOINT_REFUSED",
                 "CHECKPOINT_DONE", "CHECKPOINT_HOOKS", "ENV_VAR"):
        assert getattr(ctl, name) == getattr(ws, name), name


def test_write_is_atomic_and_clear_is_idempotent(tmp_path: Path) -> None:
    path = ctl.write(str(tmp_path), ctl.RESTORE_COMPLETE, "pid=7\n")
    assert Path(path).read_text() == "pid=7\n" and oct(os.stat(path).st_mode & 0o777) == "0o644"
    assert [p.name for p in tmp_path.iterdir()] == [ctl.RESTORE_COMPLETE]
    assert ctl.present(str(tmp_path), ctl.RESTORE_COMPLETE)
    ctl.clear(str(tmp_path), ctl.RESTORE_COMPLETE, ctl.READY)
    ctl.clear(str(tmp_path), ctl.RESTORE_COMPLETE)
    assert not ctl.present(str(tmp_path), ctl.RESTORE_COMPLETE)
    assert ctl.parse_kv("pid=7\n junk \nsnapshot = s1\n") == {"pid": "7", "snapshot": "s1"}


class Workload:
    """The real helper watching a control dir in this process (its watcher thread)."""

    def __init__(self, path: Path) -> None:
        self.control = ws.Control(str(path), poll=0.01)
        self.events: List[object] = []


@pytest.fixture
def workload(tmp_path: Path) -> Iterator[Workload]:
    yield Workload(tmp_path)


def test_request_checkpoint_is_answered_after_the_quiesce_callbacks(tmp_path: Path, workload: Workload) -> None:
    def quiesce(req) -> None:
        time.sleep(0.2)  # finishing in-flight requests
        workload.events.append(("quiesced", req.request))

    assert not ctl.has_checkpoint_hooks(str(tmp_path))
    workload.control.on_pre_checkpoint(quiesce)
    assert ctl.has_checkpoint_hooks(str(tmp_path)), "the workload advertises its hooks"
    answer = ctl.request_checkpoint(str(tmp_path), timeout=10)
    assert workload.events == [("quiesced", answer["request"])]
    assert float(answer["waited"]) >= 0.2
    assert answer["pid"] == str(os.getpid())
    assert not (tmp_path / ctl.CHECKPOINT_REQUESTED).exists(), "the request is withdrawn once answered"
    assert ctl.parse_kv((tmp_path / ctl.READY).read_text())["request"] == answer["request"]


def test_stale_sentinels_are_cleared_first(tmp_path: Path, workload: Workload) -> None:
    for name in (ctl.READY, ctl.CHECKPOINT_REFUSED, ctl.CHECKPOINT_DONE, ctl.CHECKPOINT_REQUESTED):
        (tmp_path / name).write_text("request=old\n")
    release = threading.Event()
    workload.control.on_pre_checkpoint(lambda req: release.wait(5))
    threading.Timer(0.3, release.set).start()
    t0 = time.monotonic()
    answer = ctl.request_checkpoint(str(tmp_path), timeout=10)
    assert time.monotonic() - t0 >= 0.3, "the old ready-for-snapshot did not count"
    assert answer["request"] != "old"
    assert not (tmp_path / ctl.CHECKPOINT_REFUSED).exists() and not (tmp_path / ctl.CHECKPOINT_DONE).exists()


def test_a_refusal_raises_with_the_workloads_error(tmp_path: Path, workload: Workload) -> None:
    resumed = threading.Event()

    def kv_cache(req) -> None:
        raise RuntimeError("KV cache still pinned by 2 sequences")

    workload.control.on_pre_checkpoint(kv_cache)
    workload.control.on_post_checkpoint(lambda req: resumed.set())
    with pytest.raises(ctl.CheckpointRefused) as err:
        ctl.request_checkpoint(str(tmp_path), timeout=10)
    assert str(err.value) == (f"the workload refused the checkpoint ({tmp_path / ctl.CHECKPOINT_REFUSED}): "
                              "RuntimeError: KV cache still pinned by 2 sequences (stage lock_pre, callback kv_cache)")
    assert err.value.request
    assert not (tmp_path / ctl.CHECKPOINT_REQUESTED).exists()
    assert resumed.wait(5), "the workload resumes what it had quiesced"


def test_a_timeout_withdraws_the_request_and_says_done(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as err:
        ctl.request_checkpoint(str(tmp_path), timeout=0.3)
    assert time.monotonic() - t0 >= 0.3
    assert str(err.value) == (f"the workload did not answer {tmp_path / ctl.CHECKPOINT_REQUESTED} with "
                              "ready-for-snapshot or checkpoint-refused within 0.3 s (does it use on_pre_checkpoint?)")
    assert not (tmp_path / ctl.CHECKPOINT_REQUESTED).exists()
    done = ctl.parse_kv((tmp_path / ctl.CHECKPOINT_DONE).read_text())
    assert done["result"] == "timeout" and done["request"]


def test_a_hanging_lock_pre_callback_is_refused_by_name_and_resumes(tmp_path: Path, workload: Workload) -> None:
    resumed = threading.Event()
    results = []

    def drain(req: object) -> None:
        time.sleep(2)

    workload.control.on_pre_checkpoint(drain)
    workload.control.on_post_checkpoint(lambda req: (results.append(req.result), resumed.set()))
    t0 = time.monotonic()
    with pytest.raises(ctl.CheckpointRefused) as err:
        ctl.request_checkpoint(str(tmp_path), timeout=0.5)
    assert time.monotonic() - t0 < 0.6, "bounded by the request's deadline"
    assert "lock_pre callback drain did not return within" in str(err.value)
    assert "(stage lock_pre, callback drain)" in str(err.value)
    assert resumed.wait(5) and results == ["refused"]


def test_a_late_workload_resumes_after_the_timeout(tmp_path: Path) -> None:
    late = ws.Control(str(tmp_path), watch=False)
    results = []
    late.on_pre_checkpoint(lambda req: None)
    late.on_post_checkpoint(lambda req: results.append(req.result))
    with pytest.raises(TimeoutError):
        ctl.request_checkpoint(str(tmp_path), timeout=0.2)
    late.check()  # too late: the request was withdrawn, checkpoint-done says timeout
    assert results == [], "a withdrawn request is not answered"


def test_an_answer_for_another_request_is_not_taken(tmp_path: Path) -> None:
    def answer_wrong() -> None:
        time.sleep(0.1)
        (tmp_path / "x").write_text("request=not-this-one\n")
        os.rename(tmp_path / "x", tmp_path / ctl.READY)

    threading.Thread(target=answer_wrong).start()
    with pytest.raises(TimeoutError):
        ctl.request_checkpoint(str(tmp_path), timeout=0.4)


def test_a_workload_that_exits_is_noticed(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    try:
        with pytest.raises(ProcessLookupError, match=rf"process {child.pid} exited before answering .*checkpoint-requested"):
            ctl.request_checkpoint(str(tmp_path), timeout=10, alive=child.pid)
    finally:
        child.wait()
    assert not (tmp_path / ctl.CHECKPOINT_REQUESTED).exists()


def test_finish_checkpoint_resumes_the_source(tmp_path: Path, workload: Workload) -> None:
    resumed = threading.Event()
    seen = []
    workload.control.on_pre_checkpoint(lambda req: None)
    workload.control.on_post_checkpoint(lambda req: (seen.append((req.request, req.result)), resumed.set()))
    answer = ctl.request_checkpoint(str(tmp_path), timeout=10)
    ctl.finish_checkpoint(str(tmp_path), answer["request"], "ok", "published\nsnapshot s1")
    assert ctl.parse_kv((tmp_path / ctl.CHECKPOINT_DONE).read_text()) == {
        "request": answer["request"], "result": "ok", "detail": "published snapshot s1"}
    assert resumed.wait(5) and seen == [(answer["request"], "ok")]


def test_a_helper_in_another_process_answers(tmp_path: Path) -> None:
    """The workload side as a real separate process using the helper file as it is shipped."""
    code = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); import warmstart_workload as ws\n"
        "c = ws.Control(sys.argv[2], poll=0.01)\n"
        "c.on_pre_checkpoint(lambda req: open(sys.argv[2] + '/quiesced', 'w').write(req.request))\n"
        "print('up', flush=True); time.sleep(30)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code, str(HELPER.parent), str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "up"
        answer = ctl.request_checkpoint(str(tmp_path), timeout=10, alive=child.pid)
        assert answer["pid"] == str(child.pid)
        assert (tmp_path / "quiesced").read_text() == answer["request"]
    finally:
        child.kill()
        child.wait()


# --- the six lifecycle stages: hook_stages and run_stage against the real helper ---------------------------


def test_stage_names_match_the_helper() -> None:
    assert ctl.STAGES == ws.STAGES
    assert (ctl.CHECKPOINT_STAGE, ctl.CHECKPOINT_STAGE_DONE) == (ws.CHECKPOINT_STAGE, ws.CHECKPOINT_STAGE_DONE)


def test_hook_stages_reads_the_advertisement_old_and_new(tmp_path: Path) -> None:
    assert ctl.hook_stages(str(tmp_path)) == [] and ctl.hook_stages(None) == []
    (tmp_path / ctl.CHECKPOINT_HOOKS).write_text("pid=1\nstages=pre_checkpoint,post_checkpoint,post_restore\n")
    assert ctl.hook_stages(str(tmp_path)) == ["lock_pre", "unlock_post"], "an older helper's names"
    (tmp_path / ctl.CHECKPOINT_HOOKS).write_text("pid=1\nstages=unlock_post,backup_pre,bogus\n")
    assert ctl.hook_stages(str(tmp_path)) == ["backup_pre", "unlock_post"], "lifecycle order, unknown names dropped"
    (tmp_path / ctl.CHECKPOINT_HOOKS).write_text("pid=1\n")
    assert ctl.hook_stages(str(tmp_path)) == ["lock_pre"], "hooks without a list: at least the request"


def test_run_stage_runs_the_workloads_callbacks_once_per_request(tmp_path: Path, workload: Workload) -> None:
    seen: List[object] = []
    workload.control.on("backup_pre", lambda req: seen.append((req.stage, req.request)))
    assert ctl.hook_stages(str(tmp_path)) == ["backup_pre"]
    answer = ctl.request_checkpoint(str(tmp_path), timeout=10)  # lock_pre: the request the stages belong to
    assert ctl.run_stage(str(tmp_path), "backup_pre", answer["request"], 10) >= 0
    assert seen == [("backup_pre", answer["request"])]
    assert not (tmp_path / ctl.CHECKPOINT_STAGE).exists() and not (tmp_path / ctl.CHECKPOINT_STAGE_DONE).exists()
    with pytest.raises(ValueError):
        ctl.run_stage(str(tmp_path), "backup", answer["request"], 1)


def test_a_stage_of_another_request_is_not_answered(tmp_path: Path, workload: Workload) -> None:
    workload.control.on("backup_post", lambda req: None)
    ctl.request_checkpoint(str(tmp_path), timeout=10)
    with pytest.raises(ctl.StageFailed) as err:
        ctl.run_stage(str(tmp_path), "backup_post", "someone-else", 0.3)
    assert err.value.stage == "backup_post" and "did not answer" in str(err.value) and "within 0.3 s" in str(err.value)


def test_a_raising_stage_callback_is_named(tmp_path: Path, workload: Workload) -> None:
    def flush_queue(req: object) -> None:
        raise OSError("queue not empty")

    workload.control.on("backup_pre", lambda req: None)
    workload.control.on("backup_pre", flush_queue)
    answer = ctl.request_checkpoint(str(tmp_path), timeout=10)
    with pytest.raises(ctl.StageFailed) as err:
        ctl.run_stage(str(tmp_path), "backup_pre", answer["request"], 10)
    assert str(err.value) == "the workload's backup_pre callback flush_queue failed: OSError: queue not empty"
    assert (err.value.stage, err.value.callback) == ("backup_pre", "flush_queue")


def test_a_hanging_stage_callback_is_bounded_and_named(tmp_path: Path, workload: Workload) -> None:
    def stuck(req: object) -> None:
        time.sleep(5)

    workload.control.on("restore_post", stuck)
    answer = ctl.request_checkpoint(str(tmp_path), timeout=10)
    t0 = time.monotonic()
    with pytest.raises(ctl.StageFailed) as err:
        ctl.run_stage(str(tmp_path), "restore_post", answer["request"], 1.0)
    assert time.monotonic() - t0 < 1.5
    assert err.value.callback == "stuck" and "restore_post callback stuck did not return within" in str(err.value)


def test_run_stage_stops_when_the_process_exits(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    with pytest.raises(ctl.StageFailed) as err:
        ctl.run_stage(str(tmp_path), "backup_pre", "r1", 10, alive=child.pid)
    assert f"process {child.pid} exited during its backup_pre callbacks" == str(err.value)


def test_a_copy_runs_its_restore_stages_with_restore_info(tmp_path: Path, workload: Workload) -> None:
    seen: List[object] = []
    workload.control.on("restore_pre", lambda info: seen.append((type(info).__name__, info.stage, info.snapshot)))
    ctl.run_stage(str(tmp_path), "restore_pre", "restore-s1", 10, extra={"copy": "1", "snapshot": "s1", "pid": "1"})
    assert seen == [("RestoreInfo", "restore_pre", "s1")]
