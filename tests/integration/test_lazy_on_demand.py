"""A lazy restore with ``lazy_verify: on_demand`` on a node that never verified the snapshot's page images (issue 37,
item 2, from a store read in place): the tree runs before the page images are hashed, and every page reaches it
only from a 64 MiB piece of its image that matched the manifest when read - served to CRIU's lazy-pages daemon by
the restore's own supervisor, speaking CRIU's page-server protocol (criu/_pagewire).

A process holding 200 MiB of random memory is checkpointed (four chunk digests; the pages CRIU restores itself
lie in the first and the last), then restored lazily with this node's record of hashed files removed - as on
another node reading the same shared store. A byte changed in the first, middle or last piece never reaches the
tree: it is killed and restore-failed names the piece. The node that verified the images (the record kept) lets
CRIU read them directly; without ``lazy_verify: on_demand`` a fresh node hashes every page image first, as before.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import pytest

from .process_lab import Lab, flip_byte, forget_hashed, gone, query, snapshot_of_a_fresh_node

pytestmark = pytest.mark.integration

MIB = 1 << 20


@pytest.fixture
def snapshot(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> Dict[str, Any]:
    """A checkpoint of a 200 MiB workload (stopped), this node's record of hashed files in a dir of the test's."""
    return snapshot_of_a_fresh_node(lab, monkeypatch, 200)


def _state(work_dir: str) -> Dict[str, Any]:
    path = Path(work_dir) / "lazy-state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def test_a_fresh_node_serves_checked_pages_and_memory_completes(lab: Lab, snapshot: Dict[str, Any]) -> None:
    pages = snapshot["pages"]
    assert pages["size"] > 192 * MIB and len(pages["chunks"]["sha256"]) == 4
    forget_hashed(lab)
    res = lab.play([lab.restore("restore", snapshot=snapshot["id"], lazy=True, lazy_wait=True,
                                lazy_verify="on_demand")])
    out = res["restore"]["restore"]
    lazy = out["lazy"]
    assert lazy["used"] is True and lazy["pages"] == "checked_on_demand", lazy
    assert 0 < lazy["resumed_after"] <= lazy["complete_after"], lazy
    # this node read of the page images only what CRIU restores itself before the tree ran; no copy was made
    assert 0 < lazy["eager_bytes"] < pages["size"] / 4, lazy
    assert "verified_copy" not in out["timings"], out["timings"]
    after = query(snapshot["port"])
    assert after["token"] == snapshot["before"]["token"] and after["sha256"] == snapshot["before"]["digest_at_start"]
    assert _state(out["work_dir"])["state"] == "complete"
    assert gone(lazy["daemon_pid"], 10)
    assert not (Path(out["work_dir"]) / "images").exists(), "the staged images outlived the restore"
    assert (lab.wdir("big") / "control" / "restore-complete").exists()


def test_the_node_that_verified_the_images_lets_criu_read_them(lab: Lab, snapshot: Dict[str, Any]) -> None:
    res = lab.play([lab.restore("restore", snapshot=snapshot["id"], lazy=True, lazy_wait=True,
                                lazy_verify="on_demand")])
    lazy = res["restore"]["restore"]["lazy"]
    assert lazy["used"] is True and lazy["pages"] == "images", lazy
    assert query(snapshot["port"])["sha256"] == snapshot["before"]["digest_at_start"]


def test_by_default_a_fresh_node_hashes_the_page_images_before_the_tree_runs(
        lab: Lab, snapshot: Dict[str, Any]) -> None:
    forget_hashed(lab)
    res = lab.play([lab.restore("restore", snapshot=snapshot["id"], lazy=True, lazy_wait=True)])
    out = res["restore"]["restore"]
    assert out["lazy"]["pages"] == "images" and "verified_copy" in out["timings"], out
    assert query(snapshot["port"])["sha256"] == snapshot["before"]["digest_at_start"]


def test_on_demand_where_it_cannot_be_used_says_why_and_checks_before(lab: Lab, snapshot: Dict[str, Any]) -> None:
    forget_hashed(lab)
    res = lab.play([lab.restore("restore", snapshot=snapshot["id"], lazy=True, lazy_wait=True, verify=False,
                                lazy_verify="on_demand")])
    lazy = res["restore"]["restore"]["lazy"]
    assert lazy["pages"] == "images" and "lazy_verify: on_demand not used - verify: false" in lazy["reason"], lazy


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_changed_piece_is_never_served_and_the_tree_is_killed(lab: Lab, snapshot: Dict[str, Any],
                                                                where: str) -> None:
    pages = snapshot["pages"]
    offset = {"first": 4096 * 64 + 7, "middle": 100 * MIB + 12345, "last": pages["size"] - 1}[where]
    flip_byte(snapshot["top"] / pages["path"], offset)
    forget_hashed(lab)
    res = lab.play([lab.restore("restore", snapshot=snapshot["id"], lazy=True, lazy_wait=True,
                                lazy_verify="on_demand", expect_fail=True)])["restore"]
    assert res["failed"], res
    said = res["msg"] + " ".join(res.get("reasons", []))
    assert pages["path"].rsplit("/", 1)[-1] in said and "SHA256 mismatch" in said, said
    assert not lab.ours(), "a process of the changed snapshot is still running"
    # the middle pieces hold only the workload's own anonymous memory, served lazily: the tree ran first and was
    # killed; the first and the last also hold pages CRIU restores itself, checked (and refused) before it runs
    if where == "middle":
        assert "was killed" in said, said
    if "was killed" in said:
        failed = lab.wdir("big") / "control" / "restore-failed"
        assert failed.exists() and "SHA256 mismatch" in failed.read_text()
