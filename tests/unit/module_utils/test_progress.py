"""Progress reporting: the module's JSON file and the action plugin's lines."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _checksums as ck
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _progress as prog
from ansible_collections.warmstart.snapshot.plugins.plugin_utils._progress_action import format_progress, human


def read(path: Path) -> dict:
    return json.loads(path.read_text())


def test_phases_bytes_and_timings_are_written(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    rep = prog.start(str(path), min_interval=0)
    try:
        prog.phase("download", 1000)
        prog.add(250)
        doc = read(path)
        assert (doc["phase"], doc["done"], doc["total"]) == ("download", 250, 1000)
        time.sleep(0.05)
        prog.phase("verify", 1000)
        assert read(path)["done"] == 0 and read(path)["phases"]["download"] >= 0.05
        prog.finish()
        doc = read(path)
        assert doc["phase"] == "done" and set(doc["phases"]) == {"download", "verify"}
        assert rep is prog.current()
    finally:
        prog.start(None)
    assert not list(tmp_path.glob("*.tmp")), "the file is replaced by rename, never left half-written"


def test_writes_are_throttled_but_phase_changes_are_not(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    rep = prog.Reporter(str(path), min_interval=60)
    rep.phase("upload", 10)
    rep.add(5)
    assert read(path)["done"] == 0, "a second write within min_interval is skipped"
    rep.phase("publish")
    assert read(path)["phase"] == "publish"


@pytest.mark.parametrize("min_interval, adds", [
    (60, 10000),  # many adds racing, the file written once: the counting itself
    (0, 250),     # every add writes the file too (a write per add is slow: fewer adds)
])
def test_counting_is_thread_safe(tmp_path: Path, min_interval: float, adds: int) -> None:
    path = tmp_path / "p.json"
    rep = prog.Reporter(str(path), min_interval=min_interval)
    rep.phase("download", 8 * adds)

    def work() -> None:
        for _i in range(adds):
            rep.add(1)

    threads = [threading.Thread(target=work) for _i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert rep.snapshot()["done"] == 8 * adds
    if min_interval == 0:
        assert read(path)["done"] == 8 * adds, "the last write holds the last count"


def test_an_unwritable_file_never_fails_the_work(tmp_path: Path) -> None:
    rep = prog.Reporter(str(tmp_path / "missing-dir" / "p.json"), min_interval=0)
    rep.phase("dump")
    rep.add(10)
    assert rep.path is None and rep.snapshot()["done"] == 10


def test_no_file_no_writes(tmp_path: Path) -> None:
    rep = prog.start(None)
    prog.phase("verify", 5)
    prog.add(5)
    assert rep.snapshot()["done"] == 5 and list(tmp_path.iterdir()) == []


def test_verify_reports_the_bytes_it_hashes(tmp_path: Path) -> None:
    (tmp_path / "snap").mkdir()
    data = tmp_path / "snap" / "pages-1.img"
    data.write_bytes(b"x" * 300000)
    doc = {"files": ck.record_files(str(tmp_path / "snap"))}
    rep = prog.start(None)
    try:
        assert ck.verify_files(str(tmp_path / "snap"), doc) == []
        snap = rep.snapshot()
        assert (snap["phase"], snap["done"], snap["total"]) == ("verify", 300000, 300000)
    finally:
        prog.start(None)


def test_lines_read_like_a_transfer() -> None:
    line = format_progress({"phase": "download", "done": 300 << 20, "total": 600 << 20, "elapsed": 3, "rate": 100 << 20})
    assert line == "download: 300.0 MiB of 600.0 MiB (50%), 100.0 MiB/s, ~3 s left"
    assert format_progress({"phase": "dump", "done": 2 << 30, "total": None, "rate": 1 << 30, "elapsed": 2}) == \
        "dump: 2.0 GiB, 1.0 GiB/s"
    assert format_progress({"phase": "verify", "done": 0, "total": 1 << 30, "elapsed": 12.4}) == \
        "verify: 0 B of 1.0 GiB (0%), 12 s"
    assert format_progress({"phase": "restore", "done": 0, "total": None, "elapsed": 4.2}) == "restore: 4 s"
    assert format_progress({"phase": "wait for ready-for-snapshot", "done": 0, "elapsed": 31}) == \
        "wait for ready-for-snapshot: 31 s"
    assert format_progress({"phase": "done"}) is None and format_progress({}) is None
    assert human(512) == "512 B" and human(1536) == "1.5 KiB"
