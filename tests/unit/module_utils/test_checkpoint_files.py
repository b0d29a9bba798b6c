"""The workload files a checkpoint copies while the tree is stopped, against the sizes CRIU's dump recorded
(_checkpoint._match_dump): equal sizes pass, growth by appends to an ``O_APPEND`` file is cut back to the
dump's size and noted, any other difference fails the checkpoint naming every file; and nothing is copied or
captured before every thread of the tree is stopped (_hold_stopped). The dump's records and the threads' states
are stubbed here; test_process_snapshot runs it on real CRIU images."""
from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Dict, List, Tuple, cast

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _files as cimg
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _checkpoint as ckpt
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._storeapi import Staging


def job_with(tmp_path: Path, copies: Dict[str, bytes]) -> Tuple[ckpt._Job, snap.Target]:
    """A job whose copies of workload ``w``'s files hold ``copies``, and its target."""
    tdir = tmp_path / "staging" / "containers" / "w"
    for rel, data in copies.items():
        (tdir / "files" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tdir / "files" / rel).write_bytes(data)
    job = ckpt._Job(staging=cast(Staging, None), manifest={}, source={}, tdir=str(tdir))
    job.files = [{"path": rel, "mode": 0o600} for rel in copies]
    return job, snap.Target(pid=1, name="w", workload="w", workloads_root=str(tmp_path / "wl"))


def dumped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sizes: Dict[str, Tuple[int, int]]) -> None:
    """The dump's records: workload-relative path -> (size, flags), by the path the process saw."""
    table = {str(tmp_path / "wl" / "w" / rel): cimg.Recorded(*v) for rel, v in sizes.items()}
    monkeypatch.setattr(cimg, "regular_files", lambda images: table)


def test_sizes_as_dumped_pass_untouched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job, target = job_with(tmp_path, {"journal.log": b"tick 1\n", "notes.txt": b"free"})
    dumped(monkeypatch, tmp_path, {"journal.log": (7, os.O_RDWR | os.O_APPEND)})
    ckpt._match_dump(job, target)
    assert job.trimmed == []
    assert (Path(job.tdir) / "files" / "journal.log").read_bytes() == b"tick 1\n"


def test_appends_after_the_dump_are_cut_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job, target = job_with(tmp_path, {"logs/journal.log": b"tick 1\ntick 2\ntick 3\n"})
    dumped(monkeypatch, tmp_path, {"logs/journal.log": (14, os.O_RDWR | os.O_APPEND)})
    ckpt._match_dump(job, target)
    assert job.trimmed == [{"path": "logs/journal.log", "bytes": 7}]
    assert (Path(job.tdir) / "files" / "logs" / "journal.log").read_bytes() == b"tick 1\ntick 2\n"


def test_other_changes_fail_and_name_every_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job, target = job_with(tmp_path, {"state.db": b"x" * 10, "journal.log": b"ab", "grown.bin": b"0123"})
    dumped(monkeypatch, tmp_path, {"state.db": (12, os.O_RDWR),                    # shrank
                                   "journal.log": (5, os.O_RDWR | os.O_APPEND),     # shorter: not appends
                                   "grown.bin": (2, os.O_RDWR)})                    # grew, but not O_APPEND
    with pytest.raises(snap.SnapshotError) as err:
        ckpt._match_dump(job, target)
    assert err.value.reasons == ["state.db: 12 bytes at the dump, 10 when copied",
                                 "journal.log: 5 bytes at the dump, 2 when copied",
                                 "grown.bin: 2 bytes at the dump, 4 when copied"]
    assert "workload w" in str(err.value) and "nothing was published" in str(err.value)
    assert (Path(job.tdir) / "files" / "grown.bin").read_bytes() == b"0123", "a refused file was changed"


def test_a_workloads_root_reached_through_a_symlink_still_matches(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """CRIU records the resolved path; a workloads root given through a symlink names the same files."""
    job, target = job_with(tmp_path, {"journal.log": b"tick 1\ntick 2\n"})
    (tmp_path / "real" / "w").mkdir(parents=True)
    (tmp_path / "wl").symlink_to(tmp_path / "real")
    monkeypatch.setattr(cimg, "regular_files", lambda images: {
        str(tmp_path / "real" / "w" / "journal.log"): cimg.Recorded(7, os.O_RDWR | os.O_APPEND)})
    ckpt._match_dump(job, target)
    assert job.trimmed == [{"path": "journal.log", "bytes": 7}]


def test_an_unreadable_files_img_fails_the_checkpoint_with_the_cause(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    job, target = job_with(tmp_path, {"journal.log": b"tick 1\n"})

    def broken(images: str) -> Dict[str, cimg.Recorded]:
        raise ValueError(f"{images}/files.img: 3 bytes after its last entry")
    monkeypatch.setattr(cimg, "regular_files", broken)
    with pytest.raises(snap.SnapshotError, match=r"^workload w: cannot read the dump's files.img \(.*3 bytes after "
                                                 r"its last entry\); nothing was published$"):
        ckpt._match_dump(job, target)


# --- every thread stopped before anything is copied (_hold_stopped) ----------------------------------------------

class FakeCapture:
    """A container target's capture: notes which threads still ran when it captured."""

    def __init__(self, running: List[int]) -> None:
        self.running = running
        self.saw_running: List[List[int]] = []

    def while_stopped(self, target_dir: str) -> Dict[str, str]:
        self.saw_running.append(list(self.running))
        return {"rootfs": "captured"}


@pytest.fixture(name="quick")
def fixture_quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ckpt, "STOP_SETTLE", 0.05)


@pytest.mark.usefixtures("quick")
def test_the_capture_waits_for_every_thread_and_nudges_one_that_keeps_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    running = [4242]
    sent: List[Tuple[int, int]] = []
    monkeypatch.setattr(ckpt.proc, "unstopped", lambda pid: list(running))
    monkeypatch.setattr(ckpt.proc, "signal_tree", lambda pid, sig: (sent.append((pid, sig)), running.clear()))
    capture = FakeCapture(running)
    job, _target = job_with(tmp_path, {})
    ckpt._capture_stopped(job, snap.Target(pid=7, name="c", capture=cast(snap.Capture, capture)), {})
    assert sent == [(7, signal.SIGSTOP)] and capture.saw_running == [[]], "captured while a thread ran"
    assert job.extra == {"rootfs": "captured"}


@pytest.mark.usefixtures("quick")
def test_a_thread_that_never_stops_fails_the_checkpoint_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ckpt.proc, "unstopped", lambda pid: [4242, 4243])
    monkeypatch.setattr(ckpt.proc, "signal_tree", lambda pid, sig: None)
    with pytest.raises(snap.SnapshotError, match=r"^workload w: thread\(s\) 4242, 4243 kept running after the dump"):
        ckpt._hold_stopped(snap.Target(pid=7, name="w", workload="w"))


@pytest.mark.usefixtures("quick")
def test_a_stopped_tree_is_not_signalled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ckpt.proc, "unstopped", lambda pid: [])
    monkeypatch.setattr(ckpt.proc, "signal_tree", lambda pid, sig: pytest.fail("a stopped tree got a signal"))
    ckpt._hold_stopped(snap.Target(pid=7, name="w", workload="w"))
