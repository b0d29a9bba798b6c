"""runners/_workload: every failure names the workload; check mode starts nothing."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _workload
from tests.support.runner_fixtures import failed
from tests.support.store_fixtures import tree


def workload_params(tmp_path: Path, **over: Any) -> Dict[str, Any]:
    return dict(dict(name="w1", command=None, state="started", env={}, chdir=None, root=str(tmp_path / "wl"),
                     wait_ready=False, ready_timeout=5, stop_timeout=5), **over)


def test_workload_command_that_cannot_be_split_names_the_workload(tmp_path: Path) -> None:
    out = failed(_workload.run, workload_params(tmp_path, command="sleep 'unterminated"))
    assert out["msg"] == "workload w1: No closing quotation" and "exception" not in out


def test_workload_check_mode_starts_nothing(tmp_path: Path) -> None:
    before = tree(tmp_path)
    result = _workload.run(workload_params(tmp_path, command="sleep 60"), True)
    assert result["changed"] is True and tree(tmp_path) == before


def test_stopped_workload_that_never_ran_is_unchanged(tmp_path: Path) -> None:
    result = _workload.run(workload_params(tmp_path, state="stopped"), False)
    assert result["changed"] is False and "workload" in result
