"""_module: each node-side module's params-in/result-out call, against real temporary filesystem stores.

What a user sees on failure is pinned through the adapter's failure shape (``_adapter.failure``).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _container as ctr
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _module
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import failure
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from tests.support.store_fixtures import make_snapshot, tree

STORE_OPTIONS: Dict[str, Any] = {}


def failed(call: Any, params: Dict[str, Any], check_mode: bool = False) -> Dict[str, Any]:
    with pytest.raises(Exception) as raised:
        call(params, check_mode)
    return failure(raised.value)


def info_params(store: st.FsStore, **over: Any) -> Dict[str, Any]:
    return dict(dict(store=store.root, store_options=STORE_OPTIONS, name=None, labels={}, details=False,
                     verify=False, query=None), **over)


def restore_params(store: st.FsStore, tmp_path: Path, **over: Any) -> Dict[str, Any]:
    return dict(dict(store=store.root, store_options=STORE_OPTIONS, snapshot=None, name=None, labels=None,
                     verify=True, skip_compat_check=False, criu_path=None, restore_root=str(tmp_path / "restore"),
                     workloads_root=str(tmp_path / "workloads"), control_roots=[str(tmp_path)], cuda="auto",
                     lazy=False, lazy_wait=False, lazy_timeout=600, page_server=None, into=None), **over)


# --- snapshot_info ----------------------------------------------------------------

def test_snapshot_info_lists_newest_first_and_verifies(store: st.FsStore) -> None:
    first = make_snapshot(store, "embed", {"model": "a"})
    second = make_snapshot(store, "embed", {"model": "b"})
    result = _module.snapshot_info(info_params(store, verify=True), True)
    assert result["changed"] is False
    assert result["store"] == {"path": store.root, "kind": "fs", "exists": True}
    assert {s["id"] for s in result["snapshots"]} == {first["id"], second["id"]}
    assert result["count"] == 2 and result["broken"] == [] and result["staging"] == []
    assert all(s["intact"] and s["problems"] == [] for s in result["snapshots"])
    assert result["snapshots"][0]["path"] == store.snapshot_dir(result["snapshots"][0]["id"])
    only_b = _module.snapshot_info(info_params(store, labels={"model": "b"}, query="[].id"), False)
    assert only_b["query_result"] == [second["id"]]


def test_snapshot_info_query_failure_carries_the_result(store: st.FsStore) -> None:
    make_snapshot(store)
    out = failed(_module.snapshot_info, info_params(store, query="[?"))
    assert "is not valid JMESPath" in out["msg"]
    assert out["count"] == 1 and len(out["snapshots"]) == 1 and out["changed"] is False
    assert "store" in out and "broken" in out and "staging" in out


def test_snapshot_info_refuses_an_empty_name(store: st.FsStore) -> None:
    out = failed(_module.snapshot_info, info_params(store, name=" "))
    assert out["msg"].startswith("empty value for name")


def test_snapshot_info_reports_a_broken_snapshot(store: st.FsStore) -> None:
    doc = make_snapshot(store)
    os.unlink(os.path.join(store.snapshot_dir(doc["id"]), "manifest.json"))
    result = _module.snapshot_info(info_params(store), False)
    assert result["count"] == 0 and [b["id"] for b in result["broken"]] == [doc["id"]]
    assert result["broken"][0]["newer_schema"] is False


# --- checkpoint -------------------------------------------------------------------

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
                     wait_ready=False, ready_timeout=300, cuda="auto", cuda_lock_timeout=30000,
                     progress_file=None), **over)


def test_checkpoint_failure_carries_target_even_when_unresolved(store: st.FsStore, tmp_path: Path) -> None:
    out = failed(_module.checkpoint, checkpoint_params(store, tmp_path, workload="absent"))
    assert out["target"] == {}
    assert out["msg"].startswith("workload absent is not running")


def test_checkpoint_failure_after_resolving_carries_the_target(store: st.FsStore, tmp_path: Path, pid: int,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Dict[str, Any]:
        raise snap.SnapshotError("no", reasons=["because"])

    monkeypatch.setattr(snap, "checkpoint", refuse)
    out = failed(_module.checkpoint, checkpoint_params(store, tmp_path, pid=pid))
    assert out["target"]["pid"] == pid and out["target"]["container"] is None
    assert out["msg"] == "no: because" and out["reasons"] == ["because"]


def test_checkpoint_os_error_keeps_its_message_and_the_target(store: st.FsStore, tmp_path: Path, pid: int,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(*args: Any, **kwargs: Any) -> Dict[str, Any]:
        raise PermissionError(13, "Permission denied", "/proc/1/mem")

    monkeypatch.setattr(snap, "checkpoint", denied)
    out = failed(_module.checkpoint, checkpoint_params(store, tmp_path, pid=pid))
    assert out["msg"] == "/proc/1/mem: Permission denied" and out["target"]["pid"] == pid


def test_checkpoint_success_shapes_the_result(store: st.FsStore, tmp_path: Path, pid: int,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    seen: Dict[str, Any] = {}

    def fake(store_: Any, target: Any, name: str, labels: Any, options: Any, **kwargs: Any) -> Dict[str, Any]:
        seen.update(name=name, options=options, **kwargs)
        return {"id": "20261203T120000Z-0a1b2c3d"}

    monkeypatch.setattr(snap, "checkpoint", fake)
    result = _module.checkpoint(checkpoint_params(store, tmp_path, pid=pid, name="srv"), False)
    assert result["changed"] is True and result["snapshot"] == {"id": "20261203T120000Z-0a1b2c3d"}
    assert "transfer" not in result["snapshot"]  # a filesystem store moves nothing over a network
    assert result["target"]["pid"] == pid and seen["name"] == "srv" and seen["pod"] is None
    assert seen["options"].tcp == "established" and seen["cuda"] == "auto"


def test_checkpoint_check_mode_creates_nothing(store: st.FsStore, tmp_path: Path, pid: int) -> None:
    before = tree(tmp_path)
    result = _module.checkpoint(checkpoint_params(store, tmp_path, pid=pid, cuda="off"), True)
    assert tree(tmp_path) == before
    assert result["changed"] is True and result["msg"] == f"would snapshot pid {pid} as process"
    assert result["target"]["pid"] == pid and "cuda" in result and "snapshot" not in result


# --- restore ----------------------------------------------------------------------

def test_restore_refuses_empty_options_with_outcome_failed(store: st.FsStore, tmp_path: Path) -> None:
    out = failed(_module.restore, restore_params(store, tmp_path, snapshot="", name=""))
    assert out["msg"].startswith("empty value for snapshot, name")
    assert out["outcome"] == "failed"


def test_restore_failure_of_an_unknown_snapshot_has_an_outcome(store: st.FsStore, tmp_path: Path) -> None:
    out = failed(_module.restore, restore_params(store, tmp_path, snapshot="20261203T120000Z-0a1b2c3d"))
    assert out["outcome"] in ("failed", "incompatible")


def test_restore_keeps_the_engine_outcome(store: st.FsStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Dict[str, Any]:
        raise WarmstartError("does not fit", reasons=["arch"], outcome="incompatible")

    monkeypatch.setattr(snap, "restore", refuse)
    out = failed(_module.restore, restore_params(store, tmp_path, name="embed"))
    assert out["outcome"] == "incompatible" and out["msg"] == "does not fit: arch"


def test_restore_success_has_outcome_and_warnings(store: st.FsStore, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snap, "restore", lambda *a, **k: {"id": "x", "outcome": "succeeded", "warnings": ["w"]})
    result = _module.restore(restore_params(store, tmp_path, name="embed"), False)
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
    monkeypatch.setattr(ctr, "restore_into", lambda *a, **k: into_result("partially_succeeded"))
    into = dict(container="p1", container_map=None, pod=None, runtime="podman", skip_image_check=False,
                kill_placeholder_on_failure=True)
    out = failed(_module.restore, restore_params(store, tmp_path, name="app", into=into))
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

    monkeypatch.setattr(ctr, "restore_into", fake)
    into = dict(container="p1", container_map=None, pod=None, runtime="podman", skip_image_check=False,
                kill_placeholder_on_failure=True)
    result = _module.restore(restore_params(store, tmp_path, name="app", into=into), True)
    assert result["msg"] == "would restore snapshot i into p1" and result["outcome"] == "succeeded"
    assert seen["spec"] == "p1"
    result = _module.restore(restore_params(store, tmp_path, name="app", into=into), False)
    assert result["msg"] == "restored snapshot i into p1"


# --- page_server, node_info, workload ---------------------------------------------

def page_params(store: st.FsStore, tmp_path: Path, snapshot: str, **over: Any) -> Dict[str, Any]:
    return dict(dict(store=store.root, store_options=STORE_OPTIONS, snapshot=snapshot, address="127.0.0.1",
                     port=27000, timeout=5, verify=True, criu_path=None, log_dir=str(tmp_path / "logs")), **over)


def test_page_server_check_mode_verifies_and_starts_nothing(store: st.FsStore, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot._pageserver.find_criu",
                        lambda path: "/usr/local/bin/criu")
    doc = make_snapshot(store)
    before = tree(tmp_path)
    result = _module.page_server(page_params(store, tmp_path, doc["id"]), True)
    assert result == {"changed": True, "page_server": {"snapshot": doc["id"], "address": "127.0.0.1",
                                                       "port": 27000, "tls": False}}
    assert tree(tmp_path) == before


def test_page_server_refusals(store: st.FsStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot._pageserver.find_criu",
                        lambda path: "/usr/local/bin/criu")
    doc = make_snapshot(store)
    out = failed(_module.page_server, page_params(store, tmp_path, doc["id"], port=0))
    assert out["msg"] == "port: 0 is not a TCP port (1-65535)"
    with open(os.path.join(store.snapshot_dir(doc["id"]), "containers", "embed", "criu", "pages-1.img"), "ab") as fh:
        fh.write(b"more")
    out = failed(_module.page_server, page_params(store, tmp_path, doc["id"]), check_mode=True)
    assert out["msg"].startswith(f"snapshot {doc['id']} is not intact: ") and out["reasons"]
    monkeypatch.setattr("ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot._pageserver.find_criu",
                        lambda path: None)
    out = failed(_module.page_server, page_params(store, tmp_path, doc["id"]))
    assert out["msg"].startswith("no CRIU found on this node")


def test_node_info_unreadable_kernel_min_version_is_an_engine_error() -> None:
    params = dict(snapshot_root="/var/lib/warmstart", criu_path=None, kernel_min_version="abc", probe_features=False)
    with pytest.raises(WarmstartError) as raised:
        _module.node_info(params, False)
    assert str(raised.value).startswith("kernel_min_version: ")


def workload_params(tmp_path: Path, **over: Any) -> Dict[str, Any]:
    return dict(dict(name="w1", command=None, state="started", env={}, chdir=None, root=str(tmp_path / "wl"),
                     wait_ready=False, ready_timeout=5, stop_timeout=5), **over)


def test_workload_command_that_cannot_be_split_names_the_workload(tmp_path: Path) -> None:
    out = failed(_module.workload, workload_params(tmp_path, command="sleep 'unterminated"))
    assert out["msg"] == "workload w1: No closing quotation" and "exception" not in out


def test_workload_check_mode_starts_nothing(tmp_path: Path) -> None:
    before = tree(tmp_path)
    result = _module.workload(workload_params(tmp_path, command="sleep 60"), True)
    assert result["changed"] is True and tree(tmp_path) == before


def test_stopped_workload_that_never_ran_is_unchanged(tmp_path: Path) -> None:
    result = _module.workload(workload_params(tmp_path, state="stopped"), False)
    assert result["changed"] is False and "workload" in result


# --- metrics (checkpoint and restore count themselves) ----------------------------

def _metric(mdir: Path, sample: str) -> float:
    """The value of one exact sample line's series in the node's metrics file (0 when absent)."""
    for line in (mdir / "warmstart.prom").read_text().splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_checkpoint_counts_success_and_failure_but_not_check_mode(store: st.FsStore, tmp_path: Path, pid: int,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    mdir = tmp_path / "metrics"
    monkeypatch.setattr(snap, "checkpoint", lambda *a, **k: {"id": "i", "size": 2048,
                                                             "timings": {"dump": 0.2, "total": 0.5}})
    result = _module.checkpoint(checkpoint_params(store, tmp_path, pid=pid, metrics_dir=str(mdir)), False)
    assert "warnings" not in result
    assert _metric(mdir, 'warmstart_captures_total{outcome="succeeded"}') == 1
    assert _metric(mdir, "warmstart_capture_bytes_total") == 2048
    assert _metric(mdir, 'warmstart_capture_phase_seconds_count{phase="dump"}') == 1

    def refuse(*args: Any, **kwargs: Any) -> Dict[str, Any]:
        raise snap.SnapshotError("no")

    monkeypatch.setattr(snap, "checkpoint", refuse)
    failed(_module.checkpoint, checkpoint_params(store, tmp_path, pid=pid, metrics_dir=str(mdir)))
    assert _metric(mdir, 'warmstart_captures_total{outcome="failed"}') == 1
    before = (mdir / "warmstart.prom").read_text()
    monkeypatch.setattr(snap, "checkpoint", lambda *a, **k: {"cuda": {}, "msg": "would"})
    _module.checkpoint(checkpoint_params(store, tmp_path, pid=pid, metrics_dir=str(mdir)), True)
    assert (mdir / "warmstart.prom").read_text() == before


def test_restore_counts_size_and_age_from_the_manifest(store: st.FsStore, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    doc = make_snapshot(store, "embed")
    monkeypatch.setattr(snap, "restore", lambda *a, **k: {"id": doc["id"], "name": "embed", "outcome": "succeeded",
                                                          "timings": {"restore": 0.1, "total": 0.2}})
    monkeypatch.setenv("WARMSTART_METRICS_DIR", str(tmp_path / "metrics"))
    result = _module.restore(restore_params(store, tmp_path, name="embed"), False)
    assert result["outcome"] == "succeeded" and not result.get("warnings")
    mdir = tmp_path / "metrics"
    assert _metric(mdir, 'warmstart_restores_total{outcome="succeeded"}') == 1
    assert _metric(mdir, "warmstart_restore_bytes_total") == doc["size"] > 0
    assert 0 <= _metric(mdir, 'warmstart_snapshot_age_seconds{snapshot="embed"}') < 60
    assert _metric(mdir, 'warmstart_restore_phase_seconds_count{phase="total"}') == 1


def test_a_restore_failure_counts_with_its_outcome(store: st.FsStore, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Dict[str, Any]:
        raise WarmstartError("does not fit", outcome="incompatible")

    monkeypatch.setattr(snap, "restore", refuse)
    mdir = tmp_path / "metrics"
    failed(_module.restore, restore_params(store, tmp_path, name="embed", metrics_dir=str(mdir)))
    assert _metric(mdir, 'warmstart_restores_total{outcome="incompatible"}') == 1
    assert _metric(mdir, "warmstart_restore_bytes_total") == 0


def test_a_container_restore_counts_each_placeholder(store: st.FsStore, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ctr, "restore_into", lambda *a, **k: into_result("partially_succeeded"))
    into = dict(container=None, container_map=None, runtime="podman", skip_image_check=False,
                kill_placeholder_on_failure=True, pod=None)
    mdir = tmp_path / "metrics"
    failed(_module.restore, restore_params(store, tmp_path, name="app", into=dict(into, container="p1"),
                                           metrics_dir=str(mdir)))
    assert [_metric(mdir, f'warmstart_restores_total{{outcome="{o}"}}') for o in
            ("succeeded", "failed", "incompatible")] == [1, 1, 1]


def test_metrics_that_cannot_be_written_are_a_warning(store: st.FsStore, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(snap, "restore", lambda *a, **k: {"id": "x", "name": "e", "outcome": "succeeded"})
    result = _module.restore(restore_params(store, tmp_path, name="e", metrics_dir=str(tmp_path / "file" / "m")),
                             False)
    assert result["outcome"] == "succeeded" and result["warnings"][0].startswith("metrics not recorded in ")

    def refuse(*args: Any, **kwargs: Any) -> Dict[str, Any]:
        raise WarmstartError("no")

    monkeypatch.setattr(snap, "restore", refuse)
    out = failed(_module.restore, restore_params(store, tmp_path, name="e", metrics_dir=str(tmp_path / "file" / "m")))
    assert out["msg"] == "no" and out["warnings"][0].startswith("metrics not recorded in ")


# --- accelerator (and its alias cuda) ----------------------------------------------

def test_checkpoint_accelerator_maps_onto_the_engine(store: st.FsStore, tmp_path: Path, pid: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    seen: Dict[str, Any] = {}

    def fake(store_: Any, target: Any, name: str, labels: Any, options: Any, **kwargs: Any) -> Dict[str, Any]:
        seen.update(kwargs)
        return {"id": "20261203T120000Z-0a1b2c3d"}

    monkeypatch.setattr(snap, "checkpoint", fake)
    for accelerator, cuda, mode in (("cuda", None, "required"), (None, "off", "off"), ("auto", "auto", "auto")):
        _module.checkpoint(checkpoint_params(store, tmp_path, pid=pid, accelerator=accelerator, cuda=cuda), False)
        assert seen["cuda"] == mode and seen["gpu_node"] is None
    _module.checkpoint(checkpoint_params(store, tmp_path, pid=pid, accelerator="ascend", cuda=None), False)
    assert seen["cuda"] == "required"
    assert "CANN snapshot API" in seen["gpu_node"].backend()[1]


def test_accelerator_and_cuda_that_disagree_are_refused_naming_both(store: st.FsStore, tmp_path: Path,
                                                                    pid: int) -> None:
    out = failed(_module.checkpoint, checkpoint_params(store, tmp_path, pid=pid, accelerator="ascend", cuda="required"))
    assert out["msg"].startswith("accelerator: ascend and cuda: required disagree")
    out = failed(_module.restore, restore_params(store, tmp_path, accelerator="off", cuda="required"))
    assert "accelerator: off and cuda: required disagree" in out["msg"]
    into = {"container": "x", "container_map": None, "pod": None}
    out = failed(_module.restore, restore_params(store, tmp_path, accelerator="ascend", cuda=None, into=into))
    assert "accelerator: ascend restores process snapshots only" in out["msg"]
