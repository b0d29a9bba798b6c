"""Nothing is done by path where others can write (issue 32, class 2), with real CRIU through the real modules.

The attacker owns a directory warmstart writes into - the progress file's directory, the metrics dir, the
workload's control dir - and plants symlinks (and hard links) where warmstart's files go, before and during a
checkpoint and a restore, pointing at a victim file that root owns elsewhere. Before issue 32, root wrote
JSON into the victim through ``<progress>.tmp``, created it through the metrics lock file, and chmod'ed the
name of a temporary file in the control dir that could be swapped for a symlink. Now every victim is left
exactly as it was, and warmstart's own files are regular files of its own.
"""
from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Any, List, Tuple

import pytest

from .process_lab import Lab, free_port, query

pytestmark = pytest.mark.integration


def victim(path: Path) -> Tuple[bytes, int, int]:
    info = os.lstat(path)
    return path.read_bytes(), stat.S_IMODE(info.st_mode), info.st_uid


class Planter:
    """A loop that turns every new entry of ``directory`` whose name contains ``needle`` into a symlink to
    ``target``, for as long as it runs: the race a local attacker runs against a root process."""

    def __init__(self, directory: Path, needle: str, target: Path) -> None:
        self.directory, self.needle, self.target = directory, needle, target
        self.stop = threading.Event()
        self.swapped = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                names = os.listdir(self.directory)
            except OSError:
                continue
            for name in names:
                if self.needle not in name:
                    continue
                path = self.directory / name
                try:
                    if path.is_symlink():
                        continue
                    os.unlink(path)
                    os.symlink(self.target, path)
                    self.swapped += 1
                except OSError:
                    pass

    def __enter__(self) -> "Planter":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(5)


def test_planted_symlinks_and_links_in_others_directories_reach_nothing(lab: Lab, tmp_path: Path) -> None:
    secret = tmp_path / "root-only" / "secret"
    secret.parent.mkdir(mode=0o700)
    secret.write_bytes(b"root's own bytes\n")
    os.chmod(secret, 0o600)
    before = victim(secret)
    absent = tmp_path / "root-only" / "created-by-root"

    progress_dir = tmp_path / "progress"    # e.g. a connection user's temp dir
    progress_dir.mkdir(mode=0o777)
    progress = progress_dir / "progress.json"
    os.symlink(secret, f"{progress}.tmp")    # the name the old code opened for writing
    metrics = tmp_path / "metrics"
    metrics.mkdir(mode=0o777)
    os.symlink(absent, metrics / ".warmstart-metrics.lock")
    os.link(secret, metrics / "warmstart.prom")  # a hard link to the victim where the metrics file goes

    port = free_port()
    lab.play([lab.start("raced", port, 8)])
    control = lab.wdir("raced") / "control"
    os.link(secret, control / "restore-complete")  # replaced by the restore, never written through
    with Planter(control, "tmp", secret) as planter:
        res = lab.play([
            lab.checkpoint("checkpoint", workload="raced", leave_running=False, progress_file=str(progress),
                           metrics_dir=str(metrics), expect_fail=False),
            lab.restore("restore", name="raced", progress_file=str(progress), metrics_dir=str(metrics)),
        ])
    assert res["restore"]["restore"]["pid"] > 0 and query(port)["pair_ok"] is True
    assert victim(secret) == before, "root wrote, chmod'ed or chowned the victim through a planted name"
    assert not absent.exists(), "root created a file through a planted symlink"
    assert os.lstat(control / "restore-complete").st_ino != os.stat(secret).st_ino, "written through a hard link"
    warnings: List[str] = list(res["restore"].get("warnings") or []) + list(res["checkpoint"].get("warnings") or [])
    assert any("metrics" in w and "refusing" in w or "symlink" in w for w in warnings), warnings
    if progress.exists():
        assert progress.is_file() and not progress.is_symlink()
