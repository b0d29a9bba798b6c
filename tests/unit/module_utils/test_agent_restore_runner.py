"""runners/_agent_restore: what a restore adds to the node's metrics.

The node side (plugins/module_utils/agent/_agent_node.py: placeholders, sentinels, cold start) runs against
real containers in tests/integration/test_agent_e2e.py.
"""
from __future__ import annotations

from pathlib import Path

from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _agent_restore


def test_a_restore_is_counted_with_its_phases_bytes_age_and_ready_latency(tmp_path: Path) -> None:
    result = {"action": "restored", "pod_ref": "ml/embed-r-0", "outcome": "succeeded", "pod_snapshot_name": "snap-a",
              "snapshot_bytes": 4096, "snapshot_age_seconds": 30.0, "ready_seconds": 1.5,
              "restore": {"destinations": [{"timings": {"rootfs": 0.1, "restore": 0.4, "total": 0.6}}]}}
    assert _agent_restore.record_metrics(str(tmp_path), result) is None
    text = (tmp_path / "warmstart.prom").read_text()
    assert 'warmstart_restores_total{outcome="succeeded"} 1' in text
    assert "warmstart_restore_bytes_total 4096" in text
    assert 'warmstart_snapshot_age_seconds{namespace="ml",snapshot="snap-a"} 30' in text
    assert "warmstart_restore_ready_seconds_count 1" in text
    assert 'warmstart_restore_phase_seconds_count{phase="restore"} 1' in text
    failed = dict(result, outcome="failed")
    assert _agent_restore.record_metrics(str(tmp_path), failed) is None
    text = (tmp_path / "warmstart.prom").read_text()
    assert 'warmstart_restores_total{outcome="failed"} 1' in text
    assert "warmstart_restore_bytes_total 4096" in text, "a failed restore moved no snapshot into a pod"


def test_metrics_off_without_a_directory() -> None:
    assert _agent_restore.record_metrics(None, {"outcome": "succeeded"}) is None
