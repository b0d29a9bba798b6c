"""snapshot/_checkpoint: a dump that met a change of the node's mount table is planned and tried again."""
from __future__ import annotations

from typing import Any, Dict, List

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu import CriuError
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _checkpoint as ckpt
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _gpuhooks as gh

RACE = ("CRIU dump of pid 7 failed: (00.45) Error (criu/mount.c:381): mnt: No parent found for mountpoint 295 "
        "(@./run/netns/netns-b01d) | Error (criu/cr-dump.c:1975): Dumping FAILED.")


def _run(monkeypatch: pytest.MonkeyPatch, failures: List[str], plan: gh.CudaPlan) -> Dict[str, Any]:
    calls: List[int] = []

    def locked(*_args: Any) -> Dict[str, Any]:
        calls.append(1)
        if len(calls) <= len(failures):
            raise CriuError(failures[len(calls) - 1])
        return {"id": "x", "tries": len(calls)}
    monkeypatch.setattr(ckpt, "_checkpoint_locked", locked)
    timings: Dict[str, float] = {}
    out = ckpt._checkpoint_replanned(None, None, "n", {}, None, True, "criu", timings, 0.0, None, plan, None)  # type: ignore[arg-type]
    return dict(out, timings=timings)


def test_a_mount_race_is_planned_and_dumped_again(monkeypatch: pytest.MonkeyPatch) -> None:
    out = _run(monkeypatch, [RACE, RACE], gh.CudaPlan("off"))
    assert out["tries"] == 3 and out["timings"]["mount_race_retries"] == 2


def test_a_mount_race_that_persists_fails_after_the_last_try(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CriuError, match="No parent found"):
        _run(monkeypatch, [RACE] * ckpt.MOUNT_RACE_TRIES, gh.CudaPlan("off"))


def test_other_failures_and_trees_with_gpu_state_or_hooks_are_not_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CriuError, match="Dumping FAILED"):
        _run(monkeypatch, ["CRIU dump failed: Error (criu/sk-inet.c:188): inet: Unsupported | Dumping FAILED."],
             gh.CudaPlan("off"))
    for plan in (gh.CudaPlan("auto", pids=[7], backend=object()), gh.CudaPlan("off", hooks=True)):  # type: ignore[arg-type]
        with pytest.raises(CriuError, match="No parent found"):
            _run(monkeypatch, [RACE], plan)
