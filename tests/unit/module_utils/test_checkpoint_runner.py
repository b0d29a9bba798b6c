"""runners/_checkpoint: the checkpoint module's call against a real temporary filesystem store (the engine's
``_checkpoint.checkpoint`` stubbed where a test says so): the target on failure, the result, check mode, metrics
and the accelerator options.

What a user sees on failure is pinned through the adapter's failure shape (``_adapter.failure``).
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _checkpoint as ckpt
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _checkpoint
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
from tests.support.runner_fixtures import failed, metric
from tests.support.store_fixtures import tree

STORE_OPTIONS: Dict[str, Any] = {}


@pytest.fixture(name="pid")
def fixture_pid() -> Iterator[int]:
    child = subprocess.Popen(["sleep", "60"])  # pylint: disable=consider-using-with
    yield child.pid
    child.kill()
    child.wait()


def checkpoint_params(store: st.FsStore, tmp_path: Path, **over: Any) -> Dict[str, Any]:
    return dict(dict(store=store.root, store_options=STORE_OPTIONS, pid=None, pidfile=None, workload=None,
                     container=None, pod=None, runtime="podman", workloads_root=str(tmp_path / "workloads"),
                     criu_path=None, name=None, labels={}, leave_running=True, tcp="established",
                     ext_unix_sk=True, file_locks=True, link_remap=True, ghost_limit=512 << 20, timeout=0,
                     wait_ready=False, ready_timeout=300, cuda="auto", cuda_lock_timeout=30,
                     progress_file=None), **over)


def test_checkpoint_failure_carries_target_even_when_unresolved(store: st.FsStore, tmp_path: Path) -> None:
    out = failed(_checkpoint.run, checkpoint_params(store, tmp_path, workload="absent"))
    assert out["target"] == {}
    assert out["msg"].startswith("workload absent is not running")


def test_checkpoint_failure_after_resolving_carries_the_target(store: st.FsStore, tmp_path: Path, pid: int,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Dict[str, Any]:
        raise snap.SnapshotError("no", reasons=["because"])

    monkeypatch.setattr(ckpt, "checkpoint", refuse)
    out = failed(_checkpoint.run, checkpoint_params(store, tmp_path, pid=pid))
    assert out["target"]["pid"] == pid and out["target"]["container"] is None
    assert out["msg"] == "no: because" and out["reasons"] == ["because"]


def test_checkpoint_os_error_keeps_its_message_and_the_target(store: st.FsStore, tmp_path: Path, pid: int,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(*args: Any, **kwargs: Any) -> Dict[str, Any]:
        raise PermissionError(13, "Permission denied", "/proc/1/mem")

    monkeypatch.setattr(ckpt, "checkpoint", denied)
    out = failed(_checkpoint.run, checkpoint_params(store, tmp_path, pid=pid))
    assert out["msg"] == "/proc/1/mem: Permission denied" and out["target"]["pid"] == pid


def test_checkpoint_success_shapes_the_result(store: st.FsStore, tmp_path: Path, pid: int,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    seen: Dict[str, Any] = {}

    def fake(store_: Any, target: Any, name: str, labels: Any, options: Any, **kwargs: Any) -> Dict[str, Any]:
        seen.update(name=name, options=options, **kwargs)
        return {"id": "20261203T120000Z-0a1b2c3d"}

    monkeypatch.setattr(ckpt, "checkpoint", fake)
    result = _checkpoint.run(checkpoint_params(store, tmp_path, pid=pid, name="srv"), False)
    assert result["changed"] is True and result["snapshot"] == {"id": "20261203T120000Z-0a1b2c3d"}
    assert "transfer" not in result["snapshot"]  # a filesystem store moves nothing over a network
    assert result["target"]["pid"] == pid and seen["name"] == "srv" and seen["pod"] is None
    assert seen["options"].tcp == "established" and seen["cuda"] == "auto"


def test_checkpoint_check_mode_creates_nothing(store: st.FsStore, tmp_path: Path, pid: int) -> None:
    before = tree(tmp_path)
    result = _checkpoint.run(checkpoint_params(store, tmp_path, pid=pid, cuda="off"), True)
    assert tree(tmp_path) == before
    assert result["changed"] is True and result["msg"] == f"would snapshot pid {pid} as process"
    assert result["target"]["pid"] == pid and "cuda" in result and "snapshot" not in result


def test_checkpoint_counts_success_and_failure_but_not_check_mode(store: st.FsStore, tmp_path: Path, pid: int,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    mdir = tmp_path / "metrics"
    monkeypatch.setattr(ckpt, "checkpoint", lambda *a, **k: {"id": "i", "size": 2048,
                                                             "timings": {"dump": 0.2, "total": 0.5}})
    result = _checkpoint.run(checkpoint_params(store, tmp_path, pid=pid, metrics_dir=str(mdir)), False)
    assert "warnings" not in result
    assert metric(mdir, 'warmstart_captures_total{outcome="succeeded"}') == 1
    assert metric(mdir, "warmstart_capture_bytes_total") == 2048
    assert metric(mdir, 'warmstart_capture_phase_seconds_count{phase="dump"}') == 1

    def refuse(*args: Any, **kwargs: Any) -> Dict[str, Any]:
        raise snap.SnapshotError("no")

    monkeypatch.setattr(ckpt, "checkpoint", refuse)
    failed(_checkpoint.run, checkpoint_params(store, tmp_path, pid=pid, metrics_dir=str(mdir)))
    assert metric(mdir, 'warmstart_captures_total{outcome="failed"}') == 1
    before = (mdir / "warmstart.prom").read_text()
    monkeypatch.setattr(ckpt, "checkpoint", lambda *a, **k: {"cuda": {}, "msg": "would"})
    _checkpoint.run(checkpoint_params(store, tmp_path, pid=pid, metrics_dir=str(mdir)), True)
    assert (mdir / "warmstart.prom").read_text() == before


def test_checkpoint_accelerator_maps_onto_the_engine(store: st.FsStore, tmp_path: Path, pid: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    seen: Dict[str, Any] = {}

    def fake(store_: Any, target: Any, name: str, labels: Any, options: Any, **kwargs: Any) -> Dict[str, Any]:
        seen.update(kwargs)
        return {"id": "20261203T120000Z-0a1b2c3d"}

    monkeypatch.setattr(ckpt, "checkpoint", fake)
    for accelerator, cuda, mode in (("cuda", None, "required"), (None, "off", "off"), ("auto", "auto", "auto")):
        _checkpoint.run(checkpoint_params(store, tmp_path, pid=pid, accelerator=accelerator, cuda=cuda), False)
        assert seen["cuda"] == mode and seen["gpu_node"] is None
    _checkpoint.run(checkpoint_params(store, tmp_path, pid=pid, accelerator="ascend", cuda=None), False)
    assert seen["cuda"] == "required"
    assert "CANN snapshot API" in seen["gpu_node"].backend()[1]


def test_accelerator_and_cuda_that_disagree_are_refused_naming_both(store: st.FsStore, tmp_path: Path,
                                                                    pid: int) -> None:
    out = failed(_checkpoint.run, checkpoint_params(store, tmp_path, pid=pid, accelerator="ascend", cuda="required"))
    assert out["msg"].startswith("accelerator: ascend and cuda: required disagree")
