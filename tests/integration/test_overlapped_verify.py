"""Verify overlapped with the restore, on a node that never saw the snapshot (issue 24, items 1-2).

A process holding 100 MiB of random memory is checkpointed (its page image gets 64 MiB chunk digests), then
restored with this node's record of hashed files removed - as on another node reading the same shared store.
The small images are verified before anything is touched; the page images are hashed while CRIU restores the
tree stopped, and the tree runs only once they matched. A corrupted chunk (first, middle, last) leaves
nothing running; a corrupted small image is refused before CRIU starts; a snapshot whose manifest has no chunk
digests (an older warmstart) still restores, verified the old way.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Dict

import pytest

from .process_lab import Lab, free_port, query

pytestmark = pytest.mark.integration

MIB = 1 << 20


@pytest.fixture
def snapshot(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> Dict[str, Any]:
    """A checkpoint of a 100 MiB workload (stopped), this node's record of hashed files in a dir of the test's."""
    monkeypatch.setenv("WARMSTART_VERIFIED_DIR", str(lab.tmp / "verified"))
    port = free_port()
    lab.play([lab.start("big", port, 100)])
    before = query(port)
    info = lab.play([lab.checkpoint("checkpoint", workload="big", leave_running=False)])["checkpoint"]["snapshot"]
    top = lab.store / "snapshots" / info["id"]
    doc = json.loads((top / "manifest.json").read_text())
    pages = [e for e in doc["files"] if "/criu/pages-" in e["path"]]
    return {"id": info["id"], "port": port, "before": before, "top": top, "doc": doc,
            "pages": max(pages, key=lambda e: e["size"])}


def _fresh_node(lab: Lab) -> None:
    """Forget what this node hashed: the restore sees the snapshot as another node would."""
    shutil.rmtree(lab.tmp / "verified", ignore_errors=True)


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))


def test_a_fresh_node_restores_with_the_page_images_verified_alongside(lab: Lab, snapshot: Dict[str, Any]) -> None:
    pages = snapshot["pages"]
    assert pages["size"] > 64 * MIB and len(pages["chunks"]["sha256"]) == -(-pages["size"] // (64 * MIB))
    _fresh_node(lab)
    res = lab.play([lab.restore("restore", snapshot=snapshot["id"])])["restore"]["restore"]
    assert res["verify"]["overlapped"] is True, res["verify"]
    assert "verify_wait" in res["timings"]
    after = query(snapshot["port"])
    assert after["token"] == snapshot["before"]["token"] and after["sha256"] == snapshot["before"]["digest_at_start"]
    # CRIU read a private copy made while the small images were hashed (a store writer cannot change it
    # after its check); the page images' copy was hashed alongside CRIU. Nothing of it is left behind.
    assert "verified_copy" in res["timings"], res["timings"]
    assert not (Path(res["work_dir"]) / "images").exists() and not (Path(res["work_dir"]) / "snapshot").exists()


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_corrupted_page_chunk_kills_the_stopped_tree(lab: Lab, snapshot: Dict[str, Any], where: str) -> None:
    pages = snapshot["pages"]
    offset = {"first": 4096 + 7, "middle": 64 * MIB + 12345, "last": pages["size"] - 1}[where]
    _flip(snapshot["top"] / pages["path"], offset)
    _fresh_node(lab)
    res = lab.play([lab.restore("restore", snapshot=snapshot["id"], expect_fail=True)])["restore"]
    assert res["failed"] and res["outcome"] == "failed", res
    assert any(pages["path"] in r and "SHA256 mismatch" in r for r in res["reasons"]), res["reasons"]
    assert "was killed" in res["msg"]
    deadline = time.monotonic() + 10
    while lab.ours() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert lab.ours() == [], "nothing of the restored tree may be left"
    assert lab.pidfile_pid("big") is None
    # the tree never ran: its journal (appended every 50 ms while it runs) is the snapshot's copy, put back
    saved = next(e for e in snapshot["doc"]["files"] if e["path"].endswith("/files/journal.log"))
    assert (lab.wdir("big") / "journal.log").read_bytes() == (snapshot["top"] / saved["path"]).read_bytes()


def test_a_corrupted_small_image_is_refused_before_criu_starts(lab: Lab, snapshot: Dict[str, Any]) -> None:
    core = next(e for e in snapshot["doc"]["files"] if "/criu/core-" in e["path"])
    _flip(snapshot["top"] / core["path"], core["size"] // 2)
    _fresh_node(lab)
    res = lab.play([lab.restore("restore", snapshot=snapshot["id"], expect_fail=True)])["restore"]
    assert res["failed"] and res["outcome"] == "incompatible", res
    assert any(core["path"] in r for r in res["reasons"]), res["reasons"]
    assert lab.ours() == [] and not lab.restore_root.exists() or not any(lab.restore_root.iterdir())


def test_an_old_manifest_without_chunk_digests_still_restores(lab: Lab, snapshot: Dict[str, Any]) -> None:
    doc = snapshot["doc"]
    for entry in doc["files"]:
        entry.pop("chunks", None)
    path = snapshot["top"] / "manifest.json"
    path.write_text(json.dumps(doc))
    os.chmod(path, 0o600)
    _fresh_node(lab)
    res = lab.play([lab.restore("restore", snapshot=snapshot["id"])])["restore"]["restore"]
    assert res["verify"]["overlapped"] is True
    assert query(snapshot["port"])["sha256"] == snapshot["before"]["digest_at_start"]
