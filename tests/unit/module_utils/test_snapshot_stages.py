"""The engine's call points for the lifecycle stages (_gpuhooks.hook_stage / copy_stage) against the real helper."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Dict, List

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _control as ctl
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _gpuhooks as gh
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _workload as wl

HELPER = Path(__file__).resolve().parents[3] / "workload" / "warmstart_workload.py"
spec = importlib.util.spec_from_file_location("warmstart_workload_for_engine_stages", HELPER)
ws = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ws)  # type: ignore[union-attr]


def test_copy_stage_does_nothing_without_recorded_stages_or_control_dir(tmp_path: Path) -> None:
    timings: Dict[str, float] = {}
    for doc in ({"id": "s1"}, {"id": "s1", "hooks": "junk"}, {"id": "s1", "hooks": {"stages": ["backup_pre"]}}):
        gh.copy_stage(str(tmp_path), doc, "restore_pre", os.getpid(), 1, timings)
    gh.copy_stage(None, {"id": "s1", "hooks": {"stages": ["restore_pre"]}}, "restore_pre", os.getpid(), 1, timings)
    gh.copy_stage(str(tmp_path / "gone"), {"id": "s1", "hooks": {"stages": ["restore_pre"]}}, "restore_pre",
                  os.getpid(), 1, timings)
    assert timings == {} and list(tmp_path.iterdir()) == []


def test_copy_stage_runs_the_copys_callbacks_and_names_a_failure(tmp_path: Path) -> None:
    seen: List[Any] = []
    control = ws.Control(str(tmp_path), poll=0.01)

    def reconnect(info: Any) -> None:
        seen.append((info.stage, info.snapshot, info.fields["pid"]))
        if len(seen) > 1:
            raise ConnectionError("database unreachable")

    control.on("restore_post", reconnect)
    doc = {"id": "s7", "hooks": {"stages": ["lock_pre", "restore_post"]}}
    timings: Dict[str, float] = {}
    gh.copy_stage(str(tmp_path), doc, "restore_post", os.getpid(), 42, timings)
    assert seen == [("restore_post", "s7", "42")] and "hook_restore_post" in timings
    with pytest.raises(ctl.StageFailed) as err:
        gh.copy_stage(str(tmp_path), doc, "restore_post", os.getpid(), 42, timings)
    assert (err.value.stage, err.value.callback) == ("restore_post", "reconnect")
    assert "ConnectionError: database unreachable" in str(err.value)


def test_hook_stage_runs_only_registered_stages_of_an_asked_workload(tmp_path: Path) -> None:
    target = snap.Target(os.getpid(), "process", control_dir=str(tmp_path))
    timings: Dict[str, float] = {}
    plan = gh.CudaPlan("off")
    gh.hook_stage(plan, target, "backup_pre", timings)  # never asked (no lock_pre): nothing to drive
    gh.hook_stage(None, target, "backup_pre", timings)
    plan.request, plan.stages = "r1", ["lock_pre"]
    gh.hook_stage(plan, target, "backup_pre", timings)  # not registered
    assert timings == {} and list(tmp_path.iterdir()) == []
    plan.stages, plan.hook_timeout = ["lock_pre", "backup_pre"], 0.3
    with pytest.raises(snap.SnapshotError) as err:  # registered, but nobody answers: bounded, named
        gh.hook_stage(plan, target, "backup_pre", timings)
    assert str(err.value).startswith("checkpoint hooks: backup_pre: the workload's backup_pre callbacks did not answer")
    assert "within 0.3 s" in str(err.value) and str(err.value).endswith("rolled back, the source keeps running")


def test_a_started_workload_does_not_inherit_an_earlier_processs_hooks(tmp_path: Path) -> None:
    control = Path(wl.paths(str(tmp_path), "w1")["control"])
    control.mkdir(parents=True)
    for name in (ctl.CHECKPOINT_HOOKS, ctl.CHECKPOINT_STAGE, ctl.CHECKPOINT_DONE):
        (control / name).write_text("pid=1\nstages=lock_pre,backup_pre\n")
    wl.start(str(tmp_path), "w1", ["/bin/sleep", "30"])
    try:
        assert ctl.hook_stages(str(control)) == [] and sorted(p.name for p in control.iterdir()) == []
    finally:
        wl.stop(str(tmp_path), "w1")
