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
import time
from pathlib import Path
from typing import Any, Dict

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _checksums as ck

from .process_lab import Lab, flip_byte, forget_hashed, query, snapshot_of_a_fresh_node

pytestmark = pytest.mark.integration

MIB = 1 << 20


@pytest.fixture
def snapshot(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> Dict[str, Any]:
    """A checkpoint of a 100 MiB workload (stopped), this node's record of hashed files in a dir of the test's."""
    return snapshot_of_a_fresh_node(lab, monkeypatch, 100)


def test_a_fresh_node_restores_with_the_page_images_verified_alongside(lab: Lab, snapshot: Dict[str, Any]) -> None:
    pages = snapshot["pages"]
    assert pages["size"] > 64 * MIB and len(pages["chunks"]["sha256"]) == -(-pages["size"] // (64 * MIB))
    forget_hashed(lab)
    res = lab.play([lab.restore("restore", snapshot=snapshot["id"])])["restore"]["restore"]
    assert res["verify"]["overlapped"] is True, res["verify"]
    assert "verify_wait" in res["timings"]
    after = query(snapshot["port"])
    assert after["token"] == snapshot["before"]["token"] and after["sha256"] == snapshot["before"]["digest_at_start"]
    # CRIU read a private copy made while the small images were hashed (a store writer cannot change it
    # after its check); the page images' copy was hashed alongside CRIU. Nothing of it is left behind.
    assert "verified_copy" in res["timings"], res["timings"]
    assert not (Path(res["work_dir"]) / "images").exists() and not (Path(res["work_dir"]) / "snapshot").exists()
    # the page images hashed alongside are recorded as hashed on this node, by the inode the restore read, after
    # its links in the work dir are gone (they changed the file's ctime): the next restore here hashes nothing
    record = ck.VerifiedFiles(snapshot["id"], root=str(lab.tmp / "verified"), record=False)
    assert record.known(str(snapshot["top"] / pages["path"]), pages["sha256"]), record.data
    lab.play([lab.stop("big")])
    again = lab.play([lab.restore("restore again", snapshot=snapshot["id"], lazy=True)])["restore again"]["restore"]
    assert again["lazy"]["used"] is True and again["lazy"]["pages"] == "images", again["lazy"]
    assert query(snapshot["port"])["sha256"] == snapshot["before"]["digest_at_start"]


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_corrupted_page_chunk_kills_the_stopped_tree(lab: Lab, snapshot: Dict[str, Any], where: str) -> None:
    pages = snapshot["pages"]
    offset = {"first": 4096 + 7, "middle": 64 * MIB + 12345, "last": pages["size"] - 1}[where]
    flip_byte(snapshot["top"] / pages["path"], offset)
    forget_hashed(lab)
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
    flip_byte(snapshot["top"] / core["path"], core["size"] // 2)
    forget_hashed(lab)
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
    forget_hashed(lab)
    res = lab.play([lab.restore("restore", snapshot=snapshot["id"])])["restore"]["restore"]
    assert res["verify"]["overlapped"] is True
    assert query(snapshot["port"])["sha256"] == snapshot["before"]["digest_at_start"]
