"""_cleanup: retention applied to a real temporary filesystem store; check mode removes nothing."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Dict

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.catalog import _cleanup as cln
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _cleanup as cleanup_runner
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _progress as prog
from ansible_collections.warmstart.snapshot.plugins.module_utils.catalog import _retention as ret
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import failure
from tests.support.store_fixtures import make_snapshot, tree

DAY = 86400


def age(path: str, seconds: float) -> None:
    """Make ``path`` and everything under it look ``seconds`` old."""
    then = time.time() - seconds
    for dirpath, dirs, files in os.walk(path):
        for entry in dirs + files:
            os.utime(os.path.join(dirpath, entry), (then, then), follow_symlinks=False)
    os.utime(path, (then, then))


def params(store: st.FsStore, tmp_path: Path, **over: Any) -> Dict[str, Any]:
    return dict(dict(store=store.root, store_options={}, keep_last=0, group_by=[], max_age=None,
                     incomplete_older_than="1h", name=None, labels={}, remove_broken=False, snapshot_ids=[],
                     restore_root=str(tmp_path / "restore"), prune_node_cache=False), **over)


def leftovers(store: st.FsStore, tmp_path: Path) -> Dict[str, str]:
    """A stale staging dir and a stale restore work dir, both a day old."""
    staging = os.path.join(store.root, "tmp", "a" * 32)
    os.makedirs(staging)
    Path(staging, "pages.img").write_bytes(b"x" * 4096)
    restore = tmp_path / "restore" / "20261201T080000Z-0a1b2c3d-5e6f7a8b"
    restore.mkdir(parents=True)
    (restore / "restore.log").write_text("log")
    age(staging, DAY)
    age(str(restore), DAY)
    return {"staging": staging, "restore": str(restore)}


def test_check_mode_removes_nothing_and_reports_what_would_go(store: st.FsStore, tmp_path: Path) -> None:
    docs = [make_snapshot(store, "embed") for index in range(3)]
    paths = leftovers(store, tmp_path)
    before = tree(tmp_path)
    result = cleanup_runner.run(params(store, tmp_path, keep_last=1), True)
    assert tree(tmp_path) == before
    assert result["changed"] is True and len(result["removed"]) == 2
    assert {e["id"] for e in result["removed"] + result["kept"]} == {d["id"] for d in docs}
    assert [e["name"] for e in result["kept"]] == ["embed"] and result["kept"][0]["created_at"]
    assert [e["path"] for e in result["removed_staging"]] == [paths["staging"]]
    assert [e["path"] for e in result["removed_restore_dirs"]] == [paths["restore"]]
    assert result["msg"].startswith("would remove 2 snapshot(s), 1 staging dir(s) and 1 restore work dir(s)")
    assert result["bytes_freed"] == sum(e["size"] for e in result["removed"] + result["removed_staging"]
                                        + result["removed_restore_dirs"])
    assert result["warnings"] == [] and result["removed_cache"] == [] and result["missing"] == []


def test_real_run_removes_what_check_mode_listed(store: st.FsStore, tmp_path: Path) -> None:
    for index in range(3):
        make_snapshot(store, "embed")
    paths = leftovers(store, tmp_path)
    plan = cleanup_runner.run(params(store, tmp_path, keep_last=1), True)
    done = cleanup_runner.run(params(store, tmp_path, keep_last=1), False)
    assert [(e["id"], e["reason"]) for e in done["removed"]] == [(e["id"], e["reason"]) for e in plan["removed"]]
    assert done["kept"] == plan["kept"]
    assert done["msg"].startswith("removed 2 snapshot(s), 1 staging dir(s) and 1 restore work dir(s)")
    assert not os.path.lexists(paths["staging"]) and not os.path.lexists(paths["restore"])
    assert [d["id"] for d in store.list()] == [e["id"] for e in done["kept"]]
    again = cleanup_runner.run(params(store, tmp_path, keep_last=1), False)
    assert again["changed"] is False and again["removed"] == []


def test_snapshot_ids_named_and_missing(store: st.FsStore, tmp_path: Path) -> None:
    doc = make_snapshot(store)
    absent = "20200101T000000Z-0a1b2c3d"
    result = cleanup_runner.run(params(store, tmp_path, snapshot_ids=[doc["id"], absent]), False)
    assert [e["id"] for e in result["removed"]] == [doc["id"]] and result["missing"] == [absent]
    assert result["removed"][0]["reason"] == "named in snapshot_ids"


def test_bad_policy_is_refused_before_the_store_is_read(tmp_path: Path) -> None:
    store = st.FsStore(str(tmp_path / "never"))
    with pytest.raises(ret.RetentionError) as raised:
        cleanup_runner.run(params(store, tmp_path, max_age="7x"), False)
    assert failure(raised.value)["msg"].startswith("max_age: unknown unit 'x' in '7x'")
    assert not (tmp_path / "never").exists()


def test_a_failed_removal_fails_with_the_whole_result_and_errors(store: st.FsStore, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    gone, stuck, kept = (make_snapshot(store, f"embed{index}") for index in range(3))

    def delete(snapshot_id: str) -> int:
        if snapshot_id == stuck["id"]:
            raise PermissionError(13, "Permission denied")
        if snapshot_id == gone["id"]:
            raise FileNotFoundError(2, "No such file or directory")
        return 7

    monkeypatch.setattr(store, "delete", delete)
    with pytest.raises(cln.CleanupError) as raised:
        cln.cleanup(store, ret.policy(), snapshot_ids=[gone["id"], stuck["id"], kept["id"]])
    out = failure(raised.value)
    assert out["msg"] == f"cleanup could not remove everything: snapshot {stuck['id']}: Permission denied"
    assert out["errors"] == [f"snapshot {stuck['id']}: Permission denied"]
    assert [e["id"] for e in out["removed"]] == [kept["id"]] and out["bytes_freed"] == 7 and out["changed"] is True
    for key in ("removed_staging", "removed_restore_dirs", "removed_cache", "missing",
                "kept", "broken"):
        assert key in out
    assert out["warnings"] == [f"snapshot {gone['id']} was gone before cleanup removed it (another cleanup?)"]


def test_prune_node_cache_is_a_no_op_for_a_filesystem_store(store: st.FsStore, tmp_path: Path) -> None:
    make_snapshot(store)
    result = cleanup_runner.run(params(store, tmp_path, prune_node_cache=True), False)
    assert result["removed_cache"] == [] and result["changed"] is False


class CachedStore(st.FsStore):
    """A filesystem store with a node cache, as an object store has one."""

    def __init__(self, root: str, cache: str) -> None:
        super().__init__(root)
        self.cache = cache

    def cache_root(self) -> str:
        return self.cache


def test_prune_node_cache_removes_unpublished_cached_snapshots(tmp_path: Path) -> None:
    store = CachedStore(str(tmp_path / "store"), str(tmp_path / "cache"))
    store.ensure()
    live = make_snapshot(store)
    stale = tmp_path / "cache" / "20200101T000000Z-0a1b2c3d"
    stale.mkdir(parents=True)
    (stale / "pages.img").write_bytes(b"p" * 100)
    (tmp_path / "cache" / live["id"]).mkdir()
    (tmp_path / "cache" / "not-an-id").mkdir()
    plan = cln.cleanup(store, ret.policy(), prune_node_cache=True, check_mode=True)
    assert [e["id"] for e in plan["removed_cache"]] == [stale.name] and stale.exists()
    assert ", 1 cached snapshot(s)" in plan["msg"]
    done = cln.cleanup(store, ret.policy(), prune_node_cache=True)
    assert done["removed_cache"][0]["size"] == 100 and not stale.exists()
    assert (tmp_path / "cache" / live["id"]).exists() and (tmp_path / "cache" / "not-an-id").exists()


def test_remove_path_refuses_to_report_a_dir_that_stays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    top = tmp_path / "20261201T080000Z-0a1b2c3d-5e6f7a8b"
    top.mkdir()
    monkeypatch.setattr(cln.shutil, "rmtree", lambda path, ignore_errors=False: None)
    with pytest.raises(OSError) as raised:
        cln.remove_path(str(top))
    assert "could not be removed completely" in str(raised.value)


def test_human_sizes() -> None:
    assert [prog.human(n) for n in (0, 1023, 1024, 5 << 20, 3 << 40)] == ["0 B", "1023 B", "1.0 KiB", "5.0 MiB",
                                                                          "3.0 TiB"]
