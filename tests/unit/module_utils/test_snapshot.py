"""The checkpoint and restore engine without CRIU: check mode creates nothing, a failed checkpoint undoes
every step, and the restore's outcome is decided once."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _checkpoint as ckpt
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _restore as rs
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import CriuOptions
from tests.support.store_fixtures import make_snapshot, tree

NODE = {"hostname": "n1", "arch": "x86_64", "kernel": "6.12.0", "cpu_vendor": "GenuineIntel", "cpu_model": "x",
        "cpu_flags": ["sse2"], "cpu_flags_hash": "h", "criu_version": "4.2.1", "os_id": "debian", "os_version_id": "13"}


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """CRIU and the node stubbed; checkpoint locks under tmp_path/locks."""
    monkeypatch.setattr(snap, "find_criu", lambda path=None: "/usr/local/bin/criu")
    monkeypatch.setattr(ckpt, "describe_node", lambda criu=None: dict(NODE))
    monkeypatch.setattr(rs, "describe_node", lambda criu=None: dict(NODE))
    real_lock = snap.lock_target
    monkeypatch.setattr(snap, "lock_target", lambda pid, what: real_lock(pid, what, str(tmp_path / "locks")))
    return tmp_path


@pytest.fixture
def sleeper() -> Iterator[int]:
    child = subprocess.Popen(["sleep", "120"])
    try:
        yield child.pid
    finally:
        child.kill()
        child.wait()


# --- check mode ---------------------------------------------------------------

def test_checkpoint_check_mode_creates_nothing(engine: Path, sleeper: int) -> None:
    store = st.FsStore(str(engine / "store"))
    before = tree(engine)
    result = ckpt.checkpoint(store, snap.Target(sleeper, "process"), "embed", {}, CriuOptions(), cuda="off",
                             check_mode=True)
    assert result == {"cuda": {"mode": "off", "used": False,
                               "reason": "cuda: off - GPU state is not checkpointed by warmstart"},
                      "msg": f"would snapshot pid {sleeper} as embed"}
    assert tree(engine) == before and not (engine / "store").exists()
    assert proc.stat_fields(sleeper)[0] != "T"


def test_checkpoint_check_mode_refuses_what_the_store_would(engine: Path, sleeper: int) -> None:
    (engine / "store").write_text("not a directory")
    with pytest.raises(st.StoreError, match="cannot create"):
        ckpt.checkpoint(st.FsStore(str(engine / "store")), snap.Target(sleeper, "process"), "embed", {},
                        CriuOptions(), cuda="off", check_mode=True)


def test_restore_check_mode_touches_nothing(engine: Path) -> None:
    store = st.FsStore(str(engine / "store"))
    doc = make_snapshot(store)
    shutil.rmtree(engine / "verified")  # the record publish wrote: a node that did not take the snapshot
    before = tree(engine / "store")
    result = rs.restore(store, doc["id"], skip_compat=True, restore_root=str(engine / "restore"), check_mode=True)
    tcp = result.pop("tcp")  # this node (the engine fixture's) did not take the snapshot (node-a did)
    assert tcp["mode"] == "close" and tcp["reason"].endswith("the snapshot was taken on node node-a")
    assert result == {"id": doc["id"], "name": "embed", "verified": True, "compat_checked": False,
                      "gpu_state": False, "passed_over": [], "app_profile": None}
    assert tree(engine / "store") == before
    assert not (engine / "restore").exists() and not (engine / "locks").exists()
    assert not (engine / "verified").exists()  # this node's record of hashed files is not written either


# --- outcome ------------------------------------------------------------------

def test_a_refusal_before_anything_is_touched_is_incompatible(engine: Path) -> None:
    store = st.FsStore(str(engine / "store"))
    doc = make_snapshot(store)
    with open(os.path.join(store.snapshot_dir(doc["id"]), doc["files"][0]["path"]), "r+b") as handle:
        handle.write(b"X")
    for check_mode in (True, False):
        with pytest.raises(snap.SnapshotError, match="refusing to restore") as err:
            rs.restore(store, doc["id"], skip_compat=True, restore_root=str(engine / "restore"),
                       check_mode=check_mode)
        assert err.value.details["outcome"] == "incompatible"
        assert any("SHA256 mismatch" in r for r in err.value.reasons)
    # the copy that was hashed (and refused) is gone with its work dir; at most the node's empty restore root is left
    assert not (engine / "restore").exists() or not any((engine / "restore").iterdir())


def test_other_failures_are_failed(engine: Path) -> None:
    store = st.FsStore(str(engine / "store"))
    with pytest.raises(st.StoreError, match="not found") as err:
        rs.restore(store, "20260101T000000Z-0123abcd", restore_root=str(engine / "restore"))
    assert err.value.details["outcome"] == "failed"


# --- rollback -----------------------------------------------------------------

class FailingCapture:
    """A target kind whose capture while stopped fails, after a dump that left the tree stopped."""

    def __init__(self) -> None:
        self.calls: List[str] = []

    def criu_options(self, base: CriuOptions) -> CriuOptions:
        self.calls.append("options")
        return base

    def while_stopped(self, target_dir: str) -> Dict[str, Any]:
        self.calls.append("while_stopped")
        raise snap.SnapshotError("container c: rootfs changes cannot be captured: disk full")

    def entry(self) -> Dict[str, Any]:
        return {}

    def before_resume(self) -> None:
        self.calls.append("before_resume")


def test_a_failure_while_stopped_resumes_the_tree_unlocks_its_network_and_removes_staging(
        engine: Path, sleeper: int, monkeypatch: pytest.MonkeyPatch) -> None:
    def stopping_dump(criu: str, pid: int, images: str, options: Any, leave_stopped: bool = True,
                      setup: Any = None) -> None:
        os.kill(pid, signal.SIGSTOP)
        Path(images, "pages-1.img").write_bytes(b"\0" * 4096)

    monkeypatch.setattr(ckpt, "dump", stopping_dump)
    capture = FailingCapture()
    store = st.FsStore(str(engine / "store"))
    with pytest.raises(snap.SnapshotError, match="disk full"):
        ckpt.checkpoint(store, snap.Target(sleeper, "c", capture=capture), "c", {}, CriuOptions(), cuda="off")
    assert capture.calls[-2:] == ["while_stopped", "before_resume"]
    deadline = time.monotonic() + 5
    while proc.stat_fields(sleeper)[0] == "T" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.stat_fields(sleeper)[0] != "T"
    assert os.listdir(store.tmp) == [] and os.listdir(store.snapshots) == []
