"""runners/_restore: the restore module's call against a real temporary filesystem store (the engine's
``_restore.restore`` and ``_restoreinto.restore_into`` stubbed where a test says so): the outcome on success and on
failure, a container restore's failure shape, metrics and the accelerator options.

What a user sees on failure is pinned through the adapter's failure shape (``_adapter.failure``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _restore
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _restore as rs
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _restoreinto as rinto
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from tests.support.runner_fixtures import failed, metric
from tests.support.store_fixtures import make_snapshot

STORE_OPTIONS: Dict[str, Any] = {}


def restore_params(store: st.FsStore, tmp_path: Path, **over: Any) -> Dict[str, Any]:
    return dict(dict(store=store.root, store_options=STORE_OPTIONS, snapshot=None, name=None, labels=None,
                     verify=True, skip_compat_check=False, criu_path=None, restore_root=str(tmp_path / "restore"),
                     workloads_root=str(tmp_path / "workloads"), control_roots=[str(tmp_path)], cuda="auto",
                     lazy=False, lazy_wait=False, lazy_timeout=600, page_server=None, into=None), **over)


def test_restore_refuses_empty_options_with_outcome_failed(store: st.FsStore, tmp_path: Path) -> None:
    out = failed(_restore.run, restore_params(store, tmp_path, snapshot="", name=""))
    assert out["msg"].startswith("empty value for snapshot, name")
    assert out["outcome"] == "failed"


def test_restore_failure_of_an_unknown_snapshot_has_an_outcome(store: st.FsStore, tmp_path: Path) -> None:
    out = failed(_restore.run, restore_params(store, tmp_path, snapshot="20261203T120000Z-0a1b2c3d"))
    assert out["outcome"] in ("failed", "incompatible")


def test_restore_keeps_the_engine_outcome(store: st.FsStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Dict[str, Any]:
        raise WarmstartError("does not fit", reasons=["arch"], outcome="incompatible")

    monkeypatch.setattr(rs, "restore", refuse)
    out = failed(_restore.run, restore_params(store, tmp_path, name="embed"))
    assert out["outcome"] == "incompatible" and out["msg"] == "does not fit: arch"


def test_restore_success_has_outcome_and_warnings(store: st.FsStore, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rs, "restore", lambda *a, **k: {"id": "x", "outcome": "succeeded", "warnings": ["w"]})
    result = _restore.run(restore_params(store, tmp_path, name="embed"), False)
    assert result["outcome"] == "succeeded" and result["warnings"] == ["w"] and result["changed"] is True
    assert result["restore"]["id"] == "x"


def into_result(outcome: str) -> Dict[str, Any]:
    return {"id": "20261203T120000Z-0a1b2c3d", "name": "app", "outcome": outcome, "destinations": [
        {"container": "p1", "source": "app", "result": "succeeded"},
        {"container": "p2", "source": "app", "result": "failed", "error": "CRIU restore failed",
         "criu_log_tail": ["Error (criu/cr-restore.c)", "Restoring FAILED."]},
        {"container": "p3", "source": "app", "result": "refused", "error": "refusing to restore into p3: busy",
         "criu_log_tail": ["tail of p3"]},
    ]}


def test_container_restore_partial_failure_shape(store: st.FsStore, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rinto, "restore_into", lambda *a, **k: into_result("partially_succeeded"))
    into = dict(container="p1", container_map=None, pod=None, runtime="podman", skip_image_check=False,
                kill_placeholder_on_failure=True)
    out = failed(_restore.run, restore_params(store, tmp_path, name="app", into=into))
    assert out["msg"] == ("restore of snapshot 20261203T120000Z-0a1b2c3d partially succeeded: 1 of 3 container(s) "
                          "restored; CRIU restore failed; refusing to restore into p3: busy")
    assert out["restore"] == into_result("partially_succeeded")
    assert out["criu_log_tail"] == ["Error (criu/cr-restore.c)", "Restoring FAILED.", "tail of p3"]
    assert out["outcome"] == "partially_succeeded"


def test_container_restore_success_and_check_mode(store: st.FsStore, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    seen: Dict[str, Any] = {}

    def fake(store_: Any, spec: Any, **kwargs: Any) -> Dict[str, Any]:
        seen.update(kwargs, spec=spec)
        verb = "would restore" if kwargs["check_mode"] else "succeeded"
        return {"id": "i", "name": "app", "outcome": "succeeded",
                "destinations": [{"container": "p1", "source": "app", "result": verb}]}

    monkeypatch.setattr(rinto, "restore_into", fake)
    into = dict(container="p1", container_map=None, pod=None, runtime="podman", skip_image_check=False,
                kill_placeholder_on_failure=True)
    result = _restore.run(restore_params(store, tmp_path, name="app", into=into), True)
    assert result["msg"] == "would restore snapshot i into p1" and result["outcome"] == "succeeded"
    assert seen["spec"] == "p1"
    result = _restore.run(restore_params(store, tmp_path, name="app", into=into), False)
    assert result["msg"] == "restored snapshot i into p1"


def test_restore_counts_size_and_age_from_the_manifest(store: st.FsStore, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    doc = make_snapshot(store, "embed")
    monkeypatch.setattr(rs, "restore", lambda *a, **k: {"id": doc["id"], "name": "embed", "outcome": "succeeded",
                                                        "timings": {"restore": 0.1, "total": 0.2}})
    monkeypatch.setenv("WARMSTART_METRICS_DIR", str(tmp_path / "metrics"))
    result = _restore.run(restore_params(store, tmp_path, name="embed"), False)
    assert result["outcome"] == "succeeded" and not result.get("warnings")
    mdir = tmp_path / "metrics"
    assert metric(mdir, 'warmstart_restores_total{outcome="succeeded"}') == 1
    assert metric(mdir, "warmstart_restore_bytes_total") == doc["size"] > 0
    assert 0 <= metric(mdir, 'warmstart_snapshot_age_seconds{snapshot="embed"}') < 60
    assert metric(mdir, 'warmstart_restore_phase_seconds_count{phase="total"}') == 1


def test_a_restore_failure_counts_with_its_outcome(store: st.FsStore, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Dict[str, Any]:
        raise WarmstartError("does not fit", outcome="incompatible")

    monkeypatch.setattr(rs, "restore", refuse)
    mdir = tmp_path / "metrics"
    failed(_restore.run, restore_params(store, tmp_path, name="embed", metrics_dir=str(mdir)))
    assert metric(mdir, 'warmstart_restores_total{outcome="incompatible"}') == 1
    assert metric(mdir, "warmstart_restore_bytes_total") == 0


def test_a_container_restore_counts_each_placeholder(store: st.FsStore, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rinto, "restore_into", lambda *a, **k: into_result("partially_succeeded"))
    into = dict(container=None, container_map=None, runtime="podman", skip_image_check=False,
                kill_placeholder_on_failure=True, pod=None)
    mdir = tmp_path / "metrics"
    failed(_restore.run, restore_params(store, tmp_path, name="app", into=dict(into, container="p1"),
                                        metrics_dir=str(mdir)))
    assert [metric(mdir, f'warmstart_restores_total{{outcome="{o}"}}') for o in
            ("succeeded", "failed", "incompatible")] == [1, 1, 1]


def test_metrics_that_cannot_be_written_are_a_warning(store: st.FsStore, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(rs, "restore", lambda *a, **k: {"id": "x", "name": "e", "outcome": "succeeded"})
    result = _restore.run(restore_params(store, tmp_path, name="e", metrics_dir=str(tmp_path / "file" / "m")),
                          False)
    assert result["outcome"] == "succeeded" and result["warnings"][0].startswith("metrics not recorded in ")

    def refuse(*args: Any, **kwargs: Any) -> Dict[str, Any]:
        raise WarmstartError("no")

    monkeypatch.setattr(rs, "restore", refuse)
    out = failed(_restore.run, restore_params(store, tmp_path, name="e", metrics_dir=str(tmp_path / "file" / "m")))
    assert out["msg"] == "no" and out["warnings"][0].startswith("metrics not recorded in ")


def test_accelerator_and_cuda_that_disagree_are_refused_naming_both(store: st.FsStore, tmp_path: Path) -> None:
    out = failed(_restore.run, restore_params(store, tmp_path, accelerator="off", cuda="required"))
    assert "accelerator: off and cuda: required disagree" in out["msg"]
    into = {"container": "x", "container_map": None, "pod": None}
    out = failed(_restore.run, restore_params(store, tmp_path, accelerator="ascend", cuda=None, into=into))
    assert "accelerator: ascend restores process snapshots only" in out["msg"]
