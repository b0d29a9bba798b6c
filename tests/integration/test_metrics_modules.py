"""Metrics of real runs: a checkpoint and a restore through the real modules count themselves in metrics_dir.

A small workload (2 MB of patterned memory) is checkpointed and restored with CRIU on this node; the node's
``warmstart.prom`` then says so, check mode adds nothing, a refused restore counts with its outcome, and the
agent's HTTP endpoint (``_metrics.serve``) serves the same numbers.
"""
from __future__ import annotations

import re
import urllib.request
from pathlib import Path
from typing import Dict

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _metrics as mt

from .process_lab import Lab, free_port, query

pytestmark = pytest.mark.integration


def samples(text: str) -> Dict[str, float]:
    """``{'name{labels}': value}`` of every sample line."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def test_a_real_checkpoint_and_restore_write_the_metrics_file(lab: Lab) -> None:
    mdir = lab.tmp / "metrics"
    port = free_port()
    lab.play([lab.start("m", port, 2, "--pattern")])
    assert query(port)["counter"] >= 0
    snap = lab.play([lab.checkpoint("checkpoint", workload="m", leave_running=False,
                                    metrics_dir=str(mdir))])["checkpoint"]["snapshot"]
    prom = mdir / mt.PROM_FILE
    assert (prom.stat().st_mode & 0o777) == 0o644
    after_capture = samples(prom.read_text())
    assert after_capture['warmstart_captures_total{outcome="succeeded"}'] == 1
    assert after_capture["warmstart_capture_bytes_total"] == snap["size"] > 0
    assert after_capture['warmstart_capture_phase_seconds_count{phase="dump"}'] == 1

    lab.play([lab.restore("would restore", snapshot=snap["id"], metrics_dir=str(mdir), check=True)])
    assert samples(prom.read_text()) == after_capture  # check mode counts nothing

    done = lab.play([lab.restore("restore", snapshot=snap["id"], metrics_dir=str(mdir)),
                     lab.restore("refused", snapshot="20000101T000000Z-00000000", metrics_dir=str(mdir),
                                 expect_fail=True)])
    assert done["restore"]["outcome"] == "succeeded" and query(port)["counter"] >= 0
    assert done["refused"]["failed"] and not done["refused"].get("warnings")
    text = prom.read_text()
    got = samples(text)
    assert got['warmstart_restores_total{outcome="succeeded"}'] == 1
    assert got['warmstart_restores_total{outcome="' + done["refused"]["outcome"] + '"}'] == 1
    assert got["warmstart_restore_bytes_total"] == snap["size"]
    assert 0 <= got['warmstart_snapshot_age_seconds{snapshot="m"}'] < 600
    assert got['warmstart_restore_phase_seconds_count{phase="restore"}'] == 1
    total = done["restore"]["restore"]["timings"]["total"]
    assert got['warmstart_restore_phase_seconds_sum{phase="total"}'] == pytest.approx(total)
    assert re.search(r'^warmstart_last_restore_timestamp_seconds\{outcome="succeeded"\} \d', text, re.M)

    server = mt.serve(str(mdir), "127.0.0.1", 0)
    try:
        with urllib.request.urlopen(server.url, timeout=10) as resp:
            assert resp.headers["Content-Type"] == mt.CONTENT_TYPE
            assert samples(resp.read().decode()) == got
    finally:
        server.close()


def test_metrics_dir_from_the_environment_and_a_warning_when_unwritable(lab: Lab, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    port = free_port()
    lab.play([lab.start("e", port, 2, "--pattern")])
    task = lab.checkpoint("checkpoint", workload="e", leave_running=True)
    task["environment"] = {"WARMSTART_METRICS_DIR": str(blocker / "metrics")}
    result = lab.play([task])["checkpoint"]
    assert result["changed"] and result["snapshot"]["id"]
    assert any("metrics not recorded in" in w for w in result.get("warnings", [])), result.get("warnings")
